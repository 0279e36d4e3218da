"""Gemma 3 (interleaved sliding and full attention) against transformers, the oracle.

A tiny random config that keeps the real layer pattern (five sliding layers per full one; 8 layers, not a multiple of
the period, as the 34-layer 4B), a window of 6 shorter than every test sequence, so the window matters, a linear RoPE
scaling on the full layers beside the sliding layers' own base, `query_pre_attn_scalar` != head_dim, and the
zero-centred norms given random values. Logits of `Gemma3ForCausalLM` and of a `Gemma3ForConditionalGeneration`
checkpoint's text model; greedy generation token for token, 32 tokens (26+ past the window), through the whole-batch
rollout and `max_num_seqs` slots; the rollout's log-probs against the training forward; export and reload; the value
and reward heads; LoRA through PEFT.
"""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxrlhf.models import Decoder, load_hf_config, load_hf_params, positions_from_mask, save_hf_checkpoint  # noqa: E402
from jaxrlhf.models.decoding import decode_model  # noqa: E402
from jaxrlhf.rollout import SamplingParams, generate, generate_in_slots, token_log_probs  # noqa: E402

VOCAB, PROMPT, NEW_TOKENS, WINDOW = 96, 13, 32, 6
TEXT = dict(
  vocab_size=VOCAB,
  hidden_size=48,
  intermediate_size=64,
  num_hidden_layers=8,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=16,
  query_pre_attn_scalar=20,
  sliding_window=WINDOW,
  max_position_embeddings=256,
  rope_scaling={"rope_type": "linear", "factor": 2.0},
  pad_token_id=0,
  bos_token_id=None,
  eos_token_id=None,
)


def _randomise_norms(model):
  """Zero-centred norms start at 0 (a scale of 1): give them values, so that (1 + w) is tested."""
  with torch.no_grad():
    for name, param in model.named_parameters():
      if name.endswith("norm.weight"):
        param.normal_(0.0, 0.3)
  return model


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory):
  torch.manual_seed(0)
  hf = _randomise_norms(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**TEXT)).eval())
  path = str(tmp_path_factory.mktemp("gemma3"))
  hf.save_pretrained(path, safe_serialization=True)
  config = load_hf_config(path)
  return dict(hf=hf, path=path, config=config, params=load_hf_params(path, config))


def _batch(seed=0, rows=8, length=PROMPT):
  """Left-padded prompts of lengths 1..length: most longer than the window."""
  rng = np.random.RandomState(seed)
  lengths = np.array([length, 3, 9, 1, 11, 7, 8, 12])[:rows]
  mask = (np.arange(length)[None, :] >= length - lengths[:, None]).astype(np.int32)
  ids = np.where(mask > 0, rng.randint(1, VOCAB, (rows, length)), 0)
  return ids, mask


def _ours_logits(config, params, ids, mask, head="lm"):
  logits, _ = Decoder(config, head=head).apply(
    {"params": params}, jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
  )
  return np.asarray(logits)


def _hf_logits(model, ids, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def test_config_maps_the_layer_kinds_and_both_ropes(causal_lm):
  config = causal_lm["config"]
  assert config.model_type == "gemma3_text"
  assert config.layer_types == ("sliding_attention",) * 5 + ("full_attention",) + ("sliding_attention",) * 2
  assert config.sliding_window == WINDOW and config.rope_local_base_freq == 10_000.0
  assert (config.rope_theta, config.rope_type, config.rope_factor) == (1_000_000.0, "linear", 2.0)
  assert config.qk_norm and config.norm_offset and config.sandwich_norms and config.embed_scale
  assert config.tie_word_embeddings and config.hidden_activation == "gelu_pytorch_tanh"
  assert config.query_pre_attn_scalar == 20


def test_v4_config_keys_read_as_v5_rope_parameters(causal_lm):
  """Released config.json files (transformers v4): rope_theta + rope_scaling (full layers), rope_local_base_freq,
  sliding_window_pattern instead of layer_types."""
  from jaxrlhf.models.hf_io import config_from_hf_dict

  with open(f"{causal_lm['path']}/config.json") as f:
    v5 = json.load(f)
  v4 = {k: v for k, v in v5.items() if k not in ("rope_parameters", "layer_types")}
  v4.update(
    rope_theta=1_000_000.0,
    rope_scaling={"rope_type": "linear", "factor": 2.0},
    rope_local_base_freq=10_000.0,
    sliding_window_pattern=6,
  )
  assert config_from_hf_dict(v4) == causal_lm["config"]


@pytest.mark.parametrize("scan_layers", [True, False])
def test_logits_match_transformers_on_left_padded_rows(causal_lm, scan_layers):
  from jaxrlhf.models.decoder import params_for

  ids, mask = _batch()
  config = dataclasses.replace(causal_lm["config"], scan_layers=scan_layers)
  got = _ours_logits(config, params_for(config, causal_lm["params"]), ids, mask)
  want = _hf_logits(causal_lm["hf"], ids, mask)
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-4)


def test_the_window_and_the_second_rope_matter(causal_lm):
  """Without the window (or with one RoPE for all layers) the logits differ: the test sequences reach past it."""
  ids, mask = _batch()
  config, params = causal_lm["config"], causal_lm["params"]
  want = _ours_logits(config, params, ids, mask)
  for change in (dict(sliding_window=64), dict(rope_local_base_freq=config.rope_theta)):
    other = _ours_logits(dataclasses.replace(config, **change), params, ids, mask)
    assert np.abs(other - want)[mask > 0].max() > 1e-2, change


def test_conditional_generation_checkpoint_loads_its_text_model(tmp_path, caplog):
  torch.manual_seed(1)
  vision = dict(
    hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
  )
  config = transformers.Gemma3Config(text_config=TEXT, vision_config=vision, mm_tokens_per_image=4)
  hf = _randomise_norms(transformers.Gemma3ForConditionalGeneration(config).eval())
  hf.save_pretrained(str(tmp_path), safe_serialization=True)
  with caplog.at_level("INFO"):
    ours_config = load_hf_config(str(tmp_path))
    params = load_hf_params(str(tmp_path), ours_config)
  assert ours_config.model_type == "gemma3_text" and ours_config.layer_types[5] == "full_attention"
  assert "vision tower" in caplog.text
  ids, mask = _batch(seed=2)
  want = _hf_logits(hf, ids, mask)
  np.testing.assert_allclose(_ours_logits(ours_config, params, ids, mask)[mask > 0], want[mask > 0], atol=1e-4)
  # Exported with the multimodal checkpoint as its source: a text model's config.json (no sub-configs).
  save_hf_checkpoint(params, ours_config, str(tmp_path / "out"), source_dir=str(tmp_path))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
  assert type(reloaded).__name__ == "Gemma3ForCausalLM"
  np.testing.assert_allclose(_hf_logits(reloaded, ids, mask)[mask > 0], want[mask > 0], atol=1e-4)


@functools.cache
def _hf_greedy(path: str, seed: int):
  hf = transformers.Gemma3ForCausalLM.from_pretrained(path).eval()
  ids, mask = _batch(seed)
  generation = transformers.GenerationConfig(
    max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None
  )
  with torch.no_grad():
    out = hf.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), generation_config=generation)
  return out[:, PROMPT:].numpy()


@pytest.mark.parametrize("slots", [None, 3])
def test_greedy_generation_is_token_identical_to_transformers(causal_lm, slots):
  """32 new tokens on 8 prompts: every row decodes 26+ tokens past the window, the sliding layers then attending to
  the last 6 columns only; with `max_num_seqs` slots rows enter mid-loop at other columns."""
  ids, mask = _batch(seed=3)
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(-1,), pad_token_id=0, do_sample=False)
  model = decode_model(Decoder(causal_lm["config"]))
  if slots is None:
    run = functools.partial(generate, model, sampling=sampling)
  else:
    run = functools.partial(generate_in_slots, model, sampling=sampling, slots=slots, shards=2)
  out = jax.jit(run)(causal_lm["params"], jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(out["responses"]), _hf_greedy(causal_lm["path"], 3))


def test_rollout_log_probs_equal_the_training_forward(causal_lm):
  ids, mask = _batch(seed=4)
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(5,), pad_token_id=0, temperature=0.7)
  config, params = causal_lm["config"], causal_lm["params"]
  out = jax.jit(functools.partial(generate, decode_model(Decoder(config)), sampling=sampling))(
    params, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(1)
  )
  responses, response_mask = np.asarray(out["responses"]), np.asarray(out["response_mask"])
  full_ids = np.concatenate([ids, responses], axis=1)
  full_mask = np.concatenate([mask, response_mask], axis=1)
  logits = _ours_logits(config, params, full_ids, full_mask)[:, PROMPT - 1 : -1]
  want = np.asarray(token_log_probs(jnp.asarray(logits), jnp.asarray(responses), 0.7))
  assert response_mask.sum() > 8 * WINDOW
  np.testing.assert_allclose(
    np.asarray(out["rollout_log_probs"])[response_mask > 0], want[response_mask > 0], atol=1e-5
  )


def test_export_reloads_in_transformers_with_the_same_logits(causal_lm, tmp_path):
  save_hf_checkpoint(causal_lm["params"], causal_lm["config"], str(tmp_path))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert type(reloaded).__name__ == "Gemma3ForCausalLM"
  assert reloaded.config.rope_parameters["full_attention"]["factor"] == 2.0
  ids, mask = _batch(seed=5)
  got, want = _hf_logits(reloaded, ids, mask), _hf_logits(causal_lm["hf"], ids, mask)
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-5)
  assert load_hf_config(str(tmp_path)) == causal_lm["config"]
  again = load_hf_params(str(tmp_path), causal_lm["config"])
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(causal_lm["params"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_critic_from_the_actor_checkpoint_and_its_export(causal_lm, tmp_path):
  """The value head: a fresh `score` on the actor's backbone (verl's critic), scores at every position; its export
  reloads as the same critic."""
  config = causal_lm["config"]
  critic = load_hf_params(causal_lm["path"], config, head="value", rng=jax.random.key(7))
  ids, mask = _batch(seed=6)
  values = _ours_logits(config, critic, ids, mask, head="value")
  assert values.shape == ids.shape and np.isfinite(values).all() and np.abs(values[mask > 0]).max() > 0
  save_hf_checkpoint(critic, config, str(tmp_path), head="value")
  again = load_hf_params(str(tmp_path), load_hf_config(str(tmp_path)), head="value")
  np.testing.assert_array_equal(_ours_logits(config, again, ids, mask, head="value"), values)


def test_reward_model_scores_are_transformers_sequence_classification(causal_lm, tmp_path):
  from jaxrlhf.models.decoder import reward_model_scores

  torch.manual_seed(2)
  hf = transformers.Gemma3TextForSequenceClassification(transformers.Gemma3TextConfig(**TEXT, num_labels=1))
  hf = _randomise_norms(hf.eval())
  hf.save_pretrained(str(tmp_path / "rm"), safe_serialization=True)
  config = load_hf_config(str(tmp_path / "rm"))
  params = load_hf_params(str(tmp_path / "rm"), config, head="reward")
  ids, mask = _batch(seed=7)
  got = np.asarray(reward_model_scores(Decoder(config, head="reward"), params, jnp.asarray(ids), jnp.asarray(mask)))
  np.testing.assert_allclose(got, _hf_logits(hf, ids, mask)[:, 0], atol=1e-4)
  save_hf_checkpoint(params, config, str(tmp_path / "out"), head="reward")
  reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "out")).eval()
  np.testing.assert_allclose(_hf_logits(reloaded, ids, mask)[:, 0], got, atol=1e-4)


def test_lora_on_attention_and_mlp_exports_peft_adapters_transformers_loads(causal_lm, tmp_path):
  peft = pytest.importorskip("peft")
  from jaxrlhf.models.decoder import init_adapters, model_variables
  from jaxrlhf.models.lora import LORA_TARGETS, count_adapter_params, expected_adapter_params, save_peft_adapter

  config = dataclasses.replace(causal_lm["config"], lora_rank=4, lora_alpha=8.0, lora_targets=LORA_TARGETS)
  adapters = init_adapters(Decoder(config), jax.random.key(3))[0]
  leaves, treedef = jax.tree.flatten(adapters)
  keys = jax.random.split(jax.random.key(4), len(leaves))
  adapters = treedef.unflatten([x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])
  assert count_adapter_params(adapters) == expected_adapter_params(config)
  ids, mask = _batch(seed=8)
  variables = model_variables(causal_lm["params"], adapters)
  ours = np.asarray(
    Decoder(config).apply(variables, jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))[0]
  )
  adapter_dir = save_peft_adapter(adapters, config, str(tmp_path / "adapter"), causal_lm["path"])
  base = transformers.AutoModelForCausalLM.from_pretrained(causal_lm["path"], dtype=torch.float32).eval()
  with_adapter = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
  loaded = [k for k in with_adapter.state_dict() if "lora_A" in k]
  for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
    assert sum(f".{name}." in k for k in loaded) == 8, name
  want = _hf_logits(with_adapter, ids, mask)
  np.testing.assert_allclose(ours[mask > 0], want[mask > 0], atol=1e-4, rtol=1e-4)


def test_softcapping_and_bidirectional_attention_are_refused(causal_lm):
  from jaxrlhf.errors import CheckpointError
  from jaxrlhf.models.hf_io import config_from_hf_dict

  with open(f"{causal_lm['path']}/config.json") as f:
    hf = json.load(f)
  for key, value, message in (
    ("final_logit_softcapping", 30.0, "final_logit_softcapping=30.0 is not supported"),
    ("attn_logit_softcapping", 50.0, "attn_logit_softcapping=50.0 is not supported"),
    ("use_bidirectional_attention", True, "use_bidirectional_attention=True is not supported"),
  ):
    with pytest.raises(CheckpointError, match=message):
      config_from_hf_dict({**hf, key: value})


# ----- the sliding layers' ring cache (`models/ring_cache.py`) ------------------------------------------------------


def test_sliding_layers_keep_a_ring_of_the_window(causal_lm):
  from jaxrlhf.models.decoder import cache_axes, init_cache

  config = causal_lm["config"]
  cache = jax.eval_shape(lambda: init_cache(config, 3, 200))
  assert cache["k"].shape == (1, 3, 2, 200, 16)  # the one full layer: the whole length
  assert cache["sliding_k"].shape == (7, 3, 2, WINDOW, 16)  # seven sliding layers: the window
  assert cache_axes(config)["sliding_v"][3] == "ring"
  full = jax.eval_shape(lambda: init_cache(dataclasses.replace(config, ring_kv_cache=False), 3, 200))
  assert set(full) == {"k", "v"} and full["k"].shape == (8, 3, 2, 200, 16)


@pytest.mark.parametrize("slots", [None, 3])
def test_the_ring_decodes_4x_the_window_as_the_whole_length_cache(causal_lm, slots):
  """Sampled at temperature 0.7, 32 tokens (over 4x the window of 6): the same tokens and log-probs as the sliding
  layers keeping every column."""
  ids, mask = _batch(seed=9)
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(-1,), pad_token_id=0, temperature=0.7)
  outputs = []
  for ring in (True, False):
    model = decode_model(Decoder(dataclasses.replace(causal_lm["config"], ring_kv_cache=ring)))
    if slots is None:
      run = functools.partial(generate, model, sampling=sampling)
    else:
      run = functools.partial(generate_in_slots, model, sampling=sampling, slots=slots, shards=2)
    outputs.append(jax.device_get(jax.jit(run)(causal_lm["params"], jnp.asarray(ids), jnp.asarray(mask), row_keys())))
  ring, full = outputs
  assert NEW_TOKENS >= 4 * WINDOW
  np.testing.assert_array_equal(ring["responses"], full["responses"])
  np.testing.assert_allclose(ring["rollout_log_probs"], full["rollout_log_probs"], atol=1e-5)


def row_keys(rows=8, seed=5):
  return jax.vmap(lambda i: jax.random.fold_in(jax.random.key(seed), i))(jnp.arange(rows))


def test_serving_engine_through_compaction_with_the_ring(causal_lm):
  """Continuous batching, 3 slots, a cache of 50 columns shifted left by 5 (no multiple of the window: the rings
  roll) each time it fills, prompts of up to 8 tokens prefilled in a bucket of 8 and padded to 13 (rolled): what
  `generate` samples."""
  from jaxrlhf.rollout import Engine, request_key

  config, params = causal_lm["config"], causal_lm["params"]
  ids, mask = _batch(seed=10)
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(-1,), pad_token_id=0, temperature=0.7)
  model = decode_model(Decoder(config))
  engine = Engine(config, sampling, model=model, max_concurrent_decodes=3, prefill_buckets=(8, PROMPT), cache_length=50)
  served = engine.serve(params, [row[m > 0].tolist() for row, m in zip(ids, mask)], seed=11)
  keys = jax.vmap(request_key, in_axes=(None, 0, None))(11, jnp.arange(len(ids)), 0)
  want = jax.device_get(
    jax.jit(functools.partial(generate, model, sampling=sampling))(params, jnp.asarray(ids), jnp.asarray(mask), keys)
  )
  for row, result in enumerate(served):
    assert result["token_ids"] == want["responses"][row].tolist(), row
    np.testing.assert_allclose(result["log_probs"], want["rollout_log_probs"][row], atol=1e-5)


def test_turns_with_paused_rows_and_forced_tokens_with_the_ring(causal_lm):
  """Multi-turn: some rows sit the first turn out (their columns advance unwritten) and every row then takes forced
  tokens: the ring gives the whole-length cache's tokens and log-probs."""
  from jaxrlhf.rollout.turns import run_turn, start_turns

  ids, mask = _batch(seed=11)
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(5,), pad_token_id=0, temperature=0.7)
  forced = jnp.asarray(np.tile(np.array([[7, 9, 11, 13, 0]], np.int32), (8, 1)))
  results = []
  for ring in (True, False):
    model = decode_model(Decoder(dataclasses.replace(causal_lm["config"], ring_kv_cache=ring)))
    state = jax.jit(functools.partial(start_turns, model, sampling=sampling))(
      causal_lm["params"], prompt_ids_NxP=jnp.asarray(ids), prompt_mask_NxP=jnp.asarray(mask), rng=row_keys()
    )
    turn = jax.jit(functools.partial(run_turn, model, sampling=sampling))
    state = turn(causal_lm["params"], state, forced, jnp.zeros((8,), jnp.int32), jnp.asarray(np.arange(8) % 3 != 0))
    state = turn(causal_lm["params"], state, forced, jnp.full((8,), 4, jnp.int32), jnp.ones((8,), bool))
    results.append(jax.device_get((state.responses, state.log_probs, state.length)))
  (responses, log_probs, length), (want_responses, want_log_probs, want_length) = results
  assert length.max() > 4 * WINDOW
  np.testing.assert_array_equal(length, want_length)
  np.testing.assert_array_equal(responses, want_responses)
  np.testing.assert_allclose(log_probs, want_log_probs, atol=1e-5)
