"""`use_dynamic_bsz` and `use_remove_padding`: same numbers as the padded path, fewer tokens processed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.config import ConfigError, get_base_config, resolve_config, validate_config
from jaxrlhf.models import Decoder, DecoderConfig
from jaxrlhf.models.decoder import init_params
from jaxrlhf.parallel import StepLayouts
from jaxrlhf.trainer import PPOStep, Trainer, packing, update_loop
from jaxrlhf.trainer.state import RoleState, make_optimizer
from tests.helpers import TIMING_DEPENDENT, programs_built, rollout_of, small_config

PROMPT_LEN, RESPONSE_LEN = 6, 8
MODEL = DecoderConfig(
  vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)


def make_step(
  use_remove_padding=False, use_dynamic_bsz=False, micro=None, loss_agg_mode="token-mean", log_prob_micro=None
):
  config = get_base_config()
  config.data.train_batch_size, config.data.max_prompt_length = 16, PROMPT_LEN
  config.data.max_response_length = RESPONSE_LEN
  actor = config.actor_rollout_ref.actor
  actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu = 8, micro
  actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu = use_dynamic_bsz, 2 * (PROMPT_LEN + RESPONSE_LEN)
  actor.loss_agg_mode, actor.entropy_coeff, actor.use_kl_loss = loss_agg_mode, 0.01, True
  config.actor_rollout_ref.model.use_remove_padding = use_remove_padding
  config.actor_rollout_ref.rollout.n = 2
  config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu = log_prob_micro
  config = resolve_config(config)
  optimizers = {
    "actor": make_optimizer(config.actor_rollout_ref.actor.optim, 1.0),
    "critic": make_optimizer(config.critic.optim, 1.0),
  }
  constant = lambda step: jnp.float32(1e-3)
  return PPOStep(
    config,
    MODEL,
    reward_fn=None,
    eos_token_ids=(1,),
    pad_token_id=0,
    lr_schedules={"actor": constant, "critic": constant},
    optimizers=optimizers,
    layouts=StepLayouts(),
  )


def make_rollout(num_rows, seed=0):
  """Left-padded prompts of 1..6 tokens and responses of 1..8 tokens: very different lengths."""
  rng = np.random.default_rng(seed)
  prompt_lengths = rng.integers(1, PROMPT_LEN + 1, num_rows)
  response_lengths = rng.integers(1, RESPONSE_LEN + 1, num_rows)
  response_lengths[:2] = (1, RESPONSE_LEN)
  prompt_mask = (np.arange(PROMPT_LEN)[None] >= PROMPT_LEN - prompt_lengths[:, None]).astype(np.int32)
  response_mask = (np.arange(RESPONSE_LEN)[None] < response_lengths[:, None]).astype(np.int32)
  prompts = rng.integers(2, MODEL.vocab_size, (num_rows, PROMPT_LEN)) * prompt_mask
  responses = rng.integers(2, MODEL.vocab_size, (num_rows, RESPONSE_LEN)) * response_mask
  as_jax = lambda x: jnp.asarray(x, jnp.int32)
  return {
    "prompts": as_jax(prompts),
    "prompt_mask": as_jax(prompt_mask),
    "responses": as_jax(responses),
    "response_mask": as_jax(response_mask),
  }


FULL = RoleState(params=None, opt_state=None).frozen  # full fine-tuning: nothing frozen beside what trains


@pytest.fixture(scope="module")
def params():
  actor, _ = init_params(Decoder(MODEL, head="lm"), jax.random.key(1))
  critic, _ = init_params(Decoder(MODEL, head="value"), jax.random.key(2))
  return actor, critic


def test_packed_log_probs_and_values_equal_padded(params):
  actor_params, critic_params = params
  rollout = make_rollout(32)
  mask = np.asarray(rollout["response_mask"], bool)
  padded, packed = make_step(), make_step(use_remove_padding=True, use_dynamic_bsz=True)
  for phase, model_params in (("old_log_prob", actor_params), ("critic_values", critic_params)):
    weights = RoleState(params=model_params, opt_state=None)
    record = rollout_of(**rollout)
    expected = jax.tree.leaves(jax.jit(getattr(padded, phase))(weights, record))[0]  # old_log_prob: + metrics
    got = jax.tree.leaves(jax.jit(getattr(packed, phase))(weights, record))[0]
    np.testing.assert_allclose(np.asarray(got)[mask], np.asarray(expected)[mask], atol=1e-5, rtol=1e-5, err_msg=phase)


def _minibatch(step, params, rollout):
  actor_params, critic_params = params
  rng = np.random.default_rng(3)
  mask_f = rollout["response_mask"].astype(jnp.float32)
  log_probs = step.old_log_prob(RoleState(params=actor_params, opt_state=None), rollout_of(**rollout)).log_probs
  return dict(
    rollout,
    old_log_probs=log_probs + 0.1 * jnp.asarray(rng.normal(size=mask_f.shape), jnp.float32),
    ref_log_probs=log_probs + 0.2 * jnp.asarray(rng.normal(size=mask_f.shape), jnp.float32),
    advantages=jnp.asarray(rng.normal(size=mask_f.shape), jnp.float32) * mask_f,
    values=jnp.asarray(rng.normal(size=mask_f.shape), jnp.float32) * mask_f,
    returns=jnp.asarray(rng.normal(size=mask_f.shape), jnp.float32) * mask_f,
  )


def _gradients(step, params, minibatch, loss_agg_mode):
  actor_params, critic_params = params
  seq_len = PROMPT_LEN + RESPONSE_LEN
  batching = step.batcher.update_plan(
    step.config.actor_rollout_ref.actor, "actor_rollout_ref.actor", seq_len, step.plan.actor_packed
  )

  @jax.jit
  def run(minibatch):
    key = jax.random.key(0)
    actor = update_loop.minibatch_gradients(
      step.actor_loss, actor_params, {"kl_gate": 1.0, "frozen": FULL}, minibatch, key, batching, loss_agg_mode
    )
    critic = update_loop.minibatch_gradients(
      step.critic_loss, critic_params, {"frozen": FULL}, minibatch, key, batching, loss_agg_mode
    )
    return actor[:2], critic[:2]  # (grads, metrics): these losses have no per-row outputs

  return batching, run(minibatch)


@pytest.mark.parametrize(
  "switches,loss_agg_mode",
  [
    ({"use_remove_padding": True, "use_dynamic_bsz": True}, "seq-mean-token-mean"),
    ({"use_remove_padding": True, "micro": 4}, "token-mean"),
    ({"use_dynamic_bsz": True}, "seq-mean-token-sum"),
  ],
)
def test_losses_and_gradients_equal_padded(params, switches, loss_agg_mode):
  reference = make_step(loss_agg_mode=loss_agg_mode)  # padded, the whole mini-batch in one micro-batch
  fast = make_step(loss_agg_mode=loss_agg_mode, **switches)
  minibatch = _minibatch(reference, params, make_rollout(16, seed=4))
  _, (expected_actor, expected_critic) = _gradients(reference, params, minibatch, loss_agg_mode)
  batching, (got_actor, got_critic) = _gradients(fast, params, minibatch, loss_agg_mode)
  assert batching.num_micro > 1  # the switches really split the mini-batch
  close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
  for (got_grads, got_metrics), (want_grads, want_metrics) in (
    (got_actor, expected_actor),
    (got_critic, expected_critic),
  ):
    if batching.packed:  # lengths 1..8 of 14: the packed slots ran (they pay), not the padded fallback
      assert float(got_metrics.pop("perf/packed")) == 1.0
    assert got_metrics.keys() == want_metrics.keys()
    for key in want_metrics:
      close(got_metrics[key], want_metrics[key])
    jax.tree.map(close, got_grads, want_grads)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(want_grads)) > 1e-3  # not trivially zero


def test_packing_cuts_tokens_processed():
  rollout = make_rollout(64, seed=5)
  valid = jnp.concatenate([rollout["prompt_mask"], rollout["response_mask"]], axis=1)
  seq_len = valid.shape[1]
  batching = packing.micro_batching(64, seq_len, 1, rows_per_shard=None, max_token_len=4 * seq_len, packed=True)
  plan = packing.pack(jnp.zeros_like(valid), valid, batching)
  used_rows = int((plan["segment_ids"].max(axis=-1) > 0).sum())
  ratio = float(packing.packed_token_ratio(valid, batching))
  # Every valid token is placed exactly once and no row overflows.
  assert int((plan["segment_ids"] > 0).sum()) == int(valid.sum())
  print(
    f"\npacking: {int(valid.sum())} valid of {valid.size} padded tokens ({valid.mean():.2f}); "
    f"rows used {used_rows}/64 ({used_rows / 64:.2f}); tokens processed by executed micro-batches "
    f"{ratio:.2f} of the padded path"
  )
  assert used_rows < 64 * 0.75 and ratio < 0.8


def test_fused_step_with_both_switches_compiles_once_and_matches_padded(tmp_path):
  switches = {
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 32,
  }
  fast = Trainer(small_config(tmp_path / "fast", **switches), devices=jax.devices()[:1])
  padded = Trainer(small_config(tmp_path / "padded"), devices=jax.devices()[:1])
  first, reference = fast.train_step(0), padded.train_step(0)
  for key, value in reference.items():
    if not key.startswith(TIMING_DEPENDENT):
      np.testing.assert_allclose(first[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
  with programs_built() as events:
    fast.train_step(1)
  assert events == [], f"the second packed PPO step compiled {len(events)} program(s)"


def test_token_budget_smaller_than_a_sequence_names_the_keys():
  config = get_base_config()
  config.actor_rollout_ref.actor.use_dynamic_bsz = True
  config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 1000
  with pytest.raises(ConfigError, match=r"ppo_max_token_len_per_gpu=1000 .*max_prompt_length.*1024"):
    validate_config(config)
  config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 1024
  config.actor_rollout_ref.model.use_remove_padding = True
  validate_config(config)  # both switches are supported now


def test_packing_runs_only_when_it_pays(params):
  """Uniform full-length sequences fill every slot: packing saves nothing and would add its head work,
  so the padded micro-batches run (same numbers either way); varied lengths pack."""
  actor_params, _ = params
  packed_step = make_step(use_remove_padding=True, micro=4)
  seq_len = PROMPT_LEN + RESPONSE_LEN
  batching = packed_step.batcher.update_plan(
    packed_step.config.actor_rollout_ref.actor, "actor_rollout_ref.actor", seq_len, True
  )
  assert batching.head_cost > 0  # the LM head's share, from the model's shape
  full = make_rollout(16, seed=6)
  full = dict(full, prompt_mask=jnp.ones_like(full["prompt_mask"]), response_mask=jnp.ones_like(full["response_mask"]))
  # At most 3 prompt + 3 response tokens of 14: two sequences share a row, half the slots run.
  short = dict(
    full,
    prompt_mask=full["prompt_mask"].at[:, : PROMPT_LEN - 3].set(0),
    response_mask=full["response_mask"].at[:, 3:].set(0),
  )
  for rollout, want_packed in ((full, 0.0), (short, 1.0)):
    minibatch = _minibatch(make_step(), params, rollout)
    plan = update_loop.pack_sequences(minibatch, batching)
    assert bool(packing.packing_pays(plan, batching, PROMPT_LEN, RESPONSE_LEN)) == bool(want_packed)
    _, (got, _) = _gradients(packed_step, params, minibatch, "token-mean")
    _, (want, _) = _gradients(make_step(micro=4), params, minibatch, "token-mean")
    assert float(got[1].pop("perf/packed")) == want_packed
    for key in want[1]:
      np.testing.assert_allclose(np.asarray(got[1][key]), np.asarray(want[1][key]), atol=1e-5, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), got[0], want[0])
