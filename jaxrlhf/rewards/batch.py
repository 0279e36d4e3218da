"""Scoring a batch of decoded responses, the host side of the reward ``jax.pure_callback``.

One call per batch; the result always has the same structure for a given ``extra_keys`` and
``on_error``, which a callback with static result shapes needs. A `RewardScorer` says where the reward
function runs: in this process, or in worker processes (`rewards.workers`) with a time limit per
sample, kept across batches.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxrlhf.errors import UserError
from jaxrlhf.rewards.custom import source_of
from jaxrlhf.rewards.registry import UnknownDataSourceError, default_compute_score, registered_name
from jaxrlhf.rewards.sample import SampleResult, score_sample, score_samples_at_once
from jaxrlhf.rewards.workers import WorkerPool, default_num_workers

ON_ERROR_MODES = ("raise", "zero")
ERROR_KEY = "reward_error"
PROGRESS_EVERY_S = 10.0  # a batch that takes longer says how far it got, this often

_log = logging.getLogger(__name__)


class RewardFunctionError(UserError, RuntimeError):
  """A reward function failed on one sample: it raised, exited, crashed, timed out or returned something
  that is not a finite number."""


class RewardScorer:
  """The reward function and where it runs.

  `num_workers`: 0 scores in this process, one sample after another, with no time limit; N >= 1 in N
  worker processes, each sample within `timeout_s`; None (auto) chooses N = `default_num_workers()` for
  a reward file (user code, which may hang or crash) and 0 for the registry's rules (the built-in ones
  take microseconds a sample and cannot hang, where a process round trip would cost more). Workers start
  at the first batch and stay until `close()`; a batch after `close()` starts them again.

  Workers load the function themselves (`rewards.custom.source_of`): a function that is neither the
  registry nor from a reward file is scored in this process, as is a data_source whose registered
  function the workers cannot import (one defined in `__main__` or a notebook); each is said once.

  `batch` (verl's `reward_manager.name=batch`): the function is called once per batch with lists and returns
  one score (or dict) per sample; in this process, without a time limit per sample.
  """

  def __init__(
    self,
    compute_score_fn: Optional[Callable[..., Any]] = None,
    *,
    num_workers: Optional[int] = 0,
    timeout_s: Optional[float] = None,
    batch: bool = False,
  ):
    self.fn = default_compute_score if compute_score_fn is None else compute_score_fn
    self.source = source_of(compute_score_fn)
    self.batch = batch and compute_score_fn is not None
    if self.batch:
      if num_workers:
        _log.warning("reward: a batch reward function (reward_manager=batch) is called in this process")
      num_workers = 0
    if num_workers is None:
      num_workers = default_num_workers() if self.source is not None and self.source.path else 0
    if num_workers and self.source is None:
      _log.warning(
        "reward: %s cannot be loaded by worker processes (not the registry's, not from "
        "custom_reward_function.path): scoring it in this process, without a time limit",
        function_name(self.fn),
      )
      num_workers = 0
    self.num_workers, self.timeout_s = num_workers, timeout_s
    self._pool: Optional[WorkerPool] = None
    self._lock = threading.Lock()  # one batch at a time through the pool, whichever thread calls
    self._said_in_process: set[str] = set()

  def close(self) -> None:
    """Stops the worker processes (if any)."""
    with self._lock:
      if self._pool is not None:
        self._pool.close()
        self._pool = None

  def where(self) -> str:
    return f"{self.num_workers} worker processes" if self.num_workers else "in this process"

  def score(self, samples: Sequence[tuple], stop_at_error: bool = False) -> list[Optional[SampleResult]]:
    """One result per `(data_source, solution_str, ground_truth, extra_info)` sample. With
    `stop_at_error` scoring stops at the first failed sample (the samples not scored are None); an
    unknown data_source always stops it."""
    with self._lock:
      return self._score(samples, stop_at_error)

  def _score(self, samples: Sequence[tuple], stop_at_error: bool) -> list[Optional[SampleResult]]:
    if self.batch:
      return score_samples_at_once(self.fn, list(samples)) if samples else []
    progress = _Progress(len(samples), self.where())
    results: list[Optional[SampleResult]] = [None] * len(samples)
    in_process = list(range(len(samples)))
    if self.num_workers and samples:
      if self._pool is None:
        self._pool = WorkerPool(self.source, self.num_workers, self.timeout_s)
      served = self._pool.served(on_wait=lambda: progress.update(results))
      in_workers = [
        (i, sample) for i, sample in enumerate(samples) if served is None or registered_name(sample[0], served)
      ]
      in_process = sorted(set(range(len(samples))) - {i for i, _ in in_workers})
      self._say_in_process({samples[i][0] for i in in_process})
      for index, result in self._pool.score(
        in_workers, stop_at_error, on_progress=lambda done: progress.update(results, done)
      ).items():
        results[index] = result
      if _stops(results, stop_at_error):
        return results
    fn, next_report = self.fn, progress.next_report
    for index in in_process:
      results[index] = result = score_sample(fn, *samples[index])
      if result.error is not None and stop_at_error or result.unknown_data_source is not None:
        break
      if time.monotonic() >= next_report:  # the clock, not a call, per sample: the built-in rules take ~1 us
        progress.update(results)
        next_report = progress.next_report
    return results

  def _say_in_process(self, data_sources: set[str]) -> None:
    for data_source in sorted(data_sources - self._said_in_process):
      self._said_in_process.add(data_source)
      _log.warning(
        "reward: data_source %r is scored in this process, without reward_model.timeout_s: the worker "
        "processes cannot import its registered function (defined in __main__, a notebook or a config "
        "file?); register it in an importable module",
        data_source,
      )


def _stops(results: Sequence[Optional[SampleResult]], stop_at_error: bool) -> bool:
  return any(r is not None and (r.unknown_data_source or (stop_at_error and r.error)) for r in results)


class _Progress:
  """Logs "reward: scored 120/512 samples in 10 s (...)" every PROGRESS_EVERY_S while a batch is scored."""

  def __init__(self, total: int, where: str):
    self.total, self.where = total, where
    self.start = time.monotonic()
    self.next_report = self.start + PROGRESS_EVERY_S

  def update(self, results: Sequence[Optional[SampleResult]], more: Optional[dict] = None) -> None:
    now = time.monotonic()
    if now < self.next_report:
      return
    self.next_report = now + PROGRESS_EVERY_S
    scored = [r for r in results if r is not None] + list((more or {}).values())
    timed_out = sum(1 for r in scored if r.timed_out)
    failed = sum(1 for r in scored if r.error) - timed_out
    _log.warning(
      "reward: scored %d/%d samples in %.0f s (%s; %d timed out, %d failed)",
      len(scored),
      self.total,
      now - self.start,
      self.where,
      timed_out,
      failed,
    )


def function_name(fn: Any) -> str:
  return getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None) or repr(fn)


def score_batch(
  compute_score_fn: Optional[Callable[..., Any] | RewardScorer],
  data_sources: Sequence[str],
  solution_strs: Sequence[str],
  ground_truths: Sequence[Any],
  extra_infos: Optional[Sequence[Optional[dict]]] = None,
  *,
  extra_keys: Optional[Sequence[str]] = None,
  require_extra_keys: bool = False,
  on_error: str = "raise",
  keywords: Optional[Sequence[dict]] = None,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """Scores every sample; returns ``(scores float32[B], extras {key: float32[B]})``.

  ``compute_score_fn`` is called as verl calls it, with keywords ``data_source``,
  ``solution_str``, ``ground_truth``, ``extra_info``; None means ``default_compute_score``; a
  `RewardScorer` runs its function where it says (worker processes), a function runs in this process.
  A dict result gives its ``"score"`` as the score and its other entries as extras: numbers as float32
  (0 for samples that lack the key), and, when ``extra_keys`` is None, text entries (verl's
  ``"pred"``, what majority voting counts) as object arrays (None where missing). ``extra_keys``
  fixes the set of extras, numbers only; with ``require_extra_keys`` a sample whose result lacks one
  of them fails the batch (GDPO's reward components must all be there).

  ``keywords``: one dict per sample of more keywords for its call (a judge's reply, ``judge_response``).

  ``on_error="raise"``: a reward function that raises, exits, crashes, times out, or returns a
  non-number / non-finite value fails the batch with a ``RewardFunctionError`` naming the sample index,
  its data_source and what happened. ``on_error="zero"``: such a sample scores 0 and is flagged 1.0 in
  ``extras["reward_error"]``. An unknown data_source is a configuration error and always raises.
  """
  if on_error not in ON_ERROR_MODES:
    raise ValueError(f"reward on_error must be one of {ON_ERROR_MODES}, got {on_error!r}")
  batch_size = len(solution_strs)
  if extra_infos is None:
    extra_infos = [None] * batch_size
  lengths = {
    "data_sources": len(data_sources),
    "solution_strs": batch_size,
    "ground_truths": len(ground_truths),
    "extra_infos": len(extra_infos),
    **({} if keywords is None else {"keywords": len(keywords)}),
  }
  if len(set(lengths.values())) != 1:
    raise ValueError(f"score_batch inputs must all have the batch size; got lengths {lengths}")
  scorer = compute_score_fn if isinstance(compute_score_fn, RewardScorer) else RewardScorer(compute_score_fn)
  columns = (data_sources, solution_strs, ground_truths, extra_infos) + (() if keywords is None else (keywords,))
  samples = list(zip(*columns))
  results = scorer.score(samples, stop_at_error=on_error == "raise")
  for result in results:
    if result is not None and result.unknown_data_source:
      raise UnknownDataSourceError(result.unknown_data_source)

  scores = np.zeros(batch_size, dtype=np.float32)
  errors = np.zeros(batch_size, dtype=np.float32)
  extra_rows: list[dict] = []
  for index, result in enumerate(results):
    data_source = data_sources[index]
    if result is None:  # not scored: scoring stopped at a failure, which raises below
      extra_rows.append({})
      continue
    if result.error is not None:
      if on_error == "raise":
        hint = "reward_model.on_error=zero scores such a sample 0 and counts it (metric reward/num_errors)"
        if result.timed_out:
          hint = "raise reward_model.timeout_s, or " + hint
        raise RewardFunctionError(
          f"reward function {function_name(scorer.fn)!r} failed on sample {index} "
          f"(data_source={data_source!r}): {result.error}",
          hint=hint,
        )
      errors[index] = 1.0
      extra_rows.append({})
      continue
    scores[index] = result.score
    extra_rows.append(result.extras)
    missing = [key for key in extra_keys or () if not isinstance(result.extras.get(key), float)]
    if require_extra_keys and missing:
      raise RewardFunctionError(
        f"reward function {function_name(scorer.fn)!r} returned no number for {missing} on sample {index} "
        f"(data_source={data_source!r}); it returned {sorted(['score', *result.extras])}",
        hint="algorithm.gdpo_reward_keys names entries of the dict the reward function returns",
      )

  if extra_keys is not None:
    keys = list(extra_keys)
    extra_rows = [{k: v for k, v in row.items() if isinstance(v, float)} for row in extra_rows]
  else:
    keys = sorted({k for row in extra_rows for k in row})
  extras_out = {}
  for key in keys:
    values = [row.get(key) for row in extra_rows]
    if any(isinstance(v, str) for v in values):
      extras_out[key] = np.array(values, dtype=object)
    else:
      extras_out[key] = np.array([0.0 if v is None else v for v in values], dtype=np.float32)
  if on_error == "zero":
    extras_out[ERROR_KEY] = errors
    failures = [(index, result) for index, result in enumerate(results) if result is not None and result.error]
    if failures:  # the metric counts them; the text of what happened is said here, once a batch
      index, first = failures[0]
      _log.warning(
        "reward: %d of %d samples failed and scored 0 (reward_model.on_error=zero); the first, sample %d "
        "(data_source=%r): %s",
        len(failures),
        batch_size,
        index,
        data_sources[index],
        first.error,
      )
  return scores, extras_out
