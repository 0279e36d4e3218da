"""Shared test helpers: a small config derived from the quickstart, the metrics that depend on time, a free port,
a count of the XLA programs built."""

import contextlib
import os
import socket

import jax.monitoring

from jaxrlhf.config import load_config_file

# Metrics measured with a clock: they differ between any two runs, whatever the numerics.
TIMING_DEPENDENT = ("timing_s/", "timing_per_token_ms/", "perf/time", "perf/throughput", "perf/mfu")

_QUICKSTART = os.path.join(os.path.dirname(__file__), "..", "configs", "quickstart.py")


def small_config(tmp_path, **overrides):
  config = load_config_file(_QUICKSTART)
  config.data.train_batch_size = 8
  config.data.val_batch_size = 16
  config.data.max_response_length = 3
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
