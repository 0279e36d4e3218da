"""Bad input fails fast in one line, and nothing is lost (README "Bad input").

Each case runs the real command line (`train.py`, `python -m jaxrlhf.generate`, `jaxrlhf.export`) in its own
process, forked by `count_compiles.py --serve` (JAX and jaxrlhf imported once), and asserts: exit status 2, no
traceback, an error line that names the key / file / column, at most one hint line, and, for config, data, model
and reward-file cases, that nothing was compiled (jax.monitoring's backend-compile events: 0).
"""

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile

import jax
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxrlhf.checkpoint import Checkpointer
from jaxrlhf.data.builtin import build_tokenizer, recall_rows
from jaxrlhf.models import Decoder, DecoderConfig, init_params, save_hf_checkpoint
from jaxrlhf.tracking import read_metrics
from jaxrlhf.trainer import Trainer
from tests.helpers import small_config, subprocess_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COUNTER = os.path.join(ROOT, "tests", "cli", "count_compiles.py")
# The quickstart's model, as an HF directory (3 layers, to be read under a config.json that says 2).
MODEL = DecoderConfig(
  vocab_size=64,
  hidden_size=64,
  intermediate_size=128,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  tie_word_embeddings=True,
  max_position_embeddings=64,
)


class Result:
  def __init__(self, proc):
    self.returncode, self.stdout = proc.returncode, proc.stdout
    lines = proc.stderr.splitlines()
    assert lines and lines[-1].startswith("[compiled] "), proc.stderr[-3000:]
    self.compiled = int(lines[-1].split()[1])
    self.stderr = "\n".join(lines[:-1])

  def lines(self, prog):
    return [line for line in self.stderr.splitlines() if line.startswith(prog + ":")]


class CommandServer:
  """`count_compiles.py --serve`: one process that has imported JAX and jaxrlhf forks each command line, which then
  costs ~0.2 s instead of the ~2 s of a new interpreter's imports (each still runs its script as `__main__`, with
  its own argv, output and exit status)."""

  def __init__(self, workdir):
    self.workdir, self.count = workdir, 0
    env = subprocess_env(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    self.process = subprocess.Popen(
      [sys.executable, COUNTER, "--serve"], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    )

  def _reply(self, timeout):
    ready, _, _ = select.select([self.process.stdout], [], [], timeout)
    line = self.process.stdout.readline().decode() if ready else ""
    assert line, f"count_compiles.py --serve gave no reply in {timeout} s (exit status {self.process.poll()})"
    return int(line.split()[1])

  def run(self, args, timeout):
    self.count += 1
    out, err = (os.path.join(self.workdir, f"{self.count}.{name}") for name in ("stdout", "stderr"))
    request = {"argv": list(map(str, args)), "stdout": out, "stderr": err}
    self.process.stdin.write((json.dumps(request) + "\n").encode())
    pid = self._reply(60)
    try:
      returncode = self._reply(timeout)
    except AssertionError:
      os.kill(pid, signal.SIGKILL)
      self.process.kill()  # its late reply would answer the next request: the next run_cli starts another
      raise
    with open(out) as stdout, open(err) as stderr:
      return subprocess.CompletedProcess(args, returncode, stdout.read(), stderr.read())

  def close(self):
    self.process.stdin.close()
    self.process.wait(timeout=60)
    shutil.rmtree(self.workdir, ignore_errors=True)


_server: CommandServer | None = None


def run_cli(*args, timeout=300):
  """`python count_compiles.py *args`, as the command server runs it (one per test process, started on first use:
  test_flags, test_verl_compat and test_run_safety run commands through it too)."""
  global _server
  if _server is None or _server.process.poll() is not None:
    _server = CommandServer(tempfile.mkdtemp(prefix="jaxrlhf-commands-"))
    atexit.register(_server.close)
  return Result(_server.run(args, timeout))


def assert_user_error(result, prog, *needles, compiled=0):
  """Exit 2, no traceback, `prog: error: ...` naming every needle (+ at most a hint line), `compiled` programs."""
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr[-3000:]
  lines = result.lines(prog)
  assert 1 <= len(lines) <= 2 and lines[0].startswith(f"{prog}: error: "), result.stderr[-3000:]
  assert len(lines) == 1 or lines[1].startswith(f"{prog}: hint: ")
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])
  if compiled is not None:
    assert result.compiled == compiled, result.compiled


def _write_hf_model(path, num_hidden_layers):
  import dataclasses

  config = dataclasses.replace(MODEL, num_hidden_layers=num_hidden_layers)
  params, _ = init_params(Decoder(config), jax.random.key(0))
  save_hf_checkpoint(params, config, str(path))
  build_tokenizer(save_dir=str(path))
  return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """Bad (and one good) inputs on disk: data files, model directories, reward files, config files."""
  root = tmp_path_factory.mktemp("inputs")
  rows = recall_rows("test")[:8]
  with open(root / "unknown_source.jsonl", "w") as f:
    for row in rows:
      f.write(json.dumps({**row, "data_source": "my/typo"}) + "\n")
  table = pa.Table.from_pylist(
    [
      {"question": r["prompt"][0]["content"], "data_source": r["data_source"], "reward_model": r["reward_model"]}
      for r in rows
    ]
  )
  pq.write_table(table, root / "no_prompt.parquet")
  pq.write_table(pa.Table.from_pylist(rows), root / "prompts.parquet")
  # 10 rows, 6 of them longer than 8 tokens (the chat template makes a 4-digit prompt 8 tokens).
  with open(root / "mixed_lengths.jsonl", "w") as f:
    for i, row in enumerate(rows + recall_rows("test")[8:10]):
      longer = [{"role": "user", "content": row["prompt"][0]["content"] + " 1 2 3"}]
      f.write(json.dumps({**row, "prompt": longer} if i < 6 else row) + "\n")
  # A Latin-1 byte (0xe9) in the second line.
  (root / "latin1.jsonl").write_bytes(json.dumps(rows[0]).encode() + b"\n" + b'{"prompt": "caf\xe9"}\n')
  (root / "latin1.txt").write_bytes(b"first : 1 2\ncaf\xe9 : 1 2\n")

  good = _write_hf_model(root / "hf_model", 2)
  pq.write_table(pa.Table.from_pylist(rows), root / "hf_model" / "train.parquet")  # not part of a model
  truncated = _write_hf_model(root / "hf_3_layers", 3)
  with open(os.path.join(truncated, "config.json")) as f:
    hf_config = json.load(f)
  with open(os.path.join(truncated, "config.json"), "w") as f:
    json.dump({**hf_config, "num_hidden_layers": 2}, f)
  os.makedirs(root / "pickled")
  shutil.copy(os.path.join(good, "config.json"), root / "pickled")
  (root / "pickled" / "pytorch_model.bin").write_bytes(b"not unpickled")

  (root / "raises.py").write_text(
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "  raise ValueError(f'cannot parse ground truth {ground_truth!r} as a number')\n"
  )
  (root / "no_fn.py").write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n  return 0.0\n")
  quickstart = os.path.join(ROOT, "configs", "quickstart.py")
  (root / "misspelt.py").write_text(
    "from jaxrlhf.config import load_config_file\n\n\ndef get_config():\n"
    f"  config = load_config_file({quickstart!r})\n  config.trainer.total_trainig_steps = 3\n  return config\n"
  )
  (root / "with_arg.py").write_text(
    "from jaxrlhf.config import load_config_file\n\n\ndef get_config(steps):\n"
    f"  config = load_config_file({quickstart!r})\n  config.trainer.total_trainig_steps = int(steps)\n"
    "  return config\n"
  )
  # The quickstart on an HF directory: override_config cleared, so config.json alone defines the model.
  (root / "quickstart_hf.py").write_text(
    "from jaxrlhf.config import load_config_file\n\n\ndef get_config():\n"
    f"  config = load_config_file({quickstart!r})\n"
    "  for key in config.actor_rollout_ref.model.override_config.keys():\n"
    "    config.actor_rollout_ref.model.override_config[key] = None\n  return config\n"
  )
  return root


# ----- train.py: config, data, model and reward-file errors, all before anything is compiled ---------

TRAIN_CASES = {
  # id: (extra flags, words the error line must hold); {files} / {tmp} are filled in per test.
  "misspelt_override": (
    ["--config.trainer.total_trainig_steps=3"],
    ["'trainer.total_trainig_steps'", "did you mean 'trainer.total_training_steps'"],
  ),
  "wrong_type": (["--config.trainer.total_training_steps=many"], ["total_training_steps", "many"]),
  "adv_estimator": (["--config.algorithm.adv_estimator=gea"], ["'algorithm.adv_estimator'", "'gea'", "'gae'"]),
  "loss_mode": (
    ["--config.actor_rollout_ref.actor.policy_loss.loss_mode=ppo"],
    ["'actor_rollout_ref.actor.policy_loss.loss_mode'", "'ppo'", "'vanilla'"],
  ),
  "loss_agg_mode": (
    ["--config.actor_rollout_ref.actor.loss_agg_mode=token_mean"],
    ["'actor_rollout_ref.actor.loss_agg_mode'", "'token_mean'", "'token-mean'"],
  ),
  "kl_loss_type": (
    ["--config.actor_rollout_ref.actor.kl_loss_type=k4"],
    ["'actor_rollout_ref.actor.kl_loss_type'", "'k4'", "'low_var_kl'"],
  ),
  "kl_penalty": (["--config.algorithm.kl_penalty=k4"], ["'algorithm.kl_penalty'", "'k4'", "'kl'"]),
  "critic_epochs": (["--config.critic.ppo_epochs=0"], ["'critic.ppo_epochs'", ">= 1", "got 0"]),
  "micro_batch": (
    ["--config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0"],
    ["'actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu'", ">= 1"],
  ),
  "temperature_nan": (
    ["--config.actor_rollout_ref.rollout.temperature=nan"],
    ["'actor_rollout_ref.rollout.temperature'", "nan"],
  ),
  "top_p_zero": (["--config.actor_rollout_ref.rollout.top_p=0.0"], ["'actor_rollout_ref.rollout.top_p'", "(0, 1]"]),
  "top_k": (["--config.actor_rollout_ref.rollout.top_k=-2"], ["'actor_rollout_ref.rollout.top_k'", ">= -1"]),
  "rollout_name": (
    ["--config.actor_rollout_ref.rollout.name=vllm"],
    ["'actor_rollout_ref.rollout.name'='vllm'", "not implemented", "JAX sampler"],
  ),
  "log_prob_micro_batch": (
    ["--config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=0"],
    ["'actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu'", ">= 1"],
  ),
  "max_num_batched_tokens": (
    ["--config.actor_rollout_ref.rollout.max_num_batched_tokens=4096"],
    ["max_num_batched_tokens'=4096", "whole batch"],
  ),
  "critic_lora_on_lm_head": (
    ["--config.critic.model.lora_rank=8", "--config.critic.model.target_modules=q_proj,lm_head"],
    ["'critic.model.target_modules'", "no LM head"],
  ),
  "lora_on_a_tied_head": (
    ["--config.actor_rollout_ref.model.lora_rank=8", "--config.actor_rollout_ref.model.target_modules=q_proj,lm_head"],
    ["actor_rollout_ref.model.target_modules", "tie_word_embeddings=False"],
  ),
  "word_for_an_int": (
    ["--config.data.train_batch_size=abc"],
    ["config key 'data.train_batch_size' expects int", "got 'abc'", "--config.data.train_batch_size=abc"],
  ),
  "word_for_a_bool": (
    ["--config.actor_rollout_ref.rollout.do_sample=maybe"],
    ["'actor_rollout_ref.rollout.do_sample' expects bool", "got 'maybe'"],
  ),
  "typo_in_a_nested_key": (
    ["--config.actor_rollout_ref.actor.optim.lrr=1e-5"],
    ["'actor_rollout_ref.actor.optim.lrr'", "did you mean 'actor_rollout_ref.actor.optim.lr'?"],
  ),
  "missing_data_file": (
    ["--config.data.train_files=('{tmp}/gsm8k/train.parquet',)"],
    ["data.train_files", "gsm8k/train.parquet", "does not exist"],
  ),
  "missing_column": (
    ["--config.data.train_files=('{files}/no_prompt.parquet',)"],
    ["data.train_files", "no_prompt.parquet", "column 'prompt'", "data.prompt_key"],
  ),
  "unknown_data_source": (
    ["--config.data.train_files=('{files}/unknown_source.jsonl',)"],
    ["data.train_files", "unknown_source.jsonl", "'data_source'", "'my/typo'"],
  ),
  "missing_model_path": (
    ["--config.actor_rollout_ref.model.path={tmp}/Qwen2.5-0.5B"],
    ["actor_rollout_ref.model.path", "Qwen2.5-0.5B", "does not exist"],
  ),
  "pickled_weights": (
    ["--config.actor_rollout_ref.model.path={files}/pickled"],
    ["actor_rollout_ref.model.path", "pickled", "pytorch_model.bin"],
  ),
  "missing_tokenizer": (["--config.data.tokenizer={tmp}/tok"], ["data.tokenizer", "tok"]),
  "missing_reward_file": (
    ["--config.custom_reward_function.path={tmp}/my_reward.py"],
    ["custom_reward_function.path", "my_reward.py", "does not exist"],
  ),
  "missing_reward_function": (
    ["--config.custom_reward_function.path={files}/no_fn.py"],
    ["custom_reward_function.name", "no_fn.py", "'compute_score'", "['score']"],
  ),
  "missing_resume_path": (
    ["--config.trainer.resume_mode=resume_path", "--config.trainer.resume_from_path={tmp}/run/global_step_3"],
    ["trainer.resume_from_path", "global_step_3", "does not exist"],
  ),
  "resume_path_unset": (["--config.trainer.resume_mode=resume_path"], ["trainer.resume_from_path"]),
  "run_dir_under_a_file": (
    ["--config.trainer.default_local_dir={files}/prompts.parquet/runs"],
    ["trainer.default_local_dir", "prompts.parquet is a file, not a directory"],
  ),
  "lengths_beyond_the_model": (
    ["--config.data.max_response_length=100000000"],
    ["data.max_prompt_length + data.max_response_length = 12 + 100000000", "max_position_embeddings=64"],
  ),
  # Within the positions of a model that claims 10**12: the rollout's KV cache, estimated before compiling.
  "kv_cache_beyond_memory": (
    [
      "--config.data.max_response_length=10000000000",
      "--config.actor_rollout_ref.model.override_config.max_position_embeddings=1000000000000",
    ],
    ["host memory", "KV cache (512 sequences of 10,000,000,012 tokens)", "PiB"],
  ),
}


@pytest.mark.parametrize("case", sorted(TRAIN_CASES))
def test_train_refuses_bad_input_before_compiling(case, files, tmp_path):
  flags, needles = TRAIN_CASES[case]
  fill = lambda text: text.format(files=files, tmp=tmp_path)
  result = run_cli(
    "train.py", "--config", "configs/quickstart.py", f"--config.trainer.default_local_dir={tmp_path}", *map(fill, flags)
  )
  assert_user_error(result, "train.py", *map(fill, needles))
  assert not os.path.exists(tmp_path / "quickstart"), "refused input must not start a run directory"


@pytest.mark.parametrize(
  "logger, module, extra", [("wandb", "wandb", "wandb"), ("tensorboard", "tensorboardX", "loggers")]
)
def test_train_refuses_a_logger_whose_package_is_missing_before_the_model(logger, module, extra, tmp_path):
  """As on a machine without the package (`sys.modules[module] = None` makes it unimportable): one line naming the
  extra, exit 2, before the model is built, and no run directory left behind."""
  argv = ["train.py", "--config", "configs/quickstart.py", f"--config.trainer.default_local_dir={tmp_path}"]
  argv.append(f"--config.trainer.logger=('console','jsonl','{logger}')")
  script = f"import runpy, sys; sys.modules[{module!r}] = None; sys.argv = {argv!r}; "
  script += "runpy.run_path('train.py', run_name='__main__')"
  result = subprocess.run(
    [sys.executable, "-c", script], cwd=ROOT, env=subprocess_env(JAX_PLATFORMS="cpu"), capture_output=True, text=True
  )
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("train.py:")]
  assert errors == [
    f"train.py: error: trainer.logger {logger!r} needs the {module} package, which is not installed: "
    f"pip install -e '.[{extra}]'"
  ], result.stderr[-3000:]
  assert os.listdir(tmp_path) == [] and "mesh " not in result.stdout


def test_train_refuses_a_misspelt_key_inside_a_config_file_naming_its_line(files):
  result = run_cli("train.py", "--config", files / "misspelt.py")
  assert_user_error(result, "train.py", "misspelt.py:6", "'total_trainig_steps'", "'total_training_steps'")


def test_train_passes_a_config_argument_after_the_colon(files):
  """ml_collections' `--config file.py:arg` calls get_config(arg): the file is found (its error is the
  misspelt key inside, not a missing file)."""
  result = run_cli("train.py", "--config", f"{files / 'with_arg.py'}:3")
  assert_user_error(result, "train.py", "with_arg.py:6", "'total_trainig_steps'")


def test_train_refuses_a_missing_config_file():
  assert_user_error(
    run_cli("train.py", "--config", "configs/quickstart_ppo.py"), "train.py", "--config 'configs/quickstart_ppo.py'"
  )


def test_train_refuses_a_config_json_with_fewer_layers_than_its_weights(files, tmp_path):
  result = run_cli(
    "train.py",
    "--config",
    files / "quickstart_hf.py",
    f"--config.trainer.default_local_dir={tmp_path}",
    f"--config.actor_rollout_ref.model.path={files}/hf_3_layers",
  )
  assert_user_error(
    result, "train.py", "actor_rollout_ref.model.path", "hf_3_layers", "3 decoder layers", "num_hidden_layers=2"
  )


def test_a_reward_function_that_raises_reaches_the_user_as_its_own_message(files, tmp_path):
  result = run_cli(
    "train.py",
    "--config",
    "configs/quickstart.py",
    f"--config.trainer.default_local_dir={tmp_path}",
    f"--config.custom_reward_function.path={files}/raises.py",
    "--config.trainer.total_training_steps=1",
    "--config.trainer.val_before_train=False",
    "--config.trainer.logger=('jsonl',)",
  )
  assert_user_error(
    result,
    "train.py",
    "refused before compiling",
    "data.train_files",
    "data_source='jaxrlhf/recall'",
    "ValueError: cannot parse ground truth",
  )
  # tried on the data's rows before compiling; tests/trainer/test_phased_and_recipes.py has it fail inside the step
  assert "finite number" in result.lines("train.py")[1]


def test_train_names_the_file_and_byte_offset_of_bytes_that_are_not_utf8(files, tmp_path):
  offset = (files / "latin1.jsonl").read_bytes().index(b"\xe9")
  result = run_cli(
    "train.py",
    "--config",
    "configs/quickstart.py",
    f"--config.trainer.default_local_dir={tmp_path}",
    f"--config.data.train_files=('{files}/latin1.jsonl',)",
  )
  assert_user_error(result, "train.py", f"{files}/latin1.jsonl", "not UTF-8", f"byte offset {offset} (line 2)")


def test_filtered_rows_are_counted_and_a_dataset_too_small_after_filtering_leaves_no_run_directory(files, tmp_path):
  result = run_cli(
    "train.py",
    "--config",
    "configs/quickstart.py",
    f"--config.trainer.default_local_dir={tmp_path}",
    f"--config.data.train_files=('{files}/mixed_lengths.jsonl',)",
    "--config.data.max_prompt_length=8",
    "--config.data.filter_overlong_prompts=True",
  )
  assert_user_error(
    result,
    "train.py",
    "data.train_batch_size=128 is larger than the dataset (4 rows; 10 read, 6 dropped by data.filter_overlong_prompts)",
  )
  assert (
    "data.train_files: data.filter_overlong_prompts dropped 6 of 10 rows (longer than "
    "data.max_prompt_length=8); 4 left" in result.stdout
  )
  assert not os.path.exists(tmp_path / "quickstart")  # made for the tokenizer, removed with the refusal


# ----- generate ------------------------------------------------------------------------------------


def test_generate_names_the_byte_offset_of_bytes_that_are_not_utf8_in_the_prompts(files, tmp_path):
  result = run_cli(
    "-m",
    "jaxrlhf.generate",
    "--model",
    files / "hf_model",
    "--prompts",
    files / "latin1.txt",
    "--output",
    tmp_path / "out.jsonl",
  )
  assert_user_error(
    result,
    "python -m jaxrlhf.generate",
    f"--prompts {files}/latin1.txt",
    "not UTF-8",
    "byte 0xe9 at byte offset 15 (line 2)",
  )


def test_generate_checks_the_prompts_file_before_loading_the_model(tmp_path):
  result = run_cli(
    "-m",
    "jaxrlhf.generate",
    "--model",
    tmp_path / "no_model",
    "--prompts",
    tmp_path / "prompts.txt",
    "--output",
    tmp_path / "out.jsonl",
  )
  assert_user_error(result, "python -m jaxrlhf.generate", "--prompts", "prompts.txt")


@pytest.mark.parametrize("temperature", ["-1", "nan"])
def test_generate_refuses_a_temperature_that_is_not_a_sampling_or_greedy_one(temperature, files, tmp_path):
  result = run_cli(
    "-m",
    "jaxrlhf.generate",
    "--model",
    files / "hf_model",
    "--prompts",
    files / "prompts.parquet",
    "--output",
    tmp_path / "out.jsonl",
    "--temperature",
    temperature,
  )
  assert result.returncode == 2 and "Traceback" not in result.stderr and result.compiled == 0
  assert f"--temperature must be > 0 (sampling) or 0 (greedy), got {temperature}" in result.stderr


def test_generate_reads_the_trainers_parquet_prompts_with_the_chat_template(files, tmp_path):
  result = run_cli(
    "-m",
    "jaxrlhf.generate",
    "--model",
    files / "hf_model",
    "--prompts",
    files / "prompts.parquet",
    "--output",
    tmp_path / "out.jsonl",
    "--temperature",
    "0",
    "--max_new_tokens",
    "3",
  )
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "out.jsonl") as f:
    rows = [json.loads(line) for line in f]
  expected = [row["prompt"] for row in recall_rows("test")[:8]]
  assert [row["prompt"] for row in rows] == expected  # the chat messages of the `prompt` column, in order
  assert all(len(row["response_ids"]) <= 3 for row in rows)
  missing = run_cli(
    "-m",
    "jaxrlhf.generate",
    "--model",
    files / "hf_model",
    "--prompts",
    files / "no_prompt.parquet",
    "--output",
    tmp_path / "out2.jsonl",
  )
  assert_user_error(missing, "python -m jaxrlhf.generate", "no_prompt.parquet", "'prompt' column")


# ----- export and checkpoints: nothing lost ---------------------------------------------------------


@pytest.fixture(scope="module")
def trained_run(files, tmp_path_factory):
  """Real Orbax checkpoints (global_step_1, _2) of a run that started from the HF directory `files/hf_model`."""
  config = small_config(tmp_path_factory.mktemp("run"))
  for key in config.actor_rollout_ref.model.override_config.keys():
    config.actor_rollout_ref.model.override_config[key] = None
  config.actor_rollout_ref.model.path = str(files / "hf_model")
  config.data.tokenizer = ""
  trainer = Trainer(config, devices=jax.devices()[:1])
  trainer.train_step(0)
  checkpointer = Checkpointer(trainer.run_dir)
  trainer.save(checkpointer, 1)
  trainer.save(checkpointer, 2)
  checkpointer.close()
  return config, os.path.join(trainer.run_dir, "global_step_1")


def _snapshot(path):
  return {name: (path / name).read_bytes() for name in sorted(os.listdir(path))}


def test_export_refuses_a_non_empty_out_and_overwrites_only_model_files(trained_run, files, tmp_path):
  _, step_dir = trained_run
  out = tmp_path / "existing_model"
  shutil.copytree(files / "hf_model", out)
  (out / "notes.txt").write_text("mine")
  before = _snapshot(out)
  result = run_cli("-m", "jaxrlhf.export", "--checkpoint", step_dir, "--out", out)
  assert_user_error(result, "python -m jaxrlhf.export", "--out", "existing_model", "not empty")
  assert "--overwrite" in result.lines("python -m jaxrlhf.export")[1]
  assert _snapshot(out) == before  # untouched

  result = run_cli("-m", "jaxrlhf.export", "--checkpoint", step_dir, "--out", out, "--overwrite")
  assert result.returncode == 0, result.stderr[-3000:]
  after = _snapshot(out)
  assert after["notes.txt"] == b"mine" and after["model.safetensors"] != before["model.safetensors"]
  fresh = tmp_path / "fresh"
  assert run_cli("-m", "jaxrlhf.export", "--checkpoint", step_dir, "--out", fresh).returncode == 0
  # A model directory: config, weights, tokenizer and generation config; not the parquet beside the source model.
  assert "train.parquet" in os.listdir(files / "hf_model")
  assert sorted(os.listdir(fresh)) == sorted(set(os.listdir(files / "hf_model")) - {"train.parquet"})
  assert "tokenizer.json" in os.listdir(fresh)


def test_export_names_its_own_flag_and_the_unreadable_step_folder(trained_run, tmp_path):
  _, step_dir = trained_run
  result = run_cli("-m", "jaxrlhf.export", "--checkpoint", tmp_path / "global_step_9", "--out", tmp_path / "o")
  assert_user_error(result, "python -m jaxrlhf.export", "--checkpoint", "global_step_9", "does not exist")
  assert "resume_from_path" not in result.stderr
  damaged = tmp_path / "damaged"
  shutil.copytree(os.path.dirname(step_dir), damaged)
  meta = damaged / "global_step_1" / "meta" / "metadata"
  meta.write_bytes(meta.read_bytes()[:40])
  result = run_cli("-m", "jaxrlhf.export", "--checkpoint", damaged / "global_step_1", "--out", tmp_path / "o")
  assert_user_error(result, "python -m jaxrlhf.export", f"{damaged}/global_step_1", "cannot be read")
  assert not os.path.exists(tmp_path / "o")


def test_resuming_at_or_past_the_last_step_says_the_run_is_complete(trained_run, capsys):
  config, _ = trained_run
  config = config.copy_and_resolve_references()
  config.trainer.total_training_steps = 1
  config.trainer.resume_mode = "auto"
  assert Trainer(config, devices=jax.devices()[:1]).fit() == []
  assert (
    "already complete: the checkpoint at step 2 is at or past trainer.total_training_steps=1" in capsys.readouterr().out
  )


def test_auto_resume_sets_an_unreadable_latest_checkpoint_aside_and_takes_the_one_before(
  trained_run, tmp_path, caplog, capsys
):
  config, step_dir = trained_run
  config = config.copy_and_resolve_references()
  config.trainer.default_local_dir = str(tmp_path)
  config.trainer.resume_mode = "auto"
  run_dir = tmp_path / "quickstart" / "recall_ppo"
  shutil.copytree(os.path.dirname(step_dir), run_dir)
  meta = run_dir / "global_step_2" / "meta" / "metadata"  # JSON: read back, it was a JSONDecodeError naming no file
  meta.write_bytes(meta.read_bytes()[:40])
  trainer = Trainer(config, devices=jax.devices()[:1])
  checkpointer = Checkpointer(trainer.run_dir)
  with caplog.at_level("WARNING"):
    assert trainer.resume(checkpointer) == 1
  assert checkpointer.all_steps() == [1]
  checkpointer.close()
  message = " ".join(r.getMessage() for r in caplog.records)
  assert f"checkpoint {run_dir}/global_step_2 cannot be read" in message and "resuming from step 1" in message
  assert os.listdir(run_dir / "unreadable_global_step_2")  # kept as it was
  assert f"resumed from step 1: {run_dir}/global_step_1" in capsys.readouterr().out


def _training_steps(run_dir):
  return [
    int(r["training/global_step"])
    for r in read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    if "training/global_step" in r
  ]


@pytest.mark.slow
def test_a_truncated_file_in_the_latest_checkpoint_resumes_from_the_previous_one(tmp_path, caplog):
  config = small_config(
    tmp_path,
    **{
      "trainer.total_training_steps": 4,
      "trainer.save_freq": 2,
      "trainer.resume_mode": "auto",
      "trainer.val_before_train": False,
    },
  )
  Trainer(config, devices=jax.devices()[:1]).fit()
  run_dir = tmp_path / "quickstart" / "recall_ppo"
  data_files = [os.path.join(d, f) for d, _, names in os.walk(run_dir / "global_step_4" / "state") for f in names]
  largest = max(data_files, key=os.path.getsize)
  with open(largest, "r+b") as f:
    f.truncate(os.path.getsize(largest) // 2)

  config.trainer.total_training_steps = 6
  with caplog.at_level("WARNING"):
    history = Trainer(config, devices=jax.devices()[:1]).fit()
  assert [int(h["training/global_step"]) for h in history] == [3, 4, 5, 6]  # from step 2
  assert any(f"checkpoint {run_dir}/global_step_4 cannot be read" in r.getMessage() for r in caplog.records)
  assert os.path.isdir(run_dir / "unreadable_global_step_4")  # kept for a look, no longer a step
  assert _training_steps(run_dir) == [1, 2, 3, 4, 5, 6]
  checkpointer = Checkpointer(str(run_dir))
  assert checkpointer.all_steps() == [2, 4, 6]
  checkpointer.close()


def test_importing_jaxrlhf_and_transformers_without_torch_prints_nothing():
  """transformers says "PyTorch was not found. Models won't be available..." when imported without torch, which
  read as a failure at the top of every command of a user without torch; jaxrlhf turns that advisory off."""
  code = "import sys; sys.modules['torch'] = None; import jaxrlhf, transformers; transformers.AutoTokenizer"
  env = {k: v for k, v in subprocess_env().items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr[-2000:]
  shown = subprocess.run(
    [sys.executable, "-c", code.replace("import jaxrlhf, ", "import ")], env=env, capture_output=True, text=True
  )
  assert "PyTorch was not found" in shown.stderr  # what it turns off (here torch is made unimportable)
