"""Generation TP apart from training TP (`rollout.tensor_model_parallel_size` = k > mesh.tensor): the mesh
refines fsdp with a `rollout_tp` sub-axis (nested with Ulysses' `sp`), training stays FSDP over all of fsdp,
generation splits heads k ways (key/value heads repeated where k does not divide them) and gives the same
greedy tokens and log-probs as generation TP = training TP on the same devices."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.config import resolve_config
from jaxrlhf.models import Decoder, DecoderConfig, init_params
from jaxrlhf.parallel.layouts import ShardingError, generation_kv_repeat
from jaxrlhf.parallel.mesh import (
  MeshError,
  fsdp_axes,
  make_mesh,
  mesh_axes,
  mesh_from_config,
  rollout_dp_axes,
  rollout_tp_axes,
  sequence_axes,
)
from jaxrlhf.parallel.step_layouts import build_step_layouts
from jaxrlhf.rollout import SamplingParams
from jaxrlhf.trainer.generation import Generation
from jaxrlhf.trainer.state import RoleState
from tests.helpers import small_config

SAMPLING = SamplingParams(max_new_tokens=6, eos_token_ids=(3,), pad_token_id=0, do_sample=False)


@pytest.mark.parametrize(
  "shape,sp,k,axes",
  [
    ((1, 8, 1), 1, 1, {"data": 1, "fsdp": 8, "tensor": 1}),
    ((1, 8, 1), 1, 4, {"data": 1, "fsdp": 2, "rollout_tp": 4, "tensor": 1}),
    ((1, 4, 2), 1, 4, {"data": 1, "fsdp": 2, "rollout_tp": 2, "tensor": 2}),
    ((1, 4, 2), 1, 2, {"data": 1, "fsdp": 4, "tensor": 2}),  # k <= tensor: generation TP = training TP
    ((1, 8, 1), 1, 8, {"data": 1, "fsdp": 1, "rollout_tp": 8, "tensor": 1}),
    # Ulysses and rollout TP nest, the smaller innermost: verl's DAPO-32B (sp 8, TP 4 on 128 GPUs) and the reverse.
    ((1, 128, 1), 8, 4, {"data": 1, "fsdp": 16, "sp": 2, "rollout_tp": 4, "tensor": 1}),
    ((1, 16, 1), 2, 4, {"data": 1, "fsdp": 4, "rollout_tp": 2, "sp": 2, "tensor": 1}),
    ((1, 8, 1), 4, 4, {"data": 1, "fsdp": 2, "sp": 1, "rollout_tp": 4, "tensor": 1}),
  ],
)
def test_mesh_refines_fsdp_into_nested_sub_axes(shape, sp, k, axes):
  sizes, names = mesh_axes(shape, sp, k)
  assert dict(zip(names, sizes)) == axes
  mesh = jax.sharding.AbstractMesh(sizes, names)
  assert np.prod([mesh.shape[a] for a in fsdp_axes(mesh)]) == shape[1]  # training's FSDP: every fsdp device
  assert mesh.shape["tensor"] * np.prod([mesh.shape[a] for a in rollout_tp_axes(mesh)]) == max(k, shape[2])
  assert np.prod([mesh.shape[a] for a in sequence_axes(mesh)]) == sp
  assert set(rollout_dp_axes(mesh)) | set(rollout_tp_axes(mesh)) == set(fsdp_axes(mesh))


def test_refined_mesh_keeps_the_device_order():
  assert (make_mesh((1, 8, 1), rollout_tensor_parallel=4).devices.reshape(-1) == np.array(jax.devices())).all()


@pytest.mark.parametrize(
  "shape,sp,k,message",
  [
    ((1, 8, 1), 1, 3, "tensor_model_parallel_size=3 must be a multiple of mesh.tensor=1 that divides"),
    ((1, 4, 2), 1, 6, "tensor_model_parallel_size=6 must be a multiple of mesh.tensor=2 that divides"),
    ((1, 4, 2), 1, 16, "tensor_model_parallel_size=16 must be a multiple"),
    ((1, 12, 1), 4, 6, "ulysses_sequence_parallel_size=4 and .*=6 / mesh.tensor=1 = 6 must nest"),
  ],
)
def test_rollout_tp_the_mesh_cannot_hold_is_an_error_naming_the_key(shape, sp, k, message):
  with pytest.raises(MeshError, match=message):
    mesh_axes(shape, sp, k)


def test_kv_heads_repeat_where_the_rollout_tp_does_not_divide_them():
  mesh = make_mesh((1, 8, 1), rollout_tensor_parallel=8)
  assert generation_kv_repeat(mesh, 64, 8) == 1
  assert generation_kv_repeat(mesh, 64, 4) == 2
  assert generation_kv_repeat(mesh, 8, 2) == 4
  with pytest.raises(ShardingError, match="num_attention_heads=12 over 8 devices"):
    generation_kv_repeat(mesh, 12, 4)


def _model(kv_heads, hybrid=False):
  # hybrid: Qwen3.5's layers, a Gated DeltaNet layer (2 key heads, 4 value heads) then gated full attention.
  linear = dict(
    model_type="qwen3_5_text",
    layer_types=("linear_attention", "full_attention"),
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    linear_chunk_size=4,
    attn_output_gate=True,
    norm_offset=True,
  )
  return DecoderConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=kv_heads,
    rope_theta=100.0,
    **(linear if hybrid else {}),
  )


@functools.cache
def _rollout(shape, k, sp, kv_heads, hybrid=False):
  """Greedy fp32 generation through the trainer's path (train-layout weights -> generation layout -> sample),
  compiled: (outputs, layouts, compiled HLO text)."""
  data, fsdp, tensor = shape
  config = resolve_config(
    small_config(
      "/tmp/unused",
      **{
        "mesh.data": data,
        "mesh.fsdp": fsdp,
        "mesh.tensor": tensor,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": k,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": sp,
      },
    )
  )
  model = _model(kv_heads, hybrid)
  mesh = mesh_from_config(config)
  layouts = build_step_layouts(config, mesh, model, model, None)
  generation = Generation(config, model, SAMPLING, layouts)
  params = jax.device_put(init_params(Decoder(model), jax.random.key(0))[0], layouts.actor_train)
  prompts_BxP = jax.random.randint(jax.random.key(1), (8, 5), 4, 64)
  mask_BxP = jnp.ones((8, 5), jnp.int32).at[1, :2].set(0).at[6, :4].set(0)
  weights = lambda p: RoleState(params=p, opt_state=None)
  run = jax.jit(
    lambda p, x, m: generation.sample(generation.generation_params(weights(p)), x, m, jax.random.key(0), SAMPLING)
  )
  compiled = run.lower(params, prompts_BxP, mask_BxP).compile()
  return jax.device_get(compiled(params, prompts_BxP, mask_BxP)), layouts, compiled.as_text()


# (mesh, k, sp, kv heads): fsdp devices join generation TP; tensor and fsdp together; k = all devices; key/value
# heads fewer than k (repeated, as Qwen2-72B's 8 at TP 16); rollout TP over (rollout_tp, sp) with Ulysses inside
# (the other nesting, sp over (sp, rollout_tp), is in test_sequence_parallel's split forward).
@pytest.mark.parametrize(
  "shape,k,sp,kv_heads",
  [((1, 8, 1), 2, 1, 4), ((1, 4, 2), 4, 1, 4), ((1, 8, 1), 8, 1, 4), ((1, 8, 1), 4, 1, 2), ((1, 8, 1), 4, 2, 2)],
)
def test_generation_equals_generation_tp_of_training(shape, k, sp, kv_heads, capfd):
  want, _, _ = _rollout(shape, shape[2], 1, kv_heads)
  got, layouts, hlo = _rollout(shape, k, sp, kv_heads)
  np.testing.assert_array_equal(got["responses"], want["responses"])
  np.testing.assert_array_equal(got["response_mask"], want["response_mask"])
  np.testing.assert_allclose(got["rollout_log_probs"], want["rollout_log_probs"], atol=2e-6, rtol=2e-6)

  # Training: FSDP over every fsdp device, heads over tensor; generation: heads (and copies of the key/value
  # heads) split k ways, the rest of the devices split the batch.
  repeat = k // np.gcd(kv_heads, k)
  assert layouts.generation_kv_repeat == repeat
  attention = lambda tree: tree["layers"]["self_attn"]
  train_q = attention(layouts.actor_train)["q_proj"]["kernel"]
  assert train_q.shard_shape((2, 32, 8, 4)) == (2, 32 // shape[1], 8 // shape[2], 4)
  generation_q, generation_k = (attention(layouts.actor_generation)[name]["kernel"] for name in ("q_proj", "k_proj"))
  assert generation_q.shard_shape((2, 32, 8, 4)) == (2, 32, 8 // k, 4)
  assert generation_k.shard_shape((2, 32, kv_heads * repeat, 4)) == (2, 32, kv_heads * repeat // k, 4)
  # The compiled program's KV cache [layers, rows, kv heads, length, head dim] per device: rows 8 over the
  # devices outside a TP group, the (repeated) key/value heads over k.
  cache_shape = f"f32[2,{8 * k // 8},{kv_heads * repeat // k},10,4]"
  assert cache_shape in hlo, sorted(set(re.findall(r"f32\[2,\d+,\d+,10,4\]", hlo)))
  # The move to the generation layout goes through `GENERATION_STAGING_RULES`: in one step XLA's partitioner
  # gathered every whole weight on every device first (and says so on stderr).
  assert "Involuntary full rematerialization" not in capfd.readouterr().err


@pytest.mark.parametrize("shape,k", [((1, 4, 2), 2), ((1, 4, 2), 4), ((1, 8, 1), 4)])
def test_hybrid_layers_split_their_heads_and_generate_as_on_one_shard(shape, k):
  """Qwen3.5's Gated DeltaNet layers split their value heads and fused q|k|v channels like attention heads: over
  tensor in training, over k devices in generation (its recurrent state too); the tokens equal an unsplit run's."""
  want, _, _ = _rollout((1, 8, 1), 1, 1, 4, hybrid=True)
  got, layouts, hlo = _rollout(shape, k, 1, 4, hybrid=True)
  np.testing.assert_array_equal(got["responses"], want["responses"])
  np.testing.assert_allclose(got["rollout_log_probs"], want["rollout_log_probs"], atol=2e-6, rtol=2e-6)
  linear = lambda tree: tree["layers"]["0"]["linear_attn"]
  # in_proj_z [groups, embed, value heads, value dim]; in_proj_qkv [groups, embed, 2 * 2 * 8 + 4 * 8 channels].
  z_shape, qkv_shape = (1, 32, 4, 8), (1, 32, 64)
  assert linear(layouts.actor_train)["in_proj_z"]["kernel"].shard_shape(z_shape) == (
    1,
    32 // shape[1],
    4 // shape[2],
    8,
  )
  assert linear(layouts.actor_train)["in_proj_qkv"]["kernel"].shard_shape(qkv_shape) == (
    1,
    32 // shape[1],
    64 // shape[2],
  )
  assert linear(layouts.actor_generation)["in_proj_z"]["kernel"].shard_shape(z_shape) == (1, 32, 4 // k, 8)
  # The compiled program's recurrent state [linear layers, rows, value heads, key dim, value dim] per device.
  state_shape = f"f32[1,{8 * k // 8},{4 // k},8,8]"
  assert state_shape in hlo, sorted(set(re.findall(r"f32\[1,\d+,\d+,8,8\]", hlo)))
