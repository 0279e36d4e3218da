"""Where a cache-free forward's activations live on the mesh, pinned at each decoder layer's boundaries.

The train layout (`parallel.layouts.TRAIN_RULES`) splits parameters over `fsdp` on their embed dim and
the batch over (data, fsdp); activations follow the batch: rows over (data, fsdp) (with `sp` when the
mesh has one and the sequences are not split over it), heads / kv_heads / mlp / vocab over `tensor`,
the hidden (embed) dim, head dim and length whole. An axis that does not divide an array's dimension
is dropped for that array (`layouts.fit_spec` does the same for batches).

Why pin them: only the phase's inputs carry the batch layout, and inside the layer scan (with
rematerialisation, and the packed / padded `cond` of a forward phase) XLA's sharding propagation may
follow an FSDP-split weight instead. For a 7B packed micro-batch of 128 rows it replicated the MLP's
[rows, length, 18944] activations on every GPU (119 GiB per H100) rather than gather the weights.
Constraining the layer's input, q/k/v, the MLP intermediate and the output to the batch layout makes
XLA gather the (small) weights and keep the (large) activations split, as FSDP intends.

The layout also runs what XLA cannot partition: `attention` puts a Mosaic kernel (Pallas splash attention)
in a `shard_map` over rows and key/value heads. `SequenceParallel` is this layout with the length split
over `sp` and its own `attention` (the all-to-all).

`models/` imports no `parallel/` code (that package imports the decoder), so the rules for
activations are written here; `tests/parallel` checks they agree with `activation_sharding`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

SEQUENCE_AXIS = "sp"  # the mesh axis sequence parallelism splits sequences over (`parallel/mesh.py`)
TENSOR_AXIS = "tensor"
DATA_AXIS = "data"
_TENSOR_SPLIT = ("heads", "kv_heads", "mlp", "vocab")  # logical axes of activations split over `tensor`


def _size(mesh: Mesh, axes) -> int:
  size = 1
  for axis in axes:
    size *= mesh.shape[axis]
  return size


@dataclasses.dataclass(frozen=True)
class ActivationLayout:
  """The train layout of activations on `mesh` (the module docstring); a hashable Flax attribute."""

  mesh: Mesh

  @property
  def fsdp_axes(self) -> tuple[str, ...]:
    """The sub-axes of the user's fsdp axis, outer first: every axis but data and tensor (`fsdp` alone, or
    refined by `sp` / `rollout_tp`: `parallel.mesh`)."""
    return tuple(axis for axis in self.mesh.axis_names if axis not in (DATA_AXIS, TENSOR_AXIS))

  @property
  def row_axes(self) -> tuple[str, ...]:
    """The mesh axes rows are split over: the batch's (data, fsdp), fsdp meaning all its sub-axes."""
    return (DATA_AXIS,) + self.fsdp_axes

  def _rows(self, rows: int):
    """The largest prefix of `row_axes` that divides `rows` (the rest of the axes hold copies)."""
    axes = self.row_axes
    while axes and rows % _size(self.mesh, axes):
      axes = axes[:-1]
    return None if not axes else (axes[0] if len(axes) == 1 else axes)

  def _axis(self, name, dim: int):
    if name == "batch":
      return self._rows(dim)
    if name in _TENSOR_SPLIT:
      return TENSOR_AXIS if dim % self.mesh.shape[TENSOR_AXIS] == 0 else None
    return None

  def spec(self, x, logical_axes: tuple) -> PartitionSpec:
    return PartitionSpec(*(self._axis(name, dim) for name, dim in zip(logical_axes, x.shape)))

  def constrain(self, x, logical_axes: tuple):
    """`x` pinned to this layout by its logical axes; on a one-device mesh, `x` itself."""
    if self.mesh.size == 1:
      return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, self.spec(x, logical_axes)))

  def attention(
    self, core: Callable, q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, kv_mask_BxS, segment_ids_BxL, window_on
  ):
    """`core(q, k, v, kv_mask, segment_ids, window_on) -> out [B, L, K, G, H]` run on each device's rows and
    key/value heads: for a kernel XLA cannot partition (Pallas splash attention, a Mosaic custom call)."""
    if self.mesh.size == 1:
      return core(q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, kv_mask_BxS, segment_ids_BxL, window_on)
    heads = TENSOR_AXIS if keys_BxSxKxH.shape[2] % self.mesh.shape[TENSOR_AXIS] == 0 else None
    return self._shard_attention(
      core,
      PartitionSpec(self._rows(q_BxLxKxGxH.shape[0]), None, heads),
      q_BxLxKxGxH,
      keys_BxSxKxH,
      values_BxSxKxH,
      kv_mask_BxS,
      segment_ids_BxL,
      window_on,
    )

  def experts(self, local: Callable, x_TxD, experts_Txk, weights_Txk, kernels: dict, kernel_axes: dict):
    """`local(x, experts, weights, kernels) -> [T, D]` (`moe.grouped_experts` around a family's expert function) on
    each device's own tokens: the sort by expert and the grouped matmul's loop, which XLA would otherwise run on every
    token on every device. `kernels` {name: [E, ...]} with their logical axes `kernel_axes` {name: tuple}: they enter
    whole over fsdp (gathered, as a dense layer's are) and split over `tensor` on their hidden dim (`expert_mlp`), so
    each tensor device computes a part of every pair's output and the parts are summed. A kernel without an
    `expert_mlp` dim (a bias on the output) enters whole on every tensor device: `local` must add it once, not on
    each part (gpt-oss adds its output bias outside)."""
    if self.mesh.size == 1:
      return local(x_TxD, experts_Txk, weights_Txk, kernels)
    rows = self._rows(x_TxD.shape[0])
    # Every kernel's hidden dim splits, or none does: the parts must hold the same hidden units.
    hidden_dims = [
      dim for name in kernels for axis, dim in zip(kernel_axes[name], kernels[name].shape) if axis == "expert_mlp"
    ]
    split = all(dim % self.mesh.shape[TENSOR_AXIS] == 0 for dim in hidden_dims)
    kernel_specs = {
      name: PartitionSpec(*(TENSOR_AXIS if split and axis == "expert_mlp" else None for axis in kernel_axes[name]))
      for name in kernels
    }

    def body(x, experts, weights, kernels):
      out = local(x, experts, weights, kernels)
      return jax.lax.psum(out, TENSOR_AXIS) if split else out

    tokens = PartitionSpec(rows, None)
    specs = (tokens,) * 3 + (kernel_specs,)
    return jax.shard_map(body, mesh=self.mesh, in_specs=specs, out_specs=tokens, check_vma=False)(
      x_TxD, experts_Txk, weights_Txk, kernels
    )

  def _shard_attention(
    self,
    local: Callable,
    split: PartitionSpec,
    q_BxLxKxGxH,
    keys_BxSxKxH,
    values_BxSxKxH,
    kv_mask_BxS,
    segment_ids_BxL,
    window_on,
  ):
    """`local` in a shard_map: q, k, v and the output split as `split` (rows, length, heads), the mask and
    segment ids by rows only, the window flag whole."""
    whole = PartitionSpec(split[0], None)
    # Only the operands present enter the shard_map (an absent segment ids / window flag stays None).
    optional = {"segment_ids": (segment_ids_BxL, whole), "window_on": (window_on, PartitionSpec())}
    present = [name for name, (x, _) in optional.items() if x is not None]

    def body(q, k, v, kv_mask, *rest):
      given = dict(zip(present, rest))
      return local(q, k, v, kv_mask, given.get("segment_ids"), given.get("window_on"))

    # The vma check is off: the kernels' custom VJPs and loops carry no varying-axis annotations.
    specs = (split,) * 3 + (whole,) + tuple(optional[name][1] for name in present)
    return jax.shard_map(body, mesh=self.mesh, in_specs=specs, out_specs=split, check_vma=False)(
      q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, kv_mask_BxS, *(optional[name][0] for name in present)
    )
