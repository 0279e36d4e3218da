"""PRM800K's answer grader, in the two dialects verl 0.9.1 scores with: `prime_math` (the `numina_*` sources) and
mathruler's (the `hiyouga/geometry3k` source).

An answer is right when (a) Hendrycks MATH's string normalisation makes it equal to the ground truth, or (b) a
second normalisation (units, `$`, `%`, LaTeX turned to text by pylatexenc) does, or (c) element by element (tuples
and intervals split at commas) sympy simplifies the difference to 0. Fractions are compared as written (an
unreduced fraction is wrong) and an integer only ever equals an integer string. Written from verl's behaviour, not
its code; tests/rewards/test_verl_scorer_oracle.py compares the two.

sympy and pylatexenc come with the `math` extra (`pip install -e '.[math]'`); they are imported on first use, so the
other scorers run without them. sympy's `simplify` can run for minutes on a hostile expression: verl gives it 10 s in
a forked process (prime_math) or no limit (mathruler). Here it gets 10 s in both: through SIGALRM on the main thread
of a process with no timer of its own (a reward worker, a script), else in a helper process (the trainer's reward
callback thread); past them it counts as "not equal", as in verl. A reward worker's per-sample time limit
(`reward_model.timeout_s`) still bounds what no signal interrupts.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing.util  # noqa: F401  (its exit handler registered before ours: end of file)
import re
import signal
import threading
from typing import Optional

from jaxrlhf.rewards.processes import process_context

EXTRA = "math"
MODULES = ("sympy", "pylatexenc")
SYMPY_TIME_LIMIT_S = 10.0

_TUPLE_CHARS = "()[]"
_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_GROUPED_THOUSANDS = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER = re.compile(r"([0-9]) +([0-9])")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
# Expressions sympy may hang on: not worth being lenient about.
_TOO_HARD = re.compile(r"\^\{|\^\(|\^[0-9]+\^|\^[0-9][0-9]+")
_UNITS = "degree cm centimeter meter mile second minute hour day week month year foot feet inch yard".split()


@dataclasses.dataclass(frozen=True)
class Dialect:
  """Where verl's two copies of the grader differ."""

  percent_signs: tuple[str, ...]  # removed by the MATH normalisation
  units: tuple[str, ...]  # words (with plural and power) removed by the second normalisation
  squash: bool  # the second normalisation also drops spaces and braces


PRIME = Dialect(percent_signs=("\\\\%", "\\%"), units=(*_UNITS, "liter"), squash=False)
MATHRULER = Dialect(percent_signs=("\\%", "%"), units=tuple(_UNITS), squash=True)


# ----- (a) Hendrycks MATH's normalisation --------------------------------------------------------------------------


def normalize_mathd(answer: Optional[str], dialect: Dialect) -> Optional[str]:
  """MATH's `normalize_answer`: the answer unwrapped from `\\text{}` and normalised; as unwrapped when that fails."""
  if answer is None:
    return None
  answer = answer.strip()
  try:
    match = _TEXT.search(answer)
    if match is not None:
      answer = match.group("text").strip()
    return _strip_mathd(answer, dialect)
  except (IndexError, ValueError):  # a `\sqrt` or `\frac` with nothing after it, two `\text{ ` units
    return answer


def _strip_mathd(string: str, dialect: Dialect) -> str:
  for before, after in (
    ("\n", ""),
    ("\\!", ""),
    ("\\\\", "\\"),
    ("tfrac", "frac"),
    ("dfrac", "frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\$", ""),
  ):
    string = string.replace(before, after)
  if "\\text{ " in string:  # MATH writes units as "5\text{ cm}": one unit, at the end
    value, unit = string.split("\\text{ ")  # more than one: ValueError, the answer stays as it is
    string = value
  for sign in dialect.percent_signs:
    string = string.replace(sign, "")
  string = string.replace(" .", " 0.").replace("{.", "{0.")
  if not string:
    return string
  if string[0] == ".":
    string = "0" + string
  sides = string.split("=")
  if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 5": a short left side names the answer
    string = sides[1]
  string = _braced_sqrt_arguments(string)
  string = string.replace(" ", "")
  string = _braced_frac_arguments(string)
  if string == "0.5":
    string = "\\frac{1}{2}"
  return _slash_to_frac(string)


def _braced_sqrt_arguments(string: str) -> str:
  """`\\sqrt3` -> `\\sqrt{3}`; IndexError for a `\\sqrt` that ends the string."""
  head, *pieces = string.split("\\sqrt")
  for piece in pieces:
    head += "\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:])
  return head


def _braced_frac_arguments(string: str) -> str:
  """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`; a one-character rest leaves the string as it
  was, an empty one (a `\\frac` that ends the string) is an IndexError."""
  head, *pieces = string.split("\\frac")
  for piece in pieces:
    if piece[0] == "{":
      head += "\\frac" + piece
    elif len(piece) < 2:
      return string
    else:
      numerator, denominator = piece[0], piece[1]
      head += "\\frac{" + numerator + "}" + (denominator if denominator == "{" else "{" + denominator + "}") + piece[2:]
  return head


def _slash_to_frac(string: str) -> str:
  """`3/4` -> `\\frac{3}{4}` when both sides are integers written plainly."""
  parts = string.split("/")
  if len(parts) != 2:
    return string
  try:
    numerator, denominator = int(parts[0]), int(parts[1])
  except ValueError:
    return string
  return f"\\frac{{{numerator}}}{{{denominator}}}" if string == f"{numerator}/{denominator}" else string


# ----- (b) the second normalisation ----------------------------------------------------------------------------------


def normalize(expr: Optional[str], dialect: Dialect) -> Optional[str]:
  """PRM800K's `_normalize`: text, `$`, `%`, units and scale words out, LaTeX to text, lower case."""
  if expr is None:
    return None
  match = _TEXT.search(expr)
  if match is not None:
    expr = match.group("text")
  for before, after in (
    ("\\%", "%"),
    ("\\$", "$"),
    ("$", ""),
    ("%", ""),
    (" or ", " , "),
    (" and ", " , "),
    ("million", "*10^6"),
    ("billion", "*10^9"),
    ("trillion", "*10^12"),
  ):
    expr = expr.replace(before, after)
  for unit in dialect.units:
    expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
  expr = re.sub(r"\^ *\\circ", "", expr)
  if expr and expr[0] == "{" and expr[-1] == "}":
    expr = expr[1:-1]
  expr = re.sub(r",\\! *", "", expr)
  if _is_float(expr) and _is_int(float(expr)):
    expr = str(int(round(float(expr))))
  if "\\" in expr:
    expr = _latex_to_text(expr)
  expr = re.sub("- *", "-", expr)
  expr = _MIXED_NUMBER.sub(r"\1+\2", expr)  # "7 3/4" -> "7+3/4"
  if dialect.squash:
    expr = expr.replace(" ", "").replace("{", "").replace("}", "")
  expr = expr.lower()
  if _str_is_int(expr):
    expr = str(int(float(expr.replace(",", ""))))
  return expr


_LATEX_SYMBOLS = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*"))


def _latex_to_text(latex: str) -> str:
  """LaTeX as pylatexenc's text, with sqrt, pi, inf, U and * for its symbols; `latex` as it was where pylatexenc
  gives up on it."""
  from pylatexenc import latex2text

  # pylatexenc warns on every malformed macro (a "\frac" with no arguments): model outputs are full of them.
  logging.getLogger("pylatexenc").setLevel(logging.ERROR)
  expr = latex.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
  expr = expr.replace("\\frac", " \\frac")  # a mixed number "1\frac12" reads as "1 1/2"
  try:
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
  except Exception:
    return latex
  for symbol, name in _LATEX_SYMBOLS:
    expr = expr.replace(symbol, name)
  return expr.strip()


def _is_float(text: str) -> bool:
  try:
    float(text)
    return True
  except ValueError:
    return False


def _is_int(number: float) -> bool:
  try:
    return abs(number - int(round(number))) <= 1e-7
  except (OverflowError, ValueError):  # inf, nan
    return False


def _str_is_int(text: str) -> bool:
  try:
    return _is_int(float(strip_grouping_commas(text)))
  except ValueError:
    return False


def strip_grouping_commas(expr: str) -> str:
  """`1,000,000` -> `1000000`, leaving a tuple's commas alone."""
  while True:
    stripped = _GROUPED_THOUSANDS.sub(r"\1\3\4", expr)
    if stripped == expr:
      return stripped
    expr = stripped


# ----- (c) sympy ----------------------------------------------------------------------------------------------------


def _allows_sympy(expr: str) -> bool:
  letters = {char for char in expr.replace("sqrt", "").replace("frac", "") if char.isalpha()}
  return len(letters) <= 2 and _TOO_HARD.search(expr) is None


def equal_under_sympy(ground_truth: str, given: str) -> bool:
  """Whether sympy simplifies `(ground_truth)-(given)` to 0, within `SYMPY_TIME_LIMIT_S`; False when it cannot
  parse it, or gives up, or the expression has more than two letters or a power it could hang on."""
  expr = f"({ground_truth})-({given})"
  if not _allows_sympy(expr):
    return False
  try:
    return _within_time_limit(_simplifies_to_zero, expr)
  except (Exception, _TimeLimit):  # any parse or simplify failure, the time limit (its alarm may land late)
    return False


def _simplifies_to_zero(expr: str) -> bool:
  import sympy
  from sympy.parsing import sympy_parser

  transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
  return sympy.simplify(sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)) == 0


class _TimeLimit(BaseException):
  """Raised by the alarm; a BaseException, so that sympy's own `except Exception` cannot swallow it."""


def _within_time_limit(fn, *args):
  """`fn(*args)`, stopped after `SYMPY_TIME_LIMIT_S` with `TimeoutError`: by SIGALRM on a process's main thread
  (a reward worker, a script), else in the helper process (the trainer's reward callback runs on a thread of its
  own, where no signal can stop it)."""
  if not hasattr(signal, "setitimer"):
    return fn(*args)
  if threading.current_thread() is not threading.main_thread() or signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0):
    return _HELPER.call(fn, *args)

  def alarm(signum, frame):
    raise _TimeLimit

  previous = signal.signal(signal.SIGALRM, alarm)
  previous = signal.SIG_DFL if previous is None else previous  # a handler installed outside Python
  # Then again every 0.5 s: code that catches everything (a bare except) only delays the stop.
  signal.setitimer(signal.ITIMER_REAL, SYMPY_TIME_LIMIT_S, 0.5)
  try:
    return fn(*args)
  except _TimeLimit:
    raise TimeoutError(f"sympy took over {SYMPY_TIME_LIMIT_S:g} s") from None
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


class _HelperProcess:
  """One process that runs calls for threads that cannot use SIGALRM, killed and replaced when a call runs past
  the time limit (sympy's integer arithmetic is C code that no signal interrupts). It comes from the forkserver
  (spawn where there is none), never from forking the trainer, whose process runs JAX's threads."""

  def __init__(self):
    self._lock = threading.Lock()
    self._process = self._conn = None

  def call(self, fn, *args):
    with self._lock:
      if self._process is None:
        context = process_context()
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve_calls, args=(child,), daemon=True, name="jaxrlhf-sympy")
        self._process.start()
        child.close()
      try:
        self._conn.send((fn, args))
        if self._conn.poll(SYMPY_TIME_LIMIT_S):
          ok, result = self._conn.recv()
          if ok:
            return result
          raise RuntimeError(result)
      except (EOFError, OSError):  # the process died (memory): the call failed, the next one gets a new process
        self._stop()
        raise RuntimeError("the sympy helper process died") from None
      self._stop()
      raise TimeoutError(f"sympy took over {SYMPY_TIME_LIMIT_S:g} s")

  def _stop(self):
    self._process.kill()
    self._process.join()
    self._conn.close()
    self._process = self._conn = None

  def close(self):
    with self._lock:
      if self._process is not None:
        self._stop()


def _serve_calls(conn) -> None:
  # Ignores SIGTERM, as a reward worker does: a scheduler's preemption signal reaches the whole process group and
  # the trainer finishes its step (with this process) before it stops. Killed at the trainer's exit (below).
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  while True:
    try:
      fn, args = conn.recv()
    except EOFError:
      return
    try:
      conn.send((True, fn(*args)))
    except Exception as error:  # as text: not every exception pickles
      conn.send((False, f"{type(error).__name__}: {error}"))


_HELPER = _HelperProcess()
# Registered after multiprocessing's own exit handler (imported above), so it runs first: that one would send the
# helper SIGTERM, which it ignores, and wait for it forever.
atexit.register(_HELPER.close)


# ----- the grader ---------------------------------------------------------------------------------------------------


def split_tuple(expr: str) -> list[str]:
  """A tuple's or interval's elements (`(1, 2]` -> `["1", "2"]`); anything else is one element."""
  expr = strip_grouping_commas(expr)
  if not expr:
    return []
  inner = expr[1:-1]
  bracketed = len(expr) > 2 and expr[0] in _TUPLE_CHARS and expr[-1] in _TUPLE_CHARS
  if bracketed and not any(char in inner for char in _TUPLE_CHARS):
    return [element.strip() for element in inner.split(",")]
  return [expr]


def grade_answer(given_answer: Optional[str], ground_truth: str, dialect: Dialect) -> bool:
  """Whether `given_answer` is `ground_truth`: (a), (b) or (c) of the module's docstring."""
  if given_answer is None:
    return False
  if normalize_mathd(ground_truth, dialect) == normalize_mathd(given_answer, dialect):
    return True
  truth, given = normalize(ground_truth, dialect), normalize(given_answer, dialect)
  if truth == given:
    return True
  if not given:
    return False
  truth_elements, given_elements = split_tuple(truth), split_tuple(given)
  if len(truth_elements) != len(given_elements):
    return False
  if len(truth_elements) > 1 and (truth[0] != given[0] or truth[-1] != given[-1]):  # (a, b) is not [a, b]
    return False
  for truth_element, given_element in zip(truth_elements, given_elements):
    if _FRACTION.search(truth_element) and _FRACTION.search(given_element):
      right = truth_element == given_element  # an unreduced fraction is not the answer
    elif _str_is_int(truth_element) != _str_is_int(given_element):
      right = False
    else:
      right = equal_under_sympy(truth_element, given_element)
    if not right:
      return False
  return True
