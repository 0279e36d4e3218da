"""Device mesh `(data, fsdp, tensor)` and the actor's train/generation layouts (docs/architecture.md)."""

from jaxrlhf.parallel.layouts import (
  BATCH_AXES,
  GENERATION_RULES,
  TRAIN_RULES,
  batch_sharding,
  logical_to_shardings,
  replicated,
)
from jaxrlhf.parallel.mesh import MESH_AXES, make_mesh
from jaxrlhf.parallel.step_layouts import StepLayouts, build_step_layouts

__all__ = [
  "MESH_AXES",
  "make_mesh",
  "BATCH_AXES",
  "GENERATION_RULES",
  "TRAIN_RULES",
  "batch_sharding",
  "logical_to_shardings",
  "replicated",
  "StepLayouts",
  "build_step_layouts",
]
