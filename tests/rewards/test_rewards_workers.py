"""Reward worker processes (`reward_model.num_workers`, `reward_model.timeout_s`): real processes running
reward functions that sleep, raise, call sys.exit or os._exit; the same scores as in-process scoring;
rows with a null ground truth counted and warned about once."""

import logging
import os
import signal
import textwrap
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf import rewards
from jaxrlhf.data import PromptDataset
from jaxrlhf.rewards import ERROR_KEY, RewardFunctionError, RewardScorer, score_batch
from jaxrlhf.rewards import batch as batch_module
from jaxrlhf.trainer.batch_metrics import batch_metrics
from jaxrlhf.trainer.records import Advantages
from jaxrlhf.trainer.reward import make_reward_fn, score_on_host
from tests.helpers import rollout_of, scored_of

TIMEOUT_S = 1.0

# One file of misbehaving reward functions: what the response asks for is what the function does.
MISBEHAVING = """
import os, sys, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "sleep":
        time.sleep(60)
    if solution_str == "mark, then sleep":  # the ground truth names a file that says the sample has started
        open(ground_truth, "w").close()
        time.sleep(60)
    if solution_str == "raise":
        raise ValueError("cannot parse " + ground_truth)
    if solution_str == "sys.exit":
        sys.exit(3)
    if solution_str == "os._exit":
        os._exit(1)
    if solution_str == "pid":
        return {"score": 1.0, "pid": float(os.getpid())}
    return {"score": float(solution_str == ground_truth), "length": len(solution_str), "pred": solution_str}
"""


@pytest.fixture(scope="module")
def misbehaving(tmp_path_factory):
  """A scorer of MISBEHAVING in 2 worker processes, shared by the tests here (a pool lives across batches)."""
  path = tmp_path_factory.mktemp("reward") / "misbehaving.py"
  path.write_text(textwrap.dedent(MISBEHAVING))
  scorer = RewardScorer(rewards.load_custom_reward_function(str(path)), num_workers=2, timeout_s=TIMEOUT_S)
  yield scorer
  scorer.close()


def _score(scorer, responses, on_error="raise"):
  n = len(responses)
  return score_batch(scorer, [f"src{i}" for i in range(n)], responses, ["a"] * n, on_error=on_error)


@pytest.mark.parametrize(
  "response, what",
  [
    ("sleep", f"timed out after {TIMEOUT_S:g} s"),
    ("raise", "ValueError: cannot parse a"),
    ("sys.exit", "called sys.exit(3)"),
    ("os._exit", "exited with status 1"),
  ],
)
def test_a_failing_sample_raises_one_line_naming_it_and_what_happened(misbehaving, response, what):
  start = time.monotonic()
  with pytest.raises(RewardFunctionError) as info:
    _score(misbehaving, ["a", "b", response, "a"])
  message = str(info.value)
  assert message == f"reward function 'compute_score' failed on sample 2 (data_source='src2'): {what}" + (
    " (reward_model.timeout_s)" if response == "sleep" else ""
  )
  assert "\n" not in message and "reward_model.on_error=zero" in info.value.hint
  assert time.monotonic() - start < TIMEOUT_S + 10  # the sleeping sample is given up on, not waited for


def test_on_error_zero_scores_them_zero_counts_them_and_replaces_dead_workers(misbehaving):
  responses = ["a", "sleep", "b", "raise", "a", "sys.exit", "os._exit", "a"]
  scores, extras = _score(misbehaving, responses, on_error="zero")
  assert scores.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
  assert extras[ERROR_KEY].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
  assert extras["length"].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
  # The pool is whole again (the timed-out and the exited workers replaced) and serves the next batch.
  scores, _ = _score(misbehaving, ["a", "b", "a"], on_error="zero")
  assert scores.tolist() == [1.0, 0.0, 1.0]


def test_the_pool_is_kept_across_batches_and_closed(tmp_path):
  path = tmp_path / "reward.py"
  path.write_text(textwrap.dedent(MISBEHAVING))
  scorer = RewardScorer(rewards.load_custom_reward_function(str(path)), num_workers=2, timeout_s=TIMEOUT_S)
  pids = lambda: set(score_batch(scorer, ["d"] * 8, ["pid"] * 8, ["a"] * 8)[1]["pid"].astype(int).tolist())
  # Which of the two workers takes a sample is up to scheduling: the same two serve both batches.
  first = pids() | pids()
  assert os.getpid() not in first and 1 <= len(first) <= 2
  processes = [worker.process for worker in scorer._pool._workers]
  scorer.close()
  assert not any(process.is_alive() for process in processes)
  assert pids().isdisjoint(first)  # scoring after close() starts new workers
  scorer.close()


def test_parallel_scores_equal_in_process_scores(tmp_path):
  data_sources = [
    "openai/gsm8k",
    "gsm8k",
    "lighteval/MATH",
    "HuggingFaceH4/MATH-500",
    "jaxrlhf/recall",
    "exact_match",
  ] * 6
  responses = ["#### 72", "#### 71", r"\boxed{\dfrac12}", "no box", "first : 3", " 12 "] * 6
  truths = ["72", "72", r"\frac{1}{2}", "3", "3", "12"] * 6
  registry_scores = None
  for fn in (None, rewards.load_custom_reward_function(str(_write(tmp_path, MISBEHAVING)))):  # registry, a file
    in_process = score_batch(fn, data_sources, responses, truths)
    scorer = RewardScorer(fn, num_workers=3, timeout_s=30.0)
    try:
      parallel = score_batch(scorer, data_sources, responses, truths)
    finally:
      scorer.close()
    np.testing.assert_array_equal(parallel[0], in_process[0])
    assert parallel[1].keys() == in_process[1].keys()
    for key in in_process[1]:  # the file's extras: numbers, and text ("pred")
      np.testing.assert_array_equal(parallel[1][key], in_process[1][key])
    registry_scores = in_process[0] if registry_scores is None else registry_scores
  assert registry_scores.tolist()[:6] == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]


def test_auto_keeps_the_built_in_rules_in_process_and_puts_reward_files_in_workers(tmp_path):
  assert RewardScorer(None, num_workers=None).num_workers == 0
  fn = rewards.load_custom_reward_function(str(_write(tmp_path, MISBEHAVING)))
  assert RewardScorer(fn, num_workers=None).num_workers == rewards.default_num_workers()
  assert 1 <= rewards.default_num_workers() <= 8


def test_a_function_the_workers_cannot_load_is_scored_in_process_and_said_once(caplog):
  def defined_in_a_notebook(data_source, solution_str, ground_truth, extra_info=None):
    return 0.5

  defined_in_a_notebook.__module__ = "__main__"
  rewards.register_reward("test/local")(defined_in_a_notebook)
  scorer = RewardScorer(None, num_workers=1, timeout_s=30.0)
  try:
    with caplog.at_level(logging.WARNING):
      for _ in range(2):
        scores, _ = score_batch(scorer, ["test/local", "gsm8k"], ["x", "#### 1"], ["1", "1"])
        assert scores.tolist() == [0.5, 1.0]
    said = [r.getMessage() for r in caplog.records if "'test/local' is scored in this process" in r.getMessage()]
    assert len(said) == 1
    # A plain function (not from a reward file) cannot be loaded by workers at all: in-process, said once.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      assert RewardScorer(lambda **kwargs: 1.0, num_workers=2).num_workers == 0
    assert "cannot be loaded by worker processes" in caplog.text
  finally:
    scorer.close()
    rewards.unregister_reward("test/local")


def test_a_slow_batch_says_how_far_it_got(tmp_path, caplog, monkeypatch):
  monkeypatch.setattr(batch_module, "PROGRESS_EVERY_S", 0.3)
  scorer = RewardScorer(
    rewards.load_custom_reward_function(str(_write(tmp_path, MISBEHAVING))), num_workers=2, timeout_s=TIMEOUT_S
  )
  try:
    with caplog.at_level(logging.WARNING):
      _score(scorer, ["a", "sleep", "b", "a"], on_error="zero")
  finally:
    scorer.close()
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reward: scored ")]
  assert lines and all("/4 samples in " in line and "(2 worker processes; " in line for line in lines)


@pytest.mark.skipif(
  signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
  reason="SIGINT is ignored here (a background job of a non-interactive shell), so the workers ignore it too",
)
def test_ctrl_c_in_a_worker_stops_the_batch(tmp_path):
  scorer = RewardScorer(
    rewards.load_custom_reward_function(str(_write(tmp_path, MISBEHAVING))), num_workers=1, timeout_s=30.0
  )
  try:
    score_batch(scorer, ["d"], ["a"], ["a"])  # started
    worker = scorer._pool._workers[0].process
    started = tmp_path / "started"

    def interrupt_once_scoring():  # not before: a worker interrupted while idle is replaced, not heard from
      deadline = time.monotonic() + 25.0
      while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
      os.kill(worker.pid, signal.SIGINT)

    threading.Thread(target=interrupt_once_scoring, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
      score_batch(scorer, ["d"], ["mark, then sleep"], [str(started)])
  finally:
    scorer.close()


def test_null_ground_truths_are_counted_and_warned_about_once(caplog):
  ground_truths = ["1", None, "2", float("nan"), "1"]
  dataset = PromptDataset(np.zeros((5, 1), np.int32), np.ones((5, 1), np.int32), ["gsm8k"] * 5, ground_truths, [{}] * 5)
  with caplog.at_level(logging.WARNING):
    reward_fn = make_reward_fn(_DigitTokenizer(), dataset, on_error="zero")
    responses = jnp.asarray([[1], [1], [2], [3], [1]], jnp.int32)
    scores, errors, null_ground_truths, _ = reward_fn(responses, jnp.ones_like(responses), jnp.arange(5))
    score_on_host(_DigitTokenizer(), dataset, None, "zero", np.asarray(responses), np.ones((5, 1)), np.arange(5))
  assert np.asarray(null_ground_truths).tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
  assert np.asarray(scores).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0] and not np.asarray(errors).any()
  warnings = [r.getMessage() for r in caplog.records if "null reward_model.ground_truth" in r.getMessage()]
  assert len(warnings) == 1
  assert "2 of 5 data rows" in warnings[0] and "row 1 (data_source 'gsm8k'), row 3 (data_source 'gsm8k')" in warnings[0]
  ones, zeros = np.ones((5, 1), np.int32), np.zeros((5, 1), np.float32)
  metrics = batch_metrics(
    rollout_of(ones, ones, ones, ones, decode_steps=np.int32(1)),
    scored_of(scores, reward_errors=errors, null_ground_truths=null_ground_truths),
    Advantages(advantages=zeros, returns=zeros, token_level_rewards=zeros, response_mask=ones, kl_coef=0.0, metrics={}),
    None,
  )
  assert float(metrics["reward/num_null_ground_truth"]) == 2.0


class _DigitTokenizer:
  """Token id k decodes to "#### k": enough tokenizer for the reward callback."""

  def batch_decode(self, rows, skip_special_tokens=True):
    return [" ".join(f"#### {i}" for i in row) for row in rows]


def _write(tmp_path, source):
  path = tmp_path / "reward.py"
  path.write_text(textwrap.dedent(source))
  return path
