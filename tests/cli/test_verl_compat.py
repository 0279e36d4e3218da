"""verl command lines run unchanged (README "verl command lines"): `jaxrlhf.verl_compat` and train.py's key=value.

The three scripts in verl_scripts/ have the shape of verl's PPO (critic), GRPO and DAPO examples. Each
must resolve to the same config as the `--config.` command `python -m jaxrlhf.verl_compat` prints for
it; an ignored key is reported, an unknown one fails naming it; and a printed command runs (1 step).
"""

import json
import os
import shlex
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from jaxrlhf import verl_compat
from jaxrlhf.config import get_base_config, resolve_config
from jaxrlhf.errors import UserError
from tests.cli.test_bad_input import MODEL, assert_user_error, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "cli", "verl_scripts")
ENV = {"HOME": "/home/user"}  # the scripts' $HOME, fixed so the expected paths are known


def _command_args(command: str) -> list[str]:
  """The flags of a printed `python train.py ...` command, as the shell would pass them."""
  words = shlex.split(command.replace("\\\n", " "))
  assert words[:2] == ["python", "train.py"], words[:2]
  return words[2:]


def _config_from_flags(args: list[str]):
  """What train.py's absl + ml_collections parsing makes of `--config FILE --config.key=value ...`."""
  flag_values = flags.FlagValues()
  argv = ["train.py", *[arg.replace("configs/", os.path.join(ROOT, "configs") + "/", 1) for arg in args]]
  config = config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=True,
                                           sys_argv=argv)
  flag_values(argv)
  return config.value


@pytest.mark.parametrize("script, expected", [
    ("ppo_gae_qwen2_7b.sh", {"algorithm.adv_estimator": "gae", "critic.optim.lr": 1e-5, "mesh.tensor": 2,
                             "mesh.fsdp": 4, "data.train_files": ("/home/user/data/gsm8k/train.parquet",),
                             "trainer.logger": ("console", "wandb"), "critic.enable": True}),
    ("grpo_qwen2_7b.sh", {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 5,
                          "actor_rollout_ref.ref.fsdp_config.param_offload": True, "critic.enable": False,
                          "actor_rollout_ref.rollout.tensor_model_parallel_size": 2}),
    ("dapo_qwen2_5_32b.sh", {"data.gen_batch_size": 1536, "data.max_response_length": 20480,
                             "actor_rollout_ref.actor.clip_ratio_high": 0.28, "mesh.tensor": 4, "mesh.fsdp": 32,
                             "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 22528,
                             "trainer.default_local_dir": "/home/user/verl/ckpts/DAPO/DAPO-Qwen2.5-32B",
                             "algorithm.filter_groups.enable": True,
                             "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 8,
                             "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 8}),
])
def test_verl_script_resolves_like_its_config_flags(script, expected):
  command, report, parsed = verl_compat.translate_script(os.path.join(SCRIPTS, script), env=ENV)
  assert not parsed.missing and not report.unresolved
  via_flags = resolve_config(_config_from_flags(_command_args(command)))
  via_verl = get_base_config()
  verl_compat.apply_overrides(via_verl, parsed.overrides)
  via_verl = resolve_config(via_verl)
  assert via_verl.to_dict() == via_flags.to_dict()
  for key, value in expected.items():
    node = via_verl
    for part in key.split("."):
      node = node[part]
    assert node == value, key
  ignored = {key for key, _, _ in report.ignored}
  assert "actor_rollout_ref.rollout.gpu_memory_utilization" in ignored


def test_values_follow_hydra():
  assert verl_compat.parse_value("null") is None
  assert verl_compat.parse_value("True") is True and verl_compat.parse_value("false") is False
  assert verl_compat.parse_value("1e-6") == 1e-6 and verl_compat.parse_value("0.") == 0.0
  assert verl_compat.parse_value("-1") == -1
  assert verl_compat.parse_value("['a', \"b\",c]") == ["a", "b", "c"]
  assert verl_compat.parse_value("'error'") == "error"
  config = get_base_config()
  verl_compat.apply_overrides(config, ["+data.val_batch_size=null", "data.train_files=/d/train.parquet",
                                       "actor_rollout_ref.actor.optim.lr=1", "trainer.experiment_name=123"])
  assert config.data.val_batch_size is None and config.data.train_files == ("/d/train.parquet",)
  assert config.actor_rollout_ref.actor.optim.lr == 1.0 and config.trainer.experiment_name == "123"
  with pytest.raises(UserError, match="'data.train_batch_size' expects int, got 'many'"):
    verl_compat.apply_overrides(get_base_config(), ["data.train_batch_size=many"])
  with pytest.raises(UserError, match="unknown config key 'trainer.total_trainig_steps'.*did you mean "
                                      "'trainer.total_training_steps'"):
    verl_compat.apply_overrides(get_base_config(), ["trainer.total_trainig_steps=3"])


def test_unresolved_variable_is_left_to_the_shell(tmp_path):
  script = tmp_path / "run.sh"
  script.write_text("python3 -m verl.trainer.main_ppo \\\n  data.train_batch_size=$BSZ \\\n  trainer.nnodes=1 $@\n")
  command, report, parsed = verl_compat.translate_script(str(script), env={})
  assert parsed.missing == {"BSZ"}
  assert '--config.data.train_batch_size="$BSZ"' in command
  assert [key for key, _, _ in report.unresolved] == ["data.train_batch_size"]


def test_unknown_verl_key_fails_naming_it():
  result = run_cli(os.path.join(ROOT, "train.py"), "data.train_batch_size=8", "trainer.total_trainig_steps=1")
  assert_user_error(result, "train.py", "'trainer.total_trainig_steps'", "did you mean 'trainer.total_training_steps'")


def _tiny_fixture(root):
  """A tiny HF model directory and recall-task parquet files (GSM8K's `####` answers, data_source)."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  from tests.cli.test_bad_input import _write_hf_model
  from jaxrlhf.data.builtin import recall_rows
  model = _write_hf_model(root / "model", MODEL.num_hidden_layers)
  pq.write_table(pa.Table.from_pylist(recall_rows("train")[:64]), root / "train.parquet")
  return model


VERL_TINY = """\
# verl's GRPO example in shape, on a tiny local model and data
DATA={root}
MODEL_PATH=$DATA/model
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$DATA/train.parquet \\
    data.train_batch_size=4 \\
    data.max_prompt_length=16 \\
    data.max_response_length=4 \\
    data.truncation='error' \\
    actor_rollout_ref.model.path=$MODEL_PATH \\
    actor_rollout_ref.actor.optim.lr=1e-3 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.rollout.n=2 \\
    trainer.logger='["console"]' \\
    trainer.project_name=verl_tiny \\
    trainer.experiment_name={name} \\
    trainer.default_local_dir=$DATA/runs \\
    trainer.total_training_steps=1 \\
    trainer.val_before_train=False \\
    trainer.n_gpus_per_node=2 \\
    trainer.nnodes=1 $@
"""


@pytest.mark.slow
def test_printed_command_and_verl_args_both_train(tmp_path):
  """The command jaxrlhf.verl_compat prints runs 1 step; so does train.py given the verl overrides as they are."""
  _tiny_fixture(tmp_path)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
  script = tmp_path / "run_tiny.sh"
  script.write_text(VERL_TINY.format(root=tmp_path, name="translated"))
  printed = subprocess.run([sys.executable, "-m", "jaxrlhf.verl_compat", str(script)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
  assert printed.returncode == 0, printed.stderr[-2000:]
  command = printed.stdout.split("\n\n")[0]
  assert command.startswith("python train.py \\\n    --config configs/verl_defaults.py")
  assert "--config.mesh.tensor=2" in command and "--config.mesh.fsdp=1" in command
  assert "actor_rollout_ref.rollout.name=vllm  ->  vLLM" in printed.stdout
  translated = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
  assert translated.returncode == 0, translated.stderr[-3000:]

  _, _, parsed = verl_compat.translate_script(str(script))
  direct_args = [arg.replace("experiment_name=translated", "experiment_name=direct") for arg in parsed.overrides]
  direct = subprocess.run([sys.executable, "train.py", *direct_args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
  assert direct.returncode == 0, direct.stderr[-3000:]
  assert "ignored 2 verl key(s)" in direct.stdout
  assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.6: vLLM's KV-cache share" in direct.stdout

  runs = tmp_path / "runs" / "verl_tiny"
  configs = {name: json.loads((runs / name / "config.json").read_text()) for name in ("translated", "direct")}
  for config in configs.values():
    assert config["mesh"] == {"data": 1, "fsdp": 1, "tensor": 2}
    assert config["algorithm"]["adv_estimator"] == "grpo" and config["actor_rollout_ref"]["rollout"]["n"] == 2
    assert config["data"]["train_files"] == [str(tmp_path / "train.parquet")]
    config["trainer"].pop("experiment_name")
  assert configs["translated"] == configs["direct"]
  for result in (translated, direct):
    assert "done: 1 records" in result.stdout, result.stdout[-2000:]
