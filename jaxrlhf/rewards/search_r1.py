"""Search-R1's exact-match reward (verl's `search_r1_like_qa_em`, the `searchR1_*` data sources).

The answer is the last ``<answer>...</answer>`` of the response; it scores 1.0 when, normalised (lower case, no
punctuation, no articles, single spaces), it equals one of ``ground_truth["target"]`` normalised alike, else 0.0.
A response with more than 10 opening or closing answer tags scores a quarter (verl's guard against tag spam).
Written from verl 0.9.1's behaviour, not its code (tests/rewards/test_verl_scorer_oracle.py compares the two).
"""

from __future__ import annotations

import re
import string
from typing import Any, Optional

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
MAX_TAGS = 10


def normalize_answer(text: str) -> str:
  return " ".join(_ARTICLE.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def extract_answer(solution_str: str) -> Optional[str]:
  answers = _ANSWER.findall(solution_str)
  return answers[-1].strip() if answers else None


def compute_score(solution_str: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0) -> float:
  answer = extract_answer(solution_str)
  if answer is None:
    return 0.0
  targets = ground_truth["target"]
  targets = [targets] if isinstance(targets, str) else list(targets)
  if normalize_answer(answer) not in {normalize_answer(target) for target in targets}:
    return float(format_score)
  spam = max(solution_str.count("<answer>"), solution_str.count("</answer>")) > MAX_TAGS
  return float(score) / 4 if spam else float(score)
