"""Code rewards (verl's `codecontests`, `apps`, `codeforces`, `taco`): the response's program run against the tests.

verl 0.9.1 runs these through its `prime_code` checker when no sandbox service is configured (sandbox_fusion,
refused here: docs/verl_scripts.md). Its results, written from its behaviour:

- the program is the text after the last `````python`` fence, up to the next fence (the whole response if none);
- `ground_truth` holds the tests, as a dict or its JSON: ``inputs`` and ``outputs`` (one string per test), and
  ``fn_name`` for tests that call a function (each input line one JSON argument, the output JSON) instead of
  feeding stdin and reading stdout;
- every test passes: 1.0; else the fraction of the first 10 tests that pass.

Each test runs the program in a process of its own (`python -I`, a temporary working folder, a new session): at
most `TEST_TIMEOUT_S` seconds of wall clock and of CPU, `MEMORY_LIMIT_BYTES` of address space, no network (a
network namespace of its own where the kernel allows one, and an audit hook that refuses sockets, subprocesses and
signals to other processes in any case). A program that loops, allocates too much, opens a socket or crashes fails
its test; the whole process group is killed when the time is up, so nothing is left running. Broken tests (not a
dict with inputs and outputs) raise, which `reward_model.on_error` handles.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any, Optional

TEST_TIMEOUT_S = 5.0
MEMORY_LIMIT_BYTES = 1 << 30
MAX_PARTIAL_TESTS = 10  # verl scores at most the first 10 tests when not all pass
_OUTPUT_LIMIT = 1 << 20  # bytes of a program's stdout read back; more is a failed test

# Names the checked programs may use without importing them (verl's checker runs them after these imports).
_PRELUDE_MODULES = (
  "string re datetime collections heapq bisect copy math random statistics itertools functools operator io sys json"
).split()
PRELUDE = "".join(f"from {name} import *\n" for name in (*_PRELUDE_MODULES, "builtins", "typing")) + "".join(
  f"import {name}\n" for name in _PRELUDE_MODULES
)

# The child: limits first, then an audit hook (it cannot be removed), then the program.
_RUNNER = r"""
import ctypes, json, os, resource, sys
memory, seconds, mode, program_path, result_path, fn_name = sys.argv[1:7]
resource.setrlimit(resource.RLIMIT_AS, (int(memory), int(memory)))
resource.setrlimit(resource.RLIMIT_CPU, (int(float(seconds)) + 1, int(float(seconds)) + 1))
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x40000000) != 0:  # CLONE_NEWNET: no interface but a down loopback
  libc.unshare(0x10000000 | 0x40000000)  # CLONE_NEWUSER too, where only unprivileged namespaces are allowed
BLOCKED = ("socket.", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty",
           "os.kill", "os.killpg", "ctypes.dlopen", "os.putenv", "shutil.rmtree")
def guard(event, args):
  if event.startswith(BLOCKED):
    raise PermissionError(f"{event} is not allowed in the code reward's sandbox")
code = compile(open(program_path).read(), "<program>", "exec")
sys.setrecursionlimit(600000)
sys.addaudithook(guard)
scope = {"__name__": "__main__"}
if mode == "stdin":
  try:
    exec(code, scope)
  except SystemExit:
    pass
else:
  scope["__name__"] = "solution"
  exec(code, scope)
  fn = getattr(scope["Solution"](), fn_name) if "class Solution" in open(program_path).read() else scope[fn_name]
  args = [json.loads(line) for line in sys.stdin.read().split("\n")]
  output = fn(*args)
  with open(result_path, "w") as file:
    json.dump(output, file)
"""


def extract_program(completion: str) -> str:
  return completion.split("```python")[-1].split("```")[0]


def load_tests(ground_truth: Any) -> dict:
  tests = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
  if not isinstance(tests, dict) or "inputs" not in tests or "outputs" not in tests:
    raise ValueError(
      "a code source's reward_model.ground_truth must be a dict (or its JSON) with 'inputs' and 'outputs' "
      f"(and 'fn_name' for call tests), got {str(ground_truth)[:80]!r}"
    )
  if len(tests["inputs"]) != len(tests["outputs"]):
    raise ValueError(f"code tests: {len(tests['inputs'])} inputs but {len(tests['outputs'])} outputs")
  return tests


def run_program(program: str, stdin: str, fn_name: Optional[str] = None) -> tuple[Optional[str], Any]:
  """(stdout, the call's JSON result) of `program` on one test; stdout None when it failed (error, limit)."""
  with tempfile.TemporaryDirectory(prefix="jaxrlhf-code-") as folder:
    program_path, result_path = os.path.join(folder, "program.py"), os.path.join(folder, "result.json")
    with open(program_path, "w") as file:
      file.write(PRELUDE + program)
    args = [str(MEMORY_LIMIT_BYTES), str(TEST_TIMEOUT_S), "call" if fn_name else "stdin", program_path]
    command = [sys.executable, "-I", "-c", _RUNNER, *args, result_path, fn_name or ""]
    process = subprocess.Popen(
      command,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      cwd=folder,
      start_new_session=True,  # its own process group: killed whole, with anything it started
      env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    try:
      stdout, _ = process.communicate(stdin.encode(), timeout=TEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      stdout = None
    finally:
      _kill_group(process)
    if stdout is None or process.returncode != 0 or len(stdout) > _OUTPUT_LIMIT:
      return None, None
    result = None
    if fn_name:
      try:
        with open(result_path) as file:
          result = json.load(file)
      except (OSError, ValueError):
        return None, None
    return stdout.decode(errors="replace"), result


def _kill_group(process: subprocess.Popen) -> None:
  try:
    os.killpg(process.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  process.wait()


def _floats(lines: list[str]) -> Optional[list[float]]:
  try:
    return [float(line) for line in lines]
  except ValueError:
    return None


def stdout_matches(stdout: str, expected: Any) -> bool:
  """verl's comparisons of printed output: the text stripped; each line stripped; the non-empty stripped lines;
  the lines as numbers (close, as numpy.allclose) when they are not all integers."""
  expected = "\n".join(expected) if isinstance(expected, list) else str(expected)
  lines = stdout.splitlines()
  if "\n".join(lines).strip() == expected.strip() or "\n".join(line.strip() for line in lines).strip() == (
    expected.strip()
  ):
    return True
  got = [line.strip() for line in lines if line.strip()]
  want = [line.strip() for line in expected.split("\n") if line.strip()]
  if got == want:
    return True
  got_numbers, want_numbers = _floats(got), _floats(want)
  if got_numbers is None or want_numbers is None or len(got_numbers) != len(want_numbers):
    return False
  if all(_is_int(a) and _is_int(b) for a, b in zip(got, want)):
    return False
  return all(abs(a - b) <= 1e-8 + 1e-5 * abs(b) for a, b in zip(got_numbers, want_numbers))  # numpy.allclose


def _is_int(text: str) -> bool:
  try:
    return float(text) == int(text)
  except ValueError:
    return False


def call_matches(result: Any, expected_json: str) -> bool:
  expected = json.loads(expected_json)
  result = list(result) if isinstance(result, tuple) else result
  if result == expected or (isinstance(expected, list) and expected and result == expected[0]):
    return True
  try:  # a list of tuples against the lists JSON has
    return isinstance(result[0], tuple) and [list(item) for item in result] == expected[0]
  except (TypeError, IndexError, KeyError):
    return False


def passes(program: str, tests: dict, index: int) -> bool:
  fn_name = tests.get("fn_name")
  test_input = tests["inputs"][index]
  test_input = "\n".join(test_input) if isinstance(test_input, list) else str(test_input)
  stdout, result = run_program(program, test_input, fn_name)
  if stdout is None:
    return False
  if fn_name:
    return call_matches(result, tests["outputs"][index])
  return stdout_matches(stdout, tests["outputs"][index])


def compute_score(solution_str: str, ground_truth: Any) -> float:
  """1.0 when every test passes, else the share of the first 10 that pass: verl's score, which comes to the share
  of the first 10 in both cases (a failure after the 10th leaves 10 of 10)."""
  tests = load_tests(ground_truth)
  program = extract_program(solution_str)
  first = [passes(program, tests, index) for index in range(min(len(tests["inputs"]), MAX_PARTIAL_TESTS))]
  return sum(first) / len(first) if first else 1.0
