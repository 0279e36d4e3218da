"""Logical-axis rules per layout, declared once, and the helpers that turn them into shardings.

Train layout: parameters split over `fsdp` (embed dim) and `tensor` (heads / mlp / vocab).
Generation layout: parameters gathered over `fsdp`, still split over `tensor`. Batches are split
over `(data, fsdp)` in both. A mesh axis that does not divide a dimension is dropped for that array
(e.g. a vocab of 50 on tensor=4), so every parameter tree has a valid sharding on every mesh.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

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
)


def _axis_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  if isinstance(axes, str):
    axes = (axes,)
  return int(np.prod([mesh.shape[a] for a in axes]))


def fit_spec(spec: PartitionSpec, shape, mesh: Mesh) -> PartitionSpec:
  """Drops mesh axes from dims they do not divide (keeps the largest dividing prefix of a tuple)."""
  fitted = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    if axes is None:
      fitted.append(None)
      continue
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    while axes and dim % _axis_size(mesh, axes):
      axes = axes[:-1]
    fitted.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
  return PartitionSpec(*fitted)


def logical_to_mesh_spec(logical_axes, rules) -> PartitionSpec:
  table = dict(rules)
  return PartitionSpec(*(table.get(name) if name is not None else None for name in logical_axes))


def logical_to_shardings(logical_tree, shape_tree, mesh: Mesh, rules):
  """Tree of logical-axis tuples + tree of shapes -> tree of NamedShardings for `mesh`."""
  def one(logical_axes, shaped):
    spec = logical_to_mesh_spec(logical_axes, rules)
    return NamedSharding(mesh, fit_spec(spec, shaped.shape, mesh))
  return jax.tree.map(one, logical_tree, shape_tree, is_leaf=lambda x: isinstance(x, tuple))


def batch_sharding(mesh: Mesh, shape) -> NamedSharding:
  """Leading (batch) dim over (data, fsdp) where it divides; the rest replicated."""
  spec = PartitionSpec(BATCH_AXES, *([None] * (len(shape) - 1)))
  return NamedSharding(mesh, fit_spec(spec, shape, mesh))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())
