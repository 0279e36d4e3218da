"""Phased mode equals fused mode; DAPO dynamic sampling and overlong shaping; ReMax; reward errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.trainer import Trainer
from jaxrlhf.trainer.phased import group_is_informative, select_groups
from jaxrlhf.trainer.reward import decode_responses
from tests.helpers import TIMING_DEPENDENT, rollout_of, scored_of, small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ONE = {"mesh.fsdp": 1}


def test_phased_mode_matches_fused_mode_and_times_every_phase(tmp_path):
  """Also critic_warmup=1 (the fused run's) against the default 0 (the phased run's): verl updates the actor once
  critic_warmup <= step, counting from 1, so warm-up 1 skips nothing and both give the same numbers."""
  fused = Trainer(small_config(tmp_path / "f", **ONE, **{"trainer.critic_warmup": 1}), devices=jax.devices()[:1])
  phased = Trainer(small_config(tmp_path / "p", **ONE, **{"trainer.fuse_step": False}), devices=jax.devices()[:1])
  actor_before = jax.device_get(fused.state.actor.params)
  for step in range(3):
    a, b = fused.train_step(step), phased.train_step(step)
    if step == 0:
      assert "actor/pg_loss" in a
      moved = jax.tree.map(lambda x, y: np.abs(x - y).max(), actor_before, jax.device_get(fused.state.actor.params))
      assert max(jax.tree.leaves(moved)) > 0
    for key, value in a.items():
      if not key.startswith(TIMING_DEPENDENT):
        # From step 1 on, an Adam step has amplified the fp32 rounding differences of two different programs.
        np.testing.assert_allclose(b[key], value, rtol=1e-5, atol=1e-5, err_msg=f"step {step} {key}")
  for phase in ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"):
    assert b[f"timing_s/{phase}"] > 0 and f"timing_per_token_ms/{phase}" in b
  assert "timing_s/gen" not in a
  # verl: generation time per response token; the update phases' own MFU.
  response_tokens = b["response_length/mean"] * 16
  assert b["timing_per_token_ms/gen"] == pytest.approx(1000 * b["timing_s/gen"] / response_tokens)
  assert b["perf/mfu/actor"] > 0 and b["perf/mfu/critic"] > 0 and "perf/mfu/critic" not in a
  # The fused step times no update phase: its MFU is the whole step's, under its own name.
  assert a["perf/mfu/step"] > 0 and "perf/mfu/actor" not in a


def test_group_filter_keeps_groups_with_varied_scores():
  scores = np.array([1, 1, 0, 1, 0, 0, 1, 0], np.float32)
  groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])
  np.testing.assert_array_equal(group_is_informative(scores, groups), [False, True, False, True])
  responses = np.arange(8)[:, None]
  rollout = rollout_of(
    np.zeros((8, 2), np.int32), np.ones((8, 2), np.int32), responses, np.ones_like(responses), group_index=groups
  )
  scored = scored_of(scores)
  assert select_groups([(rollout, scored)], 3, "score") is None  # only 2 informative groups
  picked, picked_scores = select_groups([(rollout, scored), (rollout, scored)], 3, "score")
  np.testing.assert_array_equal(picked.responses[:, 0], [2, 3, 6, 7, 2, 3])
  np.testing.assert_array_equal(picked.group_index, [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(picked.sample_index, [2, 3, 6, 7, 2, 3])
  np.testing.assert_array_equal(picked_scores.scores, [0, 1, 1, 0, 0, 1])


def test_dapo_dynamic_sampling_trains_on_informative_groups_only(tmp_path):
  config = small_config(
    tmp_path,
    **ONE,
    **{
      "algorithm.adv_estimator": "grpo",
      "algorithm.filter_groups.enable": True,
      "data.gen_batch_size": 16,
      "actor_rollout_ref.rollout.n": 4,
      "actor_rollout_ref.actor.clip_ratio_low": 0.2,
      "actor_rollout_ref.actor.clip_ratio_high": 0.28,
      "reward_model.overlong_buffer.enable": True,
      "reward_model.overlong_buffer.len": 1,
      "algorithm.filter_groups.max_num_gen_batches": 50,
      "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    },
  )
  trainer = Trainer(config, devices=jax.devices()[:1])
  # Overlong penalty makes scores differ within most groups; make them informative for sure.
  metrics = trainer.train_step(0)
  assert metrics["training/num_gen_batches"] >= 1 and trainer.gen_cursor == metrics["training/num_gen_batches"]
  assert np.isfinite(metrics["actor/pg_loss"]) and metrics["critic/advantages/max"] > 0


def test_overlong_penalty_is_linear_over_the_buffer(tmp_path):
  config = small_config(
    tmp_path,
    **ONE,
    **{
      "reward_model.overlong_buffer.enable": True,
      "reward_model.overlong_buffer.len": 2,
      "reward_model.overlong_buffer.penalty_factor": 1.0,
    },
  )
  trainer = Trainer(config, devices=jax.devices()[:1])
  trainer.ppo.reward_fn = lambda responses, mask, index: (
    jnp.ones(responses.shape[0]),
    jnp.zeros(responses.shape[0]),
    jnp.zeros(responses.shape[0]),
    jnp.zeros((0, responses.shape[0])),
  )
  mask = jnp.array([[1, 0, 0], [1, 1, 0], [1, 1, 1]], jnp.int32)  # lengths 1, 2, 3 of max 3, buffer 2
  rollout = rollout_of(jnp.ones((3, 2), jnp.int32), jnp.ones((3, 2), jnp.int32), jnp.zeros((3, 3), jnp.int32), mask)
  scores = trainer.ppo.score(rollout).scores
  np.testing.assert_allclose(np.asarray(scores), [1.0, 0.5, 0.0])  # expected length 1: -(L-1)/2


def test_remax_runs_with_a_greedy_baseline(tmp_path):
  config = small_config(tmp_path, **ONE, **{"algorithm.adv_estimator": "remax"})
  trainer = Trainer(config, devices=jax.devices()[:1])
  assert not trainer.ppo.plan.use_critic
  metrics = trainer.train_step(0)
  assert np.isfinite(metrics["actor/pg_loss"]) and "critic/vf_loss" not in metrics


def _failing_reward_file(tmp_path):
  path = tmp_path / "reward.py"
  path.write_text(
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    if '1' in solution_str:\n        raise ValueError('boom')\n    return 0.5\n"
  )
  return str(path)


def test_reward_errors_zero_and_count_or_fail_naming_the_sample(tmp_path):
  overrides = {
    **ONE,
    "custom_reward_function.path": _failing_reward_file(tmp_path),
    "actor_rollout_ref.rollout.temperature": 3.0,
  }
  tolerant = Trainer(
    small_config(tmp_path / "z", **overrides, **{"reward_model.on_error": "zero"}), devices=jax.devices()[:1]
  )
  metrics = tolerant.train_step(0)
  assert metrics["reward/num_errors"] > 0 and metrics["critic/score/min"] == 0.0
  strict = Trainer(small_config(tmp_path / "r", **overrides), devices=jax.devices()[:1])
  with pytest.raises(Exception, match=r"failed on sample \d+ \(data_source='jaxrlhf/recall'\)"):
    strict.train_step(0)


def test_critic_warmup_updates_only_the_critic_first(tmp_path):
  """verl counts steps from 1 and updates the actor once critic_warmup <= step: warm-up 2 skips step 1 only.
  In that step the actor's update metrics are absent (not 0); its learning-rate schedule starts after."""
  overrides = {**ONE, "trainer.critic_warmup": 2, "actor_rollout_ref.actor.optim.lr_warmup_steps": 4}
  trainer = Trainer(small_config(tmp_path, **overrides), devices=jax.devices()[:1])
  actor_before = jax.device_get(trainer.state.actor.params)
  critic_before = jax.device_get(trainer.state.critic.params)
  first = trainer.train_step(0)
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert same(actor_before, jax.device_get(trainer.state.actor.params))
  assert not same(critic_before, jax.device_get(trainer.state.critic.params))
  assert "actor/pg_loss" not in first and "actor/lr" not in first and "critic/vf_loss" in first
  assert "actor/entropy" in first  # the old-log-prob phase still runs, as in verl
  second = trainer.train_step(1)
  lr = trainer.config.actor_rollout_ref.actor.optim.lr
  assert second["actor/lr"] == 0.0  # the schedule's step 0 (warm-up from 0), not step 1
  trainer.train_step(2)
  assert not same(actor_before, jax.device_get(trainer.state.actor.params))
  assert trainer.train_step(3)["actor/lr"] == pytest.approx(lr * 2 / 4)


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_optimal_token_baselines_get_sum_pi_squared_from_the_old_log_prob_phase(tmp_path, estimator):
  trainer = Trainer(small_config(tmp_path, **ONE, **{"algorithm.adv_estimator": estimator}), devices=jax.devices()[:1])
  batch = trainer._load_batch(trainer.train_data, trainer.schedule.indices(0))
  rollout = jax.jit(trainer.ppo.rollout)(trainer.state.actor.weights, batch, jax.random.key(0))
  old = jax.jit(trainer.ppo.old_log_prob)(trainer.state.actor.weights, rollout)
  mask = np.asarray(rollout.response_mask, bool)
  sum_pi_squared = np.asarray(old.sum_pi_squared)[mask]
  assert np.all((sum_pi_squared > 0) & (sum_pi_squared <= 1))  # sum_v pi_v^2 of a distribution
  metrics = trainer.train_step(0)
  assert not trainer.ppo.plan.use_critic and np.isfinite(metrics["actor/pg_loss"])


def _component_reward_file(tmp_path, with_format=True):
  """A reward returning verl-style components: `format` (even length) and `acc` (contains a 3)."""
  path = tmp_path / "components.py"
  fmt = '"format": float(len(solution_str) % 2 == 0), ' if with_format else ""
  path.write_text(
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    acc = float('3' in solution_str)\n"
    f"    return {{'score': acc + 0.5 * (len(solution_str) % 2 == 0), {fmt}'acc': acc, "
    "'pred': solution_str[:1]}\n"
  )
  return str(path)


def test_gdpo_reads_the_reward_components_and_validation_uses_acc(tmp_path):
  overrides = {
    **ONE,
    "custom_reward_function.path": _component_reward_file(tmp_path),
    "algorithm.adv_estimator": "gdpo",
    "algorithm.gdpo_reward_keys": ("format", "acc"),
    "algorithm.gdpo_reward_weights": (0.5, 1.0),
    "critic.enable": False,
    "actor_rollout_ref.rollout.temperature": 3.0,
    "actor_rollout_ref.rollout.val_kwargs.n": 2,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 3.0,
  }
  trainer = Trainer(small_config(tmp_path / "run", **overrides), devices=jax.devices()[:1])
  phased = trainer.phased
  batch = trainer._load_batch(trainer.train_data, trainer.schedule.indices(1))
  rollout = phased.gen(trainer.state.actor.weights, batch, jax.random.key(0))
  scored = jax.device_get(phased.reward(rollout, trainer.state.reward_params))
  texts = decode_responses(trainer.tokenizer, np.asarray(rollout.responses), np.asarray(rollout.response_mask))
  np.testing.assert_array_equal(
    scored.reward_components, [[float(len(t) % 2 == 0) for t in texts], [float("3" in t) for t in texts]]
  )
  metrics = trainer.train_step(0)
  assert "gdpo/format/mean" in metrics and "gdpo/acc/max" in metrics and np.isfinite(metrics["actor/pg_loss"])
  val = trainer.validate(0)
  assert "val-core/jaxrlhf/recall/acc/mean@2" in val and "val-aux/jaxrlhf/recall/reward/mean@2" in val
  assert "val-core/jaxrlhf/recall/acc/maj@2/mean" in val  # `pred` is voted on


def test_gdpo_fails_naming_a_component_the_reward_does_not_return(tmp_path):
  overrides = {
    **ONE,
    "custom_reward_function.path": _component_reward_file(tmp_path, with_format=False),
    "algorithm.adv_estimator": "gdpo",
    "algorithm.gdpo_reward_keys": ("format", "acc"),
    "critic.enable": False,
  }
  trainer = Trainer(small_config(tmp_path / "run", **overrides), devices=jax.devices()[:1])
  with pytest.raises(
    Exception, match=r"no number for \['format'\] on sample 0 .*it returned \['acc', 'pred', 'score'\]"
  ):
    trainer.train_step(0)
