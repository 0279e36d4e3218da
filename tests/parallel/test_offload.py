"""The actor's, the critic's and the reference's params and the optimizer states in host memory
(memory_kind='pinned_host')."""

import jax
import numpy as np
import pytest

from jaxrlhf.trainer import Trainer
from tests.helpers import small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_offloaded_ref_and_optimizer_live_on_host_and_give_the_same_step(tmp_path):
  mesh = {"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2}
  plain = Trainer(small_config(tmp_path / "plain", **mesh))
  offloaded = Trainer(
    small_config(
      tmp_path / "offload",
      **mesh,
      **{
        "actor_rollout_ref.ref.fsdp_config.param_offload": True,
        "actor_rollout_ref.actor.fsdp_config.param_offload": True,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
        "critic.model.fsdp_config.param_offload": True,
        "critic.model.fsdp_config.optimizer_offload": True,
      },
    )
  )
  kinds = lambda tree: {x.sharding.memory_kind for x in jax.tree.leaves(tree)}
  on_host = lambda: [offloaded.state.ref_params, *(offloaded.state.role(r) for r in ("actor", "critic"))]
  assert all(kinds(tree) == {"pinned_host"} for tree in on_host())
  expected, got = plain.train_step(0), offloaded.train_step(0)
  for key in ("actor/pg_loss", "actor/kl_loss", "critic/vf_loss", "actor/grad_norm"):
    np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, err_msg=key)
  assert all(kinds(tree) == {"pinned_host"} for tree in on_host())  # and they stay there
  for role in ("actor", "critic"):
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
      jax.device_get(plain.state.role(role).params),
      jax.device_get(offloaded.state.role(role).params),
    )
