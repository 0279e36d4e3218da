"""Greedy generation is token-identical to HF transformers `generate`; log-probs equal the training forward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.models import Decoder, load_hf_config, load_hf_params, positions_from_mask
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.rollout import SamplingParams, generate, token_log_probs
from tests.models import hf_fixtures

NEW_TOKENS = 64


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
  torch = pytest.importorskip("torch")
  hf_model = hf_fixtures.build_model("qwen2_untied", seed=3)
  path = hf_fixtures.save_model(hf_model, tmp_path_factory.mktemp("qwen2"))
  config = load_hf_config(path)
  model = Decoder(config)
  params = load_hf_params(path, config)
  apply_fn = decode_model(model)
  ids, mask, _ = hf_fixtures.left_padded_batch(seed=5, batch=3, length=12, pads=(0, 3, 7), low=2)
  return torch, hf_model, model, params, apply_fn, ids, mask


_compiled = {}


def _ours(qwen2, sampling, seed=0):
  _, _, model, params, apply_fn, ids, mask = qwen2
  if sampling not in _compiled:
    _compiled[sampling] = jax.jit(functools.partial(generate, apply_fn, sampling=sampling))
  fn = _compiled[sampling]
  return jax.device_get(
    fn(params, prompt_ids_BxP=jnp.asarray(ids), prompt_mask_BxP=jnp.asarray(mask), rng=jax.random.key(seed))
  )


def _hf(qwen2, eos_token_id):
  torch, hf_model, *_, ids, mask = qwen2
  with torch.no_grad():
    out = hf_model.generate(
      torch.tensor(ids, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
      max_new_tokens=NEW_TOKENS,
      do_sample=False,
      pad_token_id=0,
      eos_token_id=eos_token_id,
    )
  return out[:, ids.shape[1] :].numpy()


def test_greedy_is_token_identical_to_hf_for_64_tokens(qwen2):
  ours = _ours(
    qwen2,
    SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(hf_fixtures.VOCAB + 1,), pad_token_id=0, do_sample=False),
  )
  np.testing.assert_array_equal(ours["responses"], _hf(qwen2, None))
  assert ours["response_mask"].all() and (ours["response_lengths"] == NEW_TOKENS).all()
  assert int(ours["num_steps"]) == NEW_TOKENS


def test_greedy_with_eos_inside_matches_hf_with_right_masks_and_lengths(qwen2):
  free_run = _ours(
    qwen2,
    SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(hf_fixtures.VOCAB + 1,), pad_token_id=0, do_sample=False),
  )["responses"]
  # An EOS that row 0 first emits mid-way; other rows may stop on it too, or run to the end.
  eos = next(int(t) for i, t in enumerate(free_run[0]) if 5 <= i and t not in free_run[0][:i] and t != 0)
  ours = _ours(qwen2, SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(eos,), pad_token_id=0, do_sample=False))
  hf = _hf(qwen2, eos)
  np.testing.assert_array_equal(ours["responses"][:, : hf.shape[1]], hf)
  assert (ours["responses"][:, hf.shape[1] :] == 0).all()
  for row in range(3):
    hits = np.flatnonzero(free_run[row] == eos)
    expected = hits[0] + 1 if len(hits) else NEW_TOKENS
    assert ours["response_lengths"][row] == expected
    np.testing.assert_array_equal(ours["response_mask"][row], np.arange(NEW_TOKENS) < expected)
  assert ours["response_lengths"][0] < NEW_TOKENS
  assert int(ours["num_steps"]) == ours["response_lengths"].max()


@pytest.mark.parametrize("top_k,top_p", [(-1, 1.0), (5, 0.9)])
def test_rollout_log_probs_equal_training_forward(qwen2, top_k, top_p):
  _, _, model, params, _, ids, mask = qwen2
  sampling = SamplingParams(
    max_new_tokens=16, eos_token_ids=(7,), pad_token_id=0, temperature=0.8, top_k=top_k, top_p=top_p
  )
  out = _ours(qwen2, sampling, seed=11)
  responses = jnp.asarray(out["responses"])
  full_ids = jnp.concatenate([jnp.asarray(ids), responses], axis=1)
  full_mask = jnp.concatenate([jnp.asarray(mask), jnp.asarray(out["response_mask"])], axis=1)
  logits = jax.jit(lambda p, i, m: model.apply({"params": p}, i, positions_from_mask(m), m)[0])(
    params, full_ids, full_mask
  )
  recomputed = np.asarray(token_log_probs(logits[:, ids.shape[1] - 1 : -1], responses, sampling.temperature))
  valid = out["response_mask"] > 0
  assert valid.sum() > 16
  np.testing.assert_allclose(out["rollout_log_probs"][valid], recomputed[valid], atol=1e-5, rtol=0)
  assert (out["rollout_log_probs"][~valid] == 0).all()
