"""Geometry3K's text reward (verl's `geo3k`, the `hiyouga/geometry3k` data source): 0.9 for the right answer in
the last `\\boxed{}`, plus 0.1 for the format `<think>...</think> ... \\boxed{...}`.

Right is PRM800K's grader in mathruler's dialect (jaxrlhf/rewards/prm800k.py). Without a closed box the answer is
the text "None", as in mathruler. Written from verl 0.9.1's behaviour, not its code;
tests/rewards/test_verl_scorer_oracle.py compares the two.
"""

from __future__ import annotations

import re

from jaxrlhf.rewards import prm800k

FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
FORMAT_SCORE = 0.1
NO_ANSWER = "None"


def extract_boxed_content(text: str) -> str:
  """The stripped content of the last `\\boxed{`, up to the `}` that closes it; "None" when it never closes."""
  start = text.rfind("\\boxed{")
  if start == -1:
    return NO_ANSWER
  content = text[start + len("\\boxed{") :]
  depth = 0
  for index, char in enumerate(content):
    depth += {"{": 1, "}": -1}.get(char, 0)
    if depth == -1:
      return content[:index].strip()
  return NO_ANSWER


def compute_score(solution_str: str, ground_truth: str, format_score: float = FORMAT_SCORE) -> float:
  right = prm800k.grade_answer(extract_boxed_content(solution_str), ground_truth, prm800k.MATHRULER)
  formatted = FORMAT.fullmatch(solution_str) is not None
  # verl's arithmetic, so that the sum is the same float (0.9 + 0.1 and the like)
  return (1.0 - format_score) * float(right) + format_score * float(formatted)
