"""jaxrlhf's rule rewards give verl 0.9.1's results: `default_compute_score` against verl's own, per data source.

For each data source a few hundred responses are generated from a fixed seed (right, wrong, boxed, unboxed,
malformed, long, empty; for numina_* and geometry3k also LaTeX spellings: \\frac, \\sqrt, \\pi, intervals, units,
percentages, matrices) and scored by both; every score (and the dict entries verl returns) must be equal. Runs
where verl's scorer modules import (tests/rewards/verl_scorers.py), and is skipped saying why elsewhere.
`python tests/rewards/test_verl_scorer_oracle.py` prints the agreement per data source (benchmarks/README.md).
"""

from __future__ import annotations

import json
import random
import sys

import numpy as np
import pytest

from jaxrlhf.rewards import default_compute_score
from tests.rewards.verl_scorers import verl_module

SAMPLES = 300
FILLER = "Let me think step by step about this problem. " * 8


# ----- generated cases: (data_source, solution_str, ground_truth) ----------------------------------------------

MATH_TRUTHS = [
  "72",
  "1000",
  "-3",
  "\\frac{1}{2}",
  "\\dfrac{3}{4}",
  "\\sqrt{2}",
  "2\\sqrt{3}",
  "(1, 2)",
  "\\pi",
  "3.5",
  "10\\%",
  "5\\text{ cm}",
  "x^2+1",
  "\\text{(B)}",
  "1,000",
  "0.25",
  "\\infty",
  "2^{10}",
  "\\$15",
  "12 degrees",
]
MATH_SPELLINGS = [
  lambda t: t,
  lambda t: f"${t}$",
  lambda t: t.replace("\\dfrac", "\\frac"),
  lambda t: f"x = {t}",
  lambda t: f"{t} units",
  lambda t: t.replace(" ", ""),
  lambda t: f"\\text{{{t}}}",
  lambda t: f"{t}.",
  lambda t: t + "0" if "." in t else t,
  lambda t: f"\\boxed{{{t}}}",
]


def _math_response(rng: random.Random, truth: str) -> str:
  answer = rng.choice(MATH_SPELLINGS)(truth if rng.random() < 0.5 else rng.choice(MATH_TRUTHS))
  kind = rng.randrange(9)
  lead = FILLER[: rng.choice((0, 40, 250, 400))]
  if kind == 0:
    return f"{lead}Answer: {answer}"
  if kind == 1:
    return f"{lead}So the final answer is $\\boxed{{{answer}}}$."
  if kind == 2:
    return f"{lead}answer : {answer}\nand then I double check it."
  if kind == 3:
    return f"Answer: {answer}\n{FILLER}{FILLER}"  # pushed out of the last 300 characters
  if kind == 4:
    return f"{lead}\\boxed{{{answer}"  # unclosed
  if kind == 5:
    return f"{lead}\\boxed{{{answer}}} {FILLER[:120]}"  # boxed, but not in the last 100 characters
  if kind == 6:
    return f"{lead}Answer: {rng.choice(MATH_TRUTHS)}\nANSWER: {answer}"
  if kind == 7:
    return rng.choice(("", "I don't know.", "Answer:", "\\boxed{}", "Answer: [INVALID]"))
  return f"{lead}{answer}"


def math_dapo_cases(rng: random.Random):
  sources = ("math_dapo", "math", "math_dapo_reasoning", "aime2024", "aime_2025")
  for _ in range(SAMPLES):
    truth = rng.choice(MATH_TRUTHS)
    yield rng.choice(sources), _math_response(rng, truth), truth


def gsm8k_cases(rng: random.Random):
  for _ in range(SAMPLES):
    truth = str(rng.choice((72, 1000, 5, 18, 3, 250000)))
    number = truth if rng.random() < 0.5 else str(rng.randrange(1000))
    spelled = rng.choice((number, f"{int(number):,}", f"${number}", f"{number}.00", f"-{number}"))
    lead = FILLER[: rng.choice((0, 100, 400))]
    response = rng.choice(
      (
        f"{lead}#### {spelled}",
        f"{lead}The answer is {spelled}.",
        f"#### {spelled}\n{FILLER}",
        f"{lead}####{spelled}",
        f"{lead}#### {spelled} and #### 7",
        "",
        "#### .",
      )
    )
    yield "openai/gsm8k", response, truth


SEARCH_TRUTHS = [
  {"target": ["Paris"]},
  {"target": np.array(["The Beatles", "Beatles"], dtype=object)},
  {"target": ["1969"]},
  {"target": "New York City"},
  {"target": ["an apple", "Apple Inc."]},
]


def search_r1_cases(rng: random.Random):
  names = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
  for _ in range(SAMPLES):
    truth = rng.choice(SEARCH_TRUTHS)
    target = truth["target"]
    right = target if isinstance(target, str) else rng.choice(list(target))
    answer = rng.choice((right, right.upper(), f"the {right}!", f" {right} ", "Rome", "", f"{right} and more"))
    response = rng.choice(
      (
        f"<think>search</think><answer>{answer}</answer>",
        f"<answer>wrong</answer> then <answer>{answer}</answer>",
        f"<answer>{answer}</answer>" * rng.choice((1, 11, 12)),
        f"<answer>{answer}",
        f"{FILLER}<answer>\n{answer}\n</answer>",
        answer,
      )
    )
    yield f"searchR1_{rng.choice(names)}", response, truth


CODE_PROGRAMS = [
  "a, b = map(int, input().split())\nprint(a + b)",
  "a, b = map(int, input().split())\nprint(a + b, end='  \\n\\n')",
  "a, b = map(int, input().split())\nprint(a - b)",
  "a, b = map(int, input().split())\nprint((a + b) / 1.0000001)",
  "a, b = map(int, input().split())\nprint(f'{a + b:.3f}')",
  "a, b = map(int, input().split())\nprint(a + b)\nprint()",
  "import sys\nprint(sum(map(int, sys.stdin.read().split())))",
  "print(3)",
  "raise ValueError('no')",
  "def (:",
  "",
  "def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\nif __name__ == '__main__':\n    main()",
]
CODE_TESTS = [
  {"inputs": ["1 2\n", "3 4\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]},
  {"inputs": ["1 2"], "outputs": ["3"]},
  {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3.0\n", "10\n"]},
]
CALL_PROGRAMS = [
  "def add(a, b):\n    return a + b",
  "def add(a, b):\n    return (a, b)",
  "class Solution:\n    def add(self, a, b):\n        return a + b",
  "def add(a, b):\n    return a - b",
]
CALL_TESTS = {"fn_name": "add", "inputs": ["1\n2", "3\n4"], "outputs": ["3", "7"]}


def code_cases(rng: random.Random):
  for _ in range(CODE_SAMPLES):
    source = rng.choice(("codecontests", "apps", "codeforces", "taco"))
    if rng.random() < 0.25:
      program, tests = rng.choice(CALL_PROGRAMS), CALL_TESTS
    else:
      program, tests = rng.choice(CODE_PROGRAMS), rng.choice(CODE_TESTS)
    wrapped = rng.choice(
      (program, f"Here:\n```python\n{program}\n```\nDone.", f"```python\nx\n```\n```python\n{program}\n```")
    )
    yield source, wrapped, json.dumps(tests) if rng.random() < 0.5 else json.loads(json.dumps(tests))


PRIME_TRUTHS = [
  "72",
  "-3",
  "1,000,000",
  "0.25",
  "\\frac{3}{4}",
  "\\dfrac{7}{2}",
  "2\\sqrt{3}",
  "\\sqrt{2}/2",
  "(1, 2)",
  "[-1, 3)",
  "(-\\infty, 0) \\cup (2, \\infty)",
  "\\frac{\\pi}{3}",
  "2\\pi",
  "15\\%",
  "\\$18.50",
  "5 \\text{ cm}",
  "60^\\circ",
  "101_2",
  "x^2+2x+1",
  "\\text{(C)}",
  "3 \\frac{1}{4}",
  "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
  "1, 2, 3",
  "12 meters",
]
# Other ways to write each answer: equal in value, in LaTeX, or not at all (an unreduced fraction, another interval).
PRIME_SPELLINGS = [
  lambda t: t,
  lambda t: t.replace("\\dfrac", "\\frac").replace("\\frac{3}{4}", "0.75"),
  lambda t: t.replace("\\frac{3}{4}", "3/4").replace("\\frac{7}{2}", "\\tfrac72"),
  lambda t: t.replace("\\frac{3}{4}", "\\frac{6}{8}").replace("2\\sqrt{3}", "\\sqrt{12}"),
  lambda t: t.replace("(", "[").replace(")", "]"),
  lambda t: t.replace(" ", ""),
  lambda t: f"x = {t}",
  lambda t: f"${t}$",
  lambda t: f"\\text{{{t}}}",
  lambda t: f"{t} units",
  lambda t: t.replace("\\pi", "\\cdot \\pi").replace("2\\pi", "6.2832").replace("72", "72.0"),
  lambda t: t.replace("\\%", "%").replace("15", "0.15").replace("1,000,000", "10^6"),
  lambda t: t.replace("x^2+2x+1", "(x+1)^2").replace("60^\\circ", "60 degrees").replace("101_2", "5"),
  lambda t: t.replace("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}").replace("1, 2, 3", "3, 2, 1"),
  lambda t: t.replace("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "[[1, 2], [3, 4]]").replace("-3", "- 3"),
  lambda t: t + "0" if "." in t else t + "1",
]


def _prime_response(rng: random.Random, truth: str) -> str:
  answer = rng.choice(PRIME_SPELLINGS)(truth if rng.random() < 0.6 else rng.choice(PRIME_TRUTHS))
  lead = FILLER[: rng.choice((0, 60, 400))] + rng.choice(("", "Step 1: set up.\nStep 2: solve.\n"))
  return rng.choice(
    (
      f"{lead}So the answer is $\\boxed{{{answer}}}$.",
      f"{lead}The answer is {answer}",
      f"{lead}Answer: {answer}\n",
      f"{lead}We get {answer}. Done",
      f"{lead}{answer} is the answer.",
      f"{lead}Thus x = {answer}",
      f"{lead}\\fbox{{{answer}}}",
      f"{lead}\\boxed{{{answer}",  # unclosed
      f"{lead}\\boxed{{1}} first, then the answer is \\boxed{{{answer}}}",
      f"{lead}{answer}",
      f"{lead}The answers are {answer} and 7",
      rng.choice(("", "I give up.", "\\boxed{}", "Answer:", "The answer is \\boxed{x_1}", "\\boxed{\\pi}")),
    )
  )


def prime_math_cases(rng: random.Random):
  names = ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc", "cn_k12", "olympiads")
  for _ in range(SAMPLES):
    truth = rng.choice(PRIME_TRUTHS)
    yield f"numina_{rng.choice(names)}", _prime_response(rng, truth), truth


GEOMETRY_TRUTHS = ["3", "60", "12.5", "2\\sqrt{3}", "\\frac{40}{3}", "4\\sqrt{2}", "25\\pi", "0.75", "108", "7.2"]
GEOMETRY_SPELLINGS = [
  lambda t: t,
  lambda t: t.replace("\\frac{40}{3}", "40/3").replace("0.75", "\\frac{3}{4}").replace("108", "108^\\circ"),
  lambda t: t.replace("2\\sqrt{3}", "\\sqrt{12}").replace("12.5", "12.50").replace("60", "60 degrees"),
  lambda t: t.replace("\\sqrt{2}", "\\sqrt2").replace("25\\pi", "25 \\pi").replace("7.2", "7.20 cm"),
  lambda t: f"x = {t}",
  lambda t: f"{{{t}}}",
  lambda t: t + "1",
]


def geometry3k_cases(rng: random.Random):
  for _ in range(SAMPLES):
    truth = rng.choice(GEOMETRY_TRUTHS)
    answer = rng.choice(GEOMETRY_SPELLINGS)(truth if rng.random() < 0.6 else rng.choice(GEOMETRY_TRUTHS))
    think = rng.choice(("<think>The angles sum to 180.</think>", "<think>" + FILLER + "</think>\n", "", "<think>x"))
    response = rng.choice(
      (
        f"{think} The answer is \\boxed{{{answer}}}.",
        f"{think}\\boxed{{{answer}}}",
        f"{think}\\boxed{{{answer}",  # unclosed
        f"{think}{answer}",
        f"{think}\\boxed{{0}} no, \\boxed{{{answer}}}\n",
        f"\\boxed{{{answer}}}{think}",
        rng.choice(("", "\\boxed{}", "<think></think>\\boxed{None}", "\\boxed{{}")),
      )
    )
    yield "hiyouga/geometry3k", response, truth


CODE_SAMPLES = 60  # verl's checker starts a process and a multiprocessing manager per test: about 0.3 s a case
CASES = {
  "math_dapo": math_dapo_cases,
  "gsm8k": gsm8k_cases,
  "search_r1": search_r1_cases,
  "code": code_cases,
  "prime_math": prime_math_cases,
  "geometry3k": geometry3k_cases,
}


# ----- the comparison -------------------------------------------------------------------------------------------


def _same(ours, theirs) -> bool:
  if isinstance(theirs, dict):
    return isinstance(ours, dict) and set(ours) == set(theirs) and all(_same(ours[k], theirs[k]) for k in theirs)
  if isinstance(theirs, (bool, np.bool_)):
    return bool(ours) == bool(theirs) and isinstance(ours, (bool, np.bool_))
  if isinstance(theirs, (int, float)) and not isinstance(theirs, bool):
    return isinstance(ours, (int, float)) and float(ours) == float(theirs)
  return ours == theirs


# Under pytest, the first cases of the slow scorers only (a process per code case, sympy for prime_math: 15 s and 8 s
# alone, minutes beside the suite's other worker); the script compares every case (benchmarks/README.md).
TEST_CASES = {"code": 20, "prime_math": 100}


def agreement(name: str, verl_score, limit: int | None = None) -> tuple[int, int, list]:
  """(equal, total, the first disagreements) of `name`'s generated cases (the first `limit` of them)."""
  cases = list(CASES[name](random.Random(name)))[:limit]
  wrong = []
  for data_source, response, truth in cases:
    ours, theirs = default_compute_score(data_source, response, truth), verl_score(data_source, response, truth)
    if not _same(ours, theirs):
      wrong.append((data_source, response, truth, ours, theirs))
  return len(cases) - len(wrong), len(cases), wrong[:5]


def _verl_default_compute_score():
  module = verl_module("")
  if isinstance(module, str):
    pytest.skip(module)
  return module.default_compute_score


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_scores_as_verl(name, capsys):
  verl_score = _verl_default_compute_score()
  equal, total, wrong = agreement(name, verl_score, TEST_CASES.get(name))
  assert total == TEST_CASES.get(name, CODE_SAMPLES if name == "code" else SAMPLES) and equal == total, wrong


if __name__ == "__main__":
  module = verl_module("")
  if isinstance(module, str):
    sys.exit(module)
  for name in sorted(CASES):
    equal, total, wrong = agreement(name, module.default_compute_score)
    print(f"{name}: {equal}/{total} equal", *wrong, sep="\n  ")
