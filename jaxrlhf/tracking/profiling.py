"""`trainer.profile_steps`: a `jax.profiler` trace covering those steps, under <run_dir>/profile.

One trace spans the first listed step to the last (JAX allows one trace at a time, so [2, 5] traces
steps 2..5); each step in it is a `StepTraceAnnotation`, which TensorBoard's profile plugin and
Perfetto use to split the timeline per step.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import jax

# Whether this module started the trace now running: a run resumed inside the profiled range
# starts it at its first step there, and an aborted step stops it.
_tracing = False


@contextlib.contextmanager
def maybe_profile(step: int, profile_steps: Sequence[int] | None, run_dir: str):
  """Wrap one training step; traces when min(profile_steps) <= step <= max(profile_steps).

  The wrapped code must finish its device work before leaving (e.g. fetch metrics to host),
  otherwise the last step's kernels fall outside the trace.
  """
  global _tracing
  if not profile_steps or not min(profile_steps) <= step <= max(profile_steps):
    yield
    return
  if not _tracing:
    jax.profiler.start_trace(os.path.join(run_dir, "profile"))
    _tracing = True
  try:
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
      yield
  except BaseException:
    _stop()  # an aborted run still leaves a readable trace
    raise
  if step == max(profile_steps):
    _stop()


def _stop() -> None:
  global _tracing
  if _tracing:
    _tracing = False
    jax.profiler.stop_trace()
