"""gpt-oss (alternating sliding/full attention with learned sinks, YaRN RoPE, biased clamped-SwiGLU experts) against
transformers, the oracle.

A tiny random config that keeps the real layer pattern (sliding and full layers alternating, 4 layers), a window of
6 shorter than every test sequence, 8 experts with top-4 routing, YaRN with a factor of 4; the router, its bias,
the experts' weights and biases and the attention sinks given values large enough that each matters (the clamp of
the SwiGLU included). Logits; greedy generation token for token, 32 tokens (26+ past the window), through the
whole-batch rollout and `max_num_seqs` slots; the rollout's log-probs against the training forward; export and
reload; the value head; LoRA on attention; the MXFP4 refusal; the blockwise kernel's sinks and their gradient.
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
CONFIG = dict(
  vocab_size=VOCAB,
  hidden_size=48,
  intermediate_size=32,
  num_hidden_layers=4,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=16,
  num_local_experts=8,
  num_experts_per_tok=4,
  sliding_window=WINDOW,
  max_position_embeddings=256,
  swiglu_limit=1.5,
  rope_parameters={
    "rope_type": "yarn",
    "rope_theta": 10_000.0,
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 64,
  },
  pad_token_id=0,
  bos_token_id=None,
  eos_token_id=None,
)


def _randomise(model):
  """Give the router, the experts (biases too) and the sinks values that matter: HF initialises biases at zero and
  the rest at std 0.02, where the clamp never acts and the sinks barely count."""
  with torch.no_grad():
    for name, param in model.named_parameters():
      if "sinks" in name:
        param.normal_(0.0, 1.0)
      elif "router" in name:
        param.normal_(0.0, 0.5)
      elif "experts" in name:
        param.normal_(0.0, 0.3)
  return model


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory):
  torch.manual_seed(0)
  hf = _randomise(transformers.GptOssForCausalLM(transformers.GptOssConfig(**CONFIG)).eval())
  path = str(tmp_path_factory.mktemp("gpt_oss"))
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


def _ours_logits(config, params, ids, mask, head="lm", adapters=None):
  from jaxrlhf.models.decoder import model_variables

  logits, _ = Decoder(config, head=head).apply(
    model_variables(params, adapters), jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
  )
  return np.asarray(logits)


def _hf_logits(model, ids, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def test_config_maps_the_family(causal_lm):
  config = causal_lm["config"]
  assert config.model_type == "gpt_oss"
  assert config.layer_types == ("sliding_attention", "full_attention") * 2 and config.sliding_window == WINDOW
  assert config.attention_sinks and config.qkv_bias and config.o_bias and not config.qk_norm
  assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (8, 4, 32)
  assert (config.rope_type, config.rope_factor, config.rope_original_max_position_embeddings) == ("yarn", 4.0, 64)
  assert not config.rope_truncate and config.rope_attention_factor == pytest.approx(0.1 * np.log(4.0) + 1)
  assert (config.swiglu_alpha, config.swiglu_limit) == (1.702, 1.5)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_logits_match_transformers_on_left_padded_rows(causal_lm, scan_layers):
  from jaxrlhf.models.decoder import params_for

  ids, mask = _batch()
  config = dataclasses.replace(causal_lm["config"], scan_layers=scan_layers)
  got = _ours_logits(config, params_for(config, causal_lm["params"]), ids, mask)
  want = _hf_logits(causal_lm["hf"], ids, mask)
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-4)


def test_blockwise_kernel_with_sinks_matches_xla(causal_lm):
  """The blockwise kernel (blocks of 4, so the window and the sinks cross blocks) gives xla's logits, and the
  gradient of a loss by every parameter (the sinks' included) matches."""
  ids, mask = _batch(seed=1)
  config, params = causal_lm["config"], causal_lm["params"]
  blockwise = dataclasses.replace(config, attention_impl="blockwise", attention_block_size=4)
  xla = dataclasses.replace(config, attention_impl="xla")
  np.testing.assert_allclose(
    _ours_logits(blockwise, params, ids, mask)[mask > 0], _ours_logits(xla, params, ids, mask)[mask > 0], atol=1e-5
  )

  def loss(cfg, p):
    logits, _ = Decoder(cfg).apply(
      {"params": p}, jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
    )
    return jnp.sum(jax.nn.log_softmax(logits)[..., 3] * mask)

  got, want = (jax.grad(functools.partial(loss, cfg))(params) for cfg in (blockwise, xla))
  sinks = got["layers"]["self_attn"]["sinks"]
  assert np.abs(np.asarray(sinks)).max() > 1e-3
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-4, rtol=1e-3)


def test_the_sinks_the_window_and_the_clamp_matter(causal_lm):
  ids, mask = _batch()
  config, params = causal_lm["config"], causal_lm["params"]
  want = _ours_logits(config, params, ids, mask)
  no_sinks = jax.tree_util.tree_map_with_path(
    lambda path, x: x - 50.0 if "sinks" in jax.tree_util.keystr(path) else x, params
  )
  for cfg, p in (
    (dataclasses.replace(config, sliding_window=64), params),
    (dataclasses.replace(config, swiglu_limit=100.0), params),
    (config, no_sinks),
  ):
    assert np.abs(_ours_logits(cfg, p, ids, mask) - want)[mask > 0].max() > 1e-2


@functools.cache
def _hf_greedy(path: str, seed: int):
  hf = transformers.GptOssForCausalLM.from_pretrained(path).eval()
  ids, mask = _batch(seed)
  generation = transformers.GenerationConfig(
    max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None
  )
  with torch.no_grad():
    out = hf.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), generation_config=generation)
  return out[:, PROMPT:].numpy()


@pytest.mark.parametrize("slots", [None, 3])
def test_greedy_generation_is_token_identical_to_transformers(causal_lm, slots):
  """32 new tokens on 8 prompts, 26+ past the window (the sliding layers' ring); with `max_num_seqs` slots rows
  enter mid-loop at other columns."""
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
  assert type(reloaded).__name__ == "GptOssForCausalLM"
  assert reloaded.config.rope_parameters["rope_type"] == "yarn"
  ids, mask = _batch(seed=5)
  got, want = _hf_logits(reloaded, ids, mask), _hf_logits(causal_lm["hf"], ids, mask)
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-5)
  assert load_hf_config(str(tmp_path)) == causal_lm["config"]
  again = load_hf_params(str(tmp_path), causal_lm["config"])
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(causal_lm["params"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_experts_run_per_device_on_a_mesh_with_transformers_logits(causal_lm):
  """On a (1, 4, 2) mesh the experts run in `ActivationLayout.experts`' shard_map: each device sorts and multiplies
  its own 2 rows' (token, expert) pairs with its half of every expert's hidden units (the fused gate|up columns split
  in pairs), the halves summed over `tensor`, the output bias added once outside. Logits stay transformers' (fp32)."""
  from jaxrlhf.models.activation_layout import ActivationLayout
  from jaxrlhf.models.decoder import model_variables
  from jaxrlhf.parallel.mesh import make_mesh

  ids, mask = _batch()
  decoder = Decoder(causal_lm["config"], head="lm", layout=ActivationLayout(make_mesh((1, 4, 2))))
  forward = jax.jit(lambda params, ids, mask: decoder.apply(params, ids, positions_from_mask(mask), mask)[0])
  args = (model_variables(causal_lm["params"]), jnp.asarray(ids), jnp.asarray(mask))
  assert "manual_computation" in forward.lower(*args).as_text()  # the experts' shard_map (attention is XLA's here)
  got = np.asarray(forward(*args))
  np.testing.assert_allclose(got[mask > 0], _hf_logits(causal_lm["hf"], ids, mask)[mask > 0], atol=1e-4)


def test_load_balancing_loss_matches_transformers(causal_lm):
  from jaxrlhf.models.moe import load_balancing_loss, router_stats

  ids, mask = _batch(seed=6)
  config, params = causal_lm["config"], causal_lm["params"]
  _, state = Decoder(config).apply(
    {"params": params},
    jnp.asarray(ids),
    positions_from_mask(jnp.asarray(mask)),
    jnp.asarray(mask),
    mutable=["intermediates"],
  )
  counts, probs, tokens, _ = router_stats(state["intermediates"])
  got = float(load_balancing_loss(counts, probs, tokens))
  with torch.no_grad():
    want = causal_lm["hf"](
      input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_router_logits=True
    ).aux_loss.item()
  assert got == pytest.approx(want, rel=1e-5)


def test_critic_from_the_actor_checkpoint_and_its_export(causal_lm, tmp_path):
  config = causal_lm["config"]
  critic = load_hf_params(causal_lm["path"], config, head="value", rng=jax.random.key(7))
  ids, mask = _batch(seed=6)
  values = _ours_logits(config, critic, ids, mask, head="value")
  assert values.shape == ids.shape and np.isfinite(values).all() and np.abs(values[mask > 0]).max() > 0
  save_hf_checkpoint(critic, config, str(tmp_path), head="value")
  again = load_hf_params(str(tmp_path), load_hf_config(str(tmp_path)), head="value")
  np.testing.assert_array_equal(_ours_logits(config, again, ids, mask, head="value"), values)


def test_lora_on_attention_exports_peft_adapters_transformers_loads(causal_lm, tmp_path):
  peft = pytest.importorskip("peft")
  from jaxrlhf.models.decoder import init_adapters
  from jaxrlhf.models.lora import save_peft_adapter

  targets = ("q_proj", "k_proj", "v_proj", "o_proj")
  config = dataclasses.replace(causal_lm["config"], lora_rank=4, lora_alpha=8.0, lora_targets=targets)
  adapters = init_adapters(Decoder(config), jax.random.key(3))[0]
  leaves, treedef = jax.tree.flatten(adapters)
  keys = jax.random.split(jax.random.key(4), len(leaves))
  adapters = treedef.unflatten([x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])
  ids, mask = _batch(seed=8)
  ours = _ours_logits(config, causal_lm["params"], ids, mask, adapters=adapters)
  adapter_dir = save_peft_adapter(adapters, config, str(tmp_path / "adapter"), causal_lm["path"])
  base = transformers.AutoModelForCausalLM.from_pretrained(causal_lm["path"], dtype=torch.float32).eval()
  with_adapter = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
  want = _hf_logits(with_adapter, ids, mask)
  np.testing.assert_allclose(ours[mask > 0], want[mask > 0], atol=1e-4, rtol=1e-4)


def test_mxfp4_checkpoints_are_refused_in_one_line(causal_lm):
  from jaxrlhf.errors import CheckpointError
  from jaxrlhf.models.hf_io import config_from_hf_dict

  with open(f"{causal_lm['path']}/config.json") as f:
    hf = json.load(f)
  quantized = {**hf, "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["router"]}}
  with pytest.raises(CheckpointError, match="quant_method='mxfp4'.*dequantised bf16 checkpoint") as error:
    config_from_hf_dict(quantized)
  assert "\n" not in str(error.value)


def test_bf16_checkpoint_loads(causal_lm, tmp_path):
  hf = transformers.GptOssForCausalLM.from_pretrained(causal_lm["path"], dtype=torch.bfloat16)
  hf.save_pretrained(str(tmp_path), safe_serialization=True)
  config = load_hf_config(str(tmp_path))
  params = load_hf_params(str(tmp_path), config)
  ids, mask = _batch(seed=9)
  got = _ours_logits(config, params, ids, mask)
  want = _hf_logits(causal_lm["hf"], ids, mask)
  assert np.abs(got - want)[mask > 0].max() < 0.2  # bf16 weights, fp32 compute


def test_routing_replay_records_the_samplers_routes(causal_lm):
  """Rollout routing replay through gpt-oss's router: the sampler's recorded experts, replayed by the training
  forward, are the ones its own router picks (fp32), and the replayed forward gives the sampler's log-probs."""
  from jaxrlhf.models.moe import no_route, router_stats
  from jaxrlhf.trainer.model_outputs import sequence_inputs

  ids, mask = _batch(seed=10)
  config, params = causal_lm["config"], causal_lm["params"]
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, eos_token_ids=(5,), pad_token_id=0, temperature=0.7)
  run = functools.partial(generate, decode_model(Decoder(config), record_routes=True), sampling=sampling)
  out = jax.jit(run)(params, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(2))
  routes = np.asarray(out["rollout_routes"])
  assert (routes[:, :PROMPT][np.asarray(mask) == 0] == no_route(config.num_experts)).all()
  seq, positions, seq_mask = sequence_inputs(jnp.asarray(ids), jnp.asarray(mask), out["responses"])
  (logits, _), variables = Decoder(config).apply(
    {"params": params}, seq, positions, seq_mask, replay_BxLxYxk=out["rollout_routes"], mutable=["intermediates"]
  )
  _, _, tokens, replayed_elsewhere = router_stats(variables["intermediates"])
  assert replayed_elsewhere.sum() == 0 and tokens.sum() > 0
  want = np.asarray(token_log_probs(logits[:, PROMPT - 1 : -1], out["responses"], 0.7))
  response_mask = np.asarray(out["response_mask"]) > 0
  np.testing.assert_allclose(np.asarray(out["rollout_log_probs"])[response_mask], want[response_mask], atol=1e-5)
  # Routes recorded elsewhere (every token to experts 0..3) are followed: the logits change.
  forced = jnp.broadcast_to(jnp.arange(4, dtype=routes.dtype), routes.shape)
  other, _ = Decoder(config).apply({"params": params}, seq, positions, seq_mask, replay_BxLxYxk=forced)
  assert np.abs(np.asarray(other) - np.asarray(logits))[np.asarray(seq_mask) > 0].max() > 1e-2
