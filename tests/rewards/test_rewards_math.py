"""MATH rule: last \\boxed{} extraction and answer normalisation."""

import pytest

from jaxrlhf.rewards import math as math_reward

EQUIVALENT = [
  (r"\frac{1}{2}", r"\frac{1}{2}"),
  (r"\dfrac{1}{2}", r"\frac{1}{2}"),
  (r"\tfrac12", r"\frac{1}{2}"),
  (r"\frac1{72}", r"\frac{1}{72}"),
  ("0.5", r"\frac{1}{2}"),
  ("1/2", r"\frac{1}{2}"),
  ("0.50", r"\frac12"),
  (".5", "0.5"),
  ("5.0", "5"),
  ("5.00", "5"),
  (" 3 ", "3"),
  (r"\left( 3, 4 \right)", "(3,4)"),
  (r"90^\circ", "90"),
  (r"90^{\circ}", "90"),
  (r"\$18", "18"),
  (r"\$18.00", "18"),
  ("$18$", "18"),
  (r"50\%", "50"),
  ("50%", "50"),
  (r"12\text{ inches}", "12"),
  (r"12\text{cm}", "12"),
  ("x = 5", "5"),
  (r"\sqrt3", r"\sqrt{3}"),
  (r"\frac{\sqrt{2}}{2}", r"\frac{\sqrt{2}}{2}"),
  (r"1,\!000", "1,000"),
  (r"\text{(A)}", r"\text{(A)}"),
  ("(2.00, 3)", "(2,3)"),
]

DIFFERENT = [
  (r"\frac{1}{3}", r"\frac{1}{2}"),
  ("5.01", "5"),
  ("0.05", "0.5"),
  ("x+y=5", "5"),  # a real equation is not a "k = " prefix
  ("12", "21"),
  (r"\text{(A)}", r"\text{(B)}"),
]


@pytest.mark.parametrize("answer,ground_truth", EQUIVALENT)
def test_equivalent_answers_score_one(answer, ground_truth):
  assert math_reward.is_equiv(answer, ground_truth)
  assert math_reward.compute_score(f"So the answer is $\\boxed{{{answer}}}$.", ground_truth) == 1.0


@pytest.mark.parametrize("answer,ground_truth", DIFFERENT)
def test_different_answers_score_zero(answer, ground_truth):
  assert not math_reward.is_equiv(answer, ground_truth)
  assert math_reward.compute_score(f"\\boxed{{{answer}}}", ground_truth) == 0.0


@pytest.mark.parametrize(
  "text,expected",
  [
    (r"a \boxed{\frac{1}{\sqrt{2}}} b", r"\boxed{\frac{1}{\sqrt{2}}}"),
    (r"first \boxed{1} then \boxed{2}.", r"\boxed{2}"),
    (r"\boxed{1} then \fbox{7}", r"\fbox{7}"),
    (r"$\boxed 7$ done", r"\boxed 7"),
    (r"\boxed {4}", r"\boxed{4}"),
    ("no box here", None),
    (r"truncated \boxed{\frac{1}{2}", None),
    (r"\boxed", None),
  ],
)
def test_last_boxed_only_string(text, expected):
  assert math_reward.last_boxed_only_string(text) == expected


def test_extract_boxed_answer_and_remove_boxed():
  assert math_reward.extract_boxed_answer(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"
  assert math_reward.extract_boxed_answer("nothing") is None
  assert math_reward.remove_boxed(r"\fbox{x}") == "x"
  with pytest.raises(ValueError, match="not a boxed"):
    math_reward.remove_boxed("x")


def test_compute_score_cases():
  assert math_reward.compute_score(r"first \boxed{1} then \boxed{2}", "2") == 1.0
  assert math_reward.compute_score(r"first \boxed{1} then \boxed{2}", "1") == 0.0
  assert math_reward.compute_score(r"\fbox{7}", "7") == 1.0
  assert math_reward.compute_score(r"$\boxed 7$", "7") == 1.0
  assert math_reward.compute_score("the answer is 7", "7") == 0.0
  assert math_reward.compute_score(r"\boxed{\frac{1}{2}", r"\frac{1}{2}") == 0.0
  assert math_reward.compute_score(r"\boxed{8}", "7", format_score=0.1) == 0.1
  assert math_reward.compute_score("7", "7", format_score=0.1) == 0.0
  assert math_reward.compute_score(r"\boxed{7}", 7) == 1.0


def test_malformed_latex_does_not_raise():
  for text in [r"\frac", r"\frac1", r"\sqrt", "", "=", "/", r"\text{ "]:
    math_reward.strip_string(text)
  assert math_reward.is_equiv(r"\frac", r"\frac")
  assert math_reward.is_equiv(None, None) and not math_reward.is_equiv("1", None)
