"""Ulysses sequence parallelism for the cache-free forward (training, log-probs, values).

Outside attention every activation [B, L, ...] is split along its length over the mesh's `sp` axis (and
its rows over `data` x `fsdp`), so a device holds L / sp of each sequence. Attention needs whole
sequences, so around the attention core (after the projections and RoPE, which are per token)
an all-to-all over `sp` trades length for heads: each device then holds the whole sequence for
K / (tensor * sp) of the key/value heads (and their query groups), runs the unchanged kernel
(xla, blockwise, cudnn, splash: any of `models/attention.py`), and the reverse all-to-all returns
its output to length shards. RoPE positions, the padding mask and packed segment ids are the global
ones: positions are computed before the split, and the mask and segment ids (small int arrays)
reach the core whole.

With fewer key/value heads per tensor shard than `sp` devices (Qwen2.5-7B has 4 at sp=8), each
key/value head is repeated r = sp / gcd(K / tensor, sp) times and its query group split into r parts
(as verl's Ulysses repeats key/value heads): the attention is the same, and every device gets whole
heads. The query heads must still split over tensor x sp (`trainer.program.check_sequence_parallel`).

The `sp` axis is a sub-axis of FSDP: the user's `mesh.fsdp` devices are laid out as `fsdp` x `sp`
(`parallel.mesh.make_mesh`), parameters stay split over both (the layouts read `fsdp` as the pair), and
only these activations tell the two apart. A sequence-parallel group is therefore `sp` neighbouring
FSDP devices that work on the same rows; the rows of a micro-batch are split over the rest
(`data` x `fsdp`), verl's data-parallel size world / sp.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

SEQUENCE_AXIS = "sp"
_ROW_AXES = ("data", "fsdp")  # a sequence-parallel group's rows: the mesh's data-parallel part


@dataclasses.dataclass(frozen=True)
class SequenceParallel:
  """The mesh (with an `sp` axis) a Decoder splits its sequences over; a hashable Flax attribute."""
  mesh: Mesh

  def __post_init__(self):
    if SEQUENCE_AXIS not in self.mesh.axis_names:
      raise ValueError(f"sequence parallelism needs a mesh with an '{SEQUENCE_AXIS}' axis, got {self.mesh.axis_names}")

  @property
  def size(self) -> int:
    return self.mesh.shape[SEQUENCE_AXIS]

  def padded_length(self, length: int) -> int:
    """The length rounded up to a multiple of `size` (shard_map needs equal shards)."""
    return -(-length // self.size) * self.size

  def _row_axes(self, rows: int):
    """The largest prefix of (data, fsdp) that divides `rows` (a row count they do not divide runs
    replicated over the rest, as `layouts.fit_spec` does for batches)."""
    axes = _ROW_AXES
    while axes and rows % _size(self.mesh, axes):
      axes = axes[:-1]
    return axes or None

  def spec(self, x, logical_axes: tuple) -> PartitionSpec:
    """`batch` -> rows, `length` -> sp (where it divides), `heads`/`kv_heads`/`vocab` -> tensor; the rest whole."""
    def one(name, dim):
      if name == "batch":
        return self._row_axes(dim)
      if name == "length":
        return SEQUENCE_AXIS if dim % self.size == 0 else None
      if name in ("heads", "kv_heads", "vocab", "mlp"):
        return "tensor" if dim % self.mesh.shape["tensor"] == 0 else None
      return None
    return PartitionSpec(*(one(name, dim) for name, dim in zip(logical_axes, x.shape)))

  def constrain(self, x, logical_axes: tuple):
    """Pins an activation to the sequence-parallel layout (rows over data x fsdp, length over sp)."""
    return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, self.spec(x, logical_axes)))

  def attention(self, core: Callable, q_BxLxKxGxH, keys_BxLxKxH, values_BxLxKxH, kv_mask_BxL, segment_ids_BxL,
                window_on):
    """`core(q, k, v, kv_mask, segment_ids, window_on) -> out [B, L, K, G, H]` on whole sequences and
    K / (tensor * sp) heads per device, between the two all-to-alls."""
    B, L, K, G, H = q_BxLxKxGxH.shape
    repeat = self.size // math.gcd(K // self.mesh.shape["tensor"], self.size)
    if repeat > 1:
      # Head k's copies (k, 0..r-1) are neighbours, so a tensor shard keeps its own heads' copies; copy j
      # serves the j-th part of the head's query group. jnp.repeat's transpose sums the copies' gradients.
      q_BxLxKxGxH = q_BxLxKxGxH.reshape(B, L, K * repeat, G // repeat, H)
      keys_BxLxKxH = jnp.repeat(keys_BxLxKxH, repeat, axis=2)
      values_BxLxKxH = jnp.repeat(values_BxLxKxH, repeat, axis=2)
      out = self.attention(core, q_BxLxKxGxH, keys_BxLxKxH, values_BxLxKxH, kv_mask_BxL, segment_ids_BxL,
                           window_on)
      return out.reshape(B, L, K, G, H)
    rows = self._row_axes(B)
    length_split = PartitionSpec(rows, SEQUENCE_AXIS, "tensor")
    whole = PartitionSpec(rows, None)
    # Only the operands present enter the shard_map (an absent segment ids / window flag stays None).
    optional = {"segment_ids": (segment_ids_BxL, whole), "window_on": (window_on, PartitionSpec())}
    present = [name for name, (x, _) in optional.items() if x is not None]

    def local(q, k, v, kv_mask, *rest):
      given = dict(zip(present, rest))
      # [b, L/sp, K/t, ...] -> [b, L, K/(t*sp), ...]: split the heads, gather the length.
      to_heads = lambda x: jax.lax.all_to_all(x, SEQUENCE_AXIS, 2, 1, tiled=True)
      out = core(to_heads(q), to_heads(k), to_heads(v), kv_mask, given.get("segment_ids"), given.get("window_on"))
      return jax.lax.all_to_all(out, SEQUENCE_AXIS, 1, 2, tiled=True)

    # The vma check is off: the kernels' custom VJPs and loops carry no varying-axis annotations.
    specs = (length_split,) * 3 + (whole,) + tuple(optional[name][1] for name in present)
    return jax.shard_map(local, mesh=self.mesh, in_specs=specs, out_specs=length_split, check_vma=False)(
        q_BxLxKxGxH, keys_BxLxKxH, values_BxLxKxH, kv_mask_BxL, *(optional[name][0] for name in present))


def _size(mesh: Mesh, axes) -> int:
  size = 1
  for axis in axes:
    size *= mesh.shape[axis]
  return size


def pad_length(x, length: int, value=0):
  """`x` [B, L, ...] padded along L to `length` (padding is masked out: mask and segment id 0)."""
  extra = length - x.shape[1]
  if extra == 0:
    return x
  return jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2), constant_values=value)
