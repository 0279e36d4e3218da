"""Logical-axis rules per layout, declared once, and the helpers that turn them into shardings.

Train layout: parameters (and optimizer moments) split over `fsdp` on the embed dim and over
`tensor` on heads / mlp / vocab; batch over `(data, fsdp)`.
Generation layout: parameters gathered over `fsdp`'s data-parallel part, split over `tensor` and the
rollout TP part of `fsdp`; batch over `data` x the data-parallel part; KV cache split by batch and
kv-heads. With `rollout.tensor_model_parallel_size` = k <= mesh.tensor the rollout TP part is empty
(generation TP = training TP: parameters gathered over all of fsdp); with k > mesh.tensor (verl's
inference-engine TP, wider than training's) it is a sub-axis of k / tensor fsdp devices (`mesh.py`), so
heads / mlp / vocab are split k ways and the batch over the other data x fsdp / (k / tensor) devices.

The rules name parts of the user's fsdp axis, which the mesh may refine into sub-axes (`mesh.py`), and
the helpers below expand them: `fsdp` is all of it (the train layout is the same on every mesh),
`fsdp:rollout_tp` its generation TP part, `fsdp:rollout_dp` the rest.

A parameter dimension that its mesh axes do not divide is an error naming the parameter, the
dimension and the sizes. Activations and batches are more forgiving: an axis that does not divide
a batch dimension is dropped for that array (small decode batches stay valid).
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrlhf.errors import UserError
from jaxrlhf.parallel.mesh import (
  ROLLOUT_TP_KEY,
  fsdp_axes,
  rollout_dp_axes,
  rollout_tensor_parallel_size,
  rollout_tp_axes,
)

ROLLOUT_TP = "fsdp:rollout_tp"  # the fsdp devices generation splits heads / mlp / vocab over, with tensor
ROLLOUT_DP = "fsdp:rollout_dp"  # the other fsdp devices: with data they split generation's batch
_PARTS = {"fsdp": fsdp_axes, ROLLOUT_TP: rollout_tp_axes, ROLLOUT_DP: rollout_dp_axes}

BATCH_AXES = ("data", "fsdp")

TRAIN_RULES = (
  ("batch", BATCH_AXES),
  ("embed", "fsdp"),
  ("vocab", "tensor"),
  ("mlp", "tensor"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  # Gated DeltaNet (Qwen3.5's linear attention): its value heads, and the fused q|k|v channels of in_proj_qkv and
  # the conv, split as attention heads do. Contiguous blocks of the fused channels need not hold whole heads of
  # q, k and v: XLA moves them between the conv and the delta rule (a layer's activations, not its weights).
  ("linear_heads", "tensor"),
  ("conv_channels", "tensor"),
  # Mixture of experts (`models/moe.py`): the experts themselves over fsdp (each device stores E / fsdp whole experts,
  # their hidden dim over tensor). The forward still gathers a layer's experts over fsdp (`ActivationLayout.experts`
  # runs each device's own tokens through all of them): split on E, the leading dim of a layer's [E, D, F], the gather
  # and the gradient's reduce-scatter move contiguous blocks, where split on D (as a dense MLP's embed dim) XLA laid
  # the stacked weights, gradients and Adam moments out D-major for them and transposed copies of each (five 4.5 GiB
  # copies in Qwen3-30B-A3B's update). No all-to-all of tokens (docs/architecture.md, "Mixture of experts").
  ("experts", "fsdp"),
  ("expert_embed", None),
  ("expert_mlp", "tensor"),
  ("head_dim", None),
  ("length", None),
  ("layers", None),  # the stacked layer axis of scanned layers and of the KV cache
)

GENERATION_RULES = (
  ("batch", ("data", ROLLOUT_DP)),
  ("embed", None),
  ("vocab", (ROLLOUT_TP, "tensor")),
  ("mlp", (ROLLOUT_TP, "tensor")),
  ("heads", (ROLLOUT_TP, "tensor")),
  ("kv_heads", (ROLLOUT_TP, "tensor")),
  ("linear_heads", (ROLLOUT_TP, "tensor")),
  ("conv_channels", (ROLLOUT_TP, "tensor")),
  ("experts", None),
  ("expert_embed", None),
  ("expert_mlp", (ROLLOUT_TP, "tensor")),
  ("head_dim", None),
  ("length", None),
  ("layers", None),  # the stacked layer axis of scanned layers and of the KV cache
)


def with_rules(rules, **changes):
  """`rules` with some logical axes mapped elsewhere."""
  return tuple((name, changes.get(name, axes)) for name, axes in rules)


# Train -> generation in steps XLA moves efficiently (from the train layout straight to the generation one,
# its partitioner gathers each whole parameter on every device first, "involuntary full rematerialization"):
# first the rollout TP part of fsdp moves from the embed dim to the heads / mlp / vocab dim (an all-to-all,
# each device still holding 1 / fsdp of a weight), then the rest of fsdp is gathered (an all-gather).
GENERATION_STAGING_RULES = with_rules(GENERATION_RULES, embed=ROLLOUT_DP, experts=ROLLOUT_DP)
# Key/value weights whose heads generation repeats (`generation_kv_repeat`) are first gathered over the rollout
# TP part of fsdp (their heads split only over tensor, as in training), then repeated.
GENERATION_KV_STAGING_RULES = with_rules(GENERATION_RULES, embed=ROLLOUT_DP, experts=ROLLOUT_DP, kv_heads="tensor")


class ShardingError(UserError, ValueError):
  """A parameter dimension is not divisible by the mesh axes its layout puts on it."""


def generation_rules(mesh: Mesh, tensor_model_parallel_size: int):
  """The generation layout for `rollout.tensor_model_parallel_size` on this mesh, which must have been built
  for it (`mesh.mesh_from_config` / `make_mesh(..., rollout_tensor_parallel=k)`)."""
  k, tensor = int(tensor_model_parallel_size), mesh.shape["tensor"]
  if rollout_tensor_parallel_size(mesh) != max(k, tensor):
    raise ShardingError(
      f"{ROLLOUT_TP_KEY}={k}: the mesh {dict(mesh.shape)} splits generation over "
      f"{rollout_tensor_parallel_size(mesh)} devices; build it with make_mesh(..., rollout_tensor_parallel={k})"
    )
  return GENERATION_RULES


def generation_kv_repeat(mesh: Mesh, num_attention_heads: int, num_key_value_heads: int) -> int:
  """How many copies of each key/value head generation keeps so that its heads split over the rollout TP
  devices (`parallel.mesh.rollout_tensor_parallel_size`, k): k / gcd(K, k). 1 when k divides K (the train
  layout already needs `tensor` to divide K). Qwen2-72B's 8 at k = 16: 2 copies each, one per device. The
  query heads must split k ways (then the copies divide each query group)."""
  k = rollout_tensor_parallel_size(mesh)
  if num_attention_heads % k:
    raise ShardingError(
      f"{ROLLOUT_TP_KEY}: generation splits the model's num_attention_heads="
      f"{num_attention_heads} over {k} devices (mesh {dict(mesh.shape)}); choose a size that "
      "divides them"
    )
  return k // math.gcd(num_key_value_heads, k)


def rule_table(rules) -> dict:
  return dict(rules)


def _as_tuple(axes) -> tuple[str, ...]:
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def _axis_size(mesh: Mesh, axes) -> int:
  return int(np.prod([mesh.shape[a] for a in _as_tuple(axes)]))


def _on_mesh(axes, mesh: Mesh):
  """`axes` of a rule with the parts of fsdp expanded to the mesh's axes (module docstring)."""
  expanded = tuple(a for axis in _as_tuple(axes) for a in (_PARTS[axis](mesh) if axis in _PARTS else (axis,)))
  return None if not expanded else (expanded[0] if len(expanded) == 1 else expanded)


def mesh_spec(spec: PartitionSpec, mesh: Mesh) -> PartitionSpec:
  """A spec written with the rules' axis names, on `mesh` (the parts of fsdp expanded)."""
  return PartitionSpec(*(_on_mesh(axes, mesh) for axes in spec))


def fit_spec(spec: PartitionSpec, shape, mesh: Mesh) -> PartitionSpec:
  """Drops mesh axes from dims they do not divide (keeps the largest dividing prefix of a tuple)."""
  fitted = []
  spec = mesh_spec(spec, mesh)
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    axes = _as_tuple(axes)
    while axes and dim % _axis_size(mesh, axes):
      axes = axes[:-1]
    fitted.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
  return PartitionSpec(*fitted)


def logical_to_mesh_spec(logical_axes, rules) -> PartitionSpec:
  table = rule_table(rules)
  return PartitionSpec(*(table.get(name) if name is not None else None for name in logical_axes))


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def logical_to_shardings(logical_tree, shape_tree, mesh: Mesh, rules):
  """Tree of logical-axis tuples + tree of shapes -> tree of NamedShardings for `mesh`.

  Raises ShardingError naming the parameter, logical axis, mesh axes and sizes when a mesh axis
  does not divide the dimension it is assigned to.
  """

  def one(path, logical_axes, shaped):
    spec = mesh_spec(logical_to_mesh_spec(logical_axes, rules), mesh)
    for dim, name, axes in zip(shaped.shape, logical_axes, spec):
      size = _axis_size(mesh, axes)
      if dim % size:
        raise ShardingError(
          f"parameter '{_path_name(path)}' dimension '{name}' of size {dim} is not divisible by mesh axis "
          f"{'*'.join(_as_tuple(axes))} of size {size} (shape {tuple(shaped.shape)}); choose a mesh whose "
          f"{'/'.join(_as_tuple(axes))} size divides {dim}"
        )
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(one, logical_tree, shape_tree, is_leaf=lambda x: isinstance(x, tuple))


def batch_sharding(mesh: Mesh, shape, batch_axes=BATCH_AXES) -> NamedSharding:
  """Leading (batch) dim over `batch_axes` where it divides; the rest replicated."""
  spec = PartitionSpec(batch_axes, *([None] * (len(shape) - 1)))
  return NamedSharding(mesh, fit_spec(spec, shape, mesh))


def activation_sharding(mesh: Mesh, logical_axes, shape, rules) -> NamedSharding:
  """Sharding of an activation (e.g. the KV cache) by its logical axes, dropping axes that do not divide."""
  return NamedSharding(mesh, fit_spec(logical_to_mesh_spec(logical_axes, rules), shape, mesh))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())
