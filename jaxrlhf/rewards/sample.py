"""Scoring one sample: the reward function's call and the checks on what it returns.

The same code runs in the trainer's process and in a reward worker process (`rewards.workers`), so a
sample's score, extras and error text do not depend on where it was scored. A failure is data here
(`SampleResult.error`, one line of text), not an exception: a worker sends it back through a pipe, and
`score_batch` decides what it means (`reward_model.on_error`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from jaxrlhf.rewards.registry import UnknownDataSourceError, normalize_result


class SampleResult(NamedTuple):
  """`score` and `extras` (numbers as float, text as str) when the function succeeded; else `error`, what
  happened ("ValueError: ...", "timed out after 5.0 s", "exited with status 1"), and score 0.
  `unknown_data_source`: the registry's message for a data_source nothing scores (a data error, never a
  sample's: it always raises)."""

  score: float = 0.0
  extras: dict = {}
  error: Optional[str] = None
  unknown_data_source: Optional[str] = None

  @property
  def timed_out(self) -> bool:
    return self.error is not None and self.error.startswith(_TIMED_OUT)


_TIMED_OUT = "timed out"


def failed(what: str) -> SampleResult:
  return SampleResult(error=what)


def timed_out(seconds: float) -> SampleResult:
  return failed(f"{_TIMED_OUT} after {seconds:g} s (reward_model.timeout_s)")


def score_sample(
  fn: Callable[..., Any],
  data_source: str,
  solution_str: str,
  ground_truth: Any,
  extra_info: Optional[dict],
  keywords: Optional[dict] = None,
) -> SampleResult:
  """Calls `fn` as verl calls a reward function (keywords) and checks its result. `keywords`: more keywords of
  this sample's call (a judge's reply, `judge_response`, for a generative reward model's parser).

  An exception, `sys.exit` or a result that is not a finite number (or a dict with one under "score")
  gives `error`; KeyboardInterrupt propagates (Ctrl-C stops the run, it is not the sample's failure).
  """
  try:
    result = fn(
      data_source=data_source,
      solution_str=solution_str,
      ground_truth=ground_truth,
      extra_info=extra_info,
      **(keywords or {}),
    )
    score, extras = _split_result(result, data_source)
  except UnknownDataSourceError as error:
    return SampleResult(unknown_data_source=str(error))
  except SystemExit as error:
    return failed(f"called sys.exit({error.code!r})" if error.code is not None else "called sys.exit()")
  except Exception as error:
    return failed(f"{type(error).__name__}: {error}")
  return SampleResult(score, extras)


def score_samples_at_once(fn: Callable[..., Any], samples: list[tuple]) -> list[SampleResult]:
  """Calls `fn` once for all `samples`, as verl's batch reward manager does (keywords `data_sources`,
  `solution_strs`, `ground_truths`, `extra_infos`, lists), and checks its one result per sample. A call that
  raises, or returns something that is not a list of that length, fails every sample with what happened."""
  data_sources, solution_strs, ground_truths, extra_infos = (list(column) for column in zip(*samples))
  try:
    results = fn(
      data_sources=data_sources, solution_strs=solution_strs, ground_truths=ground_truths, extra_infos=extra_infos
    )
    if isinstance(results, (str, bytes, dict)) or not hasattr(results, "__len__") or len(results) != len(samples):
      kind = f"{len(results)} results" if hasattr(results, "__len__") else type(results).__name__
      raise TypeError(f"a batch reward function must return one score per sample ({len(samples)}), got {kind}")
  except SystemExit as error:
    return [failed(f"called sys.exit({error.code!r})")] * len(samples)
  except Exception as error:
    return [failed(f"{type(error).__name__}: {error}")] * len(samples)
  checked = []
  for data_source, result in zip(data_sources, results):
    try:
      checked.append(SampleResult(*_split_result(result, data_source)))
    except Exception as error:
      checked.append(failed(f"{type(error).__name__}: {error}"))
  return checked


def _split_result(result: Any, data_source: str) -> tuple[float, dict]:
  result = normalize_result(result, data_source)
  if isinstance(result, dict):
    score = normalize_result(result["score"], data_source)
    if isinstance(score, dict):
      raise TypeError(f"reward function for data_source {data_source!r} returned a dict as its 'score'")
    extras = {
      key: float(value) if _is_number(value) else value
      for key, value in result.items()
      if key != "score" and (_is_number(value) or isinstance(value, str))
    }
  else:
    score, extras = result, {}
  if not math.isfinite(score):
    raise ValueError(f"reward function for data_source {data_source!r} returned a non-finite score {score}")
  return score, extras


def _is_number(value: Any) -> bool:
  return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating))
