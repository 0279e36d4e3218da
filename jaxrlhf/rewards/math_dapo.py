"""DAPO's math reward (verl's `math_dapo`): "Answer: ..." first, then the last ``\\boxed{}``; +1 right, -1 wrong.

verl scores the data sources `math_dapo`, `math`, `math_dapo_reasoning` and every `aime*` with it (DAPO-Math-17k and
the AIME sets of DAPO's recipes). Written from verl 0.9.1's behaviour, not its code;
tests/rewards/test_verl_scorer_oracle.py compares the two on generated responses. Only the last 300
characters of a response are read (MATH-500's longest answer has 159):

1. Minerva: the last ``Answer: <rest of line>`` (any case). Found: it is normalised (`normalize_final_answer`) and
   compared with the normalised ground truth.
2. Otherwise the last ``\\boxed{...}`` within the response's last 100 characters, compared as written with the
   ground truth as written.

The result is verl's dict: ``score`` 1.0 or -1.0, ``acc`` (right or not) and ``pred`` (what was compared, or
"[INVALID]" when nothing was found).
"""

from __future__ import annotations

import re
from typing import Optional

INVALID = "[INVALID]"
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Applied in order to the text after the last "=": spellings that differ only in presentation.
_REPLACE = (
  ("an ", ""),
  ("a ", ""),
  (".$", "$"),
  ("\\$", ""),
  ("\\ ", ""),
  (" ", ""),
  ("mbox", "text"),
  (",\\text{and}", ","),
  ("\\text{and}", ","),
  ("\\text{m}", "\\text{}"),
)
# Then units, filler words and spacing macros, dropped wherever they appear.
_DROP = (
  *"square ways integers dollars mph inches hours km units \\ldots sue points feet minutes digits cents degrees cm "
  "gm pounds meters meals edges students childrentickets multiples".split(),
  "\\text{s}",
  "\\text{.}",
  "\\text{\ns}",
  "\\text{}^2",
  "\\text{}^3",
  "\\text{\n}",
  "\\text{}",
  "\\mathrm{th}",
  "^\\circ",
  "^{\\circ}",
  "\\;",
  ",\\!",
  "{,}",
  '"',
  "\\dots",
)
# (pattern, replacement), in order: keep the first $...$ span, unwrap text-like macros, spell out \fracab, \sqrta.
_REWRITE = tuple(
  (re.compile(pattern), replacement)
  for pattern, replacement in (
    (r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$"),
    (r"(\\text\{)(.*?)(\})", r"\2"),
    (r"(\\textbf\{)(.*?)(\})", r"\2"),
    (r"(\\overline\{)(.*?)(\})", r"\2"),
    (r"(\\boxed\{)(.*)(\})", r"\2"),
    (r"(frac)([^{])(.)", r"frac{\2}{\3}"),
    (r"(sqrt)([^{])", r"sqrt{\2}"),
  )
)


def normalize_final_answer(answer: str) -> str:
  """The final answer as DAPO compares it (Minerva's normalisation)."""
  answer = answer.split("=")[-1]
  for before, after in _REPLACE:
    answer = answer.replace(before, after)
  for text in _DROP:
    answer = answer.replace(text, "")
  for pattern, replacement in _REWRITE:
    answer = pattern.sub(replacement, answer)
  answer = answer.replace("$", "")
  if answer.replace(",", "").isdigit():
    answer = answer.replace(",", "")
  return answer.strip()


def last_boxed(text: str) -> Optional[str]:
  """The content of the last ``\\boxed{...}`` whose braces close, or None."""
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  depth = 0
  for end in range(start, len(text)):
    depth += {"{": 1, "}": -1}.get(text[end], 0)
    if text[end] == "}" and depth == 0:
      return text[start + len("\\boxed{") : end]
  return None


def compute_score(solution_str: str, ground_truth: str) -> dict:
  tail = solution_str[-300:]
  answers = _ANSWER.findall(tail)
  pred = normalize_final_answer(answers[-1] if answers else INVALID)
  correct = pred == normalize_final_answer(ground_truth)
  boxed = last_boxed(tail[-100:]) if pred == INVALID else None
  if boxed is not None:
    correct, pred = boxed == ground_truth, boxed
  return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
