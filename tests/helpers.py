"""Shared test helpers: a small config derived from the quickstart, the metrics that depend on time, a free port,
a count of the XLA programs built."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax.monitoring

from jaxrlhf.config import load_config_file
from jaxrlhf.trainer.preemption import EXIT_PREEMPTED

# Metrics measured with a clock: they differ between any two runs, whatever the numerics.
TIMING_DEPENDENT = ("timing_s/", "timing_per_token_ms/", "perf/time", "perf/throughput", "perf/mfu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_QUICKSTART = os.path.join(ROOT, "configs", "quickstart.py")
VAL_KEY = "val-core/jaxrlhf/recall/reward/mean@1"  # the built-in recall task's greedy validation reward


def tiny_fp32_model():
  """The rollout tests' model: conftest's tiny config computed in fp32, so that code paths compare exactly."""
  from jaxrlhf.models import DecoderConfig

  return DecoderConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=10000.0,
    dtype="float32",
    param_dtype="float32",
  )


def small_config(tmp_path, **overrides):
  config = load_config_file(_QUICKSTART)
  config.data.train_batch_size = 8
  config.data.val_batch_size = 16
  config.data.max_response_length = 3
  config.data.train_max_samples = 512  # of the recall task's 19,744: a tokenizer pass of 0.02 s, not 0.75 s
  config.actor_rollout_ref.actor.ppo_mini_batch_size = 4
  config.actor_rollout_ref.rollout.n = 2
  oc = config.actor_rollout_ref.model.override_config
  # 16 query / 8 kv heads: every mesh axis of 8 devices divides heads, kv heads, mlp and vocab.
  oc.hidden_size, oc.intermediate_size, oc.num_attention_heads, oc.num_key_value_heads = 64, 64, 16, 8
  config.trainer.default_local_dir = str(tmp_path)
  config.trainer.total_training_steps = 2
  config.trainer.logger = ("jsonl",)
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def subprocess_env(devices: int | None = None, optimize: bool = False, **extra: str) -> dict:
  """The environment for a command a test starts (train.py, a CLI, a worker): this one's, less the suite's 8 CPU
  devices (one, as a user's run has, or `devices`), with LLVM at -O1, not the suite's -O0 (commands run hundreds of
  steps of bigger models: -O1 compiles a third faster than the default -O2 and runs the quickstart's step as fast,
  where -O0 runs it 2.5x slower; the commands' compiles share the suite's cache with each other). `optimize=True`
  drops -O1 too (the command compiles as a user's does), `extra` sets more variables (XLA_FLAGS among them: then
  exactly those flags). The suite's instruction-set limit (`XLA_FLAGS=--xla_cpu_max_isa=SSE4_2 make test`,
  docs/contributing.md) reaches the commands too."""
  isa = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if flag.startswith("--xla_cpu_max_isa")]
  flags = isa + ([] if optimize else ["--xla_backend_optimization_level=1"])
  if devices is not None:
    flags.append(f"--xla_force_host_platform_device_count={devices}")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  if flags:
    env["XLA_FLAGS"] = " ".join(flags)
  env.update(extra)
  return env


def free_port() -> int:
  """A TCP port on localhost nobody listens on (for a jax.distributed coordinator)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


# A program is built by compiling it or by loading it from the persistent compilation cache (conftest turns the
# cache on); a test that proves nothing was built counts both.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


@contextlib.contextmanager
def programs_built():
  """Yields a list that gets one entry per XLA program compiled or loaded from the compilation cache inside."""
  events = []
  compiled = lambda event, *args, **kwargs: events.append(event) if event == BACKEND_COMPILE_EVENT else None
  loaded = lambda event, **kwargs: events.append(event) if event == CACHE_HIT_EVENT else None
  jax.monitoring.register_event_duration_secs_listener(compiled)
  jax.monitoring.register_event_listener(loaded)
  try:
    yield events
  finally:
    jax.monitoring.unregister_event_duration_listener(compiled)
    jax.monitoring.unregister_event_listener(loaded)


def rollout_of(prompts, prompt_mask, responses, response_mask, **fields):
  """A `Rollout` record of these sequences (numpy or jax arrays); what a test does not set is zeros of its
  shape (the sampler's log-probs), the row number (sample and group indices), or the response width."""
  import numpy as np

  from jaxrlhf.trainer.records import Rollout

  n, width = np.shape(responses)
  defaults = {
    "rollout_log_probs": np.zeros((n, width), np.float32),
    "sample_index": np.arange(n, dtype=np.int32),
    "group_index": np.arange(n, dtype=np.int32),
    "decode_steps": np.int32(width),
  }
  return Rollout(
    prompts=prompts, prompt_mask=prompt_mask, responses=responses, response_mask=response_mask, **{**defaults, **fields}
  )


def scored_of(scores, **fields):
  """A `Scored` record of sequence scores (numpy); no errors, no null ground truths, each score on the last token
  of a one-token response unless `token_level_scores` is given."""
  import numpy as np

  from jaxrlhf.trainer.records import Scored

  scores = np.asarray(scores, np.float32)
  zeros = np.zeros(scores.shape, np.float32)
  defaults = {"reward_errors": zeros, "null_ground_truths": zeros, "token_level_scores": scores[:, None]}
  return Scored(scores=scores, **{**defaults, **fields})


STOP_CHECK_FREQ = 5  # steps between the validations (greedy passes) of a learning run that stops once it has learned


def run_train(config_file: str, *args, stop_when=None, val_key=VAL_KEY, timeout=900) -> subprocess.CompletedProcess:
  """`python train.py --config config_file *args` as a user runs it (one CPU device, `subprocess_env`).

  `stop_when(validation rewards so far) -> bool` (`val_key`, VAL_KEY unless given, read from the run's metrics.jsonl
  as it grows): a SIGTERM as soon as it holds, and the trainer stops at the step boundary (exit status 143). A
  learning test stops once it has shown what it checks instead of running the config's last steps. Such a run
  validates every STOP_CHECK_FREQ steps (unless `args` set trainer.test_freq), not the configs' 20-25, so it stops
  within a few steps of learning (the Qwen3.5 quickstart crossed 0.95 between its validations at steps 50 and 75)."""
  env = subprocess_env()
  if stop_when is not None and not any(arg.startswith("--config.trainer.test_freq=") for arg in args):
    args = (*args, f"--config.trainer.test_freq={STOP_CHECK_FREQ}")
  command = [sys.executable, "train.py", "--config", config_file, *args]
  run_root = next(arg.split("=", 1)[1] for arg in args if arg.startswith("--config.trainer.default_local_dir="))
  with open(os.path.join(run_root, "stdout"), "w+") as out, open(os.path.join(run_root, "stderr"), "w+") as err:
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
    stopped, deadline = False, time.monotonic() + timeout
    while process.poll() is None:
      if time.monotonic() > deadline:
        process.kill()
        raise AssertionError(f"{command} ran over {timeout} s")
      if stop_when is not None and not stopped and stop_when(_validation_rewards(run_root, val_key)):
        process.send_signal(signal.SIGTERM)
        stopped = True
      time.sleep(1.0)
    out.seek(0), err.seek(0)
    result = subprocess.CompletedProcess(command, process.returncode, out.read(), err.read())
  assert result.returncode == (EXIT_PREEMPTED if stopped else 0), result.stderr[-3000:]
  return result


def _validation_rewards(run_root, val_key) -> list[float]:
  """The validation rewards (`val_key`) a run under `run_root` has logged so far (its metrics.jsonl's complete
  lines)."""
  for directory, _, files in os.walk(run_root):
    if "metrics.jsonl" in files:
      with open(os.path.join(directory, "metrics.jsonl")) as f:
        lines = [line for line in f.read().split("\n")[:-1] if line]
      return [record[val_key] for record in map(json.loads, lines) if val_key in record]
  return []
