"""score_batch: the per-batch host-side scorer."""

import math

import numpy as np
import pytest

from jaxrlhf.rewards import ERROR_KEY, RewardFunctionError, UnknownDataSourceError, score_batch


def test_default_scorer_over_mixed_data_sources():
  scores, extras = score_batch(
    None,
    ["openai/gsm8k", "gsm8k", "lighteval/MATH", "HuggingFaceH4/MATH-500"],
    ["#### 72", "#### 71", r"\boxed{\dfrac12}", "no box"],
    ["72", "72", r"\frac{1}{2}", "3"],
    [{"index": i} for i in range(4)],
  )
  assert scores.dtype == np.float32 and scores.shape == (4,)
  assert scores.tolist() == [1.0, 0.0, 1.0, 0.0]
  assert extras == {}


def test_accepts_numpy_object_arrays():
  scores, _ = score_batch(
    None, np.array(["gsm8k", "gsm8k"], dtype=object), np.array(["#### 1", "#### 2"]), np.array(["1", "1"])
  )
  assert scores.tolist() == [1.0, 0.0]


def test_dict_results_become_extras_missing_filled_with_zero():
  results = [
    {"score": 1.0, "acc": True, "pred": "72"},
    {"score": 0.5, "length": 3},
    0.25,
  ]

  def fn(data_source, solution_str, ground_truth, extra_info):
    return results[extra_info["i"]]

  scores, extras = score_batch(fn, ["d"] * 3, ["a", "b", "c"], ["x"] * 3, [{"i": i} for i in range(3)])
  assert scores.tolist() == [1.0, 0.5, 0.25]
  assert sorted(extras) == ["acc", "length", "pred"]
  assert extras["acc"].tolist() == [1.0, 0.0, 0.0]
  assert extras["length"].tolist() == [0.0, 3.0, 0.0]
  assert extras["acc"].dtype == extras["length"].dtype == np.float32
  assert extras["pred"].tolist() == ["72", None, None]  # text (what majority voting counts): None where missing
  # With fixed keys (the step's callback) only numbers come back.
  _, fixed = score_batch(
    fn, ["d"] * 3, ["a", "b", "c"], ["x"] * 3, [{"i": i} for i in range(3)], extra_keys=["acc", "pred"]
  )
  assert fixed["pred"].tolist() == [0.0, 0.0, 0.0] and fixed["pred"].dtype == np.float32


def test_extra_keys_fix_the_result_structure():
  def fn(**kwargs):
    return {"score": 1.0, "acc": 1.0, "unexpected": 2.0}

  _, extras = score_batch(fn, ["d"], ["a"], ["x"], extra_keys=["acc", "format"])
  assert sorted(extras) == ["acc", "format"]
  assert extras["format"].tolist() == [0.0]
  _, extras = score_batch(fn, [], [], [], extra_keys=["acc"])
  assert extras["acc"].shape == (0,)


def test_required_extra_keys_name_the_sample_and_what_it_returned():
  def fn(data_source, solution_str, ground_truth, extra_info):
    return {"score": 1.0, "format": 1.0} if solution_str == "a" else {"score": 0.0, "acc": 0.0}

  _, extras = score_batch(fn, ["d"], ["a"], ["x"], extra_keys=["format"], require_extra_keys=True)
  assert extras["format"].tolist() == [1.0]
  with pytest.raises(RewardFunctionError, match=r"no number for \['format'\] on sample 1 .*'acc', 'score'"):
    score_batch(fn, ["d", "d"], ["a", "b"], ["x", "x"], extra_keys=["format"], require_extra_keys=True)


def _failing(data_source, solution_str, ground_truth, extra_info):
  if solution_str == "boom":
    raise KeyError("missing")
  if solution_str == "none":
    return None
  if solution_str == "nan":
    return math.nan
  if solution_str == "inf-dict":
    return {"score": math.inf}
  return 1.0


@pytest.mark.parametrize("bad", ["boom", "none", "nan", "inf-dict"])
def test_on_error_raise_names_index_and_data_source(bad):
  with pytest.raises(RewardFunctionError) as info:
    score_batch(_failing, ["ok_src", "bad_src"], ["fine", bad], ["x", "x"])
  message = str(info.value)
  assert "sample 1" in message and "'bad_src'" in message and "_failing" in message


def test_on_error_zero_scores_zero_and_flags_the_sample():
  scores, extras = score_batch(_failing, ["s"] * 5, ["fine", "boom", "none", "nan", "fine"], ["x"] * 5, on_error="zero")
  assert scores.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
  assert extras[ERROR_KEY].tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
  _, clean = score_batch(_failing, ["s"], ["fine"], ["x"], on_error="zero")
  assert clean[ERROR_KEY].tolist() == [0.0]  # present even when nothing failed: fixed structure


def test_unknown_data_source_raises_even_with_on_error_zero():
  with pytest.raises(UnknownDataSourceError, match="typo/gsm8k"):
    score_batch(None, ["gsm8k", "typo/gsm8k"], ["#### 1", "#### 1"], ["1", "1"], on_error="zero")


def test_bad_arguments():
  with pytest.raises(ValueError, match="batch size.*'ground_truths': 1"):
    score_batch(None, ["gsm8k", "gsm8k"], ["a", "b"], ["1"])
  with pytest.raises(ValueError, match="on_error"):
    score_batch(None, [], [], [], on_error="ignore")
