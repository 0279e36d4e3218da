"""The named device mesh `(data, fsdp, tensor)` built from the `mesh` config section.

With Ulysses sequence parallelism (`ulysses_sequence_parallel_size` = sp > 1) the same devices form
`(data, fsdp, sp, tensor)`: the user's `mesh.fsdp` devices split as fsdp / sp x sp, neighbours in the
same sequence-parallel group. Layouts read `fsdp` as the pair (`fsdp_axes`), so parameters and batches
are laid out exactly as on the three-axis mesh; only the sequence-parallel forward tells `sp` apart
(`models/sequence_parallel.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh

from jaxrlhf.config import SEQUENCE_PARALLEL_KEYS, ConfigError, sequence_parallel_sizes
from jaxrlhf.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")
SEQUENCE_AXIS = "sp"  # the sub-axis of fsdp that sequence parallelism splits sequences over


class MeshError(UserError, ValueError):
  """The requested mesh shape does not match the devices."""


def resolve_mesh_shape(requested: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Fills one -1 entry so the product equals `num_devices`; errors name both numbers."""
  requested = tuple(int(x) for x in requested)
  fills = [i for i, x in enumerate(requested) if x == -1]
  if len(fills) > 1:
    raise MeshError(f"mesh {dict(zip(MESH_AXES, requested))}: at most one axis may be -1 (fill)")
  if any(x == 0 or x < -1 for x in requested):
    raise MeshError(f"mesh {dict(zip(MESH_AXES, requested))}: sizes must be positive or -1")
  known = math.prod(x for x in requested if x != -1)
  if fills:
    if num_devices % known:
      raise MeshError(f"mesh {dict(zip(MESH_AXES, requested))}: {num_devices} devices are not divisible "
                      f"by the fixed axes' product {known}")
    shape = list(requested)
    shape[fills[0]] = num_devices // known
    return tuple(shape)
  if known != num_devices:
    raise MeshError(f"mesh {dict(zip(MESH_AXES, requested))} has {known} devices in all, "
                    f"but {num_devices} devices are available (mesh.data*mesh.fsdp*mesh.tensor must equal it)")
  return requested


def make_mesh(shape: Sequence[int] | None = None, devices: Sequence[jax.Device] | None = None,
              sequence_parallel: int = 1) -> Mesh:
  """A mesh with Auto axis types (with_sharding_constraint refuses Explicit axes); with
  `sequence_parallel` > 1 its fsdp axis is split into (fsdp, sp) (the module docstring)."""
  devices = list(devices) if devices is not None else jax.devices()
  shape = resolve_mesh_shape(shape if shape is not None else (1, -1, 1), len(devices))
  mesh = jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)
  if sequence_parallel == 1:
    return mesh
  data, fsdp, tensor = shape
  if fsdp % sequence_parallel:
    raise MeshError(f"ulysses_sequence_parallel_size={sequence_parallel} must divide mesh.fsdp={fsdp} "
                    "(a sequence-parallel group is part of the fsdp axis)")
  axes = ("data", "fsdp", SEQUENCE_AXIS, "tensor")
  # The 3-axis mesh's device order, refined: fsdp index i is (i // sp, i % sp).
  return Mesh(mesh.devices.reshape(data, fsdp // sequence_parallel, sequence_parallel, tensor), axes,
              axis_types=(AxisType.Auto,) * len(axes))


def fsdp_axes(mesh) -> tuple[str, ...]:
  """The mesh axes the `fsdp` of the layouts means: ("fsdp",), or ("fsdp", "sp") on a sequence-parallel mesh."""
  return ("fsdp", SEQUENCE_AXIS) if SEQUENCE_AXIS in mesh.axis_names else ("fsdp",)


def fsdp_size(mesh) -> int:
  """The user's `mesh.fsdp`: devices of the fsdp axis, sequence-parallel ones included."""
  return math.prod(mesh.shape[axis] for axis in fsdp_axes(mesh))


def mesh_from_config(config, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The mesh of a resolved config: its `mesh` section, with an `sp` axis when a model is sequence-parallel."""
  devices = list(devices) if devices is not None else jax.devices()
  shape = resolve_mesh_shape((config.mesh.data, config.mesh.fsdp, config.mesh.tensor), len(devices))
  sizes = sequence_parallel_sizes(config)
  role, size = max(sizes.items(), key=lambda item: item[1])
  if shape[1] % size:
    raise ConfigError(f"config key {SEQUENCE_PARALLEL_KEYS[role]}={size} must divide mesh.fsdp={shape[1]} "
                      f"(mesh {dict(zip(MESH_AXES, shape))} on {len(devices)} devices): a sequence-parallel group "
                      "is part of the fsdp axis")
  return make_mesh(shape, devices, size)
