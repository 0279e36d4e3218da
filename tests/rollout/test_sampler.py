import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.models import Decoder, cast_floating, init_params, positions_from_mask
from jaxrlhf.models.attention import MASK_VALUE
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.rollout import SamplingParams, filter_logits, generate, greedy_tokens, token_log_probs

EOS = 3


@pytest.fixture(scope="module")
def setup(tiny_model_config):
  model = Decoder(tiny_model_config)
  params, _ = init_params(model, jax.random.key(0))
  apply_fn = decode_model(model)
  prompts = jax.random.randint(jax.random.key(1), (4, 6), 4, 64)
  mask = jnp.ones((4, 6), jnp.int32).at[1, :2].set(0).at[3, :5].set(0)
  prompts = jnp.where(mask > 0, prompts, 0)
  return model, params, apply_fn, prompts, mask


def _run(setup, sampling, seed=0):
  model, params, apply_fn, prompts, mask = setup
  fn = jax.jit(functools.partial(generate, apply_fn, sampling=sampling))
  return jax.device_get(fn(params, prompt_ids_BxP=prompts, prompt_mask_BxP=mask, rng=jax.random.key(seed)))


def _full_logits(setup, responses):
  model, params, _, prompts, mask = setup
  ids = jnp.concatenate([prompts, responses], axis=1)
  full_mask = jnp.concatenate([mask, jnp.ones_like(responses)], axis=1)
  logits = model.apply({"params": params}, ids, positions_from_mask(full_mask), full_mask)[0]
  return logits[:, prompts.shape[1] - 1 : -1]


def test_greedy_matches_step_by_step_argmax_of_full_forward(setup):
  out = _run(setup, SamplingParams(max_new_tokens=5, eos_token_ids=(999,), pad_token_id=0, do_sample=False))
  logits = _full_logits(setup, jnp.asarray(out["responses"]))
  np.testing.assert_array_equal(np.asarray(jnp.argmax(logits, -1)), out["responses"])
  assert out["response_mask"].all() and int(out["num_steps"]) == 5


def test_sampled_log_probs_equal_recomputed_training_log_probs(setup):
  sampling = SamplingParams(max_new_tokens=6, eos_token_ids=(EOS,), pad_token_id=0, temperature=0.7)
  out = _run(setup, sampling, seed=3)
  responses = jnp.asarray(out["responses"])
  recomputed = token_log_probs(_full_logits(setup, responses), responses, 0.7)
  mask = out["response_mask"] > 0
  np.testing.assert_allclose(np.asarray(recomputed)[mask], out["rollout_log_probs"][mask], atol=1e-5)


def test_eos_ends_the_response_mask_and_pads_after(setup):
  # Force EOS: make every token EOS-eligible by declaring all ids EOS for row-agnostic check.
  sampling = SamplingParams(max_new_tokens=6, eos_token_ids=tuple(range(64)), pad_token_id=0, temperature=1.0)
  out = _run(setup, sampling)
  np.testing.assert_array_equal(out["response_mask"], np.array([[1, 0, 0, 0, 0, 0]] * 4))
  assert (out["responses"][:, 1:] == 0).all() and int(out["num_steps"]) == 1  # early exit


def test_response_mask_includes_first_eos_only(setup):
  out = _run(setup, SamplingParams(max_new_tokens=8, eos_token_ids=(EOS,), pad_token_id=0, temperature=3.0), seed=7)
  for tokens, mask in zip(out["responses"], out["response_mask"]):
    hits = np.flatnonzero(tokens == EOS)
    expected_len = hits[0] + 1 if len(hits) else len(tokens)
    assert mask.sum() == expected_len and mask[:expected_len].all()


def test_top_k_one_is_greedy(setup):
  greedy = _run(setup, SamplingParams(max_new_tokens=4, eos_token_ids=(999,), pad_token_id=0, do_sample=False))
  top1 = _run(setup, SamplingParams(max_new_tokens=4, eos_token_ids=(999,), pad_token_id=0, top_k=1), seed=5)
  np.testing.assert_array_equal(greedy["responses"], top1["responses"])


def test_filter_logits_top_k_and_top_p():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  kept = lambda x: np.isfinite(np.asarray(x)) & (np.asarray(x) > MASK_VALUE / 2)
  np.testing.assert_array_equal(kept(filter_logits(logits, 2, 1.0)), [[True, True, False, False]])
  np.testing.assert_array_equal(kept(filter_logits(logits, -1, 0.7)), [[True, True, False, False]])
  np.testing.assert_array_equal(kept(filter_logits(logits, -1, 0.5)), [[True, False, False, False]])
  np.testing.assert_array_equal(kept(filter_logits(logits, -1, 0.81)), [[True, True, True, False]])


def test_greedy_tokens_is_argmax_with_first_index_on_ties():
  rng = np.random.RandomState(0)
  logits = rng.randint(-3, 4, (64, 50)).astype(np.float32)  # many ties
  logits[5] = 7.0  # a row that is all one value: index 0
  np.testing.assert_array_equal(np.asarray(greedy_tokens(jnp.asarray(logits))), np.argmax(logits, axis=-1))


def test_token_log_probs_equal_log_softmax_at_the_tokens():
  rng = np.random.RandomState(1)
  logits = rng.randn(3, 5, 40).astype(np.float32) * 4
  tokens = rng.randint(0, 40, (3, 5))
  z = logits / 0.7
  expected = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
  expected = np.take_along_axis(expected, tokens[..., None], axis=-1)[..., 0]
  np.testing.assert_allclose(
    np.asarray(token_log_probs(jnp.asarray(logits), jnp.asarray(tokens), 0.7)), expected, rtol=1e-6, atol=1e-5
  )


def test_bf16_generation_follows_fp32(setup):
  """rollout.dtype=bfloat16: weights cast once, matmuls accumulated in fp32; logits stay close to fp32's."""
  model, params, apply_fn, prompts, mask = setup
  bf16_model = Decoder(dataclasses.replace(model.config, dtype="bfloat16"))
  bf16_params = cast_floating(params, "bfloat16")
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(bf16_params))
  positions = positions_from_mask(mask)
  fp32_logits = model.apply({"params": params}, prompts, positions, mask)[0]
  bf16_logits = bf16_model.apply({"params": bf16_params}, prompts, positions, mask)[0]
  assert bf16_logits.dtype == jnp.float32
  valid = np.asarray(mask) > 0
  np.testing.assert_allclose(np.asarray(bf16_logits)[valid], np.asarray(fp32_logits)[valid], atol=0.05)
  bf16_apply = decode_model(bf16_model)
  sampling = SamplingParams(max_new_tokens=4, eos_token_ids=(999,), pad_token_id=0, do_sample=False)
  out = jax.jit(functools.partial(generate, bf16_apply, sampling=sampling))(
    bf16_params, prompt_ids_BxP=prompts, prompt_mask_BxP=mask, rng=jax.random.key(0)
  )
  assert out["responses"].shape == (4, 4) and np.asarray(out["response_mask"]).all()
  assert np.isfinite(np.asarray(out["rollout_log_probs"])).all()


def test_bf16_matmuls_accumulate_in_fp32():
  """A bf16 projection equals the fp32 product of the bf16-rounded operands, rounded once to bf16."""
  from jaxrlhf.models.projection import project

  rng = np.random.RandomState(2)
  x = jnp.asarray(rng.randn(4, 512), jnp.bfloat16)
  w = jnp.asarray(rng.randn(512, 16), jnp.bfloat16)
  out = project(x, w)
  assert out.dtype == jnp.bfloat16
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  # fp32 accumulation: at most one bf16 rounding away (bf16 accumulation over 512 terms drifts much further).
  np.testing.assert_allclose(np.asarray(out, np.float64), exact, rtol=2**-7, atol=1e-2)


@pytest.mark.parametrize("do_sample", [False, True])
def test_segmented_decode_equals_one_loop(setup, do_sample):
  """A decode split into loops over growing caches gives the same tokens, masks and log-probs."""
  base = SamplingParams(
    max_new_tokens=11, eos_token_ids=(EOS,), pad_token_id=0, temperature=0.8, do_sample=do_sample, decode_segments=1
  )
  one = _run(setup, base, seed=5)
  split = dataclasses.replace(base, decode_segments=3)
  assert split.segment_ends == [4, 7, 11]
  out = _run(setup, split, seed=5)
  for key in ("responses", "response_mask", "response_lengths", "num_steps"):
    np.testing.assert_array_equal(out[key], one[key])
  np.testing.assert_allclose(out["rollout_log_probs"], one["rollout_log_probs"], atol=1e-6)


def test_default_segments_follow_the_response_length():
  ends = lambda n: SamplingParams(max_new_tokens=n, eos_token_ids=(1,), pad_token_id=0).segment_ends
  assert ends(16) == [16] and ends(128) == [64, 128] and ends(1024) == [256, 512, 768, 1024]


@pytest.mark.parametrize("per_row_keys", [False, True])
def test_sampled_tokens_are_jax_categorical(per_row_keys):
  """`choose_tokens` (Gumbel noise + a first-index max) draws exactly `jax.random.categorical`'s tokens,
  top-k / top-p filtered logits included."""
  from jaxrlhf.rollout.sampler import choose_tokens

  logits_BxV = jax.random.normal(jax.random.key(3), (6, 50)) * 3
  sampling = SamplingParams(
    max_new_tokens=1, eos_token_ids=(0,), pad_token_id=0, do_sample=True, temperature=0.7, top_k=20, top_p=0.9
  )
  scaled_BxV = filter_logits(logits_BxV / 0.7, 20, 0.9)
  for seed in range(20):
    key = jax.random.split(jax.random.key(seed), 6) if per_row_keys else jax.random.key(seed)
    want = (
      jax.vmap(jax.random.categorical)(key, scaled_BxV)
      if per_row_keys
      else jax.random.categorical(key, scaled_BxV, axis=-1)
    )
    np.testing.assert_array_equal(np.asarray(choose_tokens(logits_BxV, key, sampling)), np.asarray(want))
