"""Generic exact-match reward: the whole response, whitespace-trimmed, equals the ground truth.

Useful for synthetic tasks whose responses are just the answer (copy, sort, arithmetic). A list or
tuple ground truth accepts any of its items.
"""

from typing import Any


def compute_score(
  solution_str: str,
  ground_truth: Any,
  case_sensitive: bool = True,
  score: float = 1.0,
) -> float:
  # parquet list columns come back as lists or numpy arrays; anything else is one answer.
  is_many = hasattr(ground_truth, "__iter__") and not isinstance(ground_truth, (str, bytes, dict))
  candidates = list(ground_truth) if is_many else [ground_truth]
  response = solution_str.strip()
  if not case_sensitive:
    response = response.casefold()
  for candidate in candidates:
    candidate = str(candidate).strip()
    if not case_sensitive:
      candidate = candidate.casefold()
    if response == candidate:
      return float(score)
  return 0.0
