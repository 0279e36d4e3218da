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
(`data` x `fsdp`), verl's data-parallel size world / sp. When generation's tensor parallelism also takes
a sub-axis of fsdp smaller than sp (`rollout_tp`, innermost), the group is the pair (`sp`, `rollout_tp`):
the sequence axes are the fsdp sub-axes from `sp` inward (`sequence_axes`), the rows' those before it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jaxrlhf.models.activation_layout import SEQUENCE_AXIS, ActivationLayout


@dataclasses.dataclass(frozen=True)
class SequenceParallel(ActivationLayout):
  """The mesh (with an `sp` axis) a Decoder splits its sequences over; a hashable Flax attribute.

  Its activation layout is `ActivationLayout`'s with the length over `sp` and the rows over the rest of
  the data-parallel axes."""

  def __post_init__(self):
    if SEQUENCE_AXIS not in self.mesh.axis_names:
      raise ValueError(f"sequence parallelism needs a mesh with an '{SEQUENCE_AXIS}' axis, got {self.mesh.axis_names}")

  @property
  def sequence_axes(self) -> tuple[str, ...]:
    """The fsdp sub-axes a sequence is split over: ("sp",), or ("sp", "rollout_tp") (`parallel.mesh`)."""
    axes = self.fsdp_axes
    return axes[axes.index(SEQUENCE_AXIS) :]

  @property
  def size(self) -> int:
    return math.prod(self.mesh.shape[axis] for axis in self.sequence_axes)

  @property
  def row_axes(self) -> tuple[str, ...]:
    """A sequence-parallel group's rows: the mesh's data-parallel part (data and fsdp's outer sub-axes)."""
    return ("data",) + self.fsdp_axes[: self.fsdp_axes.index(SEQUENCE_AXIS)]

  @property
  def _sequence_spec(self):
    """The sequence axes as one PartitionSpec entry."""
    return self.sequence_axes[0] if len(self.sequence_axes) == 1 else self.sequence_axes

  def padded_length(self, length: int) -> int:
    """The length rounded up to a multiple of `size` (shard_map needs equal shards)."""
    return -(-length // self.size) * self.size

  def _axis(self, name, dim: int):
    if name == "length":
      return self._sequence_spec if dim % self.size == 0 else None
    return super()._axis(name, dim)

  def attention(
    self, core: Callable, q_BxLxKxGxH, keys_BxLxKxH, values_BxLxKxH, kv_mask_BxL, segment_ids_BxL, window_on
  ):
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
      out = self.attention(core, q_BxLxKxGxH, keys_BxLxKxH, values_BxLxKxH, kv_mask_BxL, segment_ids_BxL, window_on)
      return out.reshape(B, L, K, G, H)

    def local(q, k, v, kv_mask, segment_ids, window_on):
      # [b, L/sp, K/t, ...] -> [b, L, K/(t*sp), ...]: split the heads, gather the length.
      to_heads = lambda x: jax.lax.all_to_all(x, self.sequence_axes, 2, 1, tiled=True)
      out = core(to_heads(q), to_heads(k), to_heads(v), kv_mask, segment_ids, window_on)
      return jax.lax.all_to_all(out, self.sequence_axes, 1, 2, tiled=True)

    length_split = PartitionSpec(self._rows(q_BxLxKxGxH.shape[0]), self._sequence_spec, "tensor")
    return self._shard_attention(
      local, length_split, q_BxLxKxGxH, keys_BxLxKxH, values_BxLxKxH, kv_mask_BxL, segment_ids_BxL, window_on
    )


def training_layout(mesh, sequence_parallel: int) -> ActivationLayout | None:
  """The activation layout of a train-layout forward: none without a mesh, the length split over `sp`
  under sequence parallelism (size > 1), else rows only."""
  if mesh is None:
    return None
  return SequenceParallel(mesh) if sequence_parallel > 1 else ActivationLayout(mesh)


def pad_length(x, length: int, value=0):
  """`x` [B, L, ...] padded along L to `length` (padding is masked out: mask and segment id 0)."""
  extra = length - x.shape[1]
  if extra == 0:
    return x
  return jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2), constant_values=value)
