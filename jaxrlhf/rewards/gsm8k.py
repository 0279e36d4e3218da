"""GSM8K rule reward (docs/algorithms.md §8), behaviour-compatible with verl's reward_score/gsm8k.py.

Only the last 300 characters of a response are examined: the answer is expected at the end, and
regexes over long generations are slow.

* strict: the last ``#### <number>`` (``#### (-?[0-9.,]+)``), with ``,`` and ``$`` removed.
  ``#### $18`` does not match (the number must follow ``#### `` directly), exactly as in verl.
* flexible: the last number-like token ``(-?[0-9.,]+)`` that is not ``.``; nothing is stripped, so
  ``1,000`` or a sentence-final ``18.`` does not equal ``1000`` / ``18`` (verl behaves the same).

Score: ``score`` (1.0) on exact string equality with the ground truth, ``format_score`` (0.0) when
an answer was extracted but differs, 0.0 when none was found.
"""

import re
from typing import Optional

SOLUTION_CLIP_CHARS = 300
EXTRACTION_METHODS = ("strict", "flexible")

_STRICT_RE = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER_RE = re.compile(r"(-?[0-9.,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> Optional[str]:
  """Returns the extracted answer string, or None when the response contains none."""
  if method not in EXTRACTION_METHODS:
    raise ValueError(f"gsm8k extraction method must be one of {EXTRACTION_METHODS}, got {method!r}")
  tail = solution_str[-SOLUTION_CLIP_CHARS:]
  if method == "strict":
    matches = _STRICT_RE.findall(tail)
    if not matches:
      return None
    return matches[-1].replace(",", "").replace("$", "")
  for token in reversed(_NUMBER_RE.findall(tail)):
    if token not in ("", "."):
      return token
  return None


def compute_score(
  solution_str: str,
  ground_truth: str,
  method: str = "strict",
  format_score: float = 0.0,
  score: float = 1.0,
) -> float:
  # A ground truth read back from parquet/jsonl as a number still compares as its string.
  answer = extract_solution(solution_str, method=method)
  if answer is None:
    return 0.0
  return float(score) if answer == str(ground_truth) else float(format_score)
