"""The built-in parser of a generative reward model's verdict (`reward_model.judge.score_function.path` ""): the last
number in the judge's reply is the score.

A parser has verl's reward function signature plus the judge's reply, `judge_response`: a verl generative reward
function that posts the judge prompt to its reward router and parses the answer becomes one by dropping the request.
A reply with no number raises, which `reward_model.on_error` turns into a failed sample (or a failed step).
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, judge_response: str = "") -> float:
  del data_source, solution_str, ground_truth, extra_info
  numbers = _NUMBER.findall(judge_response)
  if not numbers:
    raise ValueError(f"the judge's reply holds no number: {judge_response[-200:]!r}")
  return float(numbers[-1])
