"""Mixture-of-experts models (Qwen3-MoE, Qwen3.5-MoE) against transformers, the oracle; the grouped matmul against a
dense per-expert reference; the load-balancing loss against HF's `load_balancing_loss_func`.

Tiny random configs that keep the real structure: 8 experts, top-2 (Qwen3-MoE, `norm_topk_prob` both ways) and top-3
with a shared expert and the hybrid layers (Qwen3.5-MoE), in fp32 (logits within 1e-4).
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
from jaxrlhf.models.moe import grouped_swiglu, load_balancing_loss, route, router_stats  # noqa: E402
from jaxrlhf.rollout import SamplingParams, generate, generate_in_slots, token_log_probs  # noqa: E402

VOCAB, PROMPT, NEW_TOKENS = 96, 13, 16
QWEN3_MOE = dict(
  vocab_size=VOCAB,
  hidden_size=32,
  intermediate_size=48,
  moe_intermediate_size=24,
  num_hidden_layers=3,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=12,
  num_experts=8,
  num_experts_per_tok=2,
  norm_topk_prob=True,
  max_position_embeddings=256,
)
QWEN3_5_MOE = dict(
  vocab_size=VOCAB,
  hidden_size=32,
  moe_intermediate_size=24,
  shared_expert_intermediate_size=40,
  num_hidden_layers=4,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=20,
  linear_num_key_heads=2,
  linear_num_value_heads=4,
  linear_key_head_dim=12,
  linear_value_head_dim=10,
  linear_conv_kernel_dim=4,
  num_experts=8,
  num_experts_per_tok=3,
  max_position_embeddings=256,
)


def _batch(seed=0, rows=8, length=PROMPT):
  rng = np.random.RandomState(seed)
  lengths = np.array([length, 3, 9, 1, 11, 5, 7, 12])[:rows]
  mask = (np.arange(length)[None, :] >= length - lengths[:, None]).astype(np.int32)
  ids = np.where(mask > 0, rng.randint(1, VOCAB, (rows, length)), 0)
  return ids, mask


def _randomise(model, zero_centred_norms: bool):
  """Routers start at zero in transformers (every expert tied); norms at 1 (or 0, zero-centred): give them values."""
  with torch.no_grad():
    for name, param in model.named_parameters():
      if name.endswith("mlp.gate.weight"):
        param.normal_(0.0, 0.5)
      elif zero_centred_norms and name.endswith("norm.weight") and "linear_attn" not in name:
        param.normal_(0.0, 0.2)
  return model


def _family(tmp_path_factory, name, hf_class, hf_config, chunk=None):
  torch.manual_seed(0)
  hf = _randomise(hf_class(hf_config).eval(), zero_centred_norms=chunk is not None)
  path = str(tmp_path_factory.mktemp(name))
  hf.save_pretrained(path, safe_serialization=True)
  config = load_hf_config(path)
  if chunk:
    config = dataclasses.replace(config, linear_chunk_size=chunk)
  return dict(hf=hf, hf_class=hf_class, path=path, config=config, params=load_hf_params(path, config))


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3_5_moe"])
def family(request, tmp_path_factory):
  if request.param == "qwen3_moe":
    config = transformers.Qwen3MoeConfig(**QWEN3_MOE)
    return _family(tmp_path_factory, "qwen3_moe", transformers.Qwen3MoeForCausalLM, config)
  config = transformers.Qwen3_5MoeTextConfig(**QWEN3_5_MOE)
  return _family(tmp_path_factory, "qwen3_5_moe", transformers.Qwen3_5MoeForCausalLM, config, chunk=8)


def _ours_logits(config, params, ids, mask):
  logits, _ = Decoder(config).apply(
    {"params": params}, jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
  )
  return np.asarray(logits)


def _hf_logits(hf, ids, mask, **kwargs):
  with torch.no_grad():
    return hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), **kwargs)


def test_config_maps_the_experts(family):
  config = family["config"]
  assert config.num_experts == 8 and config.num_experts_per_tok in (2, 3)
  assert config.moe_intermediate_size == 24 and config.router_aux_loss_coef == 0.0  # HF: only with router logits
  if config.model_type == "qwen3_5_moe_text":
    assert config.shared_expert_intermediate_size == 40 and config.norm_topk_prob and config.layer_types
  else:
    assert config.model_type == "qwen3_moe" and config.shared_expert_intermediate_size == 0 and config.qk_norm


def test_logits_match_transformers_on_left_padded_rows(family):
  ids, mask = _batch()
  want = _hf_logits(family["hf"], ids, mask).logits.numpy()
  got = _ours_logits(family["config"], family["params"], ids, mask)
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-4)


def test_the_load_balancing_loss_is_transformers(family):
  """HF's loss over its router logits of every layer (padding masked) against ours from the sown statistics."""
  ids, mask = _batch(seed=1)
  out = _hf_logits(family["hf"], ids, mask, output_router_logits=True)
  config = family["config"]
  aux = family["hf_class"].__module__
  hf_loss = __import__(aux, fromlist=["load_balancing_loss_func"]).load_balancing_loss_func(
    out.router_logits, config.num_experts, config.num_experts_per_tok, torch.tensor(mask)
  )
  _, variables = Decoder(config).apply(
    {"params": family["params"]},
    jnp.asarray(ids),
    positions_from_mask(jnp.asarray(mask)),
    jnp.asarray(mask),
    mutable=["intermediates"],
  )
  counts, probs, tokens, replayed_elsewhere = router_stats(variables["intermediates"])
  assert counts.shape == (config.num_hidden_layers, config.num_experts)
  np.testing.assert_allclose(float(load_balancing_loss(counts, probs, tokens)), float(hf_loss), rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(tokens), [mask.sum()] * config.num_hidden_layers)
  assert not np.asarray(replayed_elsewhere).any()  # nothing replayed
  np.testing.assert_array_equal(np.asarray(counts).sum(-1), mask.sum() * config.num_experts_per_tok)


@functools.cache
def _hf_greedy(hf_class, path: str, seed: int):
  hf = hf_class.from_pretrained(path).eval()
  ids, mask = _batch(seed)
  generation = transformers.GenerationConfig(
    max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None
  )
  with torch.no_grad():
    out = hf.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), generation_config=generation)
  return out[:, PROMPT:].numpy()


@pytest.mark.parametrize("slots", [None, 3])
def test_greedy_generation_is_token_identical_to_transformers(family, slots):
  ids, mask = _batch(seed=3)
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(-1,), pad_token_id=0, do_sample=False)
  model = decode_model(Decoder(family["config"]))
  if slots is None:
    run = functools.partial(generate, model, sampling=sampling)
  else:
    run = functools.partial(generate_in_slots, model, sampling=sampling, slots=slots, shards=2)
  out = jax.jit(run)(family["params"], jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(out["responses"]), _hf_greedy(family["hf_class"], family["path"], 3))


def test_rollout_log_probs_equal_the_training_forward(family):
  """The sampler's log-probs of its tokens equal the training forward's over prompt + response (same routing)."""
  ids, mask = _batch(seed=4)
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(5,), pad_token_id=0, temperature=0.7)
  config, params = family["config"], family["params"]
  out = jax.jit(functools.partial(generate, decode_model(Decoder(config)), sampling=sampling))(
    params, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(1)
  )
  responses, response_mask = np.asarray(out["responses"]), np.asarray(out["response_mask"])
  logits = _ours_logits(
    config, params, np.concatenate([ids, responses], axis=1), np.concatenate([mask, response_mask], axis=1)
  )[:, PROMPT - 1 : -1]
  want = np.asarray(token_log_probs(jnp.asarray(logits), jnp.asarray(responses), 0.7))
  assert response_mask.sum() > 8
  np.testing.assert_allclose(
    np.asarray(out["rollout_log_probs"])[response_mask > 0], want[response_mask > 0], atol=1e-5
  )


def test_export_reloads_in_transformers_with_the_same_logits(family, tmp_path):
  save_hf_checkpoint(family["params"], family["config"], str(tmp_path))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert type(reloaded) is family["hf_class"]
  ids, mask = _batch(seed=5)
  got = _hf_logits(reloaded, ids, mask).logits.numpy()
  want = _hf_logits(family["hf"], ids, mask).logits.numpy()
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-5)
  again = load_hf_params(str(tmp_path), family["config"])
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(family["params"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _dense_reference(x_TxD, experts_Txk, weights_Txk, gate, up, down):
  """Every expert on every token, kept where the token chose it: the grouped matmul's definition."""
  hidden = jax.nn.silu(jnp.einsum("td,edf->etf", x_TxD, gate)) * jnp.einsum("td,edf->etf", x_TxD, up)
  out_ExTxD = jnp.einsum("etf,efd->etd", hidden, down)
  chosen_TxE = jnp.sum(jax.nn.one_hot(experts_Txk, gate.shape[0]) * weights_Txk[..., None], axis=1)
  return jnp.einsum("te,etd->td", chosen_TxE, out_ExTxD)


def _grouped(x, chosen, weights, gate, up, down):
  return grouped_swiglu(x, chosen, weights, {"gate_proj": gate, "up_proj": up, "down_proj": down})


def test_the_grouped_matmul_equals_a_dense_per_expert_reference_gradients_included():
  keys = jax.random.split(jax.random.key(0), 5)
  tokens, hidden, ffn, experts, top_k = 37, 16, 12, 8, 3
  x = jax.random.normal(keys[0], (tokens, hidden))
  gate, up = (jax.random.normal(k, (experts, hidden, ffn)) * 0.3 for k in keys[1:3])
  down = jax.random.normal(keys[3], (experts, ffn, hidden)) * 0.3
  logits = jax.random.normal(keys[4], (tokens, experts)) * 2

  def through(fn):
    def loss(x, gate, up, down, logits):
      weights, chosen, _ = route(logits, top_k, norm_topk_prob=True)
      return jnp.sum(jnp.sin(fn(x, chosen, weights, gate, up, down)))

    return jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))(x, gate, up, down, logits)

  (got, got_grads), (want, want_grads) = through(_grouped), through(_dense_reference)
  np.testing.assert_allclose(got, want, atol=1e-4)  # a sum of 592 sines: fp32 summation order
  weights, chosen, _ = route(logits, top_k, norm_topk_prob=True)
  np.testing.assert_allclose(
    _grouped(x, chosen, weights, gate, up, down), _dense_reference(x, chosen, weights, gate, up, down), atol=1e-5
  )
  for a, b in zip(got_grads, want_grads):
    np.testing.assert_allclose(a, b, atol=1e-5)
  # some expert gets no token: its group is empty, its weights' gradient zero
  weights, chosen, _ = route(logits.at[:, 0].set(-1e9), top_k, norm_topk_prob=False)
  grad = jax.grad(lambda g: jnp.sum(_grouped(x, chosen, weights, g, up, down)))(gate)
  assert not np.any(np.asarray(chosen) == 0) and np.all(np.asarray(grad[0]) == 0) and np.any(np.asarray(grad[1]))


def test_lora_reaches_attention_and_the_shared_expert_and_peft_loads_it(family, tmp_path):
  """The routed experts stay frozen (no adapter); attention's and the shared expert's adapters go to a PEFT file that
  transformers' model loads with our logits."""
  peft = pytest.importorskip("peft")
  from jaxrlhf.models.decoder import init_adapters, model_variables
  from jaxrlhf.models.lora import LORA_TARGETS, count_adapter_params, expected_adapter_params, save_peft_adapter

  config = dataclasses.replace(family["config"], lora_rank=4, lora_alpha=8.0, lora_targets=LORA_TARGETS)
  adapters = init_adapters(Decoder(config), jax.random.key(3))[0]
  leaves, treedef = jax.tree.flatten(adapters)
  keys = jax.random.split(jax.random.key(4), len(leaves))
  adapters = treedef.unflatten([x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])
  assert count_adapter_params(adapters) == expected_adapter_params(config)
  paths = {
    "/".join(str(getattr(k, "key", k)) for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(adapters)
  }
  assert not any("experts" in p for p in paths)  # the routed experts: frozen
  assert any("shared_expert" in p for p in paths) == bool(config.shared_expert_intermediate_size)
  ids, mask = _batch(seed=6)
  ours = np.asarray(
    Decoder(config).apply(
      model_variables(family["params"], adapters),
      jnp.asarray(ids),
      positions_from_mask(jnp.asarray(mask)),
      jnp.asarray(mask),
    )[0]
  )
  adapter_dir = save_peft_adapter(adapters, config, str(tmp_path / "adapter"), family["path"])
  base = family["hf_class"].from_pretrained(family["path"], dtype=torch.float32).eval()
  with_adapter = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
  want = _hf_logits(with_adapter, ids, mask).logits.numpy()
  np.testing.assert_allclose(ours[mask > 0], want[mask > 0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tile", [4, 16, 256])
def test_the_tiled_grouped_matmul_is_ragged_dot_gradients_included(tile):
  """`moe.grouped_matmul` against `jax.lax.ragged_dot` (the definition it replaces; XLA lowers that one densely):
  groups longer than a tile, an empty group, rows past the groups (0), gradients of both operands."""
  from jaxrlhf.models.moe import grouped_matmul

  keys = jax.random.split(jax.random.key(1), 3)
  lhs, rhs = jax.random.normal(keys[0], (50, 6)), jax.random.normal(keys[1], (5, 6, 7))
  sizes = jnp.array([13, 0, 21, 1, 9], jnp.int32)  # 44 of 50 rows
  cotangent = jax.random.normal(keys[2], (50, 7))

  def through(fn):
    out, vjp = jax.vjp(lambda a, b: fn(a, b, sizes), lhs, rhs)
    return (out,) + vjp(cotangent)

  got = through(lambda a, b, g: grouped_matmul(a, b, g, tile))
  want = through(lambda a, b, g: jax.lax.ragged_dot(a, b, g, preferred_element_type=jnp.float32))
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(got[0])[44:] == 0)


@pytest.mark.parametrize("slots", [None, 3])
def test_routing_replay_records_the_samplers_routes(family, slots):
  """Rollout routing replay: the sampler records every fed token's experts per layer ([N, P + R, layers, k], the
  whole batch or slots), and a training forward that routes by the record gives the sampler's log-probs. In fp32 the
  training forward's own router chooses exactly the recorded experts (0 of its (token, layer) pairs replayed
  elsewhere); the tokens never fed (padding, the last response token) hold `no_route`."""
  from jaxrlhf.models.moe import no_route
  from jaxrlhf.trainer.model_outputs import sequence_inputs

  ids, mask = _batch(seed=6)
  config, params = family["config"], family["params"]
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(5,), pad_token_id=0, temperature=0.7)
  model = decode_model(Decoder(config), record_routes=True)
  if slots is None:
    run = functools.partial(generate, model, sampling=sampling)
  else:
    run = functools.partial(generate_in_slots, model, sampling=sampling, slots=slots, shards=2)
  out = jax.jit(run)(params, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(2))
  routes = np.asarray(out["rollout_routes"])
  lengths = np.asarray(out["response_lengths"])
  assert routes.shape == (8, PROMPT + NEW_TOKENS, config.num_hidden_layers, config.num_experts_per_tok)
  fed = np.concatenate([mask, np.arange(NEW_TOKENS)[None, :] < lengths[:, None] - 1], axis=1) > 0
  assert fed.sum() > 8 * PROMPT // 2 and (lengths < NEW_TOKENS).any()  # some rows end at EOS
  assert (routes[fed] < config.num_experts).all() and (routes[~fed] == no_route(config.num_experts)).all()
  seq, positions, seq_mask = sequence_inputs(jnp.asarray(ids), jnp.asarray(mask), out["responses"])
  (logits, _), variables = Decoder(config).apply(
    {"params": params}, seq, positions, seq_mask, replay_BxLxYxk=out["rollout_routes"], mutable=["intermediates"]
  )
  _, _, tokens, replayed_elsewhere = router_stats(variables["intermediates"])
  assert replayed_elsewhere.sum() == 0 and tokens.sum() > 0
  want = np.asarray(token_log_probs(logits[:, PROMPT - 1 : -1], out["responses"], 0.7))
  response_mask = np.asarray(out["response_mask"]) > 0
  np.testing.assert_allclose(np.asarray(out["rollout_log_probs"])[response_mask], want[response_mask], atol=1e-5)
