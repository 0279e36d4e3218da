import os
import re
import subprocess
import sys

import pytest

from jaxrlhf import config as config_module
from jaxrlhf.config import ConfigError, get_base_config, resolve_config, validate_config
from tests.helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_base_config_is_valid_and_resolves_critic():
  config = resolve_config(get_base_config())
  assert config.critic.enable is True  # gae needs a critic
  assert config.critic.ppo_mini_batch_size == config.actor_rollout_ref.actor.ppo_mini_batch_size
  grpo = get_base_config()
  grpo.algorithm.adv_estimator = "grpo"
  assert resolve_config(grpo).critic.enable is False
  scaled = get_base_config()
  scaled.actor_rollout_ref.actor.loss_scale_factor = 4096.0
  assert resolve_config(scaled).critic.loss_scale_factor == 4096.0  # inherited from the actor, as verl


def test_unknown_key_fails_at_assignment_naming_it():
  config = get_base_config()
  with pytest.raises(AttributeError, match="ppo_mini_batch_sze"):
    config.actor_rollout_ref.actor.ppo_mini_batch_sze = 4


def test_wrong_type_names_the_key():
  config = get_base_config()
  with pytest.raises(TypeError):
    config.data.train_batch_size = "many"


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("data.truncation", "sideways", "data.truncation"),
    ("algorithm.kl_ctrl.type", "pid", "algorithm.kl_ctrl.type"),
    ("actor_rollout_ref.model.lora_rank", -1, "actor_rollout_ref.model.lora_rank' must be >= 0"),
    ("actor_rollout_ref.model.target_modules", ["q_proj", "wte"], "target_modules.*unknown.*wte"),
    ("critic.model.target_modules", "q_proj,lm_head", "the critic has no LM head"),
    ("data.train_batch_size", 10, "not divisible"),
    ("trainer.logger", ("console", "carrier_pigeon"), "carrier_pigeon"),
    ("actor_rollout_ref.rollout.temperature", 0.0, "do_sample=False for greedy"),
    ("data.gen_batch_size", 8, "data.gen_batch_size=8 must be >= data.train_batch_size=1024"),
    ("reward_model.enable", True, "reward_model.model.path"),
    ("trainer.prometheus_port", 70000, "trainer.prometheus_port"),
    ("actor_rollout_ref.rollout.n", 0, "actor_rollout_ref.rollout.n' must be >= 1"),
    (
      "reward_model.overlong_buffer.enable",
      True,
      "overlong_buffer.len=4096 must be in 1..data.max_response_length=512",
    ),
    ("reward_model.on_error", "ignore", "reward_model.on_error"),
    ("actor_rollout_ref.rollout.dtype", "float16", "actor_rollout_ref.rollout.dtype"),
    ("algorithm.rollout_correction.rollout_is", "tokens", "algorithm.rollout_correction.rollout_is"),
    ("algorithm.rollout_correction.loss_type", "ppo", "algorithm.rollout_correction.loss_type"),
    ("algorithm.rollout_correction.rollout_rs", "token_k9", "rollout_correction.rollout_rs: unknown option 'token_k9'"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "bypass_mode", "needs algorithm.rollout_correction.bypass_mode"),
    ("algorithm.adv_estimator", "gdpo", "needs algorithm.gdpo_reward_keys"),
    ("critic.model.override_config.hidden_size", 64, r"critic.model.override_config.\['hidden_size'\] are read only"),
    ("critic.model.logits_chunk_size", 512, "the critic has no LM head"),
    ("critic.forward_micro_batch_size_per_gpu", 0, "critic.forward_micro_batch_size_per_gpu' must be >= 1"),
    ("actor_rollout_ref.model.logits_chunk_size", -1, "logits_chunk_size' must be >= 0"),
  ],
)
def test_validation_errors_name_key_and_value(key, value, message):
  config = get_base_config()
  node = config
  *parents, leaf = key.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(config)


def test_dynamic_bsz_budget_must_hold_a_sequence():
  config = get_base_config()
  config.actor_rollout_ref.actor.use_dynamic_bsz = True
  config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 100
  with pytest.raises(ConfigError, match="ppo_max_token_len_per_gpu"):
    validate_config(config)


def test_dynamic_bsz_budget_counts_a_devices_share_under_sequence_parallelism():
  config = get_base_config()
  actor = config.actor_rollout_ref.actor
  actor.use_dynamic_bsz = True
  seq_len = config.data.max_prompt_length + config.data.max_response_length
  actor.ppo_max_token_len_per_gpu = seq_len // 2
  actor.ulysses_sequence_parallel_size = 2
  config.critic.enable = False
  validate_config(config)  # each of the 2 devices holds half a row
  config.critic.enable = True  # a critic without sp takes whole rows under the actor's budget
  with pytest.raises(ConfigError, match="ppo_max_token_len_per_gpu"):
    validate_config(config)
  actor.ppo_max_token_len_per_gpu = seq_len // 2 - 1
  config.critic.enable = False
  with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size 2"):
    validate_config(config)


def test_gae_without_critic_is_an_error():
  config = get_base_config()
  config.critic.enable = False
  with pytest.raises(ConfigError, match="critic.enable"):
    resolve_config(config)


def _train(*flags):
  env = subprocess_env()
  return subprocess.run(
    [sys.executable, "train.py", "--config", "configs/quickstart.py", *flags],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )


def test_cli_unknown_override_is_an_error_naming_the_key():
  result = _train("--config.actor_rollout_ref.actor.optim.lrr=3e-4")
  assert result.returncode != 0
  assert "lrr" in result.stderr


def test_cli_override_reaches_the_trainer(tmp_path):
  result = _train(
    "--config.actor_rollout_ref.actor.optim.lr=3e-4",
    "--config.trainer.total_training_steps=2",
    "--config.trainer.val_before_train=False",
    "--config.trainer.test_freq=-1",
    f"--config.trainer.default_local_dir={tmp_path}",
    "--config.trainer.logger=('console','jsonl','tensorboard')",
    "--config.trainer.profile_steps=(2,)",
  )
  assert result.returncode == 0, result.stderr[-2000:]
  import json

  run_dir = tmp_path / "quickstart" / "recall_ppo"
  with open(run_dir / "metrics.jsonl") as f:
    record = json.loads(f.readline())
  assert record["actor/lr"] == pytest.approx(3e-4)
  assert "step 2/2" in result.stdout and "mesh {'data': 1" in result.stdout  # console line, layout report
  assert any(name.startswith("events.out.tfevents") for name in os.listdir(run_dir / "tensorboard"))
  assert any(files for _, _, files in os.walk(run_dir / "profile"))
  assert (run_dir / "metrics.png").exists()


def test_critic_mini_batch_must_divide_the_train_batch():
  config = get_base_config()
  config.critic.ppo_mini_batch_size = 384
  with pytest.raises(ConfigError, match="critic.ppo_mini_batch_size=384"):
    resolve_config(config)


def test_micro_batch_not_dividing_the_mini_batch_is_a_startup_error(tmp_path):
  import jax

  from jaxrlhf.trainer import Trainer
  from tests.helpers import small_config

  config = small_config(tmp_path, **{"mesh.fsdp": 1, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 3})
  with pytest.raises(ConfigError, match=r"ppo_micro_batch_size_per_gpu=3 x 1 batch shards = 3 rows does not divide"):
    Trainer(config, devices=jax.devices()[:1])


def test_rollout_dtype_follows_the_actor_unless_set():
  config = get_base_config()
  config.actor_rollout_ref.model.dtype = "bfloat16"
  assert resolve_config(config).actor_rollout_ref.rollout.dtype == "bfloat16"
  config.actor_rollout_ref.rollout.dtype = "float32"
  assert resolve_config(config).actor_rollout_ref.rollout.dtype == "float32"


def _set(config, key, value):
  node = config
  *parents, leaf = key.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = value


@pytest.mark.parametrize("key", sorted(config_module._registry_choices()))
def test_every_registry_choice_key_names_key_value_and_choices(key):
  config = get_base_config()
  _set(config, key, "no_such_choice")
  choices = config_module._registry_choices()[key]
  with pytest.raises(ConfigError, match=f"'{key}' must be one of .*{choices[0]}.*got 'no_such_choice'"):
    validate_config(config)


def test_choices_come_from_the_registries_so_registered_names_are_accepted():
  from jaxrlhf import algos

  config = get_base_config()
  config.algorithm.adv_estimator = "test_my_estimator"
  with pytest.raises(ConfigError, match="test_my_estimator"):
    validate_config(config)
  algos.register_adv_estimator("test_my_estimator")(lambda **kwargs: None)
  try:
    validate_config(config)
  finally:
    algos.ADV_ESTIMATORS.functions.pop("test_my_estimator")


@pytest.mark.parametrize("key", sorted(config_module.NOT_IMPLEMENTED))
def test_keys_read_by_nothing_refuse_other_values_saying_what_happens_instead(key):
  default, instead = config_module.NOT_IMPLEMENTED[key]
  config = get_base_config()
  if isinstance(default, bool):
    other = not default
  elif isinstance(default, int):
    other = default + 8
  elif key.startswith("algorithm.rollout_correction."):
    other = "token"  # a string option (a valid rollout_is choice)
  else:
    other = 4 if default is None else "vllm"
  _set(config, key, other)
  with pytest.raises(ConfigError, match=f"'{key}'=.* is not implemented") as info:
    validate_config(config)
  assert instead in str(info.value)


@pytest.mark.parametrize(
  "key,value,expected",
  [
    ("critic.ppo_epochs", 0, ">= 1"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 0, ">= 1"),
    ("trainer.total_training_steps", 0, ">= 1"),
    ("algorithm.gamma", 1.5, "in [0, 1]"),
    ("actor_rollout_ref.actor.clip_ratio_c", 1.0, "> 1"),
    ("actor_rollout_ref.actor.optim.lr", float("inf"), "finite"),
    ("actor_rollout_ref.rollout.temperature", float("nan"), "finite"),
    ("actor_rollout_ref.rollout.top_p", 0.0, "(0, 1]"),
    ("actor_rollout_ref.rollout.top_k", -2, ">= -1"),
    ("actor_rollout_ref.rollout.val_kwargs.top_p", 1.5, "(0, 1]"),
  ],
)
def test_numeric_ranges_name_the_key_and_the_range(key, value, expected):
  config = get_base_config()
  _set(config, key, value)
  with pytest.raises(ConfigError, match=re.escape(key) + ".*" + re.escape(expected)):
    validate_config(config)


def test_greedy_validation_may_have_temperature_zero_but_sampling_may_not():
  config = get_base_config()
  config.actor_rollout_ref.rollout.val_kwargs.temperature = 0.0  # do_sample=False by default: greedy
  validate_config(config)
  config.actor_rollout_ref.rollout.val_kwargs.do_sample = True
  with pytest.raises(ConfigError, match="val_kwargs.temperature' must be > 0 when do_sample=True"):
    validate_config(config)


def test_loading_a_config_file_does_not_load_jax():
  """`python -m jaxrlhf.aot` reads the config before it sets up the target's environment, which JAX reads
  when it loads: a config file (and jaxrlhf.config) must not import it."""
  code = (
    "import sys; from jaxrlhf.config import load_config_file; "
    "load_config_file('configs/grpo_gsm8k_qwen2_5_7b.py'); print('jax' in sys.modules)"
  )
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_gdpo_needs_one_weight_per_component():
  config = get_base_config()
  config.algorithm.adv_estimator = "gdpo"
  config.algorithm.gdpo_reward_keys = ("format", "acc")
  config.algorithm.gdpo_reward_weights = (1.0,)
  with pytest.raises(ConfigError, match=r"gdpo_reward_weights' has 1 weights for 2"):
    validate_config(config)
