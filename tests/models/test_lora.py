"""LoRA adapters on the decoder (its layers' linears and, when named, the LM head): the parameter count the rank
implies, fresh adapters change nothing, merging equals applying, and the exports load in transformers (merged)
and in peft (adapters alone)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.models import Decoder, load_hf_config, load_hf_params, positions_from_mask, save_hf_checkpoint
from jaxrlhf.models.decoder import init_adapters, init_params, model_variables
from jaxrlhf.models.lora import (
  ATTENTION_TARGETS,
  EMBED_TARGET,
  HEAD_TARGET,
  LORA_TARGETS,
  MLP_TARGETS,
  VALUE_HEAD,
  count_adapter_params,
  critic_params_with,
  critic_trained,
  expected_adapter_params,
  merge_adapters,
  resolve_target_modules,
  save_peft_adapter,
  split_value_head,
)
from tests.models.hf_fixtures import build_model, hf_forward, left_padded_batch, save_model


def _lora_config(config, rank=4, targets=LORA_TARGETS, scan_layers=True):
  return dataclasses.replace(config, lora_rank=rank, lora_alpha=8.0, lora_targets=targets, scan_layers=scan_layers)


def _nudged(adapters, seed=1, scale=0.1):
  """Adapters away from their init (B = 0 there), so they change the model."""
  leaves, tree = jax.tree.flatten(adapters)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def _forward(model, variables, ids, mask):
  return model.apply(variables, jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))[0]


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize(
  "targets", [LORA_TARGETS, ("q_proj", "v_proj"), (EMBED_TARGET,) + LORA_TARGETS + (HEAD_TARGET,)]
)
def test_adapter_count_is_what_the_rank_implies(tiny_model_config, scan_layers, targets):
  config = _lora_config(tiny_model_config, rank=4, targets=targets, scan_layers=scan_layers)
  adapters, _ = init_adapters(Decoder(config), jax.random.key(0))
  D, F, L, r = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.lora_rank
  QH, KH = config.num_attention_heads * config.resolved_head_dim, config.num_key_value_heads * config.resolved_head_dim
  in_out = {
    "q_proj": D + QH,
    "k_proj": D + KH,
    "v_proj": D + KH,
    "o_proj": QH + D,
    "gate_proj": D + F,
    "up_proj": D + F,
    "down_proj": F + D,
  }
  # one embedding and one LM head, outside the layer stack
  outer = sum(r * (config.vocab_size + D) for name in (EMBED_TARGET, HEAD_TARGET) if name in targets)
  assert count_adapter_params(adapters) == L * r * sum(in_out[name] for name in targets if name in in_out) + outer
  # PEFT's init: B is zero, A is not; the reverse on the embedding
  for path, leaf in jax.tree_util.tree_leaves_with_path(adapters):
    name = jax.tree_util.keystr(path)
    assert leaf.dtype == jnp.float32
    zero = "lora_A" if EMBED_TARGET in name else "lora_B"
    assert (np.abs(np.asarray(leaf)).max() == 0) == (zero in name), name


def test_target_modules_keys():
  assert resolve_target_modules("all-linear") == LORA_TARGETS
  assert resolve_target_modules(["v_proj", "q_proj"]) == ("q_proj", "v_proj")
  assert resolve_target_modules("q_proj, v_proj") == ("q_proj", "v_proj")
  # PEFT's names for the input embedding and the output layer
  assert resolve_target_modules(["lm_head", "q_proj", "embed_tokens"]) == ("embed_tokens", "q_proj", "lm_head")
  with pytest.raises(ValueError, match="actor_rollout_ref.model.target_modules.*unknown: \\['wte'\\]"):
    resolve_target_modules(["wte"], "actor_rollout_ref.model.target_modules")


@pytest.mark.parametrize(
  "scan_layers,targets",
  [
    (True, LORA_TARGETS),
    (False, LORA_TARGETS),
    (True, (EMBED_TARGET,) + LORA_TARGETS + (HEAD_TARGET,)),
    (True, (HEAD_TARGET,)),
    (True, (EMBED_TARGET,)),
  ],
)
def test_fresh_adapters_are_the_base_and_merging_equals_applying(tiny_model_config, scan_layers, targets):
  config = _lora_config(tiny_model_config, targets=targets, scan_layers=scan_layers)
  model = Decoder(config)
  params, _ = init_params(model, jax.random.key(0))
  # The base's weights do not depend on whether the config has adapters.
  jax.tree.map(
    np.testing.assert_array_equal,
    params,
    init_params(Decoder(dataclasses.replace(config, lora_rank=0)), jax.random.key(0))[0],
  )
  adapters, _ = init_adapters(model, jax.random.key(1))
  ids, mask, _ = left_padded_batch(batch=2, length=10, pads=(0, 3))
  ids = ids % config.vocab_size
  base = _forward(model, {"params": params}, ids, mask)
  np.testing.assert_array_equal(_forward(model, model_variables(params, adapters), ids, mask), base)
  adapted = _forward(model, model_variables(params, _nudged(adapters)), ids, mask)
  assert np.abs(np.asarray(adapted - base)).max() > 1e-2
  merged = _forward(model, {"params": merge_adapters(params, _nudged(adapters), config.lora_alpha)}, ids, mask)
  np.testing.assert_allclose(merged, adapted, atol=1e-5, rtol=1e-5)


def test_bf16_base_with_fp32_adapters(tiny_model_config):
  config = dataclasses.replace(_lora_config(tiny_model_config), param_dtype="bfloat16", dtype="bfloat16")
  model = Decoder(config)
  adapters, _ = init_adapters(model, jax.random.key(1))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(adapters))
  params, _ = init_params(model, jax.random.key(0))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  ids = jnp.arange(8)[None] % config.vocab_size
  grads = jax.grad(lambda a: _forward(model, model_variables(params, a), ids, jnp.ones_like(ids)).sum())(
    _nudged(adapters)
  )
  assert all(x.dtype == jnp.float32 and np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(grads))


@pytest.mark.parametrize("scan_layers", [True, False])
def test_merged_export_loads_in_transformers_and_adapters_in_peft(tmp_path, scan_layers):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  peft = pytest.importorskip("peft")
  base_dir = save_model(build_model("qwen2_untied"), tmp_path / "base")
  targets = (EMBED_TARGET,) + LORA_TARGETS + (HEAD_TARGET,)
  config = _lora_config(load_hf_config(base_dir), rank=4, targets=targets, scan_layers=scan_layers)
  params = load_hf_params(base_dir, config)
  adapters = _nudged(init_adapters(Decoder(config), jax.random.key(3))[0], scale=0.2)
  ids, mask, positions = left_padded_batch()
  ours = np.asarray(_forward(Decoder(config), model_variables(params, adapters), ids, mask))

  merged_dir = str(tmp_path / "merged")
  save_hf_checkpoint(merge_adapters(params, adapters, config.lora_alpha), config, merged_dir, source_dir=base_dir)
  merged = transformers.AutoModelForCausalLM.from_pretrained(
    merged_dir, dtype=torch.float32, attn_implementation="eager"
  ).eval()
  valid = mask.astype(bool)
  np.testing.assert_allclose(hf_forward(merged, ids, mask, positions)[valid], ours[valid], atol=1e-4, rtol=1e-4)

  adapter_dir = save_peft_adapter(adapters, config, str(tmp_path / "adapter"), base_model_name_or_path=base_dir)
  base = transformers.AutoModelForCausalLM.from_pretrained(
    base_dir, dtype=torch.float32, attn_implementation="eager"
  ).eval()
  with_adapter = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
  loaded = {k: v for k, v in with_adapter.state_dict().items() if "lora_" in k}
  # every adapter was read (the embedding's and the LM head's too), none left at init
  assert len(loaded) == 2 * (config.num_hidden_layers * len(ATTENTION_TARGETS + MLP_TARGETS) + 2)
  for name in (f"base_model.model.{HEAD_TARGET}.lora_B", f"base_model.model.model.{EMBED_TARGET}.lora_embedding_A"):
    assert any(k.startswith(name) for k in loaded), (name, sorted(loaded))
  assert all(float(v.abs().max()) > 0 for k, v in loaded.items())
  np.testing.assert_allclose(hf_forward(with_adapter, ids, mask, positions)[valid], ours[valid], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_critic_trained_part_adapters_and_value_head(tiny_model_config, scan_layers):
  """A LoRA critic: adapters as the actor's (no LM head: the head is the value head), trained beside the value
  head; backbone + head with the adapters unmerged equals the merged params."""
  config = _lora_config(tiny_model_config, targets=(EMBED_TARGET,) + LORA_TARGETS, scan_layers=scan_layers)
  critic = Decoder(config, head="value")
  params, _ = init_params(critic, jax.random.key(0))
  trained = critic_trained(init_adapters(critic, jax.random.key(1))[0], params)
  backbone, head = split_value_head(params)
  assert VALUE_HEAD not in backbone and set(head[VALUE_HEAD]) == {"kernel", "bias"}
  assert count_adapter_params(trained) == expected_adapter_params(config) + config.hidden_size + 1
  ids, mask, _ = left_padded_batch(batch=2, length=10, pads=(0, 3))
  ids = ids % config.vocab_size
  np.testing.assert_array_equal(  # fresh adapters: the full critic
    _forward(critic, model_variables(critic_params_with(backbone, trained), trained["lora"]), ids, mask),
    _forward(critic, {"params": params}, ids, mask),
  )
  nudged = _nudged(trained)
  adapted = _forward(critic, model_variables(critic_params_with(backbone, nudged), nudged["lora"]), ids, mask)
  assert np.abs(np.asarray(adapted - _forward(critic, {"params": params}, ids, mask))).max() > 1e-2
  merged = _forward(critic, {"params": critic_params_with(backbone, nudged, config.lora_alpha)}, ids, mask)
  np.testing.assert_allclose(merged, adapted, atol=1e-5, rtol=1e-5)
