"""Parity with transformers (torch CPU) on tiny random checkpoints, and the export round trip.

For each variant: full-sequence logits with left padding, step-by-step cached decode, 32 greedy tokens
against `generate`, and load -> export -> `from_pretrained` -> the same logits.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxrlhf.models import (  # noqa: E402
  Decoder,
  hf_state_dict,
  init_cache,
  load_hf_config,
  load_hf_params,
  positions_from_mask,
  save_hf_checkpoint,
)
from jaxrlhf.models.decoding import decode_model  # noqa: E402
from jaxrlhf.rollout import SamplingParams, generate  # noqa: E402
from tests.models.hf_fixtures import VARIANTS, build_model, hf_forward, left_padded_batch, save_model  # noqa: E402

GREEDY_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request, tmp_path_factory):
  variant = request.param
  hf_model = build_model(variant)
  path = save_model(hf_model, tmp_path_factory.mktemp(variant))
  config = load_hf_config(path)
  params = load_hf_params(path, config)
  model = Decoder(config)
  forward = jax.jit(lambda p, ids, mask: model.apply({"params": p}, ids, positions_from_mask(mask), mask)[0])
  return dict(variant=variant, hf_model=hf_model, path=path, config=config, params=params, model=model, forward=forward)


def test_config_switches_follow_the_checkpoint(checkpoint):
  config, variant = checkpoint["config"], checkpoint["variant"]
  assert config.model_type == variant.split("_")[0].replace("llama3", "llama")
  assert config.qk_norm == (variant == "qwen3")
  assert config.qkv_bias == (variant in ("llama", "qwen2_tied", "qwen2_untied"))
  assert config.tie_word_embeddings == (variant in ("llama3_rope", "qwen2_tied"))
  assert ("lm_head" in checkpoint["params"]) != config.tie_word_embeddings
  if variant == "llama3_rope":
    assert (config.rope_type, config.rope_factor, config.rope_original_max_position_embeddings) == ("llama3", 8.0, 64)
  if variant == "qwen3":
    assert config.head_dim == 16 and "q_norm" in checkpoint["params"]["layers"]["self_attn"]
  if variant == "mistral":
    assert config.sliding_window == 7


def test_left_padded_logits_match(checkpoint):
  ids, mask, positions = left_padded_batch(seed=1)
  expected = hf_forward(checkpoint["hf_model"], ids, mask, positions)
  ours = np.asarray(checkpoint["forward"](checkpoint["params"], ids, mask))
  valid = mask.astype(bool)
  assert np.abs(ours - expected)[valid].max() <= 1e-4
  assert np.abs(expected[valid]).max() > 0.1  # the comparison is not between near-zero logits


def test_cached_decode_matches_step_by_step(checkpoint):
  config, model, params = checkpoint["config"], checkpoint["model"], checkpoint["params"]
  prompt_len = 6
  ids, mask, positions = left_padded_batch(seed=2, length=14, pads=(0, 2, 5))
  expected = hf_forward(checkpoint["hf_model"], ids, mask, positions)
  batch, total = ids.shape

  @functools.partial(jax.jit, donate_argnums=(4,))
  def step(params, ids_BxL, positions_BxL, kv_mask_BxS, cache, index):
    return model.apply({"params": params}, ids_BxL, positions_BxL, kv_mask_BxS, cache, index)

  kv_mask = np.concatenate([mask[:, :prompt_len], np.zeros((batch, total - prompt_len), np.int32)], axis=1)
  logits, cache = step(
    params, ids[:, :prompt_len], positions[:, :prompt_len], kv_mask, init_cache(config, batch, total), jnp.int32(0)
  )
  pieces = [np.asarray(logits)]
  for t in range(prompt_len, total):
    kv_mask[:, t] = 1
    logits, cache = step(params, ids[:, t : t + 1], positions[:, t : t + 1], kv_mask, cache, jnp.int32(t))
    pieces.append(np.asarray(logits))
  incremental = np.concatenate(pieces, axis=1)
  assert np.abs(incremental - expected)[mask.astype(bool)].max() <= 1e-4


def test_greedy_generation_is_token_identical(checkpoint):
  model = checkpoint["model"]
  ids, mask, _ = left_padded_batch(seed=3, length=8, pads=(0, 3, 5))
  sampling = SamplingParams(max_new_tokens=GREEDY_TOKENS, eos_token_ids=(-1,), pad_token_id=0, do_sample=False)
  ours = jax.jit(lambda p, i, m: generate(decode_model(model), p, i, m, jax.random.key(0), sampling)["responses"])(
    checkpoint["params"], ids, mask
  )
  generation_config = transformers.GenerationConfig(
    do_sample=False,
    num_beams=1,
    max_new_tokens=GREEDY_TOKENS,
    min_new_tokens=GREEDY_TOKENS,
    eos_token_id=None,
    pad_token_id=0,
  )
  with torch.no_grad():
    hf_tokens = checkpoint["hf_model"].generate(
      input_ids=torch.tensor(ids, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
      generation_config=generation_config,
    )
  np.testing.assert_array_equal(np.asarray(ours), hf_tokens[:, ids.shape[1] :].numpy())


def test_export_round_trip(checkpoint, tmp_path):
  out = save_hf_checkpoint(
    checkpoint["params"], checkpoint["config"], str(tmp_path / "export"), source_dir=checkpoint["path"]
  )
  # The exported tensors are the source's, bit for bit.
  original = checkpoint["hf_model"].state_dict()
  exported = hf_state_dict(checkpoint["params"], checkpoint["config"])
  for name, array in exported.items():
    np.testing.assert_array_equal(array, original[name].numpy(), err_msg=name)

  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
  ids, mask, positions = left_padded_batch(seed=4)
  ours = np.asarray(checkpoint["forward"](checkpoint["params"], ids, mask))
  valid = mask.astype(bool)
  assert np.abs(hf_forward(reloaded, ids, mask, positions) - ours)[valid].max() <= 1e-5
  # ... and the export loads back into the same config.
  assert load_hf_config(out) == checkpoint["config"]
