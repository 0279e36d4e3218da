"""The fused PPO step: compiles once, same numbers on every mesh, ratio exactly 1 at the first update."""

import dataclasses
import re

import jax
import numpy as np
import pytest

from jaxrlhf.trainer import Trainer
from tests.helpers import TIMING_DEPENDENT, programs_built, small_config


@pytest.fixture(scope="module")
def one_device_run(tmp_path_factory):
  """The small config's trainer on one device after its first step: (trainer, metrics, actor params, critic
  params), the params copied to the host. Several tests read this one compile of the fused step (a step with a
  host callback, the rule reward, is never kept in the persistent compilation cache)."""
  trainer = Trainer(small_config(tmp_path_factory.mktemp("one"), **{"mesh.fsdp": 1}), devices=jax.devices()[:1])
  metrics = trainer.train_step(0)
  return trainer, metrics, jax.device_get(trainer.state.actor.params), jax.device_get(trainer.state.critic.params)


def test_step_compiles_once(one_device_run):
  trainer, first, _, _ = one_device_run
  with programs_built() as events:
    second = trainer.train_step(1)  # a different batch of prompts
  assert events == [], f"the second PPO step compiled {len(events)} program(s)"
  assert first["training/global_step"] == 1 and second["training/global_step"] == 2
  assert int(trainer.state.step) == 2


SPEC_METRIC_PREFIXES = (
  "actor/",
  "critic/",
  "response_length/",
  "prompt_length/",
  "timing_s/",
  "perf/",
  "reward/",
  "training/",
  "val-core/",
  "val/",
)


def test_metrics_follow_spec_names(one_device_run):
  metrics = one_device_run[1]
  for key in (
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/kl_loss",
    "actor/kl_coef",
    "actor/grad_norm",
    "actor/lr",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/grad_norm",
    "critic/lr",
    "critic/score/mean",
    "critic/rewards/mean",
    "critic/advantages/max",
    "critic/returns/min",
    "critic/values/mean",
    "critic/vf_explained_var",
    "response_length/mean",
    "response_length/clip_ratio",
    "prompt_length/mean",
    "prompt_length/clip_ratio",
    "timing_s/step",
    "perf/total_num_tokens",
    "perf/time_per_step",
    "perf/throughput",
    "perf/mfu/step",
    "training/global_step",
    "training/epoch",
    "training/rollout_probs_diff_valid",
    "training/rollout_probs_diff_mean",
    "training/rollout_actor_probs_pearson_corr",
  ):
    assert key in metrics, key
    assert np.isfinite(metrics[key]), key
  assert all(k.startswith(SPEC_METRIC_PREFIXES) for k in metrics)


def _without_old_in_update(trainer):
  """The same trainer, made to run the old-log-prob forward (before its step is first traced)."""
  trainer.ppo.plan = dataclasses.replace(trainer.ppo.plan, old_in_update=False)
  trainer.ppo.first_epoch_actor_loss = None
  return trainer


# Phased on one device, fused on a mesh: each mode and each layout once (phased on a mesh compiled eight programs
# for 8 devices, twice the time of the rest of this file's pairs).
@pytest.mark.parametrize("fused,mesh", [(False, None), (True, (2, 2, 2))])
def test_old_log_probs_from_the_first_epoch_equal_the_old_forward(tmp_path, fused, mesh):
  # One mini-batch per epoch, nothing before the update reading old log-probs: the update's first epoch
  # gives them. Same numbers, in fp32, as the old-log-prob forward, with the KL loss and the critic on
  # (on a mesh, against one device).
  overrides = {
    "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    "actor_rollout_ref.actor.ppo_epochs": 2,
    "actor_rollout_ref.actor.shuffle": True,
    "trainer.fuse_step": fused,
    "mesh.fsdp": 1,
  }
  mesh_overrides = {} if mesh is None else dict(zip(("mesh.data", "mesh.fsdp", "mesh.tensor"), mesh))
  reused = Trainer(
    small_config(tmp_path / "reused", **{**overrides, **mesh_overrides}),
    devices=jax.devices()[:1] if mesh is None else None,
  )
  assert reused.ppo.plan.old_in_update
  tolerance = dict(rtol=1e-5, atol=1e-6) if mesh is None else dict(rtol=1e-4, atol=1e-5)
  forward = _without_old_in_update(Trainer(small_config(tmp_path / "forward", **overrides), devices=jax.devices()[:1]))
  for step in range(2):
    a, b = reused.train_step(step), forward.train_step(step)
    assert a.keys() - {"timing_s/old_log_prob", "timing_per_token_ms/old_log_prob"} == b.keys() - {
      "timing_s/old_log_prob",
      "timing_per_token_ms/old_log_prob",
    }
    assert "timing_s/old_log_prob" not in a and ("timing_s/old_log_prob" in b) == (not fused)
    for key, value in b.items():
      if not key.startswith(TIMING_DEPENDENT):
        np.testing.assert_allclose(a[key], value, **tolerance, err_msg=f"step {step} {key}")
  close = lambda x, y: np.testing.assert_allclose(x, y, **tolerance)
  jax.tree.map(close, jax.device_get(reused.state.actor.opt_state), jax.device_get(forward.state.actor.opt_state))
  # Adam moves every element by up to ~lr whatever its gradient's size, so an element whose gradient is near zero
  # turns fp32 rounding into a visible step: parameters agree to a small fraction of one step (lr). On the mesh one
  # element of 8,192 moved 0.053 lr on this 2-core machine at 4d28606 already (the reduction order of 8 devices).
  lr = reused.config.actor_rollout_ref.actor.optim.lr
  step_fraction = lambda x, y: np.testing.assert_allclose(x, y, rtol=0, atol=(0.01 if mesh is None else 0.1) * lr)
  jax.tree.map(step_fraction, jax.device_get(reused.state.actor.params), jax.device_get(forward.state.actor.params))


@pytest.mark.parametrize(
  "overrides",
  [
    {"actor_rollout_ref.actor.ppo_mini_batch_size": 4},  # two mini-batches: the second is off-policy
    {"algorithm.use_kl_in_reward": True},  # the KL penalty reads the old log-probs before the update
    {"actor_rollout_ref.model.use_remove_padding": True},  # packed slots
    {"trainer.critic_warmup": 2},  # steps without an actor update still log its entropy
  ],
)
def test_the_old_log_prob_forward_stays_where_the_update_cannot_give_them(tmp_path, overrides):
  config = small_config(tmp_path, **{"actor_rollout_ref.actor.ppo_mini_batch_size": 8, **overrides})
  assert not Trainer(config, devices=jax.devices()[:1]).ppo.plan.old_in_update


# Every axis at once (2x2x2, generation data-parallel), the tensor axis alone at full width (8 kv heads over 8), and
# a training layout resharded to a wider generation TP (1x2x4 -> TP 8). Each mesh compiles the whole step for 8
# devices (about a minute and a half here), so single-axis meshes the first one covers are left out.
@pytest.mark.parametrize("mesh,generation_tp", [((2, 2, 2), 1), ((1, 1, 8), 1), ((1, 2, 4), 8)])
def test_same_numbers_on_every_mesh(tmp_path, one_device_run, mesh, generation_tp):
  _, ref_metrics, ref_actor, ref_critic = one_device_run
  data, fsdp, tensor = mesh
  sharded = Trainer(
    small_config(
      tmp_path,
      **{
        "mesh.data": data,
        "mesh.fsdp": fsdp,
        "mesh.tensor": tensor,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": generation_tp,
      },
    )
  )
  assert sharded.mesh.size == 8
  metrics = sharded.train_step(0)
  for key, value in ref_metrics.items():
    if key.startswith(TIMING_DEPENDENT):
      continue
    np.testing.assert_allclose(metrics[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  jax.tree.map(close, ref_actor, jax.device_get(sharded.state.actor.params))
  jax.tree.map(close, ref_critic, jax.device_get(sharded.state.critic.params))


def test_bf16_rollout_of_an_fp32_actor_and_a_first_update_with_ratio_one(tmp_path):
  """rollout.dtype=bfloat16: generation runs bf16 matmuls on a cast copy; training stays fp32. One mini-batch, one
  epoch: the only update is at the old policy, a ratio of exactly 1 (the old log-probs are the fp32 actor's, not
  the bf16 sampler's), whatever the rollout's dtype."""
  overrides = {
    "actor_rollout_ref.rollout.dtype": "bfloat16",
    "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    "actor_rollout_ref.actor.ppo_epochs": 1,
  }
  trainer = Trainer(small_config(tmp_path, **overrides), devices=jax.devices()[:1])
  assert trainer.ppo.generation.rollout_actor.config.dtype == "bfloat16" and trainer.model_config.dtype == "float32"
  metrics = trainer.train_step(0)
  assert all(np.isfinite(v) for v in metrics.values())
  assert metrics["actor/ppo_kl"] == 0.0
  assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/pg_clipfrac_lower"] == 0.0
  assert all(x.dtype == jax.numpy.float32 for x in jax.tree.leaves(trainer.state.actor.params))
  batch = trainer._load_batch(trainer.train_data, trainer.schedule.indices(1))
  hlo = trainer.jitted_step.lower(trainer.state, batch, jax.random.key(0)).as_text()
  bf16_dots = re.findall(r"dot_general.*\(tensor<[^>]*bf16>, tensor<[^>]*bf16>\) -> tensor<[^>]*f32>", hlo)
  assert bf16_dots, "no bf16 x bf16 -> fp32 matmul in the step"


@pytest.fixture(scope="module")
def full_kl_runs(tmp_path_factory):
  """One step with the exact KL over the vocabulary in the reward and in the loss, the reference
  perturbed away from the actor, fused and phased."""
  runs = {}
  for fuse in (True, False):
    trainer = Trainer(
      small_config(
        tmp_path_factory.mktemp(f"full_kl_{fuse}"),
        **{
          "trainer.fuse_step": fuse,
          "algorithm.use_kl_in_reward": True,
          "algorithm.kl_penalty": "full",
          "actor_rollout_ref.actor.use_kl_loss": True,
          "actor_rollout_ref.actor.kl_loss_type": "full",
        },
      ),
      devices=jax.devices()[:1],
    )
    assert trainer.ppo.plan.full_kl_in_reward and trainer.ppo.plan.full_kl_loss and not trainer.ppo.plan.ref_phase
    noise = jax.random.normal(jax.random.key(3), ())
    trainer.state = trainer.state.replace(
      ref_params=jax.tree.map(lambda x: x * (1.0 + 0.2 * noise) if x.ndim > 1 else x, trainer.state.ref_params)
    )
    runs[fuse] = trainer.train_step(0)
  return runs


def test_full_kl_in_reward_and_loss(full_kl_runs):
  fused, phased = full_kl_runs[True], full_kl_runs[False]
  assert fused["actor/kl_loss"] > 1e-4 and fused["actor/reward_kl_penalty"] > 1e-4
  for key, value in fused.items():
    if not key.startswith(TIMING_DEPENDENT):
      np.testing.assert_allclose(phased[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
