"""Test set-up: 8 simulated CPU devices (set before JAX starts), one compilation cache for the whole run, and small
shared fixtures."""

import os
import shutil
import tempfile

# Nearly all of a test's time is XLA compiling programs it then runs a few times on tiny shapes: LLVM at -O0 and
# XLA:CPU's loop emitters instead of its fusion emitters compile the small config's fused step in 2.0 s instead of
# 5.0 s (-O1, the default emitters) and run it in 0.08 s instead of 0.03 s. The commands tests start (learning runs
# of hundreds of steps among them) get `tests.helpers.subprocess_env`'s flags instead.
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "")
  + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")
# Most of the suite's time is XLA compiling, and many tests build the same programs (the same small trainer, the
# quickstart run again by train.py, a notebook and a resume). A persistent cache that lives for this run, set in the
# environment so the subprocesses and xdist workers the tests start share it, compiles each program once. Its
# directory is new per run (nothing carries over from another checkout); tests that count programs count its hits.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxrlhf-tests-xla-cache-")
  os.environ["JAXRLHF_TESTS_OWN_CACHE"] = os.environ["JAX_COMPILATION_CACHE_DIR"]
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402  (after XLA_FLAGS on purpose)
import pytest  # noqa: E402

from jaxrlhf.models import DecoderConfig  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_config() -> DecoderConfig:
  return DecoderConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
  )


def pytest_configure(config):
  assert jax.device_count() == 8, "tests expect 8 simulated CPU devices (XLA_FLAGS set too late?)"
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False  # xdist keeps the file order of `pytest_collection_modifyitems` below


def pytest_collection_modifyitems(config, items):
  """Files that hold `slow` tests (runs of minutes) first, most first; then the rest, most tests first.

  `make test`'s workers take whole files (`--dist loadfile`) from one queue. xdist's own order (most tests first)
  put the files of one or two slow tests last, and whichever worker drew the last of them ran on alone for minutes
  while the other had finished; started first, the minutes are shared and the many short files even the end out."""
  slow, tests = {}, {}
  for item in items:
    tests[item.path] = tests.get(item.path, 0) + 1
    slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
  items.sort(key=lambda item: (-slow[item.path], -tests[item.path]))


def pytest_unconfigure(config):
  """The run that made the cache removes it (xdist workers inherit the directory and leave it)."""
  if os.environ.get("JAXRLHF_TESTS_OWN_CACHE") == os.environ["JAX_COMPILATION_CACHE_DIR"] and not hasattr(
    config, "workerinput"
  ):
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
