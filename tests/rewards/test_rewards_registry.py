"""default_compute_score dispatch by data_source, register_reward, exact match."""

import subprocess
import sys

import pytest

from jaxrlhf.rewards import (
  UnknownDataSourceError,
  default_compute_score,
  exact_match,
  get_reward_fn,
  register_reward,
  registered_data_sources,
  unregister_reward,
)


@pytest.fixture
def scratch_sources():
  names = []
  yield names
  unregister_reward(*names)


@pytest.mark.parametrize("data_source", ["openai/gsm8k", "gsm8k"])
def test_gsm8k_sources(data_source):
  assert default_compute_score(data_source, "so\n#### 1,000", "1000") == 1.0
  assert default_compute_score(data_source, "the answer is 1000", "1000") == 0.0  # strict by default


@pytest.mark.parametrize(
  "data_source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]
)
def test_math_sources(data_source):
  assert default_compute_score(data_source, r"so $\boxed{\dfrac{1}{2}}$", r"\frac{1}{2}") == 1.0
  assert default_compute_score(data_source, r"$\boxed{3}$", "4") == 0.0


@pytest.mark.parametrize("data_source", ["math", "math_dapo", "math_dapo_reasoning", "aime2024", "aime_2025"])
def test_dapo_math_sources_as_verl_maps_them(data_source):
  # verl scores "math" and every aime* with DAPO's rule: +1 / -1, "Answer:" first, then the last box.
  assert default_compute_score(data_source, "so\nAnswer: $\\frac{1}{2}$", "\\frac12") == {
    "score": 1.0,
    "acc": True,
    "pred": "\\frac{1}{2}",
  }
  assert default_compute_score(data_source, "it is \\boxed{4}", "3")["score"] == -1.0
  assert default_compute_score(data_source, "it is \\boxed{3}", "3")["acc"] is True


def test_search_r1_exact_match():
  truth = {"target": ["The Beatles"]}
  assert default_compute_score("searchR1_nq", "<answer>beatles</answer>", truth) == 1.0
  assert default_compute_score("searchR1_nq", "<answer>Stones</answer>", truth) == 0.0
  assert default_compute_score("searchR1_nq", "<answer>beatles</answer>" * 11, truth) == 0.25


def test_results_are_python_floats():
  result = default_compute_score("openai/gsm8k", "#### 1", "1")
  assert type(result) is float


def test_exact_match():
  assert default_compute_score("exact_match", "  abc\n", "abc") == 1.0
  assert default_compute_score("exact_match", "abd", "abc") == 0.0
  assert exact_match.compute_score("ABC", "abc") == 0.0
  assert exact_match.compute_score("ABC", "abc", case_sensitive=False) == 1.0
  assert exact_match.compute_score("b", ["a", "b"]) == 1.0
  assert exact_match.compute_score("7", 7) == 1.0


@pytest.mark.parametrize("data_source", ["no/such_dataset", "", None])
def test_unknown_data_source_names_it_and_lists_registered(data_source):
  with pytest.raises(UnknownDataSourceError) as info:
    default_compute_score(data_source, "#### 1", "1")
  message = str(info.value)
  assert ("no/such_dataset" in message) if data_source else ("empty data_source" in message)
  for registered in ("openai/gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval"):
    assert registered in message
  assert isinstance(info.value, ValueError)


def test_register_reward_adds_a_data_source(scratch_sources):
  scratch_sources += ["test/upper", "test/upper-alias"]
  calls = []

  @register_reward("test/upper", "test/upper-alias")
  def upper_match(data_source, solution_str, ground_truth, extra_info=None):
    calls.append((data_source, extra_info))
    return {"score": float(solution_str.upper() == ground_truth), "length": len(solution_str)}

  assert upper_match.__name__ == "upper_match"  # the decorator returns the function itself
  assert "test/upper" in registered_data_sources()
  assert get_reward_fn("test/upper-alias") is upper_match
  assert default_compute_score("test/upper", "abc", "ABC", {"k": 1}) == {"score": 1.0, "length": 3}
  assert calls == [("test/upper", {"k": 1})]


def test_register_reward_refuses_silent_overwrite(scratch_sources):
  scratch_sources.append("test/taken")
  register_reward("test/taken")(lambda *args, **kwargs: 1.0)
  with pytest.raises(ValueError, match="'test/taken' already has"):
    register_reward("test/taken")(lambda *args, **kwargs: 0.0)
  with pytest.raises(ValueError, match="already has"):
    register_reward("openai/gsm8k")(lambda *args, **kwargs: 0.0)
  register_reward("test/taken", overwrite=True)(lambda *args, **kwargs: 0.5)
  assert default_compute_score("test/taken", "", "") == 0.5


def test_register_reward_bad_arguments():
  with pytest.raises(ValueError, match="at least one"):
    register_reward()
  with pytest.raises(ValueError, match="non-empty"):
    register_reward("")
  with pytest.raises(TypeError, match="non-callable"):
    register_reward("test/x")(3)
  assert "test/x" not in registered_data_sources()


def test_bad_return_values_name_the_data_source(scratch_sources):
  scratch_sources += ["test/none", "test/nokey", "test/str"]
  register_reward("test/none")(lambda *args: None)
  register_reward("test/nokey")(lambda *args: {"acc": 1.0})
  register_reward("test/str")(lambda *args: "1.0")
  with pytest.raises(TypeError, match="'test/none'.*NoneType"):
    default_compute_score("test/none", "", "")
  with pytest.raises(ValueError, match="'test/nokey'.*without a 'score'"):
    default_compute_score("test/nokey", "", "")
  with pytest.raises(TypeError, match="'test/str'.*string"):
    default_compute_score("test/str", "", "")


def test_rewards_package_imports_no_jax_model_or_trainer_code():
  code = (
    "import sys, jaxrlhf.rewards\n"
    "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax', 'torch') "
    "or m.startswith(('jaxrlhf.models', 'jaxrlhf.trainer', 'jaxrlhf.rollout', 'jaxrlhf.algos'))]\n"
    "assert not bad, bad\n"
  )
  subprocess.run([sys.executable, "-c", code], check=True)
