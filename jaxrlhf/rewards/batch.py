"""Scoring a batch of decoded responses, the host side of the reward ``jax.pure_callback``.

One call per batch; the result always has the same structure for a given ``extra_keys`` and
``on_error``, which a callback with static result shapes needs.
"""

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxrlhf.errors import UserError
from jaxrlhf.rewards.registry import UnknownDataSourceError, default_compute_score, normalize_result

ON_ERROR_MODES = ("raise", "zero")
ERROR_KEY = "reward_error"


class RewardFunctionError(UserError, RuntimeError):
  """A reward function raised or returned something that is not a finite number for one sample."""


def score_batch(
    compute_score_fn: Optional[Callable[..., Any]],
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Optional[Sequence[Optional[dict]]] = None,
    *,
    extra_keys: Optional[Sequence[str]] = None,
    require_extra_keys: bool = False,
    on_error: str = "raise",
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """Scores every sample; returns ``(scores float32[B], extras {key: float32[B]})``.

  ``compute_score_fn`` is called as verl calls it, with keywords ``data_source``,
  ``solution_str``, ``ground_truth``, ``extra_info``; None means ``default_compute_score``. A dict
  result gives its ``"score"`` as the score and its other entries as extras: numbers as float32
  (0 for samples that lack the key), and, when ``extra_keys`` is None, text entries (verl's
  ``"pred"``, what majority voting counts) as object arrays (None where missing). ``extra_keys``
  fixes the set of extras, numbers only; with ``require_extra_keys`` a sample whose result lacks one
  of them fails the batch (GDPO's reward components must all be there).

  ``on_error="raise"``: a reward function that raises or returns a non-number / non-finite value
  fails the batch with a ``RewardFunctionError`` naming the sample index and data_source.
  ``on_error="zero"``: such a sample scores 0 and is flagged 1.0 in ``extras["reward_error"]``.
  An unknown data_source is a configuration error and always raises.
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
  }
  if len(set(lengths.values())) != 1:
    raise ValueError(f"score_batch inputs must all have the batch size; got lengths {lengths}")
  fn = default_compute_score if compute_score_fn is None else compute_score_fn

  scores = np.zeros(batch_size, dtype=np.float32)
  errors = np.zeros(batch_size, dtype=np.float32)
  extra_rows: list[dict[str, float]] = []
  for index in range(batch_size):
    data_source = data_sources[index]
    try:
      result = fn(
          data_source=data_source,
          solution_str=solution_strs[index],
          ground_truth=ground_truths[index],
          extra_info=extra_infos[index],
      )
      score, extras = _split_result(result, data_source)
    except UnknownDataSourceError:
      raise
    except Exception as error:
      if on_error == "raise":
        raise RewardFunctionError(
            f"reward function {getattr(fn, '__name__', fn)!r} failed on sample {index} "
            f"(data_source={data_source!r}): {type(error).__name__}: {error}",
            hint="reward_model.on_error=zero scores such a sample 0 and counts it (metric reward/num_errors)",
        ) from error
      errors[index] = 1.0
      extra_rows.append({})
      continue
    scores[index] = score
    extra_rows.append(extras)
    missing = [key for key in extra_keys or () if not isinstance(extras.get(key), float)]
    if require_extra_keys and missing:
      raise RewardFunctionError(
          f"reward function {getattr(fn, '__name__', fn)!r} returned no number for {missing} on sample {index} "
          f"(data_source={data_source!r}); it returned {sorted(['score', *extras])}",
          hint="algorithm.gdpo_reward_keys names entries of the dict the reward function returns")

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
  return scores, extras_out


def _split_result(result: Any, data_source: str) -> tuple[float, dict[str, float]]:
  result = normalize_result(result, data_source)
  if isinstance(result, dict):
    score = normalize_result(result["score"], data_source)
    if isinstance(score, dict):
      raise TypeError(f"reward function for data_source {data_source!r} returned a dict as its 'score'")
    extras = {key: float(value) if _is_number(value) else value for key, value in result.items()
              if key != "score" and (_is_number(value) or isinstance(value, str))}
  else:
    score, extras = result, {}
  if not math.isfinite(score):
    raise ValueError(f"reward function for data_source {data_source!r} returned a non-finite score {score}")
  return score, extras


def _is_number(value: Any) -> bool:
  return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating))
