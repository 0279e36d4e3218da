"""Qwen3.5's hybrid layers (Gated DeltaNet + gated attention) against transformers, the oracle.

Tiny random configs that keep the real structure: two groups of three linear-attention layers and one full one, key
heads != value heads, a head dim that is not a power of two (20, partial RoPE over its first 6 dims), a chunk size
that prompt lengths are not multiples of. Logits of `Qwen3_5ForCausalLM` and of a `Qwen3_5ForConditionalGeneration`
checkpoint's text model; greedy generation token for token through the whole-batch rollout and `max_num_seqs` slots;
the rollout's log-probs against the training forward; export and reload.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxrlhf.models import Decoder, load_hf_config, load_hf_params, positions_from_mask, save_hf_checkpoint  # noqa: E402
from jaxrlhf.models.decoding import decode_model  # noqa: E402
from jaxrlhf.rollout import SamplingParams, generate, generate_in_slots, token_log_probs  # noqa: E402

VOCAB, PROMPT, NEW_TOKENS = 96, 13, 16
TEXT = dict(
  vocab_size=VOCAB,
  hidden_size=48,
  intermediate_size=64,
  num_hidden_layers=8,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=20,
  linear_num_key_heads=2,
  linear_num_value_heads=4,
  linear_key_head_dim=12,
  linear_value_head_dim=10,
  linear_conv_kernel_dim=4,
  max_position_embeddings=256,
)


def _randomise_norms(model):
  """Zero-centred norms start at 0 (a scale of 1): give them values, so that (1 + w) is tested."""
  with torch.no_grad():
    for name, param in model.named_parameters():
      if name.endswith("norm.weight") and "linear_attn" not in name:
        param.normal_(0.0, 0.2)
  return model


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory):
  torch.manual_seed(0)
  hf = _randomise_norms(transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**TEXT)).eval())
  path = str(tmp_path_factory.mktemp("qwen3_5"))
  hf.save_pretrained(path, safe_serialization=True)
  config = dataclasses.replace(load_hf_config(path), linear_chunk_size=8)
  return dict(hf=hf, path=path, config=config, params=load_hf_params(path, config))


def _batch(seed=0, rows=8, length=PROMPT):
  """Left-padded prompts of lengths 1..length, none a multiple of the chunk size 8 but one."""
  rng = np.random.RandomState(seed)
  lengths = np.array([length, 3, 9, 1, 11, 5, 7, 12])[:rows]
  mask = (np.arange(length)[None, :] >= length - lengths[:, None]).astype(np.int32)
  ids = np.where(mask > 0, rng.randint(1, VOCAB, (rows, length)), 0)
  return ids, mask


def _ours_logits(config, params, ids, mask):
  logits, _ = Decoder(config).apply(
    {"params": params}, jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
  )
  return np.asarray(logits)


def test_config_maps_the_hybrid_structure(causal_lm):
  config = causal_lm["config"]
  assert config.model_type == "qwen3_5_text"
  assert config.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + (
    "full_attention",
  )
  assert config.attn_output_gate and config.qk_norm and config.norm_offset
  assert config.partial_rotary_factor == 0.25 and config.rotary_dim == 5


def test_logits_match_transformers_on_left_padded_rows(causal_lm):
  ids, mask = _batch()
  with torch.no_grad():
    want = causal_lm["hf"](input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  got = _ours_logits(causal_lm["config"], causal_lm["params"], ids, mask)
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-4)


def test_conditional_generation_checkpoint_loads_its_text_model(tmp_path, caplog):
  torch.manual_seed(1)
  vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=48, patch_size=2)
  config = transformers.Qwen3_5Config(text_config=TEXT, vision_config=vision)
  hf = _randomise_norms(transformers.Qwen3_5ForConditionalGeneration(config).eval())
  hf.save_pretrained(str(tmp_path), safe_serialization=True)
  with caplog.at_level("INFO"):
    ours_config = load_hf_config(str(tmp_path))
    params = load_hf_params(str(tmp_path), ours_config)
  assert ours_config.model_type == "qwen3_5_text" and ours_config.layer_types[3] == "full_attention"
  assert "vision tower" in caplog.text
  ids, mask = _batch(seed=2)
  with torch.no_grad():
    want = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  np.testing.assert_allclose(_ours_logits(ours_config, params, ids, mask)[mask > 0], want[mask > 0], atol=1e-4)


@functools.cache
def _hf_greedy(path: str, seed: int):
  hf = transformers.Qwen3_5ForCausalLM.from_pretrained(path).eval()
  ids, mask = _batch(seed)
  generation = transformers.GenerationConfig(
    max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None
  )
  with torch.no_grad():
    out = hf.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), generation_config=generation)
  return out[:, PROMPT:].numpy()


@pytest.mark.parametrize("slots", [None, 3])
def test_greedy_generation_is_token_identical_to_transformers(causal_lm, slots):
  """With `max_num_seqs` slots rows enter mid-loop: their linear layers' state is inserted into a slot's row."""
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
  assert response_mask.sum() > 8
  np.testing.assert_allclose(
    np.asarray(out["rollout_log_probs"])[response_mask > 0], want[response_mask > 0], atol=1e-5
  )


def test_export_reloads_in_transformers_with_the_same_logits(causal_lm, tmp_path):
  save_hf_checkpoint(causal_lm["params"], causal_lm["config"], str(tmp_path))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert type(reloaded).__name__ == "Qwen3_5ForCausalLM"
  ids, mask = _batch(seed=5)
  with torch.no_grad():
    got = reloaded(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    want = causal_lm["hf"](input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-5)
  again = load_hf_params(str(tmp_path), causal_lm["config"])
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(causal_lm["params"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("actor_rollout_ref.model.use_remove_padding", True, "actor_rollout_ref.model.use_remove_padding=True packs"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 2, "ulysses_sequence_parallel_size=2 splits"),
  ],
)
def test_packing_and_ulysses_are_refused_for_the_recurrent_layers(key, value, message):
  """The delta rule's state runs along the whole row: packed sequences would share it, Ulysses would split it."""
  from jaxrlhf.config import ConfigError, load_config_file, resolve_config
  from jaxrlhf.trainer.program import model_configs

  config = load_config_file("configs/quickstart_qwen3_5.py")
  node = config
  *parents, leaf = key.split(".")
  for name in parents:
    node = node[name]
  node[leaf] = value
  with pytest.raises(ConfigError, match=message + ".*Gated DeltaNet"):
    model_configs(resolve_config(config))


def test_lora_on_every_linear_exports_peft_adapters_transformers_loads(causal_lm, tmp_path):
  """all-linear LoRA reaches the Gated DeltaNet projections (in_proj_qkv/z/b/a, out_proj) as well as attention and
  MLP; the PEFT file of the grouped stack loads onto transformers' model and gives our logits."""
  peft = pytest.importorskip("peft")
  from jaxrlhf.models.decoder import init_adapters, model_variables
  from jaxrlhf.models.lora import (
    LINEAR_ATTENTION_TARGETS,
    LORA_TARGETS,
    count_adapter_params,
    expected_adapter_params,
    save_peft_adapter,
  )

  config = dataclasses.replace(causal_lm["config"], lora_rank=4, lora_alpha=8.0, lora_targets=LORA_TARGETS)
  adapters = init_adapters(Decoder(config), jax.random.key(3))[0]
  leaves, treedef = jax.tree.flatten(adapters)
  keys = jax.random.split(jax.random.key(4), len(leaves))
  adapters = treedef.unflatten([x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])
  assert count_adapter_params(adapters) == expected_adapter_params(config)
  ids, mask = _batch(seed=5)
  variables = model_variables(causal_lm["params"], adapters)
  ours = np.asarray(
    Decoder(config).apply(variables, jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))[0]
  )

  adapter_dir = save_peft_adapter(adapters, config, str(tmp_path / "adapter"), causal_lm["path"])
  base = transformers.AutoModelForCausalLM.from_pretrained(causal_lm["path"], dtype=torch.float32).eval()
  with_adapter = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
  loaded = [k for k in with_adapter.state_dict() if "lora_A" in k]
  for name in LINEAR_ATTENTION_TARGETS:
    assert sum(f"linear_attn.{name}." in k for k in loaded) == 6, name  # the 6 linear layers of 8
  with torch.no_grad():
    want = with_adapter(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  valid = mask.astype(bool)
  np.testing.assert_allclose(ours[valid], want[valid], atol=1e-4, rtol=1e-4)
