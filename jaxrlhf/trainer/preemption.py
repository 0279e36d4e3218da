"""Preemption: SIGTERM (SLURM's time limit or requeue, Kubernetes eviction, a spot VM's notice) ends a run at
the next step boundary with a checkpoint of the last finished step, then exit status 143.

A step cannot be cut short (the state is donated to one compiled program), so the run finishes the step in
flight, logs it, saves it and exits; SLURM (`--signal=TERM@<seconds>`) and Kubernetes
(`terminationGracePeriodSeconds`) give the grace period this needs. `trainer.resume_mode=auto` then continues
exactly: batches and keys are functions of (seed, step). On several hosts every process stops at the same step
(the hosts agree on whether any of them was signalled), so the save, a collective, runs everywhere.
"""

from __future__ import annotations

import signal
import threading

import jax
import numpy as np

EXIT_PREEMPTED = 143  # 128 + SIGTERM: what a shell reports for a process SIGTERM ended (gpu_scripts/README.md)


class Preempted(Exception):
  """The run stopped on SIGTERM at a step boundary; the message says what was saved."""


class StopSignal:
  """While entered, SIGTERM is recorded instead of ending the process; `requested()` asks whether it came."""

  def __init__(self):
    self._received = False
    self._previous = None

  def __enter__(self) -> StopSignal:
    if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
      self._previous = signal.signal(signal.SIGTERM, self._record)
    return self

  def __exit__(self, *exc) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _record(self, signum, frame) -> None:
    del signum, frame
    self._received = True

  def requested(self) -> bool:
    """Whether SIGTERM reached this process, or on several hosts any process (a collective: call it on all)."""
    if jax.process_count() == 1:
      return self._received
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.int32(self._received))))
