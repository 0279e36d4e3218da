"""The code sources' scorer (jaxrlhf.rewards.code): each test runs the program in a sandboxed process of its own."""

import json
import os

import pytest

from jaxrlhf.rewards import code, default_compute_score, score_batch

TESTS = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


@pytest.mark.parametrize("data_source", ["codecontests", "apps", "codeforces", "taco"])
def test_programs_are_run_against_the_tests(data_source):
  assert default_compute_score(data_source, "Here it is:\n" + ADD, TESTS) == 1.0
  assert default_compute_score(data_source, "a, b = map(int, input().split())\nprint(3)", TESTS) == 0.5
  calls = {"fn_name": "add", "inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"]}
  assert default_compute_score(data_source, "class Solution:\n  def add(self, a, b):\n    return a + b", calls) == 1.0


def test_runaway_programs_score_zero_and_leave_nothing_running(tmp_path, monkeypatch):
  monkeypatch.setattr(code, "TEST_TIMEOUT_S", 1.0)
  marker = tmp_path / "still_running"
  one_test = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})
  programs = [
    "while True: pass",
    "x = bytearray(10 * 10**9)\nprint(3)",  # 10 GB
    "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\nprint(3)",
    f"import os\nos.system('sleep 30; touch {marker}')\nprint(3)",
    f"import threading, time\nthreading.Thread(target=lambda: (time.sleep(3), open('{marker}', 'w'))).start()"
    "\nwhile True: pass",
    "import os\nos._exit(3)",
    "def (:",
  ]
  scores, _ = score_batch(None, ["codecontests"] * len(programs), programs, [one_test] * len(programs))
  assert scores.tolist() == [0.0] * len(programs)
  assert default_compute_score("apps", ADD, one_test) == 1.0  # the run goes on
  leftovers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_ours(pid)]
  assert not leftovers and not marker.exists()


def _is_ours(pid: str) -> bool:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
      return b"jaxrlhf-code-" in file.read()
  except OSError:
    return False


def test_broken_tests_name_what_was_expected():
  with pytest.raises(ValueError, match="'inputs' and 'outputs'"):
    default_compute_score("taco", ADD, "[1, 2]")
  scores, extras = score_batch(None, ["taco"], [ADD], ["{}"], on_error="zero")
  assert scores.tolist() == [0.0] and extras["reward_error"].tolist() == [1.0]
