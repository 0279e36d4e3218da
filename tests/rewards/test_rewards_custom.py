"""Loading a user's reward function from a real .py file."""

import textwrap

import pytest

from jaxrlhf.rewards import default_compute_score, get_compute_score_fn, load_custom_reward_function, score_batch


def write(path, source):
  path.write_text(textwrap.dedent(source))
  return path


def test_loads_compute_score(tmp_path):
  reward_file = write(
    tmp_path / "my_reward.py",
    """
      import re

      def helper(text):
          return text.strip()

      def compute_score(data_source, solution_str, ground_truth, extra_info=None):
          return {"score": float(helper(solution_str) == ground_truth), "source_len": len(data_source)}
      """,
  )
  fn = load_custom_reward_function(str(reward_file))
  assert fn("abc", " 42 ", "42", None) == {"score": 1.0, "source_len": 3}
  scores, extras = score_batch(fn, ["abc", "ab"], ["42", "41"], ["42", "42"])
  assert scores.tolist() == [1.0, 0.0]
  assert extras["source_len"].tolist() == [3.0, 2.0]


def test_named_function_and_reward_kwargs(tmp_path):
  reward_file = write(
    tmp_path / "rewards_lib.py",
    """
      def length_penalty(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
          return -scale * len(solution_str)
      """,
  )
  fn = load_custom_reward_function(reward_file, name="length_penalty", reward_kwargs={"scale": 0.5})
  assert fn(data_source="d", solution_str="abcd", ground_truth="", extra_info=None) == -2.0


def test_two_files_with_the_same_function_name_do_not_collide(tmp_path):
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  first = write(tmp_path / "a" / "reward.py", "def compute_score(*args, **kwargs):\n    return 1.0\n")
  second = write(tmp_path / "b" / "reward.py", "def compute_score(*args, **kwargs):\n    return 2.0\n")
  assert load_custom_reward_function(first)() == 1.0
  assert load_custom_reward_function(second)() == 2.0


def test_missing_file(tmp_path):
  missing = tmp_path / "nope.py"
  with pytest.raises(FileNotFoundError, match="nope.py"):
    load_custom_reward_function(str(missing))
  with pytest.raises(ValueError, match="empty"):
    load_custom_reward_function("")


def test_missing_function_names_file_and_lists_what_is_defined(tmp_path):
  reward_file = write(tmp_path / "wrong_name.py", "def my_score(*args):\n    return 1.0\n")
  with pytest.raises(AttributeError) as info:
    load_custom_reward_function(str(reward_file), name="compute_score")
  message = str(info.value)
  assert "wrong_name.py" in message and "'compute_score'" in message and "my_score" in message


def test_attribute_that_is_not_callable(tmp_path):
  reward_file = write(tmp_path / "constant.py", "compute_score = 3\n")
  with pytest.raises(TypeError, match=r"'compute_score' in reward file .*constant\.py.* is a int"):
    load_custom_reward_function(str(reward_file))


def test_file_that_fails_to_import(tmp_path):
  reward_file = write(tmp_path / "broken.py", "import no_such_module_xyz\n")
  with pytest.raises(ImportError, match="broken.py.*no_such_module_xyz"):
    load_custom_reward_function(str(reward_file))
  syntax = write(tmp_path / "syntax.py", "def compute_score(:\n")
  with pytest.raises(ImportError, match="syntax.py.*SyntaxError"):
    load_custom_reward_function(str(syntax))


def test_get_compute_score_fn(tmp_path):
  assert get_compute_score_fn(None) is default_compute_score
  assert get_compute_score_fn("") is default_compute_score
  reward_file = write(tmp_path / "r.py", "def compute_score(**kwargs):\n    return 0.25\n")
  fn = get_compute_score_fn(str(reward_file))
  assert fn(data_source="x", solution_str="", ground_truth="", extra_info=None) == 0.25
