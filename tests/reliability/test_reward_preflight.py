"""Issue 50, "late failures": a reward function that returns NaN, a string, a dict without "score", calls sys.exit,
raises or sleeps past reward_model.timeout_s is refused by `train.py` before anything compiles, in one line naming
the data file's row and what came back (jaxrlhf.trainer.reward.preflight, in the run's own worker processes).

Each case is a real `train.py` command (forked by tests/cli/count_compiles.py's server, which counts the XLA
programs compiled: 0) and must end in under 15 s; before the preflight these failed after the step compiled
(45-60 s on the quickstart). The raising function's case is tests/cli/test_bad_input.py's
test_a_reward_function_that_raises_reaches_the_user_as_its_own_message (same assertions, not repeated here).
"""

import time

import pytest

from tests.cli.test_bad_input import assert_user_error, run_cli

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
REFUSED_WITHIN_S = 15.0

HEADER = "import math, sys, time\n\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
CASES = {
  # id: (the function's body, words the error line must hold)
  "nan": ("  return math.nan\n", ["nan"]),
  "string": ("  return 'correct'\n", ["'correct'"]),
  "dict_without_score": ("  return {'acc': 1.0}\n", ["'score'"]),
  "sys_exit": ("  sys.exit(3)\n", ["sys.exit(3)"]),
  "sleeps_past_timeout": ("  time.sleep(60)\n", ["timed out after 2 s"]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_late_failing_reward_function_is_refused_before_compiling_within_15_s(case, tmp_path):
  body, needles = CASES[case]
  (tmp_path / "reward.py").write_text(HEADER + body)
  start = time.monotonic()
  result = run_cli(
    "train.py",
    "--config",
    "configs/quickstart.py",
    f"--config.trainer.default_local_dir={tmp_path}/runs",
    f"--config.custom_reward_function.path={tmp_path}/reward.py",
    "--config.reward_model.timeout_s=2",
    "--config.trainer.total_training_steps=1",
    "--config.trainer.logger=('jsonl',)",
  )
  elapsed = time.monotonic() - start
  # compiled=0 (assert_user_error's default): refused before any program was built
  assert_user_error(
    result,
    "train.py",
    "reward function 'compute_score' refused before compiling",
    "on data.train_files builtin:",  # the file ...
    " row 0 ",  # ... and its row
    "data_source='jaxrlhf/recall'",
    *needles,
  )
  assert "finite number" in result.lines("train.py")[1]
  if case == "sleeps_past_timeout":
    assert "reward_model.timeout_s" in result.lines("train.py")[1]
  assert "exited with status 255" not in result.stderr
  assert elapsed < REFUSED_WITHIN_S, elapsed
  assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("config.json"))
