"""Heads over the response positions only, the LM head in chunks, forward phases in micro-batches:
the same log-probs, entropy, values and gradients as the whole-logits computation (fp32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf import algos
from jaxrlhf.models import Decoder, DecoderConfig, init_params
from jaxrlhf.rollout import token_log_probs
from jaxrlhf.trainer.model_outputs import ModelOutputs, chunk_length, sequence_inputs
from jaxrlhf.trainer.state import RoleState
from tests.helpers import rollout_of
from tests.trainer.test_packing import MODEL, make_rollout, make_step

TEMPERATURE = 0.7
close = lambda got, want, tol=1e-6: np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=tol, rtol=tol)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def models(request):
  config = DecoderConfig(**{**MODEL.__dict__, "tie_word_embeddings": request.param})
  actor, critic = Decoder(config, head="lm"), Decoder(config, head="value")
  return actor, critic, init_params(actor, jax.random.key(1))[0], init_params(critic, jax.random.key(2))[0]


def whole_logits_outputs(actor, critic, actor_params, critic_params, micro):
  """The reference: every position's logits and values, sliced to the response afterwards."""
  prompt_len, response_len = micro["prompts"].shape[1], micro["responses"].shape[1]
  ids, positions, mask = sequence_inputs(micro["prompts"], micro["prompt_mask"], micro["responses"])
  at_responses = lambda x: x[:, prompt_len - 1 : prompt_len + response_len - 1]
  logits_NxRxV = at_responses(actor.apply({"params": actor_params}, ids, positions, mask)[0])
  values_NxR = at_responses(critic.apply({"params": critic_params}, ids, positions, mask)[0])
  return (
    token_log_probs(logits_NxRxV, micro["responses"], TEMPERATURE),
    algos.entropy_from_logits(logits_NxRxV / TEMPERATURE),
    values_NxR,
  )


@pytest.mark.parametrize("chunk_tokens", [0, 16, 40])  # whole; 1 position per chunk; 3 positions (last padded)
def test_response_heads_in_chunks_equal_whole_logits(models, chunk_tokens):
  actor, critic, actor_params, critic_params = models
  micro = make_rollout(16, seed=1)
  outputs = ModelOutputs(actor, critic, TEMPERATURE, chunk_tokens)
  assert chunk_length(16, 8, chunk_tokens, 1) == {0: 8, 16: 1, 40: 2}[chunk_tokens]
  want_log_prob, want_entropy, want_values = whole_logits_outputs(actor, critic, actor_params, critic_params, micro)
  log_prob, entropy = jax.jit(outputs.log_probs)(actor_params, micro)
  close(log_prob, want_log_prob)
  close(entropy, want_entropy)
  # The optimal token baselines' input, from the same chunks.
  stats = jax.jit(outputs.token_outputs, static_argnums=2)(actor_params, micro, ("sum_pi_squared",))
  ids, positions, mask = sequence_inputs(micro["prompts"], micro["prompt_mask"], micro["responses"])
  logits_NxRxV = actor.apply({"params": actor_params}, ids, positions, mask)[0][:, 5:13]  # prompt 6, response 8
  close(stats["sum_pi_squared"], algos.sum_pi_squared_from_logits(logits_NxRxV / TEMPERATURE))
  close(jax.jit(outputs.values)(critic_params, micro), want_values)


def test_chunked_gradients_equal_whole_logits(models):
  actor, critic, actor_params, _ = models
  micro = make_rollout(16, seed=2)
  mask = micro["response_mask"].astype(jnp.float32)

  def loss(params, outputs):
    log_prob, entropy = outputs.log_probs(params, micro)
    return jnp.sum((log_prob - 0.01 * entropy) * mask)

  want = jax.jit(jax.grad(loss), static_argnums=1)(actor_params, ModelOutputs(actor, critic, TEMPERATURE, 0))
  got = jax.jit(jax.grad(loss), static_argnums=1)(actor_params, ModelOutputs(actor, critic, TEMPERATURE, 40))
  jax.tree.map(lambda g, w: close(g, w, 1e-5), got, want)
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(want)) > 1e-3


def test_chunks_keep_the_logits_of_one_chunk_only():
  """The compiled backward of a chunked log-prob never holds [rows, length, vocab] logits."""
  config = DecoderConfig(
    vocab_size=4096,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
  )
  actor = Decoder(config, head="lm")
  params = init_params(actor, jax.random.key(0))[0]
  hidden = jnp.ones((8, 64, 32))
  tokens = jnp.zeros((8, 64), jnp.int32)

  def temp_bytes(chunk_tokens):
    from jaxrlhf.trainer.model_outputs import lm_token_outputs

    chunk = chunk_length(8, 64, chunk_tokens, 1)
    f = lambda p, h: jnp.sum(lm_token_outputs(config, p, h, tokens, 1.0, ("entropy",), chunk)["log_prob"])
    compiled = jax.jit(jax.grad(f, argnums=(0, 1))).lower(params, hidden).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  whole_logits, chunk_logits = 8 * 64 * 4096 * 4, 8 * 8 * 4096 * 4  # 64 tokens per chunk: 8 positions x 8 rows
  assert temp_bytes(0) > whole_logits
  assert temp_bytes(64) < 4 * chunk_logits  # a few chunk-sized buffers (logits, softmax, their gradient)


@pytest.mark.parametrize("packed", [False, True])
def test_forward_phase_micro_batches_equal_one_pass(packed):
  step_kwargs = {"use_remove_padding": packed}
  rollout = make_rollout(32, seed=3)
  one_pass = make_step(**step_kwargs)
  micro = make_step(log_prob_micro=3, **step_kwargs)  # 3 rows: 32 sequences in 11 micro-batches, the last padded
  actor_params = init_params(one_pass.actor, jax.random.key(1))[0]
  critic_params = init_params(one_pass.critic, jax.random.key(2))[0]
  mask = np.asarray(rollout["response_mask"], bool)
  for phase, model_params in (
    ("old_log_prob", actor_params),
    ("ref_log_prob", actor_params),
    ("critic_values", critic_params),
  ):
    record, weights = rollout_of(**rollout), RoleState(params=model_params, opt_state=None)
    args = (model_params if phase == "ref_log_prob" else weights, record)
    want = jax.tree.leaves(jax.jit(getattr(one_pass, phase))(*args))[0]  # old_log_prob: + metrics
    got = jax.tree.leaves(jax.jit(getattr(micro, phase))(*args))[0]
    close(np.asarray(got)[mask], np.asarray(want)[mask], 1e-5)


@pytest.mark.parametrize("chunk_tokens", [0, 40])
def test_full_kl_from_both_policies_chunks(models, chunk_tokens):
  """`full` KL: exact KL(pi || ref) over the vocabulary from the two policies' logits, chunk by chunk;
  its gradient reaches the actor only (the reference is frozen)."""
  actor, critic, actor_params, _ = models
  ref_params = init_params(actor, jax.random.key(7))[0]
  micro = make_rollout(16, seed=4)
  ids, positions, mask = sequence_inputs(micro["prompts"], micro["prompt_mask"], micro["responses"])
  logits = lambda params: actor.apply({"params": params}, ids, positions, mask)[0][:, 5:13] / TEMPERATURE
  outputs = ModelOutputs(actor, critic, TEMPERATURE, chunk_tokens)
  out = jax.jit(lambda p, r: outputs.token_outputs(p, micro, (), ref_params=r))(actor_params, ref_params)
  close(out["full_kl"], algos.full_kl(logits(actor_params), logits(ref_params)), 1e-5)
  close(out["ref_log_prob"], token_log_probs(logits(ref_params), micro["responses"], 1.0), 1e-5)
  assert float(out["full_kl"].min()) >= -1e-6 and float(out["full_kl"].max()) > 1e-3

  kl_sum = lambda params, ref: jnp.sum(outputs.token_outputs(params, micro, (), ref_params=ref)["full_kl"])
  want = jax.grad(lambda p: jnp.sum(algos.full_kl(logits(p), logits(ref_params))))(actor_params)
  grads = jax.jit(jax.grad(kl_sum, argnums=(0, 1)))(actor_params, ref_params)
  jax.tree.map(lambda g, w: close(g, w, 1e-5), grads[0], want)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads[1]))
