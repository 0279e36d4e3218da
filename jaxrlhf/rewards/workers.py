"""Reward worker processes: samples scored in parallel, each within a time limit.

A reward function is user code. In a process of its own it can sleep, raise, call `sys.exit` or
`os._exit`, or crash the interpreter, and the trainer still sees one failed sample (a `SampleResult`
whose error says "timed out after 60 s", "exited with status 1", "was killed by signal SIGSEGV"); the
worker is replaced and scoring goes on. The pool lives across batches (a worker costs a process start
and the import of the reward function) and is closed by its owner (`RewardScorer.close`).

Workers come from multiprocessing's forkserver (spawn where there is none), never from forking the
trainer, whose process runs JAX's threads. Each worker loads the reward function itself from a
`RewardSource` (a file's path and name, or the registry): only samples and results cross the pipes.
Each worker runs one chunk of samples at a time and answers sample by sample, so the time limit
applies to each sample.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any, Callable, Optional

from jaxrlhf.errors import UserError
from jaxrlhf.rewards.custom import RewardSource
from jaxrlhf.rewards.processes import process_context
from jaxrlhf.rewards.registry import registered_functions
from jaxrlhf.rewards.sample import SampleResult, failed, score_sample, timed_out

Sample = tuple  # (data_source, solution_str, ground_truth, extra_info[, keywords])

_CHUNKS_PER_WORKER = 4  # a batch is cut into about this many chunks per worker: even loads, few messages
_MAX_CHUNK = 64
_POLL_S = 1.0  # the longest wait without looking at the clock (timeouts, progress)
_STOP_S = 2.0  # close(): how long idle workers get to exit before they are killed


class RewardWorkerError(UserError, RuntimeError):
  """The worker processes cannot score at all: the reward function does not load in them."""


def default_num_workers() -> int:
  """verl's 8, or fewer where the machine has fewer cores."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    cores = os.cpu_count() or 1
  return max(1, min(8, cores))


@dataclasses.dataclass
class _Worker:
  process: Any
  conn: Any
  ready: bool = False
  chunk: collections.deque = dataclasses.field(default_factory=collections.deque)  # (index, sample), head running
  since: float = 0.0  # when the head of `chunk` started


class WorkerPool:
  """`num_workers` processes that score samples with the reward function of `source`."""

  def __init__(self, source: RewardSource, num_workers: int, timeout_s: Optional[float] = None):
    if num_workers < 1:
      raise ValueError(f"a reward worker pool needs num_workers >= 1, got {num_workers}")
    self.source, self.num_workers, self.timeout_s = source, num_workers, timeout_s
    self._context = process_context()
    # Registry: modules whose import registers the functions (the built-in ones register with jaxrlhf.rewards).
    self._modules = (
      ()
      if source.path
      else tuple(
        sorted(
          {
            fn.__module__
            for fn in registered_functions().values()
            if getattr(fn, "__module__", "") not in ("__main__", "__mp_main__")
          }
        )
      )
    )
    self._served: Optional[frozenset] = None  # registry: the data sources the workers score alike
    self._batch = 0
    self._retried: set[int] = set()  # this batch's samples scored again after their worker was SIGTERM'd
    self._workers: list[_Worker] = []
    self._fill()
    _OPEN_POOLS.add(self)

  # ----- processes ---------------------------------------------------------------------------------

  def _fill(self) -> None:
    """Starts workers up to `num_workers`: at first, for the dead and for those stopped with a batch."""
    while len(self._workers) < self.num_workers:
      parent_conn, child_conn = self._context.Pipe()
      # Not daemonic: a reward function may start processes of its own (a sandbox, a pool with timeouts).
      process = self._context.Process(
        target=_serve, args=(child_conn, self.source, self._modules), name="jaxrlhf-reward-worker"
      )
      process.start()
      child_conn.close()  # the worker holds the only other end: its exit reads as EOF here
      self._workers.append(_Worker(process, parent_conn))

  def _retire(self, worker: _Worker) -> None:
    _kill(worker)
    self._workers.remove(worker)

  def close(self) -> None:
    """Stops every worker: idle ones exit when their pipe closes, busy ones are killed. `score` after
    `close` starts new ones."""
    workers, self._workers = self._workers, []
    for worker in workers:
      if worker.chunk:
        worker.process.kill()
      worker.conn.close()
    deadline = time.monotonic() + _STOP_S
    for worker in workers:
      worker.process.join(max(0.0, deadline - time.monotonic()))
      _kill(worker)
    _OPEN_POOLS.discard(self)

  # ----- scoring -----------------------------------------------------------------------------------

  def served(self, on_wait: Callable[[], None] = lambda: None) -> Optional[frozenset]:
    """The data sources whose registered function the workers load as this process has it (None: every
    one, a reward file); waits for the first worker to be ready."""
    self._fill()
    while not any(w.ready for w in self._workers):
      self._wait(_POLL_S)
      self._receive_all({})
      on_wait()
    return self._served

  def score(
    self,
    items: list[tuple[int, Sample]],
    stop_at_error: bool,
    on_progress: Callable[[dict[int, SampleResult]], None] = lambda results: None,
  ) -> dict[int, SampleResult]:
    """{index: result} for `items` ((index, sample) pairs). With `stop_at_error` it returns at the first
    failed sample, without the samples not scored yet; an unknown data_source always stops it."""
    self._batch += 1
    self._retried = set()
    results: dict[int, SampleResult] = {}
    size = max(1, min(_MAX_CHUNK, len(items) // (_CHUNKS_PER_WORKER * self.num_workers)))
    pending = collections.deque(collections.deque(items[k : k + size]) for k in range(0, len(items), size))
    try:
      while len(results) < len(items):
        self._fill()
        now = time.monotonic()
        for worker in list(self._workers):
          if worker.ready and not worker.chunk and pending:
            self._send(worker, pending, now)
        self._wait(self._next_deadline(now) - now)
        if self._receive_all(results, pending):
          return results
        self._enforce_timeouts(results, pending)
        on_progress(results)
        if stop_at_error and any(r.error for r in results.values()):
          return results
      return results
    finally:
      for worker in list(self._workers):  # stopped early (an error, Ctrl-C): nothing of this batch may linger
        if worker.chunk:
          self._retire(worker)

  def _send(self, worker: _Worker, pending: collections.deque, now: float) -> None:
    """Hands `worker` the next chunk; one that died while idle hands it back and is retired (not blamed)."""
    chunk = pending.popleft()
    try:
      worker.conn.send((self._batch, list(chunk)))
    except OSError:
      pending.appendleft(chunk)
      self._retire(worker)
      return
    worker.chunk, worker.since = chunk, now

  def _next_deadline(self, now: float) -> float:
    deadline = now + _POLL_S
    if self.timeout_s is not None:
      for worker in self._workers:
        if worker.chunk:
          deadline = min(deadline, worker.since + self.timeout_s)
    return max(deadline, now)

  def _wait(self, seconds: float) -> None:
    handles = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
    multiprocessing.connection.wait(handles, timeout=max(0.0, seconds))

  def _receive_all(self, results: dict, pending: Optional[collections.deque] = None) -> bool:
    """Reads every worker's messages into `results`; replaces the dead. True: stop (unknown data_source)."""
    stop = False
    for worker in list(self._workers):
      exited = not worker.process.is_alive()  # first: a dead worker's pipe then holds all it ever sent
      try:
        while worker.conn.poll():
          stop |= self._handle(worker, worker.conn.recv(), results)
      except (EOFError, OSError):
        exited = True
      if exited:
        worker.process.join(1.0)
        if not self._retry_head(worker, pending):
          self._fail_head(worker, failed(_exit_text(worker.process.exitcode)), results, pending)
        if not worker.ready:
          raise RewardWorkerError(
            f"a reward worker process {_exit_text(worker.process.exitcode)} while loading the reward function "
            f"({self.source.describe()})",
            hint="a worker imports the script that started training: guard its top level with "
            "`if __name__ == '__main__':`, or set reward_model.num_workers=0 to score in the trainer's process",
          )
        self._retire(worker)
    return stop

  def _handle(self, worker: _Worker, message: tuple, results: dict) -> bool:
    kind = message[0]
    if kind == "ready":
      worker.ready = True
      identities = message[1]
      if identities is not None and self._served is None:
        here = {ds: _identity(fn) for ds, fn in registered_functions().items()}
        self._served = frozenset(ds for ds, name in here.items() if identities.get(ds) == name)
      return False
    if kind == "load_error":
      raise RewardWorkerError(
        f"the reward worker processes cannot load the reward function ({self.source.describe()}): {message[1]}"
      )
    if kind == "interrupted":
      raise KeyboardInterrupt  # Ctrl-C reached the workers; the trainer stops with them
    batch, index, result = message
    if batch != self._batch or not worker.chunk or worker.chunk[0][0] != index:
      return False  # a batch given up on: its workers were replaced, so this cannot happen; ignore it anyway
    worker.chunk.popleft()
    worker.since = time.monotonic()
    results[index] = result
    return result.unknown_data_source is not None

  def _retry_head(self, worker: _Worker, pending: Optional[collections.deque]) -> bool:
    """A worker that SIGTERM ended (the reward function set a handler of its own, and a scheduler's preemption
    signal reached it) was not failed by its sample: the chunk goes back to the queue, its head scored again
    once in a new worker, while the trainer finishes the step it stops after. True: given back."""
    if worker.process.exitcode != -signal.SIGTERM or not worker.chunk or pending is None:
      return False
    if worker.chunk[0][0] in self._retried:
      return False
    self._retried.add(worker.chunk[0][0])
    pending.appendleft(collections.deque(worker.chunk))
    worker.chunk = collections.deque()
    return True

  def _fail_head(
    self, worker: _Worker, result: SampleResult, results: dict, pending: Optional[collections.deque]
  ) -> None:
    """The running sample of `worker` failed (`result`); the rest of its chunk goes back to the queue."""
    if not worker.chunk:
      return
    index, _ = worker.chunk.popleft()
    results[index] = result
    if worker.chunk and pending is not None:
      pending.appendleft(collections.deque(worker.chunk))
    worker.chunk = collections.deque()

  def _enforce_timeouts(self, results: dict, pending: collections.deque) -> None:
    if self.timeout_s is None:
      return
    now = time.monotonic()
    for worker in list(self._workers):
      if worker.chunk and now - worker.since > self.timeout_s:
        self._fail_head(worker, timed_out(self.timeout_s), results, pending)
        self._retire(worker)


# Closed before multiprocessing's own exit handler (atexit runs the last registered first), which would
# otherwise wait for workers that nobody told to stop.
_OPEN_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
  for pool in list(_OPEN_POOLS):
    pool.close()


def _kill(worker: _Worker) -> None:
  if worker.process.is_alive():
    worker.process.kill()
    worker.process.join(5.0)
  worker.conn.close()


def _exit_text(exitcode: Optional[int]) -> str:
  if exitcode is None:
    return "stopped answering"
  if exitcode < 0:
    try:
      return f"was killed by signal {signal.Signals(-exitcode).name}"
    except ValueError:
      return f"was killed by signal {-exitcode}"
  return f"exited with status {exitcode}"


def _identity(fn: Any) -> str:
  return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


# ----- the worker process ---------------------------------------------------------------------------


def _serve(conn, source: RewardSource, modules: tuple[str, ...]) -> None:
  """A worker's life: load the reward function, then score chunks until the pipe closes.

  SIGTERM is ignored: a scheduler's preemption signal goes to every process of the job, and the trainer
  finishes its step (with these workers) before it saves and stops them. Ctrl-C (SIGINT) stops a worker;
  one that was scoring says so. A worker whose trainer is gone exits, even from inside a sample.
  """
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  threading.Thread(target=_exit_with_trainer, args=(multiprocessing.parent_process().sentinel,), daemon=True).start()
  busy = False
  try:
    for module in modules:  # user modules that register reward functions; one that fails just serves nothing
      try:
        importlib.import_module(module)
      except Exception:
        pass
    try:
      fn = source.load()
    except Exception as error:
      conn.send(("load_error", f"{type(error).__name__}: {error}"))
      return
    conn.send(("ready", None if source.path else {ds: _identity(f) for ds, f in registered_functions().items()}))
    while True:
      batch, chunk = conn.recv()
      for index, sample in chunk:
        busy = True
        result = score_sample(fn, *sample)
        busy = False
        conn.send((batch, index, result))
  except KeyboardInterrupt:
    if busy:  # Ctrl-C while a sample runs: say so, so the trainer stops rather than counts a failure
      try:
        conn.send(("interrupted",))
      except OSError:
        pass
  except (EOFError, OSError):
    pass  # the trainer closed the pipe (or is gone)
  finally:
    sys.stdout.flush()
    sys.stderr.flush()


def _exit_with_trainer(trainer_sentinel) -> None:
  multiprocessing.connection.wait([trainer_sentinel])  # ready when the trainer's process has ended
  os._exit(0)
