"""LoRA adapters on the decoder's linear layers (and, when named, its embedding and LM head): the `Linear` module
every projection uses, the `Embed` module, merging the adapters into the weights, and the PEFT file layout.

A targeted linear computes y = x W (+ b) + (x A) B * alpha / r, with A [in..., r] and B [r, out...] in
the kernel's own layout (q_proj: A [D, r], B [r, Q, H]; o_proj: A [Q, H, r], B [r, D]). The adapters live
in their own variable collection, "lora", beside "params", under the same module paths
(`layers/self_attn/q_proj/lora_A`): the frozen base and the trainable adapters are two pytrees, and
applying the model without the "lora" collection is the base model (the reference policy). Under the
layer scan the adapters are stacked along the leading `layers` axis like the weights.

Init as PEFT's: A kaiming-uniform (bound 1/sqrt(fan_in)), B zeros, so a fresh adapter changes nothing.
Adapters are fp32 whatever the base's param_dtype; the delta runs in the compute dtype like the base.

PEFT layout (`peft_state_dict`): `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` [r, in] and
`...lora_B.weight` [out, r] (torch Linear layout, heads flattened), with `adapter_config.json`.

Outside the layer stack, with an untied head only, PEFT's two other targets: the LM head ("lm_head") is a
`Linear` too, its adapter `lm_head/lora_A` [D, r], `lm_head/lora_B` [r, V] applied by `decoder.head_outputs`
(the trainer runs the head on chunks of hidden states itself); PEFT's key `base_model.model.lm_head.lora_A.weight`.
The token embedding ("embed_tokens") is an `Embed`: `embed_tokens/lora_A` [V, r], `lora_B` [r, D], PEFT's
`base_model.model.model.embed_tokens.lora_embedding_A` [r, V] and `lora_embedding_B` [D, r].
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# The names are jax-free (the config validates target_modules without loading jax).
from jaxrlhf.config import (  # noqa: F401
  ATTENTION_TARGETS,
  EMBED_TARGET,
  HEAD_TARGET,
  LINEAR_ATTENTION_TARGETS,
  LORA_TARGETS,
  MLP_TARGETS,
  resolve_target_modules,
)
from jaxrlhf.models.projection import project
from jaxrlhf.models.stacking import unstack_groups

COLLECTION = "lora"
RANK_AXIS = "lora_rank"  # the adapters' rank dim: in no layout rule, so replicated


def _kaiming_uniform_A(fan_in: int):
  bound = 1.0 / math.sqrt(fan_in)  # PEFT: kaiming_uniform_(a=sqrt(5)) on [r, in]
  return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)


class Linear(nn.Module):
  """x @ kernel (+ bias), contracting x's last len(in_names) dims (`projection.project`: fp32 accumulation);
  with `lora_rank` > 0 plus the adapter's delta whenever the "lora" collection is given (always at init).
  `kernel_init` / `bias_init` are boxed with logical axes in_names + out_names (`bias`: out_names)."""

  features: tuple[int, ...]
  in_names: tuple[str, ...]
  out_names: tuple[str, ...]
  use_bias: bool
  dtype: Any
  param_dtype: Any
  kernel_init: Any
  lora_rank: int = 0
  lora_alpha: float = 16.0

  @nn.compact
  def __call__(self, x):
    n_in = len(self.in_names)
    in_shape = x.shape[x.ndim - n_in :]
    names = self.in_names + self.out_names
    kernel = self.param(
      "kernel", nn.with_logical_partitioning(self.kernel_init, names), in_shape + self.features, self.param_dtype
    )
    y = project(x.astype(self.dtype), kernel.astype(self.dtype), n_in)
    if self.use_bias:
      bias = self.param(
        "bias",
        nn.with_logical_partitioning(nn.initializers.zeros_init(), self.out_names),
        self.features,
        self.param_dtype,
      )
      y = y + bias.astype(self.dtype)
    if self.lora_rank and (self.is_initializing() or self.has_variable(COLLECTION, "lora_A")):
      rank = self.lora_rank
      init_A = nn.with_logical_partitioning(_kaiming_uniform_A(int(np.prod(in_shape))), self.in_names + (RANK_AXIS,))
      init_B = nn.with_logical_partitioning(nn.initializers.zeros_init(), (RANK_AXIS,) + self.out_names)
      lora_A = self.variable(
        COLLECTION, "lora_A", lambda: init_A(self.make_rng("params"), in_shape + (rank,), jnp.float32)
      ).value
      lora_B = self.variable(COLLECTION, "lora_B", lambda: init_B(None, (rank,) + self.features, jnp.float32)).value
      xa = project(x.astype(self.dtype), nn.unbox(lora_A).astype(self.dtype), n_in)
      delta = project(xa, nn.unbox(lora_B).astype(self.dtype), 1)
      y = y + (delta * (self.lora_alpha / rank)).astype(y.dtype)
    return y


class Embed(nn.Module):
  """The token embedding, `embedding` [V, D] as flax's `nn.Embed` has it; with `lora_rank` > 0 plus the adapter's
  rows whenever the "lora" collection is given: E[ids] + A[ids] B * alpha / r, A [V, r], B [r, D].

  Init as PEFT's embedding adapter, the reverse of a Linear's: A zeros, B standard normal (a fresh adapter changes
  nothing either way). `embedding_init` is boxed with its logical axes by the caller."""

  num_embeddings: int
  features: int
  dtype: Any
  param_dtype: Any
  embedding_init: Any
  lora_rank: int = 0
  lora_alpha: float = 16.0

  @nn.compact
  def __call__(self, ids_BxL):
    embedding_VxD = self.param("embedding", self.embedding_init, (self.num_embeddings, self.features), self.param_dtype)
    x_BxLxD = jnp.take(embedding_VxD.astype(self.dtype), ids_BxL, axis=0)
    if self.lora_rank and (self.is_initializing() or self.has_variable(COLLECTION, "lora_A")):
      rank = self.lora_rank
      init_A = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab", RANK_AXIS))
      init_B = nn.with_logical_partitioning(nn.initializers.normal(1.0), (RANK_AXIS, "embed"))
      lora_A_Vxr = self.variable(
        COLLECTION, "lora_A", lambda: init_A(None, (self.num_embeddings, rank), jnp.float32)
      ).value
      lora_B_rxD = self.variable(
        COLLECTION, "lora_B", lambda: init_B(self.make_rng("params"), (rank, self.features), jnp.float32)
      ).value
      rows_BxLxr = jnp.take(nn.unbox(lora_A_Vxr).astype(self.dtype), ids_BxL, axis=0)
      delta_BxLxD = project(rows_BxLxr, nn.unbox(lora_B_rxD).astype(self.dtype))
      x_BxLxD = x_BxLxD + (delta_BxLxD * (self.lora_alpha / rank)).astype(x_BxLxD.dtype)
    return x_BxLxD


# ----- the adapter trees ------------------------------------------------------------------------


def _adapter_nodes(tree, path=()):
  """(path, node) of every dict in `tree` holding lora_A / lora_B."""
  if isinstance(tree, dict):
    if "lora_A" in tree:
      yield path, tree
      return
    for key, child in tree.items():
      yield from _adapter_nodes(child, path + (key,))


def _delta(lora_A, lora_B, kernel_shape, scale):
  """scale * A @ B in the kernel's shape, fp32; A [lead..., in..., r], B [lead..., r, out...]."""
  lead = lora_A.ndim + lora_B.ndim - 2 - len(kernel_shape)
  lead_shape = kernel_shape[:lead]
  rank = lora_A.shape[-1]
  a = jnp.asarray(lora_A, jnp.float32).reshape(lead_shape + (-1, rank))
  b = jnp.asarray(lora_B, jnp.float32).reshape(lead_shape + (rank, -1))
  return (scale * jnp.matmul(a, b)).reshape(kernel_shape)


def merge_adapters(params, adapters, lora_alpha: float):
  """The base params with every adapter folded into its kernel: W + A B * alpha / r (in W's dtype).

  What generation runs (once per rollout) and what the merged HF export writes.
  """
  if adapters is None:
    return params
  merged = jax.tree.map(lambda x: x, params)  # a new dict tree; leaves shared until replaced

  def node_of(tree, path):
    for key in path:
      tree = tree[key]
    return tree

  for path, node in _adapter_nodes(adapters):
    target = node_of(merged, path)
    name = "embedding" if path[-1] == EMBED_TARGET else "kernel"
    weight = target[name]
    scale = lora_alpha / node["lora_A"].shape[-1]
    target[name] = (weight.astype(jnp.float32) + _delta(node["lora_A"], node["lora_B"], weight.shape, scale)).astype(
      weight.dtype
    )
  return merged


# ----- a LoRA critic's trained part -------------------------------------------------------------

# The value head: fresh (a base checkpoint has none), so with critic LoRA it trains in full beside the
# adapters, as PEFT's `modules_to_save`.
VALUE_HEAD = "score"


def critic_trained(adapters, params) -> dict:
  """What a LoRA critic trains: {"lora": its adapters, "head": {"score": the value head}} of the critic's
  `params` (the head is read from them); `split_value_head` gives the frozen backbone."""
  return {"lora": adapters, "head": {VALUE_HEAD: params[VALUE_HEAD]}}


def split_value_head(params) -> tuple[dict, dict]:
  """(backbone, head) of a value model's params (or of a same-shaped tree of shapes or shardings)."""
  backbone = {key: value for key, value in params.items() if key != VALUE_HEAD}
  return backbone, {VALUE_HEAD: params[VALUE_HEAD]}


def critic_params_with(backbone, trained, lora_alpha: float | None = None):
  """The critic's params: the frozen backbone with the trained value head; with `lora_alpha` also the
  adapters merged in (what export writes). Without it, apply them unmerged (`trained["lora"]`)."""
  params = {**backbone, **trained["head"]}
  return params if lora_alpha is None else merge_adapters(params, trained["lora"], lora_alpha)


def critic_variables(params, trained) -> tuple[Any, Any]:
  """(params, adapters) a critic runs with in training, its trained part unmerged: without LoRA (`trained` None)
  its `params` and no adapters; with it the frozen backbone `params` with the trained value head, and the
  adapters (`trained["lora"]`)."""
  if trained is None:
    return params, None
  return critic_params_with(params, trained), trained["lora"]


def merged_params(params, trained, lora_alpha: float, head: str = "lm"):
  """A trained role's whole params as one tree (`trainer.state.RoleState.merged`): `params` as they are without
  LoRA (`trained` None); with it the frozen `params` with `trained` folded in: a causal LM's adapters
  (`merge_adapters`), a value model's ("value" `head`) {"lora", "head"} (`critic_params_with`)."""
  if trained is None:
    return params
  if head == "value":
    return critic_params_with(params, trained, lora_alpha)
  return merge_adapters(params, trained, lora_alpha)


def outer_targets(model, key: str = "target_modules") -> list[str]:
  """The LoRA targets outside the layer stack (the token embedding, the LM head) of model config section `model`
  (`actor_rollout_ref.model`; `key` names its `target_modules` in errors): none with `lora_rank` 0. Either needs an
  untied head (`validate.check_lora_targets`)."""
  if not model.lora_rank:
    return []
  return [name for name in resolve_target_modules(model.target_modules, key) if name in (EMBED_TARGET, HEAD_TARGET)]


def count_adapter_params(adapters) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(adapters))


def expected_adapter_params(config, head: str = "lm") -> int:
  """r x (in + out) summed over the targeted linears of every layer (a full-attention layer's q/k/v/o, a Gated
  DeltaNet layer's in_proj_*/out_proj, each layer's MLP), plus the embedding's and the LM head's r x (V + D) when
  targeted: what the rank implies."""
  del head
  # A model with experts: the MLP targets are its shared expert's (the routed experts take no adapter).
  D, F = config.hidden_size, config.shared_expert_intermediate_size if config.num_experts else config.intermediate_size
  QH, KH = config.num_attention_heads * config.resolved_head_dim, config.num_key_value_heads * config.resolved_head_dim
  key_channels = config.linear_num_key_heads * config.linear_key_head_dim
  value_channels = config.linear_num_value_heads * config.linear_value_head_dim
  attention = {
    "q_proj": (D, QH * (2 if config.attn_output_gate else 1)),  # the output gate's rows beside the queries
    "k_proj": (D, KH),
    "v_proj": (D, KH),
    "o_proj": (QH, D),
  }
  linear = {
    "in_proj_qkv": (D, 2 * key_channels + value_channels),
    "in_proj_z": (D, value_channels),
    "in_proj_b": (D, config.linear_num_value_heads),
    "in_proj_a": (D, config.linear_num_value_heads),
    "out_proj": (value_channels, D),
  }
  mlp = {"gate_proj": (D, F), "up_proj": (D, F), "down_proj": (F, D)} if F else {}
  per_layer = lambda sizes: sum(config.lora_rank * sum(sizes[name]) for name in config.lora_targets if name in sizes)
  kinds = config.layer_types or ("full_attention",) * config.num_hidden_layers
  mixers = sum(per_layer(linear if kind == "linear_attention" else attention) for kind in kinds)
  outer = sum(
    config.lora_rank * (config.vocab_size + D) for name in (EMBED_TARGET, HEAD_TARGET) if name in config.lora_targets
  )
  return mixers + per_layer(mlp) * config.num_hidden_layers + outer


# ----- PEFT files -------------------------------------------------------------------------------

_MODULE_PARENT = {
  **{name: "self_attn" for name in ATTENTION_TARGETS},
  **{name: "mlp" for name in MLP_TARGETS},
  **{name: "linear_attn" for name in LINEAR_ATTENTION_TARGETS},
}


def peft_state_dict(adapters, prefix: str = "base_model.model") -> dict[str, np.ndarray]:
  """Adapters (stacked `layers/...` or `layers_<i>/...`, `embed_tokens`, `lm_head`) -> PEFT's tensors, torch
  layout, fp32, under HF's module paths: `<prefix>.model.layers.N...`, `<prefix>.model.embed_tokens`,
  `<prefix>.lm_head`."""
  host = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32), adapters)
  if "layers" in host:
    host = unstack_groups(host)
  tensors = {}
  for path, node in _adapter_nodes(host):
    module = path[-1]
    rank = node["lora_A"].shape[-1]
    lora_A, lora_B = (
      np.ascontiguousarray(node["lora_A"].reshape(-1, rank).T),
      np.ascontiguousarray(node["lora_B"].reshape(rank, -1).T),
    )
    if module == EMBED_TARGET:  # PEFT's embedding adapter: parameters, not Linears (no ".weight")
      tensors[f"{prefix}.model.{EMBED_TARGET}.lora_embedding_A"] = lora_A  # [r, V]
      tensors[f"{prefix}.model.{EMBED_TARGET}.lora_embedding_B"] = lora_B  # [D, r]
      continue
    if module == HEAD_TARGET:
      name = f"{prefix}.{HEAD_TARGET}"
    else:
      layer = int(path[0].split("_")[-1])
      parents = ".".join(path[1:-1]) or _MODULE_PARENT[module]  # e.g. "mlp.shared_expert" (Qwen3.5-MoE)
      name = f"{prefix}.model.layers.{layer}.{parents}.{module}"
    tensors[f"{name}.lora_A.weight"] = lora_A
    tensors[f"{name}.lora_B.weight"] = lora_B
  return tensors


def save_peft_adapter(adapters, config, out_dir: str, base_model_name_or_path: str = "") -> str | None:
  """`adapter_config.json` + `adapter_model.safetensors` that `peft.PeftModel.from_pretrained` loads onto the
  base model (a causal LM); nothing (None) for `adapters` None, a model trained without LoRA."""
  if adapters is None:
    return None
  from safetensors.numpy import save_file  # noqa: PLC0415  (only export needs it)

  os.makedirs(out_dir, exist_ok=True)
  adapter_config = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "r": config.lora_rank,
    "lora_alpha": config.lora_alpha,
    # The targets this model has (all-linear names Gated DeltaNet's projections, which a dense model lacks).
    "target_modules": [
      name for name in config.lora_targets if any(path[-1] == name for path, _ in _adapter_nodes(adapters))
    ],
    "lora_dropout": 0.0,
    "bias": "none",
    "fan_in_fan_out": False,
    "use_rslora": False,
    "use_dora": False,
    "init_lora_weights": True,
    "inference_mode": True,
    "modules_to_save": None,
    "base_model_name_or_path": base_model_name_or_path or None,
  }
  with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
    json.dump(adapter_config, f, indent=2)
  save_file(peft_state_dict(adapters), os.path.join(out_dir, "adapter_model.safetensors"))
  return out_dir
