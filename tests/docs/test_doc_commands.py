"""Every shell command in the README and docs/ is run here, or checked here, or named with the test that runs it.

The commands are read from the ```bash blocks of README.md and docs/*.md (a line continued with `\\` is one
command; `export A=B` sets the environment of the block's later commands). Each must match exactly one rule below,
so a new command in the docs fails this test until it is given a check:
- run here on a CPU, as written: the GSM8K preprocessing (on a tiny raw copy in the Hub's layout), the launch
  scripts' `--dry-run`, `make -n`;
- parsed as the program parses it, without running it: every `train.py` line (flags, `--config.` and verl
  overrides, the whole config's keys, types and choices: `check_train_commands.py`), `jaxrlhf.aot`'s target;
- run in full by another test (reused, not run twice): the quickstart (tests/test_quickstart.py), `make test`
  (CI), generate / export / serve / fetch from a checkpoint (tests/cli, tests/serving, tests/models): here their
  flags are checked against the program's own;
- needing a GPU, a TPU, SLURM, the network or an account (`hf download`, `wandb login`, `sbatch`, the accelerator
  installs): flags checked against the tool's `--help` or the project's extras; the installs resolve against the
  package index in a slow test that is skipped offline.
"""

import ast
import glob
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tomllib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
PYTHONS = ("python", ".venv/bin/python")
PIPS = ("pip", ".venv/bin/pip")
# Programs that need what this machine has not got, with what they need; their flags are checked below.
EXTERNAL = {
  "wandb": "a W&B account and the network",
  "tensorboard": "the tensorboard package (the loggers extra writes its event files with tensorboardX)",
  "sbatch": "a SLURM cluster",
  "hf": "the network (the Hugging Face Hub)",
}
# `python -m <module>` programs: the test that runs each for real on a CPU.
MODULE_TESTS = {
  "jaxrlhf.generate": "tests/cli/test_bad_input.py (from a trained run's global_step_N) and tests/rollout",
  "jaxrlhf.export": "tests/cli/test_bad_input.py (from a trained run's global_step_N)",
  "jaxrlhf.serve": "tests/serving",
  "jaxrlhf.models.fetch": "tests/models (SmolLM2 from its wheel)",
  "jaxrlhf.aot": "tests/aot",
  "jaxrlhf.verl_compat": "tests/cli/test_verl_compat.py (verl's own scripts as fixtures)",
}


class Command:
  def __init__(self, doc: str, line: str, env: dict[str, str]):
    self.doc, self.line, self.env = doc, line, env
    words = shlex.split(line)
    self.env_prefix = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
      name, value = words.pop(0).split("=", 1)
      self.env_prefix[name] = value
    self.argv = [os.path.expandvars(word) for word in words]

  def __repr__(self):
    return f"{self.doc}: {self.line}"


def doc_commands(path: str) -> list[Command]:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    text = f.read()
  commands = []
  for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S):
    env = {}
    for line in block.replace("\\\n", " ").splitlines():
      line = re.sub(r"\s+#\s.*$", "", line).strip()
      if not line or line.startswith("#"):
        continue
      for part in line.split(" && "):
        if part.startswith("export "):
          env.update(word.split("=", 1) for word in shlex.split(part)[1:])
        else:
          commands.append(Command(path, part, dict(env)))
  return commands


COMMANDS = [command for doc in DOCS for command in doc_commands(doc)]


def kind(command: Command) -> str:
  argv = command.argv
  if argv[0] == "make":
    return "make"
  if argv[0] in PIPS or argv[:3] in ([p, "-m", "pip"] for p in PYTHONS):
    return "pip"
  if argv[0] in PYTHONS and argv[1] == "train.py":
    return "train"
  if argv[0] in PYTHONS and argv[1] == "-m" and argv[2] in MODULE_TESTS:
    return "module"
  if argv[0] in PYTHONS and argv[1] == "examples/data_preprocess/gsm8k.py":
    return "gsm8k"
  if re.fullmatch(r"(gpu|tpu)_scripts/[\w.]+", argv[0]):
    return "launcher"
  if argv[0] in EXTERNAL:
    return "external"
  return "unknown"


def of_kind(name: str) -> list[Command]:
  return [command for command in COMMANDS if kind(command) == name]


def test_every_command_in_the_docs_has_a_check():
  assert len(COMMANDS) > 30 and {"README.md", "docs/scale.md"} <= {c.doc for c in COMMANDS}
  assert [c for c in COMMANDS if kind(c) == "unknown"] == []


def test_the_readme_keeps_its_two_set_up_commands_and_make_runs_them():
  """`make train` is the quickstart that tests/test_quickstart.py runs in full (`train.py --config
  configs/quickstart.py`, the same command line); `make test` is what CI (.ci/run) runs."""
  readme = [c.line for c in doc_commands("README.md")]
  assert readme[:2] == ["make train", "make test"]
  with open(os.path.join(ROOT, ".ci", "run")) as f:
    assert "make test" in f.read()
  for command in of_kind("make"):
    result = subprocess.run(["make", "-n", *command.argv[1:]], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, (command, result.stderr)
    if command.argv[1:] == ["train"]:
      assert "train.py --config configs/quickstart.py" in result.stdout, result.stdout
  with open(os.path.join(ROOT, "tests", "test_quickstart.py")) as f:
    assert 'config="quickstart.py"' in f.read()


def _extras(argv: list[str]) -> list[str]:
  return [extra for arg in argv for extra in re.findall(r"^\.\[([\w,-]+)\]$", arg) for extra in extra.split(",")]


def test_pip_lines_install_extras_that_exist():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    extras = set(tomllib.load(f)["project"]["optional-dependencies"])
  with open(os.path.join(ROOT, "Makefile")) as f:
    makefile = f.read()
  for command in of_kind("pip"):
    argv = command.argv
    assert argv[argv.index("install") + 1 :][:1] in (["-e"], ["--no-deps"]), command
    assert set(_extras(argv)) <= extras, command
    pinned = [arg for arg in argv if "==" in arg]
    assert all(f"--no-deps {pin}" in makefile for pin in pinned), command  # the wheel make test installs


def _online() -> bool:
  try:
    socket.create_connection(("pypi.org", 443), timeout=3).close()
    return True
  except OSError:
    return False


@pytest.mark.slow
def test_the_accelerator_installs_resolve_against_the_package_index(tmp_path):
  """`pip install -e '.[cuda]'` (and cuda13, tpu) as the README names them: each extra's requirements resolve
  (not installed) to the accelerator's plugin for the pinned jax. The rest of `-e .` is what `make test` installs."""
  if not _online():
    pytest.skip("needs the package index (pypi.org)")
  readme = [c for c in doc_commands("README.md") if kind(c) == "pip"]
  accelerators = sorted({e for c in readme for e in _extras(c.argv)} & {"cuda", "tpu"})
  with open(os.path.join(ROOT, "README.md")) as f:
    accelerators += re.findall(r"'\.\[(cuda13)\]'", f.read())[:1]
  assert accelerators == ["cuda", "tpu", "cuda13"], accelerators
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
  command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
  # The three resolutions at once: each waits on the index far more than on this machine.
  started = {
    extra: subprocess.Popen(
      [*command, "--report", str(tmp_path / f"{extra}.json"), *extras[extra]],
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for extra in accelerators
  }
  for extra, process in started.items():
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, (extra, stderr[-3000:])
    report = tmp_path / f"{extra}.json"
    wanted = {"cuda": "jax-cuda12-plugin", "cuda13": "jax-cuda13-plugin", "tpu": "libtpu"}[extra]
    names = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert wanted in names, (extra, sorted(names))


def test_every_train_command_parses_and_its_config_validates():
  """All of them in one checker process (a fork each): a misspelt key, a wrong type or a missing config file in
  any doc fails here with train.py's own message."""
  commands = of_kind("train")
  argvs = [command.argv[1:] for command in commands]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  checker = os.path.join(ROOT, "tests", "docs", "check_train_commands.py")
  result = subprocess.run(
    [sys.executable, checker, json.dumps(argvs)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
  )
  lines = result.stdout.splitlines()
  assert len(lines) == len(commands), result.stderr[-3000:]
  failed = [(command, line) for command, line in zip(commands, lines) if not line.startswith("ok <- ")]
  assert not failed and result.returncode == 0, failed


def _argparse_flags(path: str) -> set[str]:
  """The option strings of every `add_argument` call in a program's source."""
  with open(path) as f:
    tree = ast.parse(f.read())
  return {
    arg.value
    for node in ast.walk(tree)
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
    for arg in node.args
    if isinstance(arg, ast.Constant) and str(arg.value).startswith("-")
  }


def _flags_of(argv: list[str]) -> set[str]:
  return {arg.split("=", 1)[0] for arg in argv if arg.startswith("--") and not arg.startswith("--config.")}


def test_module_commands_use_their_programs_flags():
  for command in of_kind("module"):
    module = command.argv[2]
    source = os.path.join(ROOT, *module.split(".")) + ".py"
    if module == "jaxrlhf.aot":
      from jaxrlhf.aot.targets import parse_target

      source = os.path.join(ROOT, "jaxrlhf", "aot", "__main__.py")
      with open(source) as f:
        known = {f"--{name}" for name in re.findall(r'DEFINE_\w+\(\s*"(\w+)"', f.read())}
      argv = command.argv
      parse_target(argv[argv.index("--target") + 1])
      model = next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--config.actor_rollout_ref.model.path="))
      assert os.path.isfile(os.path.join(ROOT, model, "config.json")), command
    else:
      known = _argparse_flags(source)
    assert _flags_of(command.argv[3:]) <= known, (command, sorted(known), MODULE_TESTS[module])


def test_gsm8k_preprocessing_runs_as_written_on_a_raw_copy_in_the_hubs_layout(tmp_path):
  """`hf download openai/gsm8k --include "main/*"` writes main/{train,test}-00000-of-00001.parquet; the documented
  preprocessing line reads that folder (HOME here is a temporary one) and writes the parquet the recipes read."""
  raw = tmp_path / "raw" / "gsm8k" / "main"
  raw.mkdir(parents=True)
  for split in ("train", "test"):
    rows = {"question": ["What is 2 + 3?"], "answer": ["2 + 3 = <<2+3=5>>5\n#### 5"]}
    pq.write_table(pa.table(rows), raw / f"{split}-00000-of-00001.parquet")
  commands = of_kind("gsm8k")
  assert {c.doc for c in commands} >= {"README.md"}
  downloads = [c for c in of_kind("external") if c.argv[:2] == ["hf", "download"] and "openai/gsm8k" in c.argv]
  assert all(f"{c.argv[c.argv.index('--local-dir') + 1]}/main" in commands[0].line for c in downloads), downloads
  for command in commands:
    argv = [sys.executable, *(arg.replace("~", str(tmp_path)) for arg in command.argv[1:])]
    env = {**os.environ, "HOME": str(tmp_path)}
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (command, result.stderr[-3000:])
    table = pq.read_table(tmp_path / "data" / "gsm8k" / "train.parquet")
    assert table.num_rows == 1 and table.column("reward_model")[0].as_py()["ground_truth"] == "5"


def _help(argv: list[str]) -> str:
  result = subprocess.run([*argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, (argv, result.stderr[-2000:])
  return result.stdout


def test_commands_that_need_the_network_or_a_cluster_use_real_flags():
  for command in of_kind("external"):
    tool = command.argv[0]
    assert tool in EXTERNAL, command
    if tool == "hf":
      hf = os.path.join(os.path.dirname(sys.executable), "hf")
      assert set(re.findall(r"--[\w-]+", " ".join(command.argv))) <= set(
        re.findall(r"--[\w-]+", _help([hf, "download"]))
      )
    elif tool == "tensorboard":  # where jaxrlhf's tensorboard logger writes: <run dir>/tensorboard
      assert command.argv[1] == "--logdir" and command.argv[2].endswith("/tensorboard"), command
    elif tool == "sbatch":  # the script's own dry run is a launcher check (below)
      script = next(arg for arg in command.argv[1:] if not arg.startswith("-"))
      assert os.access(os.path.join(ROOT, script), os.X_OK), command
    else:
      assert command.argv[1:] == ["login"], command


def test_launch_scripts_dry_run_as_written(tmp_path):
  """Each launcher with `--dry-run` first (it prints its commands and runs nothing), in the environment the docs'
  `export` line sets; SLURM's script as inside a one-node job (a stand-in `scontrol` lists the node)."""
  scontrol = tmp_path / "scontrol"
  scontrol.write_text("#!/bin/sh\necho gpu001\n")
  scontrol.chmod(0o755)
  slurm = {"SLURM_JOB_NODELIST": "gpu001", "SLURM_JOB_NUM_NODES": "1", "SLURM_SUBMIT_DIR": ROOT}
  sbatch = [c for c in of_kind("external") if c.argv[0] == "sbatch"]
  runs = [(c, c.argv[0], c.argv[1:], c.env) for c in of_kind("launcher")]
  for c in sbatch:
    at = next(i for i, arg in enumerate(c.argv) if arg.endswith(".sbatch"))
    runs.append((c, c.argv[at], c.argv[at + 1 :], slurm))
  assert len(runs) >= 7
  for command, script, args, env in runs:
    full_env = {**os.environ, **env, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    result = subprocess.run(
      ["bash", script, "--dry-run", *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, (command, result.stderr[-2000:])
    configs = [arg for arg in args if arg.startswith("configs/")]
    assert all(config in result.stdout for config in configs), (command, result.stdout)
