"""Partial rollouts (`rollout/partial.py`): with the weights unchanged, a row carried across steps samples exactly
the tokens it samples when its batch decodes to the end in slots (`generate_in_slots`, same per-row keys), whichever
step trains it; groups leave the pool oldest first, only when whole; `stop="all"` is one-step-off."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf.models import Decoder, init_params
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.rollout import SamplingParams, generate_in_slots
from jaxrlhf.rollout import partial as pr
from tests.helpers import tiny_fp32_model

MODEL = tiny_fp32_model()
BATCH, N, PROMPT, RESPONSE, SLOTS = 3, 2, 5, 12, 3
EOS = (3, 5, 7, 9)
SAMPLING = SamplingParams(
  max_new_tokens=RESPONSE, eos_token_ids=EOS, pad_token_id=0, temperature=0.9, do_sample=True, decode_segments=1
)


@functools.cache
def _setup():
  model = decode_model(Decoder(MODEL))
  params, _ = init_params(Decoder(MODEL), jax.random.key(0))
  batches = []
  for b in range(4):
    mask = jnp.ones((BATCH, PROMPT), jnp.int32).at[1, :2].set(0)
    ids = jnp.where(mask > 0, jax.random.randint(jax.random.key(10 + b), (BATCH, PROMPT), 12, 64), 0)
    batches.append((ids, mask, jnp.arange(BATCH, dtype=jnp.int32) + BATCH * b))
  return model, params, batches


@functools.cache
def _run(stop: str, steps: int = 3):
  """A pool of two batches of groups (one warm-up batch) run for `steps` steps; each step's trained rows."""
  model, params, batches = _setup()
  pool = pr.empty_pool(
    model, groups=2 * BATCH, n=N, prompt_len=PROMPT, response_len=RESPONSE, slots=SLOTS, pad_token_id=0
  )
  rng = jax.random.key(7)

  @jax.jit
  def one_step(pool, batch, step):
    pool = pr.admit(pool, *batch, step, 0)
    pool, loop_steps, busy = pr.decode_pool(model, params, pool, rng, SAMPLING, step=step, need=BATCH, stop=stop)
    pool, taken = pr.take_trainable(pool, step, BATCH)
    return pool, taken, loop_steps, busy

  pool = jax.jit(pr.admit, static_argnums=5)(pool, *batches[0], 0, 0)
  out = []
  for step in range(steps):
    pool, taken, loop_steps, busy = one_step(pool, batches[step + 1], jnp.int32(step))
    out.append((jax.device_get(taken), int(loop_steps), int(busy)))
  return out


@functools.cache
def _reference():
  """Every batch decoded to the end in slots, with the keys the pool gives its rows (admission order x n + j)."""
  model, params, batches = _setup()
  ids = jnp.concatenate([jnp.repeat(b[0], N, axis=0) for b in batches])
  mask = jnp.concatenate([jnp.repeat(b[1], N, axis=0) for b in batches])
  keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.key(7), r))(jnp.arange(ids.shape[0]))
  out = generate_in_slots(model, params, ids, mask, keys, SAMPLING, slots=SLOTS)
  return jax.device_get(out)


def test_carried_rows_sample_what_they_sample_uncut():
  reference = _reference()
  seen = 0
  for taken, _, _ in _run("enough"):
    for i, sample in enumerate(taken["sample_index"]):
      row = int(sample) * N + i % N  # sample_index is the admission order here
      np.testing.assert_array_equal(taken["responses"][i], reference["responses"][row])
      np.testing.assert_array_equal(taken["response_mask"][i], reference["response_mask"][row])
      np.testing.assert_allclose(taken["rollout_log_probs"][i], reference["rollout_log_probs"][row], atol=1e-6)
      seen += 1
  assert seen == 3 * BATCH * N


def test_groups_train_whole_and_oldest_first():
  runs = _run("enough")
  trained = [list(t["sample_index"][::N]) for t, _, _ in runs]
  flat = [s for step in trained for s in step]
  assert len(set(flat)) == len(flat)  # no group trained twice
  for taken, _, _ in runs:
    # Both rows of a group are in the batch, side by side, and every trained row ended (EOS or the limit).
    np.testing.assert_array_equal(taken["sample_index"][::N], taken["sample_index"][1::N])
    lengths = taken["response_mask"].sum(axis=1)
    last = taken["responses"][np.arange(len(lengths)), np.maximum(lengths - 1, 0)]
    assert all(n == RESPONSE or t in EOS for n, t in zip(lengths, last))
  # Some row was carried into a later step (so staleness > 0 once).
  assert max(int(t["staleness"].max()) for t, _, _ in runs) >= 1


def test_partial_stops_early_and_one_step_off_trains_the_previous_batch():
  partial, off = _run("enough"), _run("all")
  # One-step-off: step k trains batch k (admitted the step before), generated whole under one set of weights.
  for step, (taken, _, _) in enumerate(off):
    np.testing.assert_array_equal(sorted(set(taken["sample_index"])), np.arange(BATCH) + BATCH * step)
    assert (taken["staleness"] == (0 if step == 0 else 1)).all()
  assert sum(s for _, s, _ in partial) < sum(s for _, s, _ in off)


def test_drop_restarts_a_stale_group():
  model, params, batches = _setup()
  pool = pr.empty_pool(model, groups=2, n=N, prompt_len=PROMPT, response_len=RESPONSE, slots=SLOTS, pad_token_id=0)
  pool = pr.admit(pool, batches[0][0][:2], batches[0][1][:2], batches[0][2][:2], 0, 0)
  pool, _, _ = pr.decode_pool(model, params, pool, jax.random.key(0), SAMPLING, step=0, need=2, stop="all")
  assert bool(pool.group_done().all())
  # At step 3 a group admitted at step 0 spans 4 versions: past a threshold of 2 both start again.
  pool, dropped = pr.drop_stale(pool, 3, 2, 0)
  assert int(dropped) == 2
  assert (np.asarray(pool.status) == pr.WAITING).all() and (np.asarray(pool.admitted) == 3).all()
  assert int(pool.responses.loss_mask.sum()) == 0


def test_wait_finishes_groups_at_the_threshold_before_the_step_ends():
  """`wait` with a threshold of 1: every admitted group spans a version already, so the step waits for all of them
  (where `enough` alone stops once BATCH groups are trainable)."""
  model, params, batches = _setup()
  pool = pr.empty_pool(
    model, groups=2 * BATCH, n=N, prompt_len=PROMPT, response_len=RESPONSE, slots=SLOTS, pad_token_id=0
  )
  pool = pr.admit(pool, *batches[0], 0, 0)
  pool = pr.admit(pool, *batches[1], 0, 0)
  pool, _, _ = pr.decode_pool(
    model, params, pool, jax.random.key(7), SAMPLING, step=0, need=1, threshold=1, strategy="wait"
  )
  assert bool(pool.group_done().all())
