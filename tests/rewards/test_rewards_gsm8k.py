"""GSM8K rule (docs/algorithms.md §8): a table of hand-written responses scored in strict and flexible mode."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrlhf.rewards import gsm8k

FILLER_300 = "x" * 300

# (response, ground_truth, strict score, flexible score)
CASES = [
  ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72", 1.0, 1.0),
  ("48 + 24 = 71\n#### 71", "72", 0.0, 0.0),
  ("The answer is 72", "72", 0.0, 1.0),  # missing ####
  ("The answer is 72.", "72", 0.0, 0.0),  # flexible keeps the sentence-final "." ("72."), as verl
  ("#### 1,000", "1000", 1.0, 0.0),  # strict drops commas, flexible does not
  ("#### 1,234,567.89", "1234567.89", 1.0, 0.0),
  ("#### 72,", "72", 1.0, 0.0),
  ("#### $18", "18", 0.0, 1.0),  # "$" right after "#### " is not a strict match
  ("She pays $18 in total.\n#### 18", "18", 1.0, 1.0),
  ("#### -5", "-5", 1.0, 1.0),
  ("#### - 5", "-5", 0.0, 0.0),
  ("The total is 5 - 8 = -3", "-3", 0.0, 1.0),
  ("#### 3.5", "3.5", 1.0, 1.0),
  ("#### 3.50", "3.5", 0.0, 0.0),  # exact string equality, no numeric comparison
  ("#### .5", ".5", 1.0, 1.0),
  ("#### 12\n#### 13", "13", 1.0, 1.0),  # the last #### wins
  ("#### 13\n#### 12", "13", 0.0, 0.0),
  ("####72", "72", 0.0, 1.0),  # strict needs the space
  ("#### 72 apples", "72", 1.0, 1.0),
  ("#### 72\nI hope this helps.", "72", 1.0, 1.0),  # a lone "." is never the flexible answer
  ("", "72", 0.0, 0.0),
  ("No numbers here.", "72", 0.0, 0.0),
  ("#### 72" + FILLER_300, "72", 0.0, 0.0),  # answer before the last 300 characters
  ("#### 5\n" + "word " * 100 + "so 72", "72", 0.0, 1.0),  # decoy #### out of the window
  ("1 2 3 " * 200 + "#### 72", "72", 1.0, 1.0),
  ("#### 72" + " " * 293, "72", 1.0, 1.0),  # exactly 300 characters: all examined
  ("#### 72" + " " * 294, "72", 0.0, 1.0),  # 301: the first "#" falls out, "### 72" remains
  ("#### -0", "0", 0.0, 0.0),
]


@pytest.mark.parametrize("response,ground_truth,strict,flexible", CASES)
def test_hand_written_table(response, ground_truth, strict, flexible):
  assert gsm8k.compute_score(response, ground_truth) == strict
  assert gsm8k.compute_score(response, ground_truth, method="strict") == strict
  assert gsm8k.compute_score(response, ground_truth, method="flexible") == flexible


def test_format_score_only_when_an_answer_was_found():
  assert gsm8k.compute_score("#### 71", "72", format_score=0.1) == 0.1
  assert gsm8k.compute_score("no answer", "72", format_score=0.1) == 0.0
  assert gsm8k.compute_score("#### 72", "72", format_score=0.1, score=2.0) == 2.0
  assert gsm8k.compute_score("it is 71", "72", method="flexible", format_score=0.1) == 0.1


def test_extract_solution():
  assert gsm8k.extract_solution("a\n#### 1,234") == "1234"
  assert gsm8k.extract_solution("nothing") is None
  assert gsm8k.extract_solution("x 1,234 . ", method="flexible") == "1,234"
  assert gsm8k.extract_solution(". . .", method="flexible") is None


def test_numeric_ground_truth_compares_as_its_string():
  assert gsm8k.compute_score("#### 72", 72) == 1.0


def test_unknown_method_is_rejected():
  with pytest.raises(ValueError, match="'fuzzy'"):
    gsm8k.compute_score("#### 1", "1", method="fuzzy")


@settings(max_examples=60, deadline=None)
@given(number=st.integers(-(10**9), 10**9))
def test_strict_reads_thousands_separators(number):
  assert gsm8k.compute_score(f"so the answer is\n#### {number:,}", str(number)) == 1.0


@settings(max_examples=60, deadline=None)
@given(prefix=st.text(max_size=50), body=st.text(min_size=300, max_size=400))
def test_only_the_last_300_characters_matter(prefix, body):
  for method in ("strict", "flexible"):
    assert gsm8k.extract_solution(prefix + body, method) == gsm8k.extract_solution(body[-300:], method)
