"""Orbax's own reports of a failed checkpoint save, dropped: the user hears of the failure once.

Why this exists: when a save fails (disk full, a read-only or over-quota folder) `checkpoint.Checkpointer` raises
one CheckpointError naming the step and the last good checkpoint, and the CLIs print it in one or two lines. Orbax
and TensorStore report the same failure again on their own, as tracebacks that bury that line:
- Orbax logs an error record (a traceback) from each of its writer threads (`OrbaxSaveErrors`, a filter on absl's
  logger);
- after the failure Orbax closes the event loop it ran the save on, and TensorStore then completes the writes it
  had in flight, each calling `loop.call_soon_threadsafe` on that closed loop from C++: Python reports each as an
  unraisable RuntimeError ("Event loop is closed") with a bare traceback (`drop_abandoned_write_callbacks`, around
  `sys.unraisablehook`).

`install()` puts both in place, once per process; `Checkpointer` calls it when it is built, so importing this
module (or `jaxrlhf.checkpoint`) changes nothing. JAXRLHF_DEBUG=1 (or `-v`) keeps every report.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

from absl import logging as absl_logging


def _debug() -> bool:
  return bool(os.environ.get("JAXRLHF_DEBUG"))


class OrbaxSaveErrors(logging.Filter):
  """Drops the error records logged from Orbax's own files; its warnings and info pass."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR or f"{os.sep}orbax{os.sep}" not in record.pathname or _debug()


_ORBAX_SAVE_ERRORS = OrbaxSaveErrors()


def _is_abandoned_write_callback(unraisable) -> bool:
  """An unraisable RuntimeError "Event loop is closed" raised by `call_soon_threadsafe` with no object: a write
  of a failed save that TensorStore completed after Orbax had closed the save's loop."""
  frames = [frame.f_code.co_name for frame, _ in traceback.walk_tb(unraisable.exc_traceback)]
  return (
    unraisable.object is None
    and unraisable.exc_type is RuntimeError
    and str(unraisable.exc_value) == "Event loop is closed"
    and "call_soon_threadsafe" in frames
  )


def drop_abandoned_write_callbacks(previous_hook):
  """A `sys.unraisablehook` that drops the abandoned writes' reports and passes any other to `previous_hook`."""

  def hook(unraisable):
    if _is_abandoned_write_callback(unraisable) and not _debug():
      return
    previous_hook(unraisable)

  hook.drops_abandoned_write_callbacks = True
  return hook


def install() -> None:
  """Both filters, once per process (a filter is kept in a set; the hook wraps whatever hook is in place)."""
  absl_logging.get_absl_logger().addFilter(_ORBAX_SAVE_ERRORS)
  if not getattr(sys.unraisablehook, "drops_abandoned_write_callbacks", False):
    sys.unraisablehook = drop_abandoned_write_callbacks(sys.unraisablehook)
