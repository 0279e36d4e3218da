"""MATH-style rule reward: the last ``\\boxed{...}`` (or ``\\fbox{...}``) answer, compared with the
ground truth after normalisation.

Follows verl's reward_score/math.py (itself lm-evaluation-harness's hendrycks_math ``is_equiv`` /
``strip_string``): 1.0 when the normalised strings are equal, ``format_score`` (0.0) when a boxed
answer was found but differs, 0.0 when there is none (or its braces never close, e.g. a truncated
response).

Beyond verl, and only where verl would mark an obviously equal answer wrong:
  * ``\\fbox{...}`` is extracted (verl finds it but then fails to unwrap it and scores 0);
  * trailing decimal zeros (``5.0``, ``0.50``), bare ``$`` and ``%`` and a trailing
    ``\\text{...}`` unit (``12\\text{cm}``) are dropped;
  * malformed ``\\frac``/``\\sqrt`` at the end of a string are left alone instead of falling back
    to raw string comparison through an exception.
"""

import re
from typing import Optional

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_only_string(string: str) -> Optional[str]:
  """Returns the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` in ``string``, or None.

  Braces are matched, so nested groups (``\\boxed{\\frac{1}{2}}``) come back whole; an unclosed
  box gives None.
  """
  start = max(string.rfind(command) for command in _BOX_COMMANDS)
  if start < 0:
    return None
  command = next(c for c in _BOX_COMMANDS if string.startswith(c, start))
  rest = string[start + len(command) :]
  body = rest.lstrip(" ")
  if not body.startswith("{"):
    if command == "\\boxed" and rest.startswith(" "):
      # "\boxed 5$": the argument runs to the closing math delimiter, as in verl.
      return "\\boxed " + rest[1:].split("$")[0]
    return None
  depth = 0
  for offset, char in enumerate(body):
    if char == "{":
      depth += 1
    elif char == "}":
      depth -= 1
      if depth == 0:
        return command + "{" + body[1:offset] + "}"
  return None


def remove_boxed(boxed: str) -> str:
  """``\\boxed{x}`` / ``\\fbox{x}`` / ``\\boxed x`` -> ``x``."""
  if boxed.startswith("\\boxed "):
    return boxed[len("\\boxed ") :]
  for command in _BOX_COMMANDS:
    left = command + "{"
    if boxed.startswith(left) and boxed.endswith("}"):
      return boxed[len(left) : -1]
  raise ValueError(f"not a boxed expression: {boxed!r}")


def extract_boxed_answer(solution_str: str) -> Optional[str]:
  """The content of the last box in ``solution_str``, or None when there is none."""
  boxed = last_boxed_only_string(solution_str)
  return None if boxed is None else remove_boxed(boxed)


def compute_score(solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0) -> float:
  answer = extract_boxed_answer(solution_str)
  if answer is None:
    return 0.0
  return float(score) if is_equiv(answer, str(ground_truth)) else float(format_score)


def is_equiv(str1: Optional[str], str2: Optional[str]) -> bool:
  if str1 is None or str2 is None:
    return str1 is None and str2 is None
  return strip_string(str1) == strip_string(str2)


def _fix_fracs(string: str) -> str:
  """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``."""
  pieces = string.split("\\frac")
  fixed = pieces[0]
  for piece in pieces[1:]:
    fixed += "\\frac"
    if piece.startswith("{"):
      fixed += piece
    elif len(piece) < 2:
      return string
    else:
      numerator, denominator, tail = piece[0], piece[1], piece[2:]
      if denominator == "{":
        fixed += "{" + numerator + "}{" + tail
      else:
        fixed += "{" + numerator + "}{" + denominator + "}" + tail
  return fixed


def _fix_a_slash_b(string: str) -> str:
  """``3/4`` -> ``\\frac{3}{4}`` when both sides are plain integers."""
  parts = string.split("/")
  if len(parts) != 2:
    return string
  try:
    numerator, denominator = int(parts[0]), int(parts[1])
  except ValueError:
    return string
  if string != f"{numerator}/{denominator}":
    return string
  return "\\frac{" + str(numerator) + "}{" + str(denominator) + "}"


def _fix_sqrt(string: str) -> str:
  """``\\sqrt3`` -> ``\\sqrt{3}``."""
  pieces = string.split("\\sqrt")
  fixed = pieces[0]
  for piece in pieces[1:]:
    if piece and piece[0] != "{":
      piece = "{" + piece[0] + "}" + piece[1:]
    fixed += "\\sqrt" + piece
  return fixed


def _remove_right_units(string: str) -> str:
  # In MATH, "\text{ " (with a space) only ever introduces units: "5\text{ inches}".
  if "\\text{ " in string:
    return string.split("\\text{ ")[0]
  # A trailing \text{...}/\mbox{...} after a value is a unit too ("12\text{cm}"); a string that is
  # only text ("\text{(A)}") is the answer itself and stays.
  without_unit = re.sub(r"\\(?:text|mbox)\{[^{}]*\}$", "", string).strip()
  return without_unit if without_unit else string


def _strip_decimal_zeros(string: str) -> str:
  string = re.sub(r"(\d)\.0+(?![\d])", r"\1", string)  # 5.0 -> 5, (2.00, 3) -> (2, 3)
  return re.sub(r"(\.\d*?[1-9])0+(?![\d])", r"\1", string)  # 0.50 -> 0.5


def strip_string(string: str) -> str:
  """Normalises a MATH answer so that equivalent spellings compare equal."""
  string = string.replace("\n", "")
  string = string.replace("\\!", "")  # negative thin space
  string = string.replace("\\\\", "\\")
  string = string.replace("tfrac", "frac").replace("dfrac", "frac")
  string = string.replace("\\left", "").replace("\\right", "")
  string = string.replace("^{\\circ}", "").replace("^\\circ", "")
  string = string.replace("\\$", "").replace("$", "")
  string = _remove_right_units(string)
  string = string.replace("\\%", "").replace("%", "")

  # " .5" / "{.5" / ".5" -> 0.5
  string = string.replace(" .", " 0.").replace("{.", "{0.")
  if not string:
    return string
  if string[0] == ".":
    string = "0" + string

  # "k = 5" -> "5"; a short left side is a variable name, a long one is an equation to keep.
  sides = string.split("=")
  if len(sides) == 2 and len(sides[0]) <= 2:
    string = sides[1]

  string = _fix_sqrt(string)
  string = string.replace(" ", "")
  string = _fix_fracs(string)
  string = _strip_decimal_zeros(string)
  if string == "0.5":
    string = "\\frac{1}{2}"
  string = _fix_a_slash_b(string)
  return string
