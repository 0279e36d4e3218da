"""Multi-turn rollouts in the trainer (`trainer/multi_turn.py`): the built-in `lookup` task's rollout from an
untrained policy (some trajectories call the tool), its record, the training forward's log-probs of the policy's
own tokens across turns (fp32), tool tokens out of the loss, the reward function's view of each trajectory, and a
training step after it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf import algos
from jaxrlhf.config import load_config_file
from jaxrlhf.trainer import Trainer
from jaxrlhf.trainer.phased import timed
from tests.helpers import ROOT


@functools.cache
def _trainer_and_rollout(tmp_root: str):
  config = load_config_file(f"{ROOT}/configs/quickstart_tools.py")
  config.data.train_batch_size = 32
  config.data.val_batch_size = 64
  config.actor_rollout_ref.rollout.n = 2
  config.actor_rollout_ref.actor.ppo_mini_batch_size = 16
  config.trainer.default_local_dir = tmp_root
  config.trainer.logger = ("jsonl",)
  config.mesh.fsdp = 2
  trainer = Trainer(config, devices=jax.devices()[:2])
  generated = trainer.generation.run(trainer.state, trainer.step_batches(0), jax.random.key(3), timed({}))
  return trainer, generated


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  trainer, generated = _trainer_and_rollout(str(tmp_path_factory.mktemp("multi_turn")))
  return trainer, generated.rollout, generated.scored, generated.metrics


def test_the_record_of_a_multi_turn_rollout(setup):
  trainer, rollout, scored, _ = setup
  r, s = jax.device_get((rollout, scored))
  loss, attention = r.response_mask, r.response_attention_mask
  called = r.num_turns > 2
  assert 0 < called.sum() < len(called)  # an untrained policy calls the tool now and then
  assert (loss <= attention).all()
  # A call's turn ends at the call; the end of turn, the reply and the generation prompt follow, out of the loss.
  assert ((attention.sum(1) - loss.sum(1))[called] == 4).all() and (loss.sum(1) == attention.sum(1))[~called].all()
  assert (r.rollout_log_probs[(attention > 0) & (loss == 0)] == 0).all()
  # One step reward per call run (0.0 from the lookup); as in verl, a call whose reply did not fit the budget ran
  # (its reward is there) but was not appended (no tool turn).
  calls = np.isfinite(r.tool_rewards).sum(1)
  assert (calls >= called).all() and calls.max() == 1  # max_assistant_turns=2: one call at most
  # The reward function saw num_turns: the task's tool bonus is paid exactly to the trajectories that called.
  np.testing.assert_array_equal(s.scores >= 0.1, called)
  # The score sits on the policy's last token.
  last = attention.shape[1] - 1 - np.argmax(loss[:, ::-1], axis=1)
  np.testing.assert_array_equal(s.token_level_scores[np.arange(len(last)), last], s.scores)
  metrics = setup[3]  # the host's metrics of the rollout: turns, tool calls
  assert metrics["tool_call_counts/mean"] == pytest.approx(calls.mean())
  assert metrics["num_turns/mean"] == pytest.approx(r.num_turns.mean())
  assert metrics["tool_calls/success_rate"] == pytest.approx((calls > 0).mean()) and metrics["tool_errors/mean"] == 0


def test_the_training_forward_gives_the_rollouts_log_probs(setup):
  trainer, rollout, _, _ = setup
  actor = trainer.state.actor
  out = trainer.ppo.outputs.token_outputs(actor.params, rollout.sequences(), (), actor.adapters)
  loss = np.asarray(rollout.response_mask) > 0
  np.testing.assert_allclose(np.asarray(out["log_prob"])[loss], np.asarray(rollout.rollout_log_probs)[loss], atol=2e-6)


def test_tool_tokens_never_enter_the_loss(setup):
  trainer, rollout, _, _ = setup
  actor = trainer.state.actor
  mask = rollout.response_mask
  tool = (rollout.response_attention_mask > 0) & (mask == 0)
  assert bool(tool.any())
  rng = np.random.default_rng(0)
  micro = dict(
    rollout.sequences(),
    advantages=jnp.asarray(rng.normal(size=mask.shape), jnp.float32),
    old_log_probs=rollout.rollout_log_probs,
  )
  garbage = dict(
    micro,
    advantages=jnp.where(tool, 1e3, micro["advantages"]),
    old_log_probs=jnp.where(tool, -50.0, micro["old_log_probs"]),
  )
  loss_fn = functools.partial(trainer.ppo.actor_loss, on_policy=False)
  aux = dict(frozen=actor.frozen, kl_gate=jnp.float32(1.0))
  normalizers = algos.loss_normalizers(mask, "token-mean")
  grad = jax.jit(jax.grad(lambda trained, m: loss_fn(trained, aux, m, normalizers, jax.random.key(0))[0]))
  for a, b in zip(jax.tree.leaves(grad(actor.trained, micro)), jax.tree.leaves(grad(actor.trained, garbage))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_training_step_and_validation_run_on_the_rollout(setup):
  trainer, _, _, _ = setup
  metrics = trainer.train_step(0)
  assert metrics["num_turns/mean"] > 2 and "timing_s/tool_calls" in metrics
  assert np.isfinite(metrics["actor/pg_loss"])
  val = trainer.validate(0)
  assert "val-core/jaxrlhf/lookup/acc/mean@1" in val and "val-aux/num_turns/mean" in val


def test_tools_kwargs_that_are_off_are_reported():
  from jaxrlhf.trainer.multi_turn import tools_kwargs_notes

  rows = [
    {"tools_kwargs": {"lookup": {"create_kwargs": {"table": {"a": 1}}}}},
    {"need_tools_kwargs": True},
    {"need_tools_kwargs": True, "tools_kwargs": {"lokup": {}}},
  ]
  notes = tools_kwargs_notes(rows, {"lookup"}, "data.train_files")
  assert len(notes) == 2
  assert "1 rows have extra_info.need_tools_kwargs but no tools_kwargs (first: row 1)" in notes[0]
  assert "'lokup' (first: row 2)" in notes[1] and "['lookup']" in notes[1]
  with pytest.raises(ValueError, match="data.val_files row 0: extra_info.tools_kwargs must be a mapping"):
    tools_kwargs_notes([{"tools_kwargs": "lookup"}], {"lookup"}, "data.val_files")
