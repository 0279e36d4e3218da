"""A mixture-of-experts actor in the PPO step (issue 47): the load-balancing loss joins the actor's loss with HF's
switch (`output_router_logits`), its metrics are logged, and the step gives one device's numbers on a (1, 4, 2) mesh
(experts split as `parallel/layouts.py` says), in fp32."""

import jax
import numpy as np
import pytest

from jaxrlhf.trainer import Trainer
from tests.helpers import TIMING_DEPENDENT, small_config

MOE = {
  "actor_rollout_ref.model.override_config.model_type": "qwen3_moe",
  "actor_rollout_ref.model.override_config.head_dim": 16,
  "actor_rollout_ref.model.override_config.num_experts": 8,
  "actor_rollout_ref.model.override_config.num_experts_per_tok": 2,
  "actor_rollout_ref.model.override_config.moe_intermediate_size": 32,
  "actor_rollout_ref.model.override_config.norm_topk_prob": True,
  "actor_rollout_ref.model.override_config.output_router_logits": True,
  "actor_rollout_ref.model.override_config.router_aux_loss_coef": 0.01,
}


def _run(tmp_path, mesh, **overrides):  # lr 1e-3, the quickstart's
  data, fsdp, tensor = mesh
  config = small_config(tmp_path, **{**MOE, "mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor, **overrides})
  trainer = Trainer(config, devices=jax.devices()[: data * fsdp * tensor])
  metrics = trainer.train_step(0)
  return trainer, metrics, jax.device_get(trainer.state.actor.params)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
  return _run(tmp_path_factory.mktemp("one"), (1, 1, 1))


def test_the_load_balancing_loss_and_expert_load_are_logged(one_device):
  trainer, metrics, params = one_device
  config = trainer.model_config
  assert config.model_type == "qwen3_moe" and config.num_experts == 8 and config.router_aux_loss_coef == 0.01
  assert params["layers"]["mlp"]["experts"]["gate_proj"]["kernel"].shape[1:] == (8, 64, 32)
  # E * sum_e f_e P_e: 2 (top-k) when routing is uniform, more when it is not
  assert 1.9 < metrics["actor/moe_aux_loss"] < 8 * 2
  assert 1.0 <= metrics["actor/moe_expert_load_max"] <= 8.0
  # the critic (a dense copy of the actor's config) has experts too: its value head reads the same backbone
  assert trainer.critic_model_config.num_experts == 8


def test_the_packed_update_compiles_and_runs_with_experts(tmp_path, one_device):
  """use_remove_padding: the update chooses packed slots or padded micro-batches at run time (`lax.cond`), so both are
  compiled; the packed branch merges per-token outputs slot by slot, which the load-balancing statistics (per layer,
  not per token) must stay out of (they once broke its compile). Here the padded branch runs (uniform lengths: packing
  does not pay), with the padded step's numbers."""
  _, padded, _ = one_device
  _, packed, _ = _run(tmp_path, (1, 1, 1), **{"actor_rollout_ref.model.use_remove_padding": True})
  assert packed["perf/packed/actor"] == 0
  for key in ("actor/moe_aux_loss", "actor/moe_expert_load_max", "actor/pg_loss", "actor/entropy"):
    np.testing.assert_allclose(packed[key], padded[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.slow
def test_same_numbers_on_a_mesh_as_on_one_device(tmp_path, one_device):
  _, ref_metrics, ref_actor = one_device
  _, metrics, actor = _run(tmp_path, (1, 4, 2))
  for key, value in ref_metrics.items():
    if not key.startswith(TIMING_DEPENDENT):
      np.testing.assert_allclose(metrics[key], value, rtol=1e-5, atol=1e-5, err_msg=key)
  # Adam moves every element by up to ~lr whatever its gradient's size: an element whose gradient is near zero turns
  # fp32 rounding into a visible step (tests/trainer/test_ppo_step.py). Here 2 of 32,768 expert weights moved 0.04 lr.
  lr = 1e-3
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=0.1 * lr), ref_actor, actor)


REPLAY = {"actor_rollout_ref.rollout.enable_rollout_routing_replay": True}


def test_routing_replay_in_fp32_changes_no_number_before_the_first_update(tmp_path, one_device):
  """Rollout routing replay (verl's R3): the sampler records each token's experts and the actor's old-log-prob and
  update forwards route by them. In fp32 the sampler routes every token as the training forward would, so what the
  step computes before its first update (rollout, old log-probs and their gap to the sampler's, values, rewards) is the
  plain step's. The update's later mini-batches and epochs replay the rollout's routes on updated weights: there the
  two differ."""
  _, plain, _ = one_device
  _, replayed, _ = _run(tmp_path, (1, 1, 1), **REPLAY)
  before_update = ("training/", "critic/score", "critic/rewards", "response_length/", "prompt_length/")
  compared = [key for key in plain if key == "actor/entropy" or key.startswith(before_update)]
  assert len(compared) > 10
  for key in compared:
    np.testing.assert_allclose(replayed[key], plain[key], rtol=1e-6, atol=1e-7, err_msg=key)
  # after an Adam step at lr 1e-3 the update's router would route many pairs elsewhere
  assert 0 < replayed["actor/moe_replay_route_mismatch"] < 1


def test_routing_replay_with_slots_and_packed_rows(tmp_path):
  """The slots' rollout saves each row's routes as it leaves its slot; packed update rows carry their tokens' routes.
  One mini-batch, one epoch: the update runs on the rollout's weights, where fp32 replays every (token, layer) pair's
  own routing (0 mismatches)."""
  _, metrics, _ = _run(
    tmp_path,
    (1, 1, 1),
    **REPLAY,
    **{
      "actor_rollout_ref.rollout.max_num_seqs": 3,
      "actor_rollout_ref.model.use_remove_padding": True,
      "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
      "actor_rollout_ref.actor.ppo_epochs": 1,
    },
  )
  assert metrics["actor/moe_replay_route_mismatch"] == 0
  assert metrics["training/rollout_probs_diff_max"] < 1e-4


def test_routing_replay_needs_experts_and_a_single_turn_rollout(tmp_path):
  from jaxrlhf.config import ConfigError

  config = small_config(tmp_path, **REPLAY)
  with pytest.raises(ConfigError, match="enable_rollout_routing_replay=True needs a model with experts"):
    Trainer(config, devices=jax.devices()[:1])


@pytest.mark.slow
def test_routing_replay_on_a_mesh_with_slots(tmp_path):
  """On a (1, 4, 2) mesh the slots run per generation shard in a shard_map (`StepLayouts.generation_shards`): each
  shard saves its own rows' routes, which reach the update in the train layout."""
  _, metrics, _ = _run(
    tmp_path,
    (1, 4, 2),
    **REPLAY,
    **{
      "actor_rollout_ref.rollout.max_num_seqs": 1,
      "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
      "actor_rollout_ref.actor.ppo_epochs": 1,
    },
  )
  assert metrics["actor/moe_replay_route_mismatch"] == 0
  assert metrics["training/rollout_probs_diff_max"] < 1e-4
