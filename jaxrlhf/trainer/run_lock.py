"""One run per run directory: a lock file in it naming the run that holds it (pid, host, start time).

Two runs writing one directory interleave their metrics.jsonl records and overwrite each other's
checkpoints, so a second run is refused in one line naming the holder. A lock whose process has ended
on this host (a crash, `kill -9`) is stale: the next run takes it over and says so. A lock held from
another host cannot be checked from here; the message says which file to delete if that run is gone.

The lock is a file published with `os.link`, which fails when the name exists: two runs starting at
once cannot both win, and a reader never sees a half-written lock.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time

from jaxrlhf.errors import UserError

LOCK_NAME = "run.lock"


class RunDirectoryLocked(UserError, RuntimeError):
  """Another run holds the run directory."""


@dataclasses.dataclass(frozen=True)
class Holder:
  pid: int
  host: str
  started: float  # time.time() when the lock was taken
  process_start: str | None = None  # the process's start time in /proc (tells a reused pid apart)

  def describe(self) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
    return f"pid {self.pid} on host {self.host}, started {when}"


def _process_start(pid: int) -> str | None:
  """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); None where there is no /proc."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _this_process() -> Holder:
  return Holder(os.getpid(), socket.gethostname(), time.time(), _process_start(os.getpid()))


def _is_running(holder: Holder) -> bool:
  """Whether the holder (a process on this host) still runs: its pid exists and is the same process."""
  try:
    os.kill(holder.pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  start = _process_start(holder.pid)
  return holder.process_start is None or start is None or start == holder.process_start


def _read(path: str) -> Holder | None:
  try:
    with open(path) as f:
      return Holder(**json.load(f))
  except FileNotFoundError:
    return None
  except (OSError, ValueError, TypeError):
    return Holder(pid=-1, host="<unreadable lock file>", started=os.path.getmtime(path))


def _publish(path: str, holder: Holder) -> bool:
  """Writes the lock whole beside `path`, then links it in place; False when `path` exists."""
  scratch = f"{path}.{holder.pid}.tmp"
  with open(scratch, "w") as f:
    json.dump(dataclasses.asdict(holder), f)
  try:
    os.link(scratch, path)
    return True
  except FileExistsError:
    return False
  finally:
    os.remove(scratch)


class RunLock:
  """Held by this process on `run_dir` until `release()` (or the process ends: the lock is then stale)."""

  def __init__(self, run_dir: str):
    self.path = os.path.join(run_dir, LOCK_NAME)
    self.run_dir = run_dir

  def acquire(self) -> RunLock:
    """Takes the lock; a lock of this process is kept, a stale one taken over (logged), any other refused."""
    me = _this_process()
    for _ in range(3):  # a stale lock removed under us by another starting run: look again
      if _publish(self.path, me):
        return self
      holder = _read(self.path)
      if holder is None:
        continue
      if holder.host == me.host and holder.pid == me.pid:
        return self  # this process's earlier Trainer on the same directory (a notebook, a resume in tests)
      if holder.host != me.host or holder.pid < 0 or _is_running(holder):
        raise RunDirectoryLocked(
          f"run directory {self.run_dir} is in use by another run ({holder.describe()}); give this run its "
          "own trainer.experiment_name or trainer.default_local_dir",
          hint=f"if that run has ended, delete {self.path}",
        )
      print(
        f"run directory {self.run_dir}: taking over the lock of {holder.describe()}, which is no longer running",
        flush=True,
      )
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass
    raise RunDirectoryLocked(
      f"run directory {self.run_dir}: could not take {self.path} (other runs keep starting on it)"
    )

  def release(self) -> None:
    """Removes the lock if this process holds it."""
    holder = _read(self.path)
    if holder is not None and holder.pid == os.getpid() and holder.host == socket.gethostname():
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass
