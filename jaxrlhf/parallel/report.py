"""A start-up report of the mesh and layouts: each parameter group's sharding in the train and
generation layouts, and per-device bytes of parameters, optimizer state and KV cache."""

from __future__ import annotations

import re

import jax
import numpy as np
from jax.sharding import Mesh


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def per_device_bytes(tree, shardings=None) -> int:
  """Bytes one device holds: real arrays by their first addressable shard, abstract ones by shard shape."""
  total = 0
  leaves = jax.tree.leaves(tree)
  sharding_leaves = jax.tree.leaves(shardings) if shardings is not None else [None] * len(leaves)
  for leaf, sharding in zip(leaves, sharding_leaves):
    sharding = sharding or getattr(leaf, "sharding", None)
    itemsize = np.dtype(leaf.dtype).itemsize
    if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
      total += leaf.addressable_shards[0].data.nbytes
    elif sharding is not None:
      total += int(np.prod(sharding.shard_shape(leaf.shape))) * itemsize
    else:
      total += int(np.prod(leaf.shape)) * itemsize
  return total


def _groups(shardings_by_layout: dict):
  """{group name: {layout: spec}}; layers_N are folded into layers_* when every layer agrees."""
  groups: dict[str, dict[str, str]] = {}
  for layout, tree in shardings_by_layout.items():
    for path, sharding in jax.tree_util.tree_flatten_with_path(tree)[0]:
      name = re.sub(r"layers_\d+", "layers_*", _path_name(path))
      groups.setdefault(name, {})[layout] = str(tuple(sharding.spec))
  return groups


def fmt_bytes(n: int) -> str:
  for unit in ("B", "KiB", "MiB", "GiB"):
    if n < 1024 or unit == "GiB":
      return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
    n /= 1024
  return f"{n} B"


def layout_report(mesh: Mesh, shardings_by_layout: dict, byte_counts: dict[str, int]) -> str:
  """Text table: mesh, each param group's PartitionSpec per layout, per-device bytes by item."""
  lines = [f"mesh {dict(mesh.shape)} on {mesh.size} {mesh.devices.flat[0].platform} device(s)"]
  layouts = list(shardings_by_layout)
  groups = _groups(shardings_by_layout)
  width = max(len(name) for name in groups)
  lines.append("  " + "param".ljust(width) + "  " + "  ".join(layout.ljust(28) for layout in layouts))
  for name, specs in groups.items():
    lines.append("  " + name.ljust(width) + "  " + "  ".join(specs.get(layout, "-").ljust(28) for layout in layouts))
  lines.append("per-device memory: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in byte_counts.items()))
  return "\n".join(lines)
