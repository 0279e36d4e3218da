"""verl's rollout-vs-training gap metrics (`training/rollout_probs_diff_*`, `training/rollout_actor_probs_pearson_corr`)
against verl 0.9.1's own `calculate_debug_metrics`, and in the step whichever phase gives the old log-probs."""

import importlib.machinery
import importlib.util
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.trainer.batch_metrics import rollout_probs_diff

torch = pytest.importorskip("torch")


def _verl_metrics():
  """verl's module, loaded by path: its package's __init__ imports ray, and its one verl import (DataProto) is a type
  annotation there, so a stand-in module answers it."""
  # The path finder, not find_spec: another test may have left a stand-in `verl` (no __spec__) in sys.modules.
  spec = importlib.machinery.PathFinder.find_spec("verl")
  if spec is None:
    pytest.skip("verl 0.9.1 is not installed (make test installs it)")
  path = spec.submodule_search_locations[0] + "/utils/debug/metrics.py"
  saved = {name: sys.modules.get(name) for name in ("verl", "verl.protocol")}
  sys.modules["verl"], sys.modules["verl.protocol"] = types.ModuleType("verl"), types.ModuleType("verl.protocol")
  sys.modules["verl.protocol"].DataProto = object
  try:
    module_spec = importlib.util.spec_from_file_location("verl_debug_metrics", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
  finally:
    for name, value in saved.items():
      if value is None:
        sys.modules.pop(name, None)
      else:
        sys.modules[name] = value
  return module.calculate_debug_metrics


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_verls_calculate_debug_metrics(seed):
  rng = np.random.RandomState(seed)
  actor = np.log(rng.uniform(0.01, 1, (6, 9))).astype(np.float32)
  rollout = np.minimum(actor + rng.normal(0, 0.05, actor.shape), 0).astype(np.float32)
  mask = (rng.uniform(size=actor.shape) > 0.3).astype(np.int64)
  batch = {
    "rollout_log_probs": torch.tensor(rollout),
    "old_log_probs": torch.tensor(actor),
    "response_mask": torch.tensor(mask),
    "responses": torch.tensor(mask),
  }
  want = _verl_metrics()(types.SimpleNamespace(batch=batch))
  got = rollout_probs_diff(jnp.asarray(rollout), jnp.asarray(actor), jnp.asarray(mask))
  assert set(got) == set(want)
  for key, value in want.items():
    np.testing.assert_allclose(float(got[key]), value, rtol=1e-5, atol=1e-7, err_msg=key)


def test_no_sampled_token_is_invalid_not_an_error():
  zeros = jnp.zeros((2, 3))
  got = rollout_probs_diff(zeros, zeros, zeros)
  assert float(got["training/rollout_probs_diff_valid"]) == 0.0
  assert np.isnan(float(got["training/rollout_probs_diff_mean"]))
