"""`jaxrlhf.aot`: the trainer's step compiled for NVIDIA and TPU targets on this CPU, its memory and FLOPs.

The compiles run in a subprocess each (the CLI, as a user runs it): a target's compiler needs
`JAX_PLATFORMS=cpu` and libtpu's environment set before JAX starts, and this test process already
runs 8 simulated CPU devices.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from jaxrlhf.aot.targets import TargetError, parse_target
from tests.helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config_text(sizes, lengths, estimator: str, mesh, kl_loss: bool = True, scan_layers: bool = True) -> str:
  """A config file: model (vocab, hidden, mlp, layers, heads, kv heads), (prompts, prompt len, response
  len) with one mini-batch, the advantage estimator and the mesh (data, fsdp, tensor)."""
  return f"""
from jaxrlhf.config import get_base_config

def get_config():
  c = get_base_config()
  o = c.actor_rollout_ref.model.override_config
  (o.vocab_size, o.hidden_size, o.intermediate_size, o.num_hidden_layers, o.num_attention_heads,
   o.num_key_value_heads) = {tuple(sizes)}
  c.data.train_batch_size, c.data.max_prompt_length, c.data.max_response_length = {tuple(lengths)}
  c.actor_rollout_ref.actor.ppo_mini_batch_size = {lengths[0]}
  c.actor_rollout_ref.actor.use_kl_loss = {kl_loss}
  c.algorithm.adv_estimator = {estimator!r}
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = {tuple(mesh)}
  c.actor_rollout_ref.model.scan_layers = c.critic.model.scan_layers = {scan_layers}
  return c
"""


# A model whose state dominates the step's memory: 8 layers of width 512, vocabulary 8192, 8 prompts
# of 8 + 8 tokens; GRPO with a KL loss (actor, Adam moments, reference; no critic), split 8 ways.
STATE_HEAVY = config_text((8192, 512, 2048, 8, 8, 8), (8, 8, 8), "grpo", (1, 1, 8))
# Matmul-bound and loop-free where it can be: one epoch, one mini-batch, one micro-batch, so every
# update loop has one iteration and XLA's FLOP count (which counts a loop body once) sees all the work;
# for the same reason the layers are a Python loop, not a scan.
FLOPS_PROBE = config_text((512, 256, 1024, 2, 4, 2), (4, 32, 32), "gae", (1, 1, 1), scan_layers=False)
# 512 prompts x 4096 response tokens x a 65536-token vocabulary: its fp32 logits (64 rows per device: 64 GiB
# per logits buffer) fit on no device unless the LM head runs in chunks (`logits_chunk_size`, on by default).
TOO_BIG = config_text((65536, 64, 128, 1, 2, 2), (512, 16, 4096), "grpo", (1, -1, 1), kl_loss=False)


def run_aot(tmp_path, config_text: str, *args):
  config_path = tmp_path / "config.py"
  config_path.write_text(textwrap.dedent(config_text))
  json_path = tmp_path / "report.json"
  env = subprocess_env(optimize=True)  # the target's devices, not 8 CPUs; its compiler's passes as a user's run
  result = subprocess.run(
    [sys.executable, "-m", "jaxrlhf.aot", "--config", str(config_path), "--json", str(json_path), *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  report = json.loads(json_path.read_text()) if json_path.exists() else None
  return result, report


def test_target_names():
  assert parse_target("h100x8").topology == "1x1x8"
  assert parse_target("h200:8x8").num_devices == 64
  assert parse_target("v5e-8").topology == "v5e:2x4"
  assert parse_target("v5e-256").topology == "v5e:16x16"
  assert parse_target("v5p-64").topology == "v5p:2x4x4"  # 64 TensorCores = 32 chips
  assert parse_target("v4-8").num_devices == 4
  with pytest.raises(TargetError, match="h100x8"):
    parse_target("a100x8")
  with pytest.raises(TargetError, match="two per chip"):
    parse_target("v5p-7")


def _hand_count(report) -> int:
  """Per device: actor params, Adam's two moments and the reference (the train state, split 8 ways over
  tensor), plus the update's two gradient buffers (the accumulated and the micro-batch's)."""
  params = (8192 * 512 * 2 + 8 * (4 * 512 * 512 + 3 * 512 * 2048)) * 4 // 8  # split over tensor=8
  norms = (8 * 2 + 1) * 512 * 4  # RMSNorm weights: replicated
  state = 4 * (params + norms) + 8  # params, mu, nu, reference; Adam's step count
  assert abs(report["state_bytes_per_device"] - state) / state < 0.01
  return state + 2 * (params + norms)


@pytest.mark.parametrize("target", ["h100x8", "v5e-8"])
def test_compiles_for_target_and_memory_matches_hand_count(tmp_path, target):
  result, report = run_aot(tmp_path, STATE_HEAVY, "--target", target)
  assert result.returncode == 0, result.stdout + result.stderr
  assert report["target"]["devices"] == 8 and report["fits"]
  (step,) = report["programs"]
  assert step["name"] == "step" and step["compile_seconds"] > 0
  # The donated state comes back in place: arguments = the state, aliased = nearly all of the outputs.
  assert abs(step["argument_bytes"] - report["state_bytes_per_device"]) < 0.01 * step["argument_bytes"]
  assert step["alias_bytes"] > 0.95 * report["state_bytes_per_device"]
  # At most the hand count (state + two gradient buffers); with the layers as a scan XLA needs fewer.
  hand = _hand_count(report)
  assert report["state_bytes_per_device"] <= step["total_bytes"] < 1.10 * hand, (step, hand)
  assert "fits: yes" in result.stdout and "mesh {'data': 1, 'fsdp': 1, 'tensor': 8}" in result.stdout


def test_phases_report_every_phase_and_flops_match_xla(tmp_path):
  result, report = run_aot(tmp_path, FLOPS_PROBE, "--target", "h100x1", "--phases")
  assert result.returncode == 0, result.stdout + result.stderr
  programs = {p["name"]: p for p in report["programs"]}
  # One mini-batch: the update's first epoch gives the old log-probs, so there is no old_log_prob program
  # (the ref program is the same forward).
  assert list(programs) == ["gen", "reward", "ref", "values", "adv", "update_critic", "update_actor"]
  assert report["mode"] == "phased"
  analytic = report["analytic_flops"]
  assert "old_log_prob" not in analytic
  for phase in ("ref", "values", "update_critic", "update_actor"):
    xla = programs[phase]["xla_flops"]
    assert abs(xla - analytic[phase]) / analytic[phase] < 0.05, (phase, xla, analytic[phase])
  # The decode loop's body is in XLA's count once: prefill + one decode step.
  from jaxrlhf.models import DecoderConfig
  from jaxrlhf.rollout.batch import cache_length
  from jaxrlhf.trainer.flops import generation_flops

  model = DecoderConfig(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
  )
  one_step = generation_flops(model, 4, 32, [(1, cache_length(32, 32, 32))])
  assert abs(programs["gen"]["xla_flops"] - one_step) / one_step < 0.05
  every_step = generation_flops(model, 4, 32, [(32, cache_length(32, 32, 32))])
  assert analytic["gen"] == pytest.approx(every_step)  # the analytic count runs all 32 decode steps
  assert analytic["gen"] > 2.5 * one_step


@pytest.mark.parametrize("target", ["h100x8", "v5e-8"])  # GPU: compiles, over memory; TPU: refused
def test_config_that_cannot_fit_exits_1_naming_the_largest_buffer(tmp_path, target):
  result, report = run_aot(
    tmp_path, TOO_BIG, "--target", target, "--config.actor_rollout_ref.model.logits_chunk_size=0"
  )
  assert result.returncode == 1, result.stdout + result.stderr
  assert not report["fits"] and report["peak_bytes_per_device"] > report["target"]["device_memory_bytes"]
  assert "fits: NO" in result.stdout and "largest buffers" in result.stdout
  (step,) = report["programs"]
  size, shape = step["largest_buffers"][0]["bytes"], step["largest_buffers"][0]["shape"]
  assert size > 4 * 1024**3 and "65536" in shape, step["largest_buffers"][:3]  # the logits
  assert shape in result.stdout


def test_chunked_lm_head_makes_the_same_config_fit(tmp_path):
  result, report = run_aot(tmp_path, TOO_BIG, "--target", "h100x8")
  assert result.returncode == 0, result.stdout + result.stderr
  assert report["fits"] and report["peak_bytes_per_device"] < 16 * 1024**3
  (step,) = report["programs"]
  logits = [b for b in step["largest_buffers"] if "65536" in b["shape"]]  # vocabulary-sized buffers
  assert all(b["bytes"] < 1024**3 for b in logits), logits[:3]


def test_model_path_without_config_json_names_the_key(tmp_path):
  result, _ = run_aot(tmp_path, STATE_HEAVY, "--target", "h100x8", f"--config.actor_rollout_ref.model.path={tmp_path}")
  assert result.returncode != 0
  assert "actor_rollout_ref.model.path" in result.stderr and "config.json" in result.stderr
  assert "Traceback" not in result.stderr


def test_dynamic_sampling_compiles_generation_and_training_apart(tmp_path):
  """DAPO's rounds leave the program between reward and training: gen + reward, then the rest in one."""
  config = (
    'from jaxrlhf.config import load_config_file\n\ndef get_config():\n'
    f'  return load_config_file({os.path.join(ROOT, "configs", "quickstart_dapo.py")!r})\n'
  )
  result, report = run_aot(tmp_path, config, "--target", "v5e-8")
  assert result.returncode == 0, result.stdout + result.stderr
  assert [p["name"] for p in report["programs"]] == ["gen", "reward", "train"]
  assert report["programs"][2]["resident_bytes"] == 0  # it is given the whole train state


def test_only_compiles_the_named_phase_and_refuses_a_phase_the_step_lacks(tmp_path):
  """`--only gen`: generation's program alone (the rest traced for shapes), for its memory at a new length."""
  result, report = run_aot(tmp_path, FLOPS_PROBE, "--target", "h100x1", "--only", "gen")
  assert result.returncode == 0, result.stdout + result.stderr
  assert [p["name"] for p in report["programs"]] == ["gen"]
  assert "only gen compiled" in result.stdout
  result, _ = run_aot(tmp_path, FLOPS_PROBE, "--target", "h100x1", "--only", "generate")
  assert result.returncode != 0 and "Traceback" not in result.stderr
  assert "--only generate" in result.stderr and "'generate'" in result.stderr
