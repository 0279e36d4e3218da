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

`models/` imports no `parallel/` code (that package imports the decoder), so the rules for
activations are written here; `tests/parallel` checks they agree with `activation_sharding`.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

SEQUENCE_AXIS = "sp"  # the mesh axis sequence parallelism splits sequences over (`parallel/mesh.py`)
TENSOR_AXIS = "tensor"
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
  def row_axes(self) -> tuple[str, ...]:
    """The mesh axes rows are split over: the batch's (data, fsdp), fsdp meaning (fsdp, sp) on a mesh with
    an `sp` axis (`parallel.mesh.fsdp_axes`)."""
    return ("data", "fsdp") + ((SEQUENCE_AXIS,) if SEQUENCE_AXIS in self.mesh.axis_names else ())

  def _rows(self, rows: int):
    """The largest prefix of `row_axes` that divides `rows` (the rest of the axes hold copies)."""
    axes = self.row_axes
    while axes and rows % _size(self.mesh, axes):
      axes = axes[:-1]
    return axes or None

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
