"""A new kind of layer state decodes through every generation path without a change to `rollout/`.

The toy model here is what a hybrid family (Qwen3.5's linear-attention layers beside full attention) brings: a
per-row running state with no length axis (a decayed sum of the token embeddings, the stand-in for a recurrent
state) beside a leaf that grows with the sequence (the token ids written so far, read back as a repetition
penalty: the stand-in for a KV cache). It keeps both in its own cache tree with its own axes
(`DecodeModel.cache_axes`) and honours the contract of `models/decoding.py`: a token whose column is not marked in
`kv_mask_BxS` leaves its row's state alone. Each path (the whole batch, slots refilled in-graph, multi-turn turns
with forced tokens, the serving engine) must give what a cache-free forward over the whole sequence gives.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.models.decoding import DecodeModel
from jaxrlhf.rollout import Engine, SamplingParams, generate, generate_in_slots, request_key, row_keys
from jaxrlhf.rollout.turns import run_turn, start_turns

VOCAB, DIM, PROMPT, RESPONSE, ROWS, EOS = 24, 8, 5, 7, 8, 1
PENALTY = 2.0


def _step_logits(params, running_BxD, seen_BxV):
  return running_BxD @ params["out"] - PENALTY * seen_BxV


def toy_apply(params, ids_BxL, positions_BxL, kv_mask_BxS, cache=None, cache_index=None):
  """logits [B, L, V] fp32 and the new cache; see the module docstring. Cache-free: the columns are the tokens."""
  del positions_BxL  # the toy state is order-aware by its decay, not by positions
  batch, length = ids_BxL.shape
  width = kv_mask_BxS.shape[1]
  if cache is None:
    running, tokens, start = jnp.zeros((batch, DIM)), jnp.full((batch, width), -1, jnp.int32), jnp.int32(0)
  else:
    running, tokens, start = cache["running"], cache["tokens"], cache_index
  column_B = jnp.broadcast_to(jnp.asarray(start, jnp.int32), (batch,))
  rows_B = jnp.arange(batch)

  def one_token(carry, t):
    running, tokens = carry
    column = column_B + t
    # A column past the mask's end (a finished row stepped once more) reads as not written.
    valid = jnp.where(column < width, kv_mask_BxS[rows_B, jnp.minimum(column, width - 1)], 0) > 0
    token = ids_BxL[:, t]
    running = jnp.where(valid[:, None], params["decay"] * running + params["embed"][token], running)
    tokens = tokens.at[rows_B, jnp.where(valid, column, tokens.shape[1])].set(token, mode="drop")
    # What a query may see, as attention sees keys: written columns up to its own (others hold a previous row's).
    visible_BxS = (kv_mask_BxS > 0) & (jnp.arange(width)[None, :] <= column[:, None])
    seen_BxS = jnp.where(visible_BxS, tokens[:, :width], VOCAB)
    seen_BxV = jax.nn.one_hot(seen_BxS, VOCAB + 1)[..., :VOCAB].max(axis=1)
    return (running, tokens), _step_logits(params, running, seen_BxV)

  (running, tokens), logits_LxBxV = jax.lax.scan(one_token, (running, tokens), jnp.arange(length))
  new_cache = None if cache is None else {"running": running, "tokens": tokens}
  return logits_LxBxV.transpose(1, 0, 2), new_cache


TOY = DecodeModel(
  apply=toy_apply,
  init_cache=lambda batch, length: {
    "running": jnp.zeros((batch, DIM), jnp.float32),
    "tokens": jnp.full((batch, length), -1, jnp.int32),
  },
  cache_axes={"running": ("batch", "embed"), "tokens": ("batch", "length")},
)


@functools.cache
def _setup():
  keys = jax.random.split(jax.random.key(0), 3)
  params = {
    "embed": jax.random.normal(keys[0], (VOCAB, DIM)),
    "decay": jnp.linspace(0.5, 0.95, DIM),
    "out": jax.random.normal(keys[1], (DIM, VOCAB)) * 1.5,
  }
  lengths = np.array([5, 3, 4, 5, 2, 5, 1, 4])
  mask = (np.arange(PROMPT)[None, :] >= PROMPT - lengths[:, None]).astype(np.int32)
  prompts = np.where(mask > 0, np.asarray(jax.random.randint(keys[2], (ROWS, PROMPT), 2, VOCAB)), 0)
  return params, jnp.asarray(prompts), jnp.asarray(mask)


def _sampling(do_sample=True):
  return SamplingParams(
    max_new_tokens=RESPONSE, eos_token_ids=(EOS,), pad_token_id=0, temperature=0.8, do_sample=do_sample
  )


def _reference_log_probs(params, prompts, mask, responses, sequence_mask, temperature):
  """log softmax(z / T) of each response token under a cache-free forward over the whole sequence: [N, R]."""
  ids = jnp.concatenate([prompts, jnp.asarray(responses)], axis=1)
  full_mask = jnp.concatenate([mask, jnp.asarray(sequence_mask)], axis=1)
  logits, _ = toy_apply(params, ids, None, full_mask)
  z = jax.nn.log_softmax(logits[:, PROMPT - 1 : -1] / temperature, axis=-1)
  return np.asarray(jnp.take_along_axis(z, jnp.asarray(responses)[..., None], axis=-1)[..., 0])


def _check_against_forward(out, params, prompts, mask, sampling):
  want = _reference_log_probs(params, prompts, mask, out["responses"], out["response_mask"], sampling.temperature)
  written = np.asarray(out["response_mask"]) > 0
  assert written.sum() > ROWS  # the rows generate more than one token
  np.testing.assert_allclose(np.asarray(out["rollout_log_probs"])[written], want[written], atol=1e-5)


@functools.cache
def _batch(per_row_keys: bool, do_sample: bool = True):
  params, prompts, mask = _setup()
  rng = row_keys(jax.random.key(3), ROWS) if per_row_keys else jax.random.key(3)
  run = jax.jit(functools.partial(generate, TOY, sampling=_sampling(do_sample)))
  return jax.device_get(run(params, prompt_ids_BxP=prompts, prompt_mask_BxP=mask, rng=rng))


@pytest.mark.parametrize("per_row_keys", [False, True])
def test_whole_batch_rollout_is_the_cache_free_forward(per_row_keys):
  params, prompts, mask = _setup()
  _check_against_forward(_batch(per_row_keys), params, prompts, mask, _sampling())


def test_greedy_rollout_takes_the_forward_argmax():
  params, prompts, mask = _setup()
  out = _batch(False, do_sample=False)
  logits, _ = toy_apply(
    params,
    jnp.concatenate([prompts, jnp.asarray(out["responses"])], axis=1),
    None,
    jnp.concatenate([mask, jnp.asarray(out["response_mask"])], axis=1),
  )
  greedy = np.asarray(jnp.argmax(logits[:, PROMPT - 1 : -1], axis=-1))
  written = np.asarray(out["response_mask"]) > 0
  np.testing.assert_array_equal(np.asarray(out["responses"])[written], greedy[written])


@pytest.mark.parametrize("slots", [2, 3])
def test_slots_refilled_in_graph_sample_what_the_whole_batch_samples(slots):
  """Fewer slots than rows: finished rows' slots take the next prompt (its running state and its token columns)."""
  params, prompts, mask = _setup()
  run = jax.jit(functools.partial(generate_in_slots, TOY, sampling=_sampling(), slots=slots, shards=2))
  got = jax.device_get(run(params, prompt_ids_NxP=prompts, prompt_mask_NxP=mask, rng=jax.random.key(3)))
  want = _batch(True)
  for name in ("responses", "response_mask"):
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  np.testing.assert_allclose(got["rollout_log_probs"], want["rollout_log_probs"], atol=1e-5)
  assert int(got["num_steps"]) > RESPONSE  # the slots ran more steps than one row's budget: they were refilled


def test_turns_with_forced_tokens_are_the_cache_free_forward():
  """Two turns: rows sample, some are paused (their state must not move), then take forced tokens and sample on."""
  params, prompts, mask = _setup()
  sampling = dataclasses.replace(_sampling(), max_new_tokens=RESPONSE + 4)
  state = jax.jit(functools.partial(start_turns, TOY, sampling=sampling))(
    params, prompt_ids_NxP=prompts, prompt_mask_NxP=mask, rng=jax.random.key(5)
  )
  turn = jax.jit(functools.partial(run_turn, TOY, sampling=sampling))
  forced = jnp.asarray(np.tile(np.array([[7, 9, 11, 0]], np.int32), (ROWS, 1)))
  none = jnp.zeros((ROWS,), jnp.int32)
  live = jnp.asarray(np.arange(ROWS) % 3 != 0)  # rows 0, 3, 6 sit the first turn out
  state = turn(params, state, forced, none, live)
  paused = np.asarray(state.length)[~np.asarray(live)]
  assert (paused == 0).all()
  state = turn(params, state, forced, jnp.asarray(np.arange(ROWS) % 2 * 3, jnp.int32), jnp.ones((ROWS,), bool))
  state = jax.device_get(state)
  sequence_mask = state.sequence_mask()
  want = _reference_log_probs(params, prompts, mask, state.responses, sequence_mask, sampling.temperature)
  sampled = np.asarray(state.loss_mask) > 0
  assert (np.asarray(state.loss_mask).sum(axis=1) < np.asarray(state.length)).any()  # forced tokens were taken
  np.testing.assert_allclose(np.asarray(state.log_probs)[sampled], want[sampled], atol=1e-5)


def test_serving_engine_samples_what_generate_samples_through_compaction():
  """Continuous batching with 3 slots and a short cache: rows are inserted at a shared column and the cache is shifted
  left (the token-id leaf moves, the running state does not)."""
  params, prompts, mask = _setup()
  sampling = _sampling()
  engine = Engine(None, sampling, model=TOY, max_concurrent_decodes=3, prefill_buckets=(PROMPT,), cache_length=14)
  prompt_lists = [np.asarray(p)[np.asarray(m) > 0].tolist() for p, m in zip(prompts, mask)]
  served = engine.serve(params, prompt_lists, seed=11)
  keys = jax.vmap(request_key, in_axes=(None, 0, None))(11, jnp.arange(ROWS), 0)
  run = jax.jit(functools.partial(generate, TOY, sampling=sampling))
  want = jax.device_get(run(params, prompt_ids_BxP=prompts, prompt_mask_BxP=mask, rng=keys))
  for row, result in enumerate(served):
    length = int(want["response_lengths"][row])
    assert result["token_ids"] == want["responses"][row, :length].tolist(), row
    np.testing.assert_allclose(result["log_probs"], want["rollout_log_probs"][row, :length], atol=1e-5)
