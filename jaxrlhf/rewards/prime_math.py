"""PRIME's math reward (verl's `prime_math`, the `numina_*` data sources): 1.0 when the response's answer is the
ground truth, else 0.0.

Written from verl 0.9.1's behaviour, not its code; tests/rewards/test_verl_scorer_oracle.py compares the two.

1. The answer (`match_answer`): the text after the last "answer:" / "answer is" / "answers are", before a last
   "is the answer"; inside the last `\\boxed{}` (or `\\fbox{}`) if there is one; before the last ". "; after the last
   "be ", "is ", "=", ": ", "get " and the like.
2. Right when PRM800K's grader says so (jaxrlhf/rewards/prm800k.py, prime_math's dialect); else when the answer and
   the ground truth are equal as numbers (within 1e-4 relative, or off by a factor 100: a percentage), as strings
   without spaces or brackets, or part by part (tuples, intervals, comma lists, `Point(...)`, a `pmatrix` given as a
   list of rows). With `\\pi` in either, it is tried as 3.14159... and as 3.14.

Two differences from verl, both where verl runs the model's text as Python (`eval`): here `\\pi` expressions and
matrix rows are evaluated only as arithmetic on numbers (verl also runs any builtin call or name of its module:
`max(2)\\pi` is a number there, text here), and a `Matrix(...)` answer is not parsed (verl hands it to sympy's
`parse_expr`, another eval). verl's last resort, sympy's symbolic comparison, never answers True in 0.9.1 (its time
limit is used as a context manager but is a decorator, so the comparison raises and is taken as "not equal"); it
is left out.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from typing import Any

from jaxrlhf.rewards import prm800k

_LEADING_MARKERS = ("answer:", "answer is", "answers are")
_TRAILING_MARKERS = ("is answer", "is the answer", "are answers", "are the answers")
_LAST_MARKERS = ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n")
_DOLLARS = re.compile(r"\$\d+(\.\d+)?")
_PERCENT = re.compile(r"^\d+(\.\d+)?(%|\\%)$")
_INTERVALS = (
  (re.compile(r"^Interval\((.*)\)$"), "[{}]"),
  (re.compile(r"^Interval\.Ropen\((.*)\)$"), "[{})"),
  (re.compile(r"^Interval\.Lopen\((.*)\)$"), "({}]"),
  (re.compile(r"^Interval\.open\((.*)\)$"), "({})"),
)
_PMATRIX = "\\begin{pmatrix}"
TOLERANCE = 1e-4


def compute_score(solution_str: Any, ground_truth: Any) -> float:
  response, ground_truth = str(solution_str), str(ground_truth)
  answer = match_answer(response)
  if prm800k.grade_answer(answer, ground_truth, prm800k.PRIME):
    return 1.0
  try:
    if "\\pi" in answer or "\\pi" in ground_truth:
      # Both are tried before either counts: a failure of the second makes the answer wrong, as in verl.
      right = any([math_equal(answer, ground_truth, pi=pi) for pi in (math.pi, 3.14)])
    else:
      right = math_equal(answer, ground_truth)
  except Exception:  # a part verl cannot read ("x_1" as a number in base 1) makes the answer wrong
    right = False
  return float(right)


def match_answer(response: str) -> str:
  """The answer part of a response (step 1 of the module's docstring)."""
  for marker in _LEADING_MARKERS:
    # The position is found in the lower-cased text and used in the text as written, as verl does.
    at = response.lower().rfind(marker)
    if at != -1:
      response = response[at + len(marker) :].strip()
  for marker in _TRAILING_MARKERS:
    at = response.lower().rfind(marker)
    if at != -1:
      response = response[:at].strip()
  boxed = last_boxed(response)
  if boxed:
    response = boxed
  if ". " in response:
    response = response[: response.lower().rfind(". ")].strip()
  for marker in _LAST_MARKERS:
    at = response.lower().rfind(marker)
    if at != -1:
      response = response[at + len(marker) :].strip()
  return response


def last_boxed(text: str) -> str | None:
  """The stripped content of the last `\\boxed` (else `\\fbox`): from the first "{" after it to the "}" that
  brings the brace count back to 0; None when there is none."""
  start = text.rfind("\\boxed")
  if start < 0:
    start = text.rfind("\\fbox")
    if start < 0:
      return None
  depth, left = 0, None
  for index in range(start, len(text)):
    if text[index] == "{":
      depth += 1
      left = index if left is None else left
    elif text[index] == "}":
      depth -= 1
      if depth == 0:
        return text[left + 1 : index].strip() if left is not None else None
  return None


def math_equal(prediction: Any, reference: Any, pi: float = math.pi) -> bool:
  """Step 2's comparisons after PRM800K's grader: numbers, strings, parts. Raises where verl's does (a base
  subscript on something that is no number), which `compute_score` takes as wrong."""
  prediction, reference = _normalize(prediction, pi), _normalize(reference, pi)
  if isinstance(prediction, str) and len(prediction) > 1000:
    prediction = prediction[:1000]
  if isinstance(prediction, str) and isinstance(reference, str):
    if prediction.strip().lower() == reference.strip().lower():
      return True
    if prediction.replace(" ", "") == reference.replace(" ", ""):
      return True

  predicted_number, reference_number = _as_number(prediction), _as_number(reference)
  if predicted_number is not None and reference_number is not None:
    candidates = (reference_number / 100, reference_number, reference_number * 100)
    return any(math.isclose(candidate, predicted_number, rel_tol=TOLERANCE) for candidate in candidates)

  if not prediction and prediction not in (0, False):
    return False
  reference, prediction = str(reference).strip(), _interval_as_brackets(str(prediction).strip())

  predicted_bare, reference_bare = prediction, reference
  if (prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("(")) or (
    prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("[")
  ):
    predicted_bare, reference_bare = predicted_bare.strip("[]()"), reference_bare.strip("[]()")
  for bracket in "{}()":
    predicted_bare, reference_bare = predicted_bare.replace(bracket, ""), reference_bare.replace(bracket, "")
  if predicted_bare == reference_bare:
    return True

  if (
    prediction
    and reference
    and prediction[0] in "(["
    and prediction[-1] in ")]"
    and (prediction[0], prediction[-1]) == (reference[0], reference[-1])
    and _all_equal(prediction[1:-1].split(","), reference[1:-1].split(","))
  ):
    return True
  if "," in prediction and "," in reference:
    predicted_parts = [part.strip() for part in prediction.split(",")]
    reference_parts = [part.strip() for part in reference.split(",")]
    if len(predicted_parts) == len(reference_parts):
      return _all_equal(predicted_parts, reference_parts)
  # An empty reference raises here (IndexError), as in verl.
  if prediction.startswith("Point") and reference[0] == "(" and reference[-1] == ")":
    predicted_parts = prediction[prediction.find("(") + 1 : -1].split(",")
    if _all_equal(predicted_parts, reference[1:-1].split(",")):
      return True
  if _PMATRIX in reference and prediction.startswith("[") and prediction.endswith("]"):
    rows = _arithmetic(prediction)  # not a list of numbers: raises, as verl's eval of it does
    if isinstance(rows, list):
      return _pmatrix_equal(rows, reference)
  return False


def _all_equal(predicted_parts: list, reference_parts: list) -> bool:
  """As many parts on each side, each equal to its partner; every pair is compared (one that raises makes the
  whole raise, as in verl)."""
  if len(predicted_parts) != len(reference_parts):
    return False
  return all([math_equal(predicted, expected) for predicted, expected in zip(predicted_parts, reference_parts)])


def _pmatrix_equal(rows: list, reference: str) -> bool:
  """A `[[...], ...]` answer against `\\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix}`, row by row."""
  body = reference
  for prefix in ("\\\\begin{pmatrix}", _PMATRIX):
    body = body.removeprefix(prefix)
  for suffix in ("\\\\end{pmatrix}", "\\end{pmatrix}"):
    body = body.removesuffix(suffix)
  reference_rows = [row.split("&") if "&" in row else row for row in body.split("\\")]
  try:
    return _all_equal(rows, reference_rows)
  except Exception:
    return False


def _normalize(answer: Any, pi: float) -> Any:
  """`$5` -> "5", `5%` -> "5"; a base subscript dropped ("101_2" -> 101, an int); `\\pi` as the number `pi` and
  the whole evaluated when it is arithmetic ("2\\pi" -> 6.28...)."""
  if not isinstance(answer, str):
    return answer
  if _DOLLARS.match(answer):
    return answer[1:]
  if _PERCENT.match(answer):
    return answer.replace("\\%", "").replace("%", "")
  if "_" in answer:
    return int(float(answer.split("_")[0]))  # ValueError, OverflowError for what is no finite number
  if "\\pi" not in answer:
    return answer
  at = answer.find("\\pi")
  while at != -1:
    factor = "*" if at > 0 and answer[at - 1].isdigit() else "1*"
    answer = answer[:at] + f"{factor}{pi}" + answer[at + len("\\pi") :]
    at = answer.find("\\pi", at + 1)
  try:
    return _arithmetic(answer)
  except (ArithmeticError, SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
    return answer


def _as_number(value: Any) -> float | None:
  """`value` as verl reads a number: its text without grouping commas (or `{,}`) through `float`; else None."""
  text = str(value)
  try:
    return float(text.replace("{,}", "") if "{,}" in text else text.replace(",", ""))
  except ValueError:
    return None


def _interval_as_brackets(prediction: str) -> str:
  """sympy's `Interval.Ropen(a, b)` -> `[a, b)` and the like."""
  for pattern, brackets in _INTERVALS:
    match = pattern.match(prediction)
    if match:
      return brackets.format(match.group(1))
  return prediction


# ----- arithmetic, where verl evaluates the model's text with eval -------------------------------------------------

_BINARY = {
  ast.Add: operator.add,
  ast.Sub: operator.sub,
  ast.Mult: operator.mul,
  ast.Div: operator.truediv,
  ast.FloorDiv: operator.floordiv,
  ast.Mod: operator.mod,
  ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_BITS = 100_000  # 9**9**9 runs for hours (and hangs verl's eval); [0]*10**9 takes 8 GB


def _arithmetic(text: str) -> Any:
  """The value of `text` as Python computes it, for numbers, + - * / // % **, unary signs, tuples and lists only;
  ValueError for anything else (names, calls, strings)."""
  return _evaluate(ast.parse(text.lstrip(" \t"), mode="eval").body)  # eval drops leading blanks; so does this


def _evaluate(node: ast.AST) -> Any:
  if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, complex)):
    return node.value
  if isinstance(node, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in node.elts):
    values = [_evaluate(element) for element in node.elts]
    return tuple(values) if isinstance(node, ast.Tuple) else values
  if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
    return _UNARY[type(node.op)](_evaluate(node.operand))
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    left, right = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
      if abs(right) * abs(left).bit_length() > _MAX_BITS:
        raise ValueError("a power too large to compute")
    if isinstance(node.op, ast.Mult) and any(isinstance(side, (list, tuple)) for side in (left, right)):
      if any(isinstance(side, int) and side > _MAX_BITS for side in (left, right)):
        raise ValueError("a sequence too long to build")
    return _BINARY[type(node.op)](left, right)
  raise ValueError(f"not arithmetic: {type(node).__name__}")
