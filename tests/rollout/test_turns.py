"""Multi-turn generation on device (`rollout/turns.py`): a row that takes no forced tokens samples what single-turn
generation samples; forced tokens enter the sequence with loss mask 0; the sampled tokens' log-probs across turns
equal the training forward's over the whole sequence (fp32)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf.models import Decoder, init_params, positions_from_mask
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.rollout import SamplingParams, generate_in_slots, token_log_probs
from jaxrlhf.rollout.turns import run_turn, start_turns
from tests.helpers import tiny_fp32_model

MODEL = tiny_fp32_model()
ROWS, PROMPT, RESPONSE, FORCED = 8, 6, 16, 5
EOS = (3, 5, 7, 9)
SAMPLING = SamplingParams(max_new_tokens=RESPONSE, eos_token_ids=EOS, pad_token_id=0, temperature=0.9)


@functools.cache
def _setup():
  model = Decoder(MODEL)
  params, _ = init_params(model, jax.random.key(0))
  apply_fn = decode_model(model)
  mask = jnp.ones((ROWS, PROMPT), jnp.int32).at[1, :2].set(0).at[3, :5].set(0)
  prompts = jnp.where(mask > 0, jax.random.randint(jax.random.key(1), (ROWS, PROMPT), 10, 64), 0)
  start = jax.jit(functools.partial(start_turns, apply_fn, sampling=SAMPLING))
  turn = jax.jit(functools.partial(run_turn, apply_fn, sampling=SAMPLING))
  return model, params, apply_fn, prompts, mask, start, turn


def _trajectories(forced_rows, turns=3):
  """Turns of every row; after each turn the rows in `forced_rows` (still under budget) take FORCED tokens."""
  model, params, _, prompts, mask, start, turn = _setup()
  state = start(params, prompt_ids_NxP=prompts, prompt_mask_NxP=mask, rng=jax.random.key(7))
  forced = jnp.broadcast_to(jnp.arange(40, 40 + FORCED, dtype=jnp.int32), (ROWS, FORCED))
  live = np.ones(ROWS, bool)
  forced_len = np.zeros(ROWS, np.int32)
  for _ in range(turns):
    state = turn(params, state, forced, forced_len, live)
    length = np.asarray(state.length)
    live = np.isin(np.arange(ROWS), forced_rows) & (length < RESPONSE)
    forced_len = np.where(live, np.minimum(FORCED, RESPONSE - length), 0).astype(np.int32)
  return jax.device_get(state)


def test_a_row_without_forced_tokens_samples_as_single_turn_generation():
  _, params, apply_fn, prompts, mask, _, _ = _setup()
  want = jax.device_get(
    jax.jit(functools.partial(generate_in_slots, apply_fn, sampling=SAMPLING, slots=ROWS))(
      params, prompt_ids_NxP=prompts, prompt_mask_NxP=mask, rng=jax.random.key(7)
    )
  )
  got = _trajectories(forced_rows=())
  np.testing.assert_array_equal(got.responses, want["responses"])
  np.testing.assert_array_equal(got.loss_mask, want["response_mask"])
  np.testing.assert_array_equal(got.length, want["response_lengths"])
  np.testing.assert_array_equal(got.log_probs, want["rollout_log_probs"])
  assert len(set(got.length.tolist())) >= 3  # EOS spread over the batch


def test_forced_tokens_enter_the_sequence_out_of_the_loss():
  got = _trajectories(forced_rows=(0, 2, 4, 6))
  plain = _trajectories(forced_rows=())
  for row in range(ROWS):
    mask, length = got.loss_mask[row], got.length[row]
    if row % 2:  # no forced tokens: as before
      np.testing.assert_array_equal(got.responses[row], plain.responses[row])
      continue
    first_end = plain.length[row]
    np.testing.assert_array_equal(got.responses[row, :first_end], plain.responses[row, :first_end])
    # Forced tokens follow each turn's end (or fill what is left of the budget) and are never in the loss.
    forced_cols = np.flatnonzero((got.responses[row] >= 40) & (got.responses[row] < 40 + FORCED) & (mask == 0))
    if first_end < RESPONSE:
      assert forced_cols[0] == first_end
      np.testing.assert_array_equal(
        got.responses[row, first_end : first_end + FORCED], np.arange(40, 40 + FORCED)[: RESPONSE - first_end]
      )
    assert (got.log_probs[row][mask == 0] == 0).all()
    assert (got.responses[row, length:] == 0).all() and (mask[length:] == 0).all()
  assert (got.loss_mask.sum(axis=1) < got.length).any()


def test_log_probs_across_turns_equal_the_training_forward():
  model, params, _, prompts, mask, _, _ = _setup()
  got = _trajectories(forced_rows=tuple(range(ROWS)))
  responses = jnp.asarray(got.responses)
  ids = jnp.concatenate([prompts, responses], axis=1)
  full_mask = jnp.concatenate([mask, jnp.ones_like(responses)], axis=1)
  logits = model.apply({"params": params}, ids, positions_from_mask(full_mask), full_mask)[0][:, PROMPT - 1 : -1]
  recomputed = np.asarray(token_log_probs(logits, responses, 0.9))
  sampled = got.loss_mask > 0
  assert (got.loss_mask.sum(axis=1) < got.length).sum() >= 4  # rows with forced tokens between sampled ones
  np.testing.assert_allclose(recomputed[sampled], got.log_probs[sampled], atol=1e-5)
