"""Logical-axis rules per layout, declared once, and the helpers that turn them into shardings.

Train layout: parameters (and optimizer moments) split over `fsdp` on the embed dim and over
`tensor` on heads / mlp / vocab; batch over `(data, fsdp)`.
Generation layout: parameters gathered over `fsdp`, still split over `tensor`; batch over
`(data, fsdp)`; KV cache split by batch and kv-heads. When the rollout asks for more tensor
parallelism (`rollout.tensor_model_parallel_size = fsdp * tensor`), heads / mlp / vocab are split over
`(fsdp, tensor)` and the batch over `data` only.

On a sequence-parallel mesh (`mesh.py`) the rules' `fsdp` means the axes (fsdp, sp) together: the
helpers below expand it, so the tables are written once for both meshes.

A parameter dimension that its mesh axes do not divide is an error naming the parameter, the
dimension and the sizes. Activations and batches are more forgiving: an axis that does not divide
a batch dimension is dropped for that array (small decode batches stay valid).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrlhf.errors import UserError
from jaxrlhf.parallel.mesh import fsdp_axes, fsdp_size

BATCH_AXES = ("data", "fsdp")

TRAIN_RULES = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("length", None),
    ("layers", None),  # the stacked layer axis of scanned layers and of the KV cache
)

GENERATION_RULES = (
    ("batch", BATCH_AXES),
    ("embed", None),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("length", None),
    ("layers", None),  # the stacked layer axis of scanned layers and of the KV cache
)

# Generation with tensor parallelism over fsdp x tensor: every model-parallel dim uses both axes.
GENERATION_WIDE_TP_RULES = (
    ("batch", "data"),
    ("embed", None),
    ("vocab", ("fsdp", "tensor")),
    ("mlp", ("fsdp", "tensor")),
    ("heads", ("fsdp", "tensor")),
    ("kv_heads", ("fsdp", "tensor")),
    ("head_dim", None),
    ("length", None),
    ("layers", None),  # the stacked layer axis of scanned layers and of the KV cache
)


class ShardingError(UserError, ValueError):
  """A parameter dimension is not divisible by the mesh axes its layout puts on it."""


def generation_rules(mesh: Mesh, tensor_model_parallel_size: int):
  """The generation layout for `rollout.tensor_model_parallel_size` on this mesh."""
  tensor, fsdp = mesh.shape["tensor"], fsdp_size(mesh)
  if tensor_model_parallel_size <= tensor:
    return GENERATION_RULES
  if tensor_model_parallel_size == tensor * fsdp:
    return GENERATION_WIDE_TP_RULES
  raise ShardingError(
      f"actor_rollout_ref.rollout.tensor_model_parallel_size={tensor_model_parallel_size} must be <= "
      f"mesh.tensor={tensor} (generation TP = training TP) or mesh.fsdp*mesh.tensor={fsdp * tensor}")


def rule_table(rules) -> dict:
  return dict(rules)


def _as_tuple(axes) -> tuple[str, ...]:
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def _axis_size(mesh: Mesh, axes) -> int:
  return int(np.prod([mesh.shape[a] for a in _as_tuple(axes)]))


def _on_mesh(axes, mesh: Mesh):
  """`axes` of a rule with `fsdp` expanded to the mesh's fsdp axes (module docstring)."""
  expanded = tuple(a for axis in _as_tuple(axes) for a in (fsdp_axes(mesh) if axis == "fsdp" else (axis,)))
  return None if not expanded else (expanded[0] if len(expanded) == 1 else expanded)


def mesh_spec(spec: PartitionSpec, mesh: Mesh) -> PartitionSpec:
  """A spec written with the rules' axis names, on `mesh` (`fsdp` expanded on a sequence-parallel mesh)."""
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
            f"{'/'.join(_as_tuple(axes))} size divides {dim}")
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
