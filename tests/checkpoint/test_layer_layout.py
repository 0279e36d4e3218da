"""A checkpoint written before the layer scan (one module per layer, `layers_<i>`) resumes into a model with
scanned layers (stacked `layers/...`), optimizer moments included, on the target's shardings; and back."""

import jax
import numpy as np
import pytest

from jaxrlhf.checkpoint import Checkpointer
from jaxrlhf.models.stacking import layer_layout, stack_layers, unstack_layers
from jaxrlhf.trainer import Trainer
from tests.helpers import small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
MESH = {"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2}


def _equal(a, b):
  jax.tree.map(
    lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), jax.device_get(a), jax.device_get(b)
  )


@pytest.mark.parametrize("saved_scan", [False, True])
def test_checkpoint_resumes_into_the_other_layer_layout(tmp_path, saved_scan):
  layout = lambda scan: {"actor_rollout_ref.model.scan_layers": scan, "critic.model.scan_layers": scan}
  saved = Trainer(small_config(tmp_path, **MESH, **layout(saved_scan)))
  checkpointer = Checkpointer(str(tmp_path / "ckpt"))
  saved.save(checkpointer, 1)
  checkpointer.close()

  checkpointer = Checkpointer(str(tmp_path / "ckpt"))  # a fresh process's view: only what is on disk

  target = Trainer(small_config(tmp_path, **MESH, **layout(not saved_scan)))
  restored, meta = checkpointer.restore(1, target.state)
  checkpointer.close()
  assert meta["step"] == 1
  convert = unstack_layers if saved_scan else stack_layers
  assert layer_layout(restored.actor.params) == ("unstacked" if saved_scan else "stacked")
  _equal(restored.actor.params, convert(saved.state.actor.params))
  _equal(restored.actor.opt_state, convert(saved.state.actor.opt_state))
  _equal(restored.critic.params, convert(saved.state.critic.params))
  shardings = lambda tree: [x.sharding for x in jax.tree.leaves(tree)]
  assert shardings(restored.actor.params) == shardings(target.state.actor.params)
  assert shardings(restored.actor.opt_state) == shardings(target.state.actor.opt_state)
