"""Compile a config's step for a target ahead of time and measure it: per-device memory, FLOPs, compile time.

The program is the trainer's own (`trainer.program.build_program`): the same layouts, optimizers and
jitted step, given abstract arrays (`jax.ShapeDtypeStruct` with the trainer's shardings) instead of
weights and data, so nothing is allocated. The step is the trainer's step mode (`trainer.step_modes`), run
with a runner that compiles each program instead of running it: fused (`trainer.fuse_step=True`), one
program; phased (`--phases` or `fuse_step=False`), each phase compiled in the order the trainer runs them,
each given the abstract outputs of the ones before (shapes from `jax.eval_shape`, shardings from the
compiled program), exactly as `PhasedStep` chains them.

Memory per device of one program = arguments + outputs - aliased (donated inputs reused as outputs)
+ temporaries + generated code. A phase runs while the rest of the train state stays resident, so a
phase's peak adds the state it was not given. The rule reward, a host callback in the trainer, is
replaced by a device function of the same shapes (`_rule_reward_on_device`): a host callback cannot be
lowered without the target's runtime.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf.aot.targets import Target
from jaxrlhf.config import resolve_config
from jaxrlhf.errors import UserError
from jaxrlhf.models.hub import resolve_model_paths
from jaxrlhf.parallel import replicated
from jaxrlhf.parallel.mesh import mesh_from_config
from jaxrlhf.parallel.report import fmt_bytes, per_device_bytes
from jaxrlhf.trainer.flops import step_phase_flops
from jaxrlhf.trainer.judge import JudgeFns
from jaxrlhf.trainer.phased import PhasedStep
from jaxrlhf.trainer.program import StepProgram, build_program, model_configs, teacher_model_config
from jaxrlhf.trainer.reward import uses_judge
from jaxrlhf.trainer.state import TrainState
from jaxrlhf.trainer.step_modes import abstract_batches, generation_mode, step_mode

_BUFFER_RE = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(\w+)\[([\d,]*)\]\S*\s+([\w\-]+)\(")
_OP_NAME_RE = re.compile(r'op_name="([^"]*)"')
_ITEMSIZE = {
  "f32": 4,
  "bf16": 2,
  "f16": 2,
  "s32": 4,
  "u32": 4,
  "s8": 1,
  "u8": 1,
  "pred": 1,
  "s64": 8,
  "f64": 8,
  "u64": 8,
  "s16": 2,
  "u16": 2,
  "f8e4m3fn": 1,
  "f8e5m2": 1,
}


class AotError(UserError, ValueError):
  """A config that cannot be compiled ahead of time as given (the message names the key)."""


@dataclasses.dataclass
class ProgramReport:
  """One compiled program's per-device memory (bytes), XLA's FLOP count and compile time."""

  name: str
  compile_seconds: float
  argument_bytes: int = 0
  output_bytes: int = 0
  temp_bytes: int = 0
  alias_bytes: int = 0
  code_bytes: int = 0
  host_bytes: int = 0  # pinned-host (offloaded) arguments, outputs and temporaries
  resident_bytes: int = 0  # train state held on the device while this phase runs, not among its arguments
  xla_flops: float | None = None
  largest_buffers: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)  # bytes, shape, op
  compile_error: str | None = None  # the compiler refused it (a TPU program over HBM)
  compiler_used_bytes: int | None = None  # from a refusal: what it needed

  @property
  def total_bytes(self) -> int:
    if self.compiler_used_bytes is not None:
      return self.compiler_used_bytes + self.resident_bytes
    return (
      self.argument_bytes
      + self.output_bytes
      - self.alias_bytes
      + self.temp_bytes
      + self.code_bytes
      + self.resident_bytes
    )

  def to_json(self) -> dict:
    return dict(
      dataclasses.asdict(self),
      total_bytes=self.total_bytes,
      largest_buffers=[{"bytes": b, "shape": s, "op": o} for b, s, o in self.largest_buffers],
    )


@dataclasses.dataclass
class AotReport:
  target: Target
  num_hosts: int
  mode: str  # "fused" | "phased", after "multi-turn, " for a multi-turn rollout (its gen programs)
  layout_report: str
  programs: list[ProgramReport]
  analytic_flops: dict[str, float]  # by phase
  state_bytes: int  # the train state per device (device memory)
  notes: list[str] = dataclasses.field(default_factory=list)  # what the numbers do not model

  @property
  def peak_bytes(self) -> int:
    return max(p.total_bytes for p in self.programs)

  @property
  def fits(self) -> bool:
    return all(p.compile_error is None for p in self.programs) and self.peak_bytes <= self.target.memory_bytes

  @property
  def peak_program(self) -> ProgramReport:
    return max(self.programs, key=lambda p: p.total_bytes)

  def to_json(self) -> dict:
    target = self.target
    return {
      "target": {
        "name": target.name,
        "platform": target.platform,
        "devices": target.num_devices,
        "hosts": self.num_hosts,
        "device_kind": target.device_kind,
        "device_memory_bytes": target.memory_bytes,
      },
      "mode": self.mode,
      "fits": self.fits,
      "peak_bytes_per_device": self.peak_bytes,
      "headroom_bytes": target.memory_bytes - self.peak_bytes,
      "state_bytes_per_device": self.state_bytes,
      "programs": [p.to_json() for p in self.programs],
      "analytic_flops": dict(self.analytic_flops, total=sum(self.analytic_flops.values())),
      "compile_seconds": sum(p.compile_seconds for p in self.programs),
      "notes": self.notes,
    }


# ----- the program, abstract --------------------------------------------------------------------


def _eos_ids(model_path: str) -> tuple[int, ...]:
  """EOS ids from the model directory's config.json (a compile needs only their count); 0 without one."""
  if not model_path:
    return (0,)
  with open(os.path.join(model_path, "config.json")) as f:  # already read (and checked) by model_configs
    value = json.load(f).get("eos_token_id", 0)
  return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def _rule_reward_on_device(responses_NxR, response_mask_NxR, sample_index_N, *trajectories):
  """Stands in for the rule reward's host callback, which cannot be lowered without the target's runtime.

  Same shapes in and out; on the device a host callback costs only the transfer of these small
  arrays, so the program's memory and FLOPs are unchanged. This program is measured, never run.
  """
  del responses_NxR, sample_index_N, trajectories
  scores_N = response_mask_NxR.sum(axis=1).astype(np.float32) * 0.0
  return scores_N, scores_N, scores_N, scores_N[None, :][:0]  # scores, errors, null ground truths; no GDPO: [0, N]


def _judge_on_device(config) -> JudgeFns:
  """Stands in for a judge's two host callbacks (`trainer/judge.py`), as `_rule_reward_on_device` does for the rule
  reward: the same shapes (prompt_length judge tokens a row in, two numbers a row out), measured, never run."""
  length = config.reward_model.rollout.prompt_length

  def prompts(prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N):
    del prompts_NxP, prompt_mask_NxP, responses_NxR, sample_index_N
    ids_NxQ = jnp.zeros((response_mask_NxR.shape[0], length), jnp.int32) + response_mask_NxR[:, :1]
    return ids_NxQ, jnp.ones_like(ids_NxQ), ids_NxQ[:, 0].astype(jnp.float32) * 0.0

  def scores(responses_NxR, response_mask_NxR, sample_index_N, verdicts_NxV, verdict_mask_NxV, too_long_N):
    del responses_NxR, response_mask_NxR, sample_index_N
    scores_N = verdict_mask_NxV.sum(axis=1).astype(jnp.float32) * 0.0 + verdicts_NxV[:, 0] * 0.0
    return scores_N, too_long_N

  eos_ids = _eos_ids(config.reward_model.model.path)
  return JudgeFns(prompts, scores, eos_ids, eos_ids[0])


def build_abstract_program(config, devices) -> StepProgram:
  """The trainer's step program for `config` on `devices` (a target's abstract devices)."""
  config = resolve_config(config)
  resolve_model_paths(config, weights=False)  # Hub ids: their config.json is all a compile reads
  model_path = config.actor_rollout_ref.model.path
  if model_path and not os.path.exists(os.path.join(model_path, "config.json")):
    raise AotError(
      f"actor_rollout_ref.model.path={model_path!r} has no config.json; to compile without weights "
      "point it at a directory holding only the architecture's config.json, e.g. "
      "--config.actor_rollout_ref.model.path=configs/models/qwen2.5-7b-instruct"
    )
  model_config, critic_model_config, reward_model_config = model_configs(config)
  eos_ids = _eos_ids(model_path)
  teacher = teacher_model_config(config, model_config)  # its config.json alone, like the student's
  mesh = mesh_from_config(config, devices)
  return build_program(
    config,
    mesh,
    model_config=model_config,
    critic_model_config=critic_model_config,
    reward_model_config=reward_model_config,
    reward_fn=_rule_reward_on_device,
    eos_token_ids=eos_ids,
    pad_token_id=eos_ids[0],
    total_steps=config.trainer.total_training_steps or 1,
    judge_fns=_judge_on_device(config) if uses_judge(config.reward_model) else None,
    teacher_model_config=teacher,
  )


def _device_bytes(tree) -> int:
  """Per-device bytes of the leaves held in device memory (offloaded, pinned-host leaves excluded)."""
  leaves = [
    x
    for x in jax.tree.leaves(tree)
    if getattr(x.sharding, "memory_kind", None) != "pinned_host"
    and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
  ]  # a PRNG key: a few bytes
  return per_device_bytes(leaves)


# ----- compiling and measuring ------------------------------------------------------------------


def _largest_buffers(hlo_text: str, count: int = 8) -> list[tuple[int, str, str]]:
  """The largest arrays the compiled (per-device, partitioned) program produces, with their JAX op."""
  seen, found = set(), []
  for line in hlo_text.splitlines():
    match = _BUFFER_RE.match(line)
    if not match or match.group(1) not in _ITEMSIZE:
      continue
    dtype, dims, opcode = match.groups()
    op_name = _OP_NAME_RE.search(line)
    op_name = op_name.group(1) if op_name else None
    if op_name:  # jit(f)/while/body/closed_call/.../lm_head/dot_general -> .../lm_head/dot_general
      op_name = re.sub(r"^jit\([^)]*\)/|while/body/|closed_call/", "", op_name)
    shape = tuple(int(d) for d in dims.split(",") if d)
    size = int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[dtype]
    label = op_name or opcode
    key = (shape, dtype, label)
    if key in seen or opcode in ("parameter", "get-tuple-element", "bitcast", "tuple"):
      continue
    seen.add(key)
    found.append((size, f"{dtype}[{','.join(map(str, shape))}]", label))
  return sorted(found, reverse=True)[:count]


_TENSOR_RE = re.compile(r"tensor<((?:\d+x)+)(\w+)>")
_STABLEHLO_OP_RE = re.compile(r"= \"?([a-z_]+\.[a-z_]+)")


def _largest_lowered_arrays(stablehlo_text: str, count: int = 8) -> list[tuple[int, str, str]]:
  """The largest arrays of a program before partitioning (global shapes): for one the compiler refused."""
  found = {}
  for line in stablehlo_text.splitlines():
    op = _STABLEHLO_OP_RE.search(line)
    for dims, dtype in _TENSOR_RE.findall(line):
      if dtype not in _ITEMSIZE:
        continue
      shape = tuple(int(d) for d in dims.rstrip("x").split("x"))
      label = f"{op.group(1) if op else 'value'} (global shape)"
      found[(shape, dtype)] = (
        int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[dtype],
        f"{dtype}[{','.join(map(str, shape))}]",
        label,
      )
  return sorted(found.values(), reverse=True)[:count]


def _xla_flops(compiled) -> float | None:
  """XLA's FLOP count of a compiled program (loop bodies are counted once, not per iteration)."""
  try:
    analysis = compiled.cost_analysis()
  except Exception:  # some targets raise rather than return None
    analysis = None
  if isinstance(analysis, list):
    analysis = analysis[0] if analysis else None
  if not analysis:
    try:  # NVIDIA targets compiled on a CPU host: analyse the compiled HLO with the CPU client
      from jax._src.lib import _jax

      module = compiled.runtime_executable().hlo_modules()[0]
      analysis = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    except Exception:
      return None
  flops = analysis.get("flops") if analysis else None
  return float(flops) if flops is not None else None


# XLA's TPU refusals: "Used 25.3G of 15.75G hbm" (everything), or "the total memory required for HLO
# temporaries (145.15G) exceeds available HBM" (temporaries only: the arguments come on top).
_HBM_USED_RE = re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm")
_HBM_TEMPORARIES_RE = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\)")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def compile_program(name: str, jitted, args, resident_bytes: int = 0) -> tuple[ProgramReport, object]:
  """Lowers and compiles `jitted(*args)`; returns its report and the compiled program (None if refused)."""
  start = time.perf_counter()
  lowered = jitted.lower(*args)
  try:
    compiled = lowered.compile()
  except Exception as e:  # XLA's TPU compiler refuses a program over HBM (RESOURCE_EXHAUSTED)
    message = str(e)
    if "RESOURCE_EXHAUSTED" not in message and "hbm" not in message.lower():
      raise
    report = ProgramReport(
      name,
      time.perf_counter() - start,
      resident_bytes=resident_bytes,
      compile_error=message.strip(),
      largest_buffers=_largest_lowered_arrays(lowered.as_text()),
    )
    used, temporaries = _HBM_USED_RE.search(message), _HBM_TEMPORARIES_RE.search(message)
    if used:
      report.compiler_used_bytes = int(float(used.group(1)) * _UNITS[used.group(2)])
    elif temporaries:
      report.argument_bytes = _device_bytes(args)
      report.temp_bytes = int(float(temporaries.group(1)) * _UNITS[temporaries.group(2)])
      report.compiler_used_bytes = report.argument_bytes + report.temp_bytes
    return report, None
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  report = ProgramReport(
    name,
    seconds,
    argument_bytes=memory.argument_size_in_bytes,
    output_bytes=memory.output_size_in_bytes,
    temp_bytes=memory.temp_size_in_bytes,
    alias_bytes=memory.alias_size_in_bytes,
    code_bytes=memory.generated_code_size_in_bytes,
    host_bytes=(memory.host_argument_size_in_bytes + memory.host_output_size_in_bytes + memory.host_temp_size_in_bytes),
    resident_bytes=resident_bytes,
    xla_flops=_xla_flops(compiled),
    largest_buffers=_largest_buffers(compiled.as_text() or ""),
  )
  return report, compiled


def _abstract_outputs(jitted, args, compiled):
  """What `jitted(*args)` returns, as abstract arrays with the compiled program's output shardings."""
  shapes = jax.eval_shape(jitted, *args)
  if compiled is None:
    return shapes
  return jax.tree.map(
    lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes, compiled.output_shardings
  )


def _phase_runner(program: StepProgram, reports: list[ProgramReport], only: tuple[str, ...] = ()):
  """A `PhasedStep` runner that compiles each phase instead of running it (see `phased.timed`); with `only`, just
  the phases named there (the others are traced for their outputs' shapes, not compiled)."""
  state_bytes = _device_bytes(program.abstract_state)

  def run(name, jitted, *args, resident_state: bool = False):
    """`resident_state`: the whole train state stays on the devices beside `args` (none of it is an argument)."""
    # PRNG keys are split on the host between phases (concrete CPU arrays): give them as target arrays.
    args = jax.tree.map(
      lambda x: (
        jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated(program.mesh)) if isinstance(x, jax.Array) else x
      ),
      args,
    )
    given = args[0]
    state_given = state_bytes if isinstance(given, TrainState) else _device_bytes(given) if given is not None else 0
    state_given = 0 if resident_state else state_given
    if only and name not in only:
      return jax.eval_shape(jitted, *args)
    report, compiled = compile_program(name or "glue", jitted, args, resident_bytes=state_bytes - state_given)
    if name is not None:
      reports.append(report)
    return _abstract_outputs(jitted, args, compiled)

  return run


def compile_step(config, target: Target, *, phases: bool | None = None, only: tuple[str, ...] = ()) -> AotReport:
  """Builds `config`'s step on `target`'s devices, compiles it (fused, or phase by phase) and measures it.
  `only`: compile just these phases (phased; e.g. ("gen",) for generation's memory alone)."""
  devices = target.devices()
  program = build_abstract_program(config, devices)
  config = program.config
  phases = True if only else (not config.trainer.fuse_step) if phases is None else phases
  train_rows = config.data.train_batch_size
  reports: list[ProgramReport] = []
  multi_turn = config.actor_rollout_ref.rollout.multi_turn.enable
  phased = PhasedStep(program.ppo, program.state_shardings, replicated(program.mesh))
  step = step_mode(not phases, generation_mode(config, phased), phased, program.jit_step())
  # The step's key is split on the host between phases: a concrete key, given to each program as a target array.
  runner = _phase_runner(program, reports, only)
  step.abstract(program.abstract_state, abstract_batches(program), jax.random.key(0), runner)
  flops = step_phase_flops(
    program.ppo,
    batch_size=train_rows,
    prompt_len=config.data.max_prompt_length,
    response_len=config.data.max_response_length,
  )
  notes = []
  fsdp_configs = (
    config.actor_rollout_ref.ref.fsdp_config,
    config.actor_rollout_ref.actor.fsdp_config,
    config.critic.model.fsdp_config,
  )
  offload = any(c.get("param_offload") or c.get("optimizer_offload") for c in fsdp_configs)
  if offload and not program.layouts.offloaded:
    notes.append(
      f"offload requested, but {target.platform} targets compiled here expose no host memory: "
      "the offloaded state is counted in device memory (an upper bound)"
    )
  if only:
    missing = sorted(set(only) - {p.name for p in reports})
    if missing:
      raise AotError(f"--only {','.join(only)}: this config's step has no phase {missing}")
    notes.append(f"only {', '.join(only)} compiled: the fit judges those programs, not the whole step")
  num_hosts = len({d.process_index for d in devices})
  return AotReport(
    target,
    num_hosts,
    ("multi-turn, " if multi_turn else "") + ("phased" if phases else "fused"),
    program.layout_report(),
    reports,
    flops,
    _device_bytes(program.abstract_state),
    notes,
  )


# ----- the report -------------------------------------------------------------------------------


def _gib(n: float) -> str:
  return f"{n / 1024**3:.2f}"


def _size(n: float) -> str:
  return fmt_bytes(int(n))


def format_report(report: AotReport) -> str:
  target = report.target
  lines = [
    f"target {target.name}: {target.num_devices} x {target.device_kind} ({_gib(target.memory_bytes)} GiB "
    f"each) on {report.num_hosts} host(s); {report.mode} step",
    report.layout_report,
    "",
    "per-device memory (total = arguments + outputs - aliased + temporaries + code + resident state)",
  ]
  header = (
    "program",
    "compile s",
    "arguments",
    "outputs",
    "temporaries",
    "aliased",
    "code",
    "resident",
    "total",
    "of device",
  )
  rows = []
  for p in report.programs:
    share = f"{100 * p.total_bytes / target.memory_bytes:.0f}%"
    if p.compile_error is not None:
      known = p.compiler_used_bytes is not None
      rows.append(
        (
          p.name,
          f"{p.compile_seconds:.1f}",
          _size(p.argument_bytes) if p.argument_bytes else "-",
          "-",
          _size(p.temp_bytes) if p.temp_bytes else "-",
          "-",
          "-",
          _size(p.resident_bytes),
          _size(p.total_bytes) if known else "over",
          share if known else "over",
        )
      )
      continue
    rows.append(
      (
        p.name,
        f"{p.compile_seconds:.1f}",
        _size(p.argument_bytes),
        _size(p.output_bytes),
        _size(p.temp_bytes),
        _size(p.alias_bytes),
        _size(p.code_bytes),
        _size(p.resident_bytes),
        _size(p.total_bytes),
        share,
      )
    )
  widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
  for r in [header] + rows:
    lines.append("  " + "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
  if any(p.host_bytes for p in report.programs):
    lines.append(
      "  offloaded to host memory: "
      + ", ".join(f"{p.name} {_size(p.host_bytes)}" for p in report.programs if p.host_bytes)
    )
  headroom = target.memory_bytes - report.peak_bytes
  if report.fits:
    lines.append(
      f"fits: yes, peak {_gib(report.peak_bytes)} GiB of {_gib(target.memory_bytes)} GiB per device, "
      f"headroom {_gib(headroom)} GiB ({100 * headroom / target.memory_bytes:.0f}%)"
    )
  else:
    refused = [p for p in report.programs if p.compile_error is not None]
    worst = refused[0] if refused else report.peak_program
    needs = (
      f"{_gib(worst.total_bytes)} GiB"
      if worst.compile_error is None or worst.compiler_used_bytes
      else "more than its memory"
    )
    lines.append(f"fits: NO, {worst.name} needs {needs} per device of {_gib(target.memory_bytes)} GiB")
    if worst.compile_error:
      lines.append("  the compiler refused it:")
      lines.extend("    " + line for line in worst.compile_error.splitlines()[:40])
      lines.append(f"  largest buffers of {worst.name} (whole arrays, before they are split over devices):")
    else:
      lines.append(f"  largest buffers of {worst.name} (per device):")
    lines.extend(f"    {_size(size):>10}  {shape}  {op}" for size, shape, op in worst.largest_buffers)
  total_flops = sum(report.analytic_flops.values())
  lines.append(
    "FLOPs per step (analytic, padded lengths, dense attention; all devices): "
    + ", ".join(f"{k} {v:.3g}" for k, v in report.analytic_flops.items())
    + f"; total {total_flops:.3g}"
  )
  lines.append(
    f"  at the devices' peak ({target.peak_bf16_flops:.3g} bf16 FLOP/s each) that is "
    f"{total_flops / (target.num_devices * target.peak_bf16_flops):.3g} s per step: a lower bound"
  )
  xla = [(p.name, p.xla_flops) for p in report.programs if p.xla_flops is not None]
  if xla:
    lines.append(
      "  XLA's count per device (loop bodies counted once): " + ", ".join(f"{name} {flops:.3g}" for name, flops in xla)
    )
  lines.append(f"compile time: {sum(p.compile_seconds for p in report.programs):.1f} s")
  lines.extend(f"note: {note}" for note in report.notes)
  return "\n".join(lines)


def write_json(report: AotReport, path: str) -> None:
  with open(path, "w") as f:
    json.dump(report.to_json(), f, indent=2)
