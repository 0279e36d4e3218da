"""The named device mesh `(data, fsdp, tensor)` built from the `mesh` config section.

The user's `mesh.fsdp` devices may be refined into sub-axes, neighbours innermost, when something other
than FSDP needs a part of them:
- Ulysses sequence parallelism (`ulysses_sequence_parallel_size` = sp > 1): an `sp` sub-axis, the devices
  that split each sequence of a training forward (`models/sequence_parallel.py`);
- generation tensor parallelism wider than training's (`rollout.tensor_model_parallel_size` = k >
  `mesh.tensor`, verl's inference-engine TP): a `rollout_tp` sub-axis of r = k / tensor devices, which
  generation splits heads / mlp / vocab over together with `tensor` (`layouts.GENERATION_RULES`).

    neither                (data, fsdp, tensor)
    sp                     (data, fsdp / sp, sp, tensor)
    rollout TP             (data, fsdp / r, rollout_tp = r, tensor)
    both, r <= sp          (data, fsdp / sp, sp = sp / r, rollout_tp = r, tensor)    sp is (sp, rollout_tp)
    both, r > sp           (data, fsdp / r, rollout_tp = r / sp, sp = sp, tensor)    rollout TP is (rollout_tp, sp)

Each is the three-axis mesh's device order, refined (fsdp index i = (i // inner, i % inner)), so the two
groups nest: a sequence-parallel group and a generation TP group are each one block of neighbouring
devices (one NVLink domain where they fit), the smaller inside the larger; sizes that do not nest (one
dividing the other) are an error. The sequence-parallel devices are the fsdp sub-axes from `sp` inward
(`sequence_axes`), the generation TP ones those from `rollout_tp` inward (`rollout_tp_axes`).

Layouts read the rules' `fsdp` as all the sub-axes (`fsdp_axes`), so parameters, optimizer state and
training batches are laid out exactly as on the three-axis mesh: the train layout does not change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh

from jaxrlhf.config import SEQUENCE_PARALLEL_KEYS, ConfigError, sequence_parallel_sizes
from jaxrlhf.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")
SEQUENCE_AXIS = "sp"  # the sub-axis of fsdp that sequence parallelism splits sequences over
ROLLOUT_TP_AXIS = "rollout_tp"  # the sub-axis of fsdp that generation adds to tensor parallelism
ROLLOUT_TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


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
      raise MeshError(
        f"mesh {dict(zip(MESH_AXES, requested))}: {num_devices} devices are not divisible "
        f"by the fixed axes' product {known}"
      )
    shape = list(requested)
    shape[fills[0]] = num_devices // known
    return tuple(shape)
  if known != num_devices:
    raise MeshError(
      f"mesh {dict(zip(MESH_AXES, requested))} has {known} devices in all, "
      f"but {num_devices} devices are available (mesh.data*mesh.fsdp*mesh.tensor must equal it)"
    )
  return requested


def rollout_fsdp_part(shape: Sequence[int], rollout_tensor_parallel: int) -> int:
  """r: how many fsdp devices generation adds to tensor parallelism for `rollout.tensor_model_parallel_size`
  = k. k <= mesh.tensor: none (generation splits over `tensor`, as training does); else k / tensor, which must
  be whole and divide mesh.fsdp."""
  _, fsdp, tensor = shape
  k = int(rollout_tensor_parallel)
  if k <= tensor:
    return 1
  if k % tensor or fsdp % (k // tensor):
    raise MeshError(
      f"{ROLLOUT_TP_KEY}={k} must be a multiple of mesh.tensor={tensor} that divides "
      f"mesh.fsdp*mesh.tensor={fsdp * tensor} (generation splits heads over tensor and a part of fsdp)"
    )
  return k // tensor


def mesh_axes(
  shape: Sequence[int], sequence_parallel: int = 1, rollout_tensor_parallel: int = 1
) -> tuple[tuple[int, ...], tuple[str, ...]]:
  """(sizes, names) of the mesh for a resolved `(data, fsdp, tensor)` shape (the module docstring's table)."""
  data, fsdp, tensor = shape
  sp, r = sequence_parallel, rollout_fsdp_part(shape, rollout_tensor_parallel)
  if fsdp % sp:
    raise MeshError(
      f"ulysses_sequence_parallel_size={sp} must divide mesh.fsdp={fsdp} "
      "(a sequence-parallel group is part of the fsdp axis)"
    )
  if sp > 1 and r > 1 and max(sp, r) % min(sp, r):
    raise MeshError(
      f"ulysses_sequence_parallel_size={sp} and {ROLLOUT_TP_KEY}={rollout_tensor_parallel} / "
      f"mesh.tensor={tensor} = {r} must nest (one divides the other): both are blocks of "
      "neighbouring fsdp devices"
    )
  if r == 1:
    fsdp_part = (("fsdp", fsdp),) if sp == 1 else (("fsdp", fsdp // sp), (SEQUENCE_AXIS, sp))
  elif r <= sp:
    fsdp_part = (("fsdp", fsdp // sp), (SEQUENCE_AXIS, sp // r), (ROLLOUT_TP_AXIS, r))
  else:
    fsdp_part = (("fsdp", fsdp // r), (ROLLOUT_TP_AXIS, r // sp)) + (((SEQUENCE_AXIS, sp),) if sp > 1 else ())
  axes = (("data", data),) + fsdp_part + (("tensor", tensor),)
  return tuple(size for _, size in axes), tuple(name for name, _ in axes)


def make_mesh(
  shape: Sequence[int] | None = None,
  devices: Sequence[jax.Device] | None = None,
  sequence_parallel: int = 1,
  rollout_tensor_parallel: int = 1,
) -> Mesh:
  """A mesh with Auto axis types (with_sharding_constraint refuses Explicit axes); its fsdp axis refined for
  `sequence_parallel` > 1 and `rollout_tensor_parallel` > tensor (the module docstring)."""
  devices = list(devices) if devices is not None else jax.devices()
  shape = resolve_mesh_shape(shape if shape is not None else (1, -1, 1), len(devices))
  mesh = jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)
  sizes, names = mesh_axes(shape, sequence_parallel, rollout_tensor_parallel)
  if names == MESH_AXES:
    return mesh
  # The 3-axis mesh's device order, refined.
  return Mesh(mesh.devices.reshape(sizes), names, axis_types=(AxisType.Auto,) * len(names))


def abstract_mesh(shape: Sequence[int], sequence_parallel: int = 1, rollout_tensor_parallel: int = 1) -> AbstractMesh:
  """`make_mesh`'s axes without devices: for checking layouts against a target's device count."""
  sizes, names = mesh_axes(shape, sequence_parallel, rollout_tensor_parallel)
  return AbstractMesh(sizes, names, axis_types=(AxisType.Auto,) * len(names))


def fsdp_axes(mesh) -> tuple[str, ...]:
  """The mesh axes the `fsdp` of the layouts means: every sub-axis of the user's fsdp, outer first."""
  return tuple(axis for axis in mesh.axis_names if axis not in ("data", "tensor"))


def _from(axis: str, mesh) -> tuple[str, ...]:
  """The fsdp sub-axes from `axis` inward; none when the mesh has no such axis."""
  axes = fsdp_axes(mesh)
  return axes[axes.index(axis) :] if axis in axes else ()


def sequence_axes(mesh) -> tuple[str, ...]:
  """The fsdp sub-axes a sequence-parallel group spans: ("sp",), ("sp", "rollout_tp"), or none."""
  return _from(SEQUENCE_AXIS, mesh)


def rollout_tp_axes(mesh) -> tuple[str, ...]:
  """The fsdp sub-axes that generation splits heads / mlp / vocab over with `tensor`: ("rollout_tp",),
  ("rollout_tp", "sp"), or none (generation TP = training TP)."""
  return _from(ROLLOUT_TP_AXIS, mesh)


def rollout_dp_axes(mesh) -> tuple[str, ...]:
  """The other fsdp sub-axes: with `data` they split generation's batch."""
  tp = rollout_tp_axes(mesh)
  return tuple(axis for axis in fsdp_axes(mesh) if axis not in tp)


def fsdp_size(mesh) -> int:
  """The user's `mesh.fsdp`: devices of all the fsdp sub-axes."""
  return math.prod(mesh.shape[axis] for axis in fsdp_axes(mesh))


def rollout_tensor_parallel_size(mesh) -> int:
  """Devices generation splits heads over: `tensor` x the rollout_tp sub-axes."""
  return mesh.shape["tensor"] * math.prod(mesh.shape[axis] for axis in rollout_tp_axes(mesh))


def mesh_from_config(config, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The mesh of a resolved config: its `mesh` section, with an `sp` axis when a model is sequence-parallel and
  a `rollout_tp` axis when generation's tensor parallelism is wider than `mesh.tensor`."""
  devices = list(devices) if devices is not None else jax.devices()
  shape = resolve_mesh_shape((config.mesh.data, config.mesh.fsdp, config.mesh.tensor), len(devices))
  sizes = sequence_parallel_sizes(config)
  role, size = max(sizes.items(), key=lambda item: item[1])
  if shape[1] % size:
    raise ConfigError(
      f"config key {SEQUENCE_PARALLEL_KEYS[role]}={size} must divide mesh.fsdp={shape[1]} "
      f"(mesh {dict(zip(MESH_AXES, shape))} on {len(devices)} devices): a sequence-parallel group "
      "is part of the fsdp axis"
    )
  return make_mesh(shape, devices, size, config.actor_rollout_ref.rollout.tensor_model_parallel_size)
