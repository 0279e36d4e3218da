"""The named device mesh `(data, fsdp, tensor)` built from the `mesh` config section."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh

from jaxrlhf.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")


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


def make_mesh(shape: Sequence[int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh with Auto axis types (with_sharding_constraint refuses Explicit axes)."""
  devices = list(devices) if devices is not None else jax.devices()
  shape = resolve_mesh_shape(shape if shape is not None else (1, -1, 1), len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def mesh_from_config(mesh_config, devices: Sequence[jax.Device] | None = None) -> Mesh:
  return make_mesh((mesh_config.data, mesh_config.fsdp, mesh_config.tensor), devices)
