"""HF IO beyond the causal LM: sharded files, critic and reward heads, meshes, dtypes, config forms, errors."""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxrlhf.models import (  # noqa: E402
  CheckpointError,
  Decoder,
  DecoderConfig,
  abstract_params,
  config_from_hf_dict,
  init_params,
  load_hf_config,
  load_hf_params,
  positions_from_mask,
  reward_model_scores,
  save_hf_checkpoint,
)
from jaxrlhf.parallel import TRAIN_RULES, logical_to_shardings, make_mesh  # noqa: E402
from tests.models.hf_fixtures import build_model, hf_forward, left_padded_batch, save_model  # noqa: E402


def _leaves(tree):
  return jax.tree_util.tree_leaves_with_path(tree)


def _assert_same_params(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for (path, x), (_, y) in zip(_leaves(a), _leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
  model = build_model("qwen2_untied", seed=5)
  path = save_model(model, tmp_path_factory.mktemp("qwen2"))
  config = load_hf_config(path)
  return model, path, config, load_hf_params(path, config)


# ----- files -------------------------------------------------------------------------------------


def test_sharded_checkpoint_loads_like_a_single_file(qwen2, tmp_path):
  model, _, config, params = qwen2
  sharded = save_model(model, tmp_path / "sharded", max_shard_size="20KB")
  assert os.path.exists(os.path.join(sharded, "model.safetensors.index.json"))
  assert len([f for f in os.listdir(sharded) if f.endswith(".safetensors")]) > 1
  _assert_same_params(load_hf_params(sharded, config), params)

  # Our export shards too, and transformers reads that index.
  out = save_hf_checkpoint(params, config, str(tmp_path / "export"), max_shard_size=30_000)
  assert len([f for f in os.listdir(out) if f.endswith(".safetensors")]) > 1
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
  ids, mask, positions = left_padded_batch(seed=6)
  np.testing.assert_allclose(
    hf_forward(reloaded, ids, mask, positions), hf_forward(model, ids, mask, positions), atol=1e-6
  )


@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (2, 2, 2)])
def test_loads_onto_mesh_with_the_train_layout(qwen2, mesh_shape):
  _, path, config, params = qwen2
  mesh = make_mesh(mesh_shape)
  shapes, logical = abstract_params(Decoder(config))
  shardings = logical_to_shardings(logical, shapes, mesh, TRAIN_RULES)
  placed = load_hf_params(path, config, shardings=shardings)
  for (path_, array), sharding in zip(_leaves(placed), jax.tree.leaves(shardings)):
    assert array.sharding == sharding, jax.tree_util.keystr(path_)
    shard_shape = sharding.shard_shape(array.shape)
    assert all(shard.data.shape == shard_shape for shard in array.addressable_shards)
  _assert_same_params(placed, params)
  # The rules really split the model: embed over fsdp, mlp over tensor.
  gate = placed["layers"]["mlp"]["gate_proj"]["kernel"].sharding.spec
  assert tuple(gate) == (None, "fsdp", "tensor")  # the stacked layer axis stays whole


# ----- dtypes and config forms -------------------------------------------------------------------


def test_bf16_checkpoint_and_bf16_params(qwen2, tmp_path):
  model, path, config, params = qwen2
  bf16_path = save_model(build_model("qwen2_untied", seed=5).to(torch.bfloat16), tmp_path / "bf16")
  from_bf16 = load_hf_params(bf16_path, config)  # fp32 params holding the bf16 values exactly
  expected = jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32), params)
  _assert_same_params(from_bf16, expected)
  as_bf16 = load_hf_params(path, config, dtype="bfloat16")
  assert {x.dtype for x in jax.tree.leaves(as_bf16)} == {jnp.dtype(jnp.bfloat16)}
  # bf16 parameters and compute stay close to the fp32 model.
  bf16_model = Decoder(dataclasses.replace(config, dtype="bfloat16", param_dtype="bfloat16"))
  ids, mask, positions = left_padded_batch(seed=11)
  logits = jax.jit(bf16_model.apply)({"params": as_bf16}, ids, positions_from_mask(mask), mask)[0]
  assert logits.dtype == jnp.float32
  expected = hf_forward(model, ids, mask, positions)
  assert np.abs(np.asarray(logits) - expected)[mask.astype(bool)].max() <= 0.1 * np.abs(expected).max()


def test_rope_config_v4_and_v5_forms_agree():
  base = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    vocab_size=16,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=1024,
  )
  scaling = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
  v4 = config_from_hf_dict({**base, "rope_theta": 5e5, "rope_scaling": {"type": "llama3", **scaling}})
  v5 = config_from_hf_dict({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **scaling}})
  assert v4 == v5 and v4.rope_theta == 5e5 and v4.rope_type == "llama3"
  plain = config_from_hf_dict({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
  assert plain.rope_type == "default" and plain.rope_theta == 1e6


def test_remat_policies_give_the_same_gradients(tiny_model_config):
  config = dataclasses.replace(tiny_model_config, num_hidden_layers=1)
  ids = jax.random.randint(jax.random.key(0), (2, 6), 0, config.vocab_size)
  mask = jnp.ones_like(ids)
  params, _ = init_params(Decoder(config), jax.random.key(1))

  def loss_fn(policy):
    model = Decoder(dataclasses.replace(config, remat_policy=policy))
    return lambda p: jnp.sum(model.apply({"params": p}, ids, positions_from_mask(mask), mask)[0] ** 2)

  is_remat = lambda policy: "remat" in str(jax.make_jaxpr(loss_fn(policy))(params))
  assert not is_remat("none")
  reference = jax.jit(jax.grad(loss_fn("none")))(params)
  for policy in ("full", "dots_saveable"):
    assert is_remat(policy)
    for a, b in zip(jax.tree.leaves(jax.jit(jax.grad(loss_fn(policy)))(params)), jax.tree.leaves(reference)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="remat_policy='sometimes'"):
    dataclasses.replace(config, remat_policy="sometimes")


# ----- critic and reward model -------------------------------------------------------------------


def test_critic_from_token_classification_checkpoint(tmp_path):
  hf_critic = build_model("qwen2_untied", "AutoModelForTokenClassification", seed=7, num_labels=1)
  assert hf_critic.score.bias is not None
  path = save_model(hf_critic, tmp_path / "critic")
  config = load_hf_config(path)
  params = load_hf_params(path, config, head="value")
  ids, mask, positions = left_padded_batch(seed=8)
  critic = Decoder(config, head="value")
  values = np.asarray(critic.apply({"params": params}, ids, positions_from_mask(mask), mask)[0])
  expected = hf_forward(hf_critic, ids, mask, positions)[..., 0]
  assert np.abs(values - expected)[mask.astype(bool)].max() <= 1e-4

  out = save_hf_checkpoint(params, config, str(tmp_path / "export"), head="value")
  reloaded = transformers.AutoModelForTokenClassification.from_pretrained(out, attn_implementation="eager").eval()
  assert np.abs(hf_forward(reloaded, ids, mask, positions)[..., 0] - values)[mask.astype(bool)].max() <= 1e-5


def test_critic_from_actor_checkpoint_gets_a_fresh_head(qwen2):
  _, path, config, actor_params = qwen2
  critic_params = load_hf_params(path, config, head="value", rng=jax.random.key(3))
  assert "lm_head" not in critic_params
  assert critic_params["score"]["kernel"].shape == (config.hidden_size, 1)
  np.testing.assert_array_equal(np.asarray(critic_params["score"]["bias"]), [0.0])
  assert 0 < float(jnp.std(critic_params["score"]["kernel"])) < 0.1
  backbone = {k: v for k, v in actor_params.items() if k != "lm_head"}
  _assert_same_params({k: v for k, v in critic_params.items() if k != "score"}, backbone)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_reward_model_scores_last_valid_token(tmp_path, padding):
  hf_reward = build_model("llama", "AutoModelForSequenceClassification", seed=9, num_labels=1)
  path = save_model(hf_reward, tmp_path / "rm")
  config = load_hf_config(path)
  params = load_hf_params(path, config, head="reward")
  ids, mask, positions = left_padded_batch(seed=10)
  if padding == "right":  # the same tokens, pads moved to the end
    ids = np.stack([np.concatenate([row[m > 0], row[m == 0]]) for row, m in zip(ids, mask)])
    mask = np.sort(mask, axis=1)[:, ::-1].copy()
    positions = np.maximum(mask.cumsum(-1) - 1, 0)
  scores = reward_model_scores(Decoder(config, head="reward"), params, jnp.asarray(ids), jnp.asarray(mask))
  as_torch = lambda x: torch.tensor(x, dtype=torch.long)
  with torch.no_grad():  # HF picks the rightmost non-pad token itself (pad id 0 is never a real token here)
    expected = (
      hf_reward(input_ids=as_torch(ids), attention_mask=as_torch(mask), position_ids=as_torch(positions))
      .logits[:, 0]
      .numpy()
    )
  assert scores.shape == (3,)
  assert np.abs(np.asarray(scores) - expected).max() <= 1e-4

  out = save_hf_checkpoint(params, config, str(tmp_path / "export"), head="reward", source_dir=path)
  reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
  assert reloaded.config.pad_token_id == 0 and reloaded.config.num_labels == 1


# ----- errors ------------------------------------------------------------------------------------


def _copy_config_only(source, target, **changes):
  os.makedirs(target)
  with open(os.path.join(source, "config.json")) as f:
    config = json.load(f)
  config.update(changes)
  with open(os.path.join(target, "config.json"), "w") as f:
    json.dump(config, f)
  return str(target)


def test_pickled_weights_are_refused(qwen2, tmp_path):
  _, path, config, _ = qwen2
  target = _copy_config_only(path, tmp_path / "bin")
  with open(os.path.join(target, "pytorch_model.bin"), "wb") as f:
    f.write(b"never unpickled")
  with pytest.raises(CheckpointError, match=r"pickled PyTorch weights \['pytorch_model.bin'\].*safetensors"):
    load_hf_params(target, config)


def test_unknown_model_type_and_architecture(qwen2, tmp_path):
  _, path, _, _ = qwen2
  with pytest.raises(
    CheckpointError,
    match=r"model_type='gpt2' is not supported; supported model types: "
    r"\['gemma3_text', 'gpt_oss', 'llama', 'mistral', 'qwen2', 'qwen3', 'qwen3_5_moe_text', 'qwen3_5_text', "
    r"'qwen3_moe'\]",
  ):
    load_hf_config(_copy_config_only(path, tmp_path / "gpt2", model_type="gpt2"))
  with pytest.raises(
    CheckpointError,
    match=r"architectures \['Qwen2ForQuestionAnswering'\] are not supported.*"
    r"Qwen2ForCausalLM",
  ):
    load_hf_config(_copy_config_only(path, tmp_path / "qa", architectures=["Qwen2ForQuestionAnswering"]))
  with pytest.raises(CheckpointError, match=r"rope_type='yarn' is not supported"):
    load_hf_config(
      _copy_config_only(
        path, tmp_path / "yarn", rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
      )
    )


def test_missing_tensor_is_named(qwen2, tmp_path):
  from safetensors.numpy import load_file, save_file

  _, path, config, _ = qwen2
  target = str(tmp_path / "missing")
  shutil.copytree(path, target)
  tensors = load_file(os.path.join(target, "model.safetensors"))
  del tensors["model.layers.1.self_attn.k_proj.bias"]
  save_file(tensors, os.path.join(target, "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(CheckpointError, match=r"missing tensor\(s\) model.layers.1.self_attn.k_proj.bias"):
    load_hf_params(target, config)


def test_shape_mismatch_names_tensor_and_both_shapes(qwen2, tmp_path):
  _, path, _, _ = qwen2
  target = _copy_config_only(path, tmp_path / "wide", intermediate_size=48)
  shutil.copy(os.path.join(path, "model.safetensors"), target)
  with pytest.raises(
    CheckpointError,
    match=r"tensor model.layers.0.mlp.(gate|up|down)_proj.weight .* has shape "
    r"\[(64, 32|32, 64)\], but the config expects \[(48, 32|32, 48)\]",
  ):
    load_hf_params(target, load_hf_config(target))


def test_missing_config_and_weights(tmp_path):
  with pytest.raises(CheckpointError, match="config.json not found"):
    load_hf_config(str(tmp_path))
  with pytest.raises(CheckpointError, match=r"has no \*.safetensors weight files"):
    load_hf_params(str(tmp_path), DecoderConfig(8, 8, 8, 1, 2, 1))


# ----- tokenizer ---------------------------------------------------------------------------------


def test_tokenizer_and_eos_ids(tmp_path):
  from jaxrlhf.data.builtin import build_tokenizer
  from jaxrlhf.models import generation_eos_ids, load_tokenizer, pad_token_id

  build_tokenizer(save_dir=str(tmp_path))
  tokenizer = load_tokenizer(str(tmp_path))
  prompt = tokenizer.apply_chat_template(
    [{"role": "user", "content": "first : 1 2"}], add_generation_prompt=True, tokenize=False
  )
  assert prompt.endswith("<|assistant|>")
  assert generation_eos_ids(str(tmp_path), tokenizer) == (tokenizer.eos_token_id,)
  with open(tmp_path / "generation_config.json", "w") as f:
    json.dump({"eos_token_id": [7, tokenizer.eos_token_id, 9]}, f)
  assert generation_eos_ids(str(tmp_path), tokenizer) == (tokenizer.eos_token_id, 7, 9)
  assert pad_token_id(tokenizer, (1,)) == tokenizer.pad_token_id
  with pytest.raises(ValueError, match="is not a directory"):
    load_tokenizer(str(tmp_path / "nope"))


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3_5_text"])
def test_the_word_tokenizer_beside_a_model_config_tokenizes_as_it_was_saved(tmp_path, model_type):
  """An exported quickstart model: the built-in word tokenizer in the folder of a config.json. transformers maps
  qwen2 and qwen3_5 to their own tokenizer class whatever tokenizer_config.json says; loaded so, "10" was "1" "0"
  and "3 3" decoded as "33"."""
  from jaxrlhf.data.builtin import build_tokenizer
  from jaxrlhf.models import load_tokenizer

  built = build_tokenizer(save_dir=str(tmp_path))
  with open(tmp_path / "config.json", "w") as f:
    json.dump({"model_type": model_type, "vocab_size": built.vocab_size}, f)
  loaded = load_tokenizer(str(tmp_path))
  text = "<|user|> last : 5 8 2 10 first #### 7"
  assert loaded.encode(text) == built.encode(text)
  assert loaded.decode(loaded.encode("3 3")) == built.decode(built.encode("3 3")) == "3 3"


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_text"])
def test_gemma4_is_refused_naming_what_it_adds(model_type):
  with pytest.raises(CheckpointError, match=r"not supported yet: Gemma 4's text model adds per-layer inputs"):
    config_from_hf_dict({"model_type": model_type, "vocab_size": 64, "hidden_size": 32})
