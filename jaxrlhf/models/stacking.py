"""The decoder's two layer layouts, and the conversion between them of any tree shaped like its weights.

A model with scanned layers (`scan_layers=True`) holds each layer parameter stacked along a leading layer axis
under `layers/...`; one with a loop of modules (and every checkpoint written before the scan) under
`layers_<i>/...`. `stack_layers` / `unstack_layers` convert any tree (params, adapters, optimizer moments, their
shapes or shardings) between the two: `decoder.params_for` to load weights into either model,
`checkpoint.Checkpointer.restore` to resume a checkpoint of either layout into either model, the PEFT export to
name each layer's tensors. `abstract_stack` / `abstract_layer` convert abstract arrays (with their shardings).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

_LAYER_KEY = re.compile(r"layers_(\d+)$")


def _is_unstacked(node) -> bool:
  return isinstance(node, dict) and "layers_0" in node


def _is_stacked(node) -> bool:
  return isinstance(node, dict) and "layers" in node and isinstance(node["layers"], dict)


def stack_layers(tree, stack=None):
  """Any tree holding `layers_0 .. layers_{n-1}` dicts (params, optimizer moments, their shapes or
  shardings) with each such group replaced by `layers`: one subtree whose leaves stack the layers'
  along a new leading axis. `stack(leaves) -> leaf` (default `jnp.stack`) decides how a leaf stacks."""
  stack = stack or (lambda leaves: jnp.stack(leaves))

  def convert(node):
    if not _is_unstacked(node):
      return node
    indices = sorted(int(m.group(1)) for key in node if (m := _LAYER_KEY.match(str(key))))
    if indices != list(range(len(indices))):
      raise ValueError(f"layers {indices} are not numbered 0..{len(indices) - 1}")
    rest = {k: v for k, v in node.items() if not _LAYER_KEY.match(str(k))}
    layers = [node[f"layers_{i}"] for i in indices]
    return {**rest, "layers": jax.tree.map(lambda *leaves: stack(list(leaves)), *layers)}

  return jax.tree.map(convert, tree, is_leaf=_is_unstacked)


def unstack_layers(tree, unstack=None):
  """The inverse of `stack_layers`: each `layers` group split into `layers_0 .. layers_{n-1}`, n the
  leading dim of its leaves. `unstack(leaf, i) -> layer i of leaf` (default: `leaf[i]`)."""
  unstack = unstack or (lambda leaf, i: leaf[i])

  def convert(node):
    if not _is_stacked(node):
      return node
    rest = {k: v for k, v in node.items() if k != "layers"}
    num_layers = jax.tree.leaves(node["layers"])[0].shape[0]
    return {
      **rest,
      **{f"layers_{i}": jax.tree.map(lambda leaf, i=i: unstack(leaf, i), node["layers"]) for i in range(num_layers)},
    }

  return jax.tree.map(convert, tree, is_leaf=_is_stacked)


def layer_layout(tree) -> str | None:
  """ "stacked" (`layers/...`), "unstacked" (`layers_<i>/...`) or None (no layers) of a tree of nested dicts
  (and other pytree nodes); the first group found decides."""
  found = []
  jax.tree.map(
    lambda node: found.append("stacked" if _is_stacked(node) else "unstacked" if _is_unstacked(node) else None),
    tree,
    is_leaf=lambda n: _is_stacked(n) or _is_unstacked(n),
  )
  return next((layout for layout in found if layout), None)


def _layer_sharding(sharding):
  """One layer's sharding of a stacked leaf: without the leading layer axis."""
  if isinstance(sharding, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(
      sharding.mesh, jax.sharding.PartitionSpec(*tuple(sharding.spec)[1:]), memory_kind=sharding.memory_kind
    )
  return sharding


def abstract_layer(leaf: jax.ShapeDtypeStruct, _: int) -> jax.ShapeDtypeStruct:
  """`unstack_layers`' `unstack` for abstract arrays: one layer's shape and sharding."""
  return jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype, sharding=_layer_sharding(leaf.sharding))


def abstract_stack(leaves: list) -> jax.ShapeDtypeStruct:
  """`stack_layers`' `stack` for abstract arrays: the layers' shape and sharding with a leading, unsplit layer axis."""
  sharding = leaves[0].sharding
  if isinstance(sharding, jax.sharding.NamedSharding):
    sharding = jax.sharding.NamedSharding(
      sharding.mesh, jax.sharding.PartitionSpec(None, *sharding.spec), memory_kind=sharding.memory_kind
    )
  return jax.ShapeDtypeStruct((len(leaves),) + tuple(leaves[0].shape), leaves[0].dtype, sharding=sharding)


def _is_grouped(node) -> bool:
  return _is_stacked(node) and bool(node["layers"]) and all(key.isdigit() for key in node["layers"])


def unstack_groups(tree, unstack=None):
  """`unstack_layers` for a hybrid stack's groups too (`decoder.layer_pattern`: `layers/<position>/...`, each leaf
  [groups, ...]): position j of group g becomes `layers_{g * period + j}`, HF's layer index."""
  unstack = unstack or (lambda leaf, i: leaf[i])

  def convert(node):
    groups = node["layers"]
    period = len(groups)
    count = jax.tree.leaves(groups)[0].shape[0]
    rest = {k: v for k, v in node.items() if k != "layers"}
    layers = {
      f"layers_{g * period + int(position)}": jax.tree.map(lambda leaf, g=g: unstack(leaf, g), subtree)
      for position, subtree in groups.items()
      for g in range(count)
    }
    return {**rest, **layers}

  return unstack_layers(jax.tree.map(lambda n: convert(n) if _is_grouped(n) else n, tree, is_leaf=_is_grouped), unstack)
