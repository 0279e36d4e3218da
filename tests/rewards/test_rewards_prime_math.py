"""The `numina_*` (prime_math) and `hiyouga/geometry3k` scorers on cases whose verl 0.9.1 results are known, their
sympy time limit on a thread and on the main thread, and the one-line error without the `math` extra.
test_verl_scorer_oracle.py compares them with verl itself on hundreds of generated responses."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from jaxrlhf.rewards import default_compute_score, prm800k, registry


@pytest.mark.parametrize(
  "response, truth, score",
  [
    ("So the answer is $\\boxed{\\frac{1}{2}}$.", "0.5", 1.0),
    ("The answer is \\boxed{x^2+2x+1}", "(x+1)^2", 1.0),  # sympy
    ("The answer is \\boxed{\\frac{6}{8}}", "\\frac{3}{4}", 0.0),  # unreduced
    ("Thus x = 2\\pi", "6.2832", 1.0),  # \pi as a number
    ("The answer is [1, 2]", "(1, 2)", 0.0),  # another interval
    ("The answer is 1,000,000", "1000000", 1.0),
    ("The answer is 15%", "0.15", 1.0),  # a percentage off by 100
    ("The answer is \\boxed{x_1}", "3", 0.0),  # a base subscript on no number
    ("I give up.", "72", 0.0),
    ("The answer is \\boxed{__import__('os')}", "1", 0.0),  # never run
  ],
)
def test_numina_scores(response, truth, score):
  assert default_compute_score("numina_olympiads", response, truth) == score


@pytest.mark.parametrize(
  "response, score",
  [
    ("<think>Angles sum to 180.</think> The answer is \\boxed{2\\sqrt{3}}.", 1.0),
    ("<think>x</think>\\boxed{\\sqrt{12}}", 1.0),
    ("\\boxed{2\\sqrt{3}}", 0.9),  # no <think>
    ("<think>x</think>\\boxed{3}", 0.1),  # formatted, wrong
    ("<think>x</think>\\boxed{2\\sqrt{3}", 0.1),  # unclosed: the answer is "None" (the format holds)
  ],
)
def test_geometry3k_scores(response, score):
  assert default_compute_score("hiyouga/geometry3k", response, "2\\sqrt{3}") == pytest.approx(score, abs=1e-12)


def test_time_limit_on_the_main_thread(monkeypatch):
  monkeypatch.setattr(prm800k, "SYMPY_TIME_LIMIT_S", 0.2)
  start = time.monotonic()
  with pytest.raises(TimeoutError):
    prm800k._within_time_limit(time.sleep, 30)
  assert time.monotonic() - start < 5


def test_time_limit_on_a_thread_kills_the_helper_process(monkeypatch):
  """A thread (the trainer's reward callback) cannot take SIGALRM: the call runs in a helper process, killed at
  the limit; the next call gets a new one."""
  monkeypatch.setattr(prm800k, "SYMPY_TIME_LIMIT_S", 1.0)
  outcomes = []

  def run():
    try:
      prm800k._within_time_limit(time.sleep, 30)
    except TimeoutError:
      outcomes.append("timed out")
    outcomes.append(prm800k._within_time_limit(abs, -3))

  thread = threading.Thread(target=run)
  thread.start()
  thread.join(60)
  assert outcomes == ["timed out", 3]


def test_without_the_math_extra_the_error_names_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "pylatexenc", None)  # not importable
  with pytest.raises(registry.ScorerUnavailableError, match=r"numina_cn_k12.*pylatexenc.*\.\[math\]"):
    default_compute_score("numina_cn_k12", "The answer is 3", "3")
  with pytest.raises(registry.UnknownDataSourceError, match="geometry3k"):  # stops the run, as an unknown source
    default_compute_score("hiyouga/geometry3k", "\\boxed{3}", "3")
