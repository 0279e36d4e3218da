"""verl command lines run unchanged (README "verl command lines"): `jaxrlhf.verl_compat` and train.py's key=value.

The scripts in verl_scripts/ are written here in the shape of verl's examples and recipes (PPO with a critic,
GRPO, DAPO, multi-node SLURM jobs, the bash verl's newer recipes use). Each must resolve to the same config
as the command `python -m jaxrlhf.verl_compat` prints for it, read as train.py reads it: the `--config.`
flags, then the verl overrides after them (`key=null`, values only the shell knows). Ignored keys are
reported with a reason, refused ones and unknown ones fail, all in one message; scripts the reader cannot
read fail naming the line (verl_scripts/unreadable/). Only the last test compiles (a printed command runs 1 step).
"""

import json
import os
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from jaxrlhf import verl_compat
from jaxrlhf.config import get, get_base_config, resolve_config
from jaxrlhf.errors import UserError
from tests.cli.test_bad_input import MODEL, assert_user_error, run_cli
from tests.helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "cli", "verl_scripts")
ENV = {"HOME": "/home/user"}  # the scripts' $HOME, fixed so the expected paths are known


def _script(name):
  return os.path.join(SCRIPTS, name)


def _shell_words(command: str, env: dict | None = None) -> list[str]:
  """The arguments bash passes to `python train.py` for a printed command (with `env` as the shell's)."""
  assert command.startswith("python train.py"), command[:40]
  args = command[len("python train.py") :]
  result = subprocess.run(
    ["bash", "-c", "printf '%s\\0' " + args],
    env={"PATH": "/usr/bin:/bin", **(env or {})},
    capture_output=True,
    text=True,
    check=True,
  )
  return result.stdout.split("\0")[:-1]


def _config_from_flags(args: list[str]):
  """What train.py's absl + ml_collections parsing makes of `--config FILE --config.key=value ...`."""
  flag_values = flags.FlagValues()
  argv = ["train.py", *[arg.replace("configs/", os.path.join(ROOT, "configs") + "/", 1) for arg in args]]
  config = config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=True, sys_argv=argv)
  flag_values(argv)
  return config.value


def _config_from_command(command: str, env: dict | None = None):
  """The config train.py runs with for a printed command: its flags, then its verl overrides."""
  verl_args, flag_args = verl_compat.split_overrides(_shell_words(command, env))
  config = _config_from_flags(flag_args)
  verl_compat.apply_overrides(config, verl_args)
  return config


def _via_overrides(script):
  """The config train.py runs with given the script's verl overrides as they are (verl's own command line)."""
  config = get_base_config()
  verl_compat.apply_overrides(config, [str(word) for word in script.overrides])
  return config


@pytest.mark.parametrize(
  "script, expected",
  [
    (
      "ppo_gae_qwen2_7b.sh",
      {
        "algorithm.adv_estimator": "gae",
        "critic.optim.lr": 1e-5,
        "mesh.tensor": 1,
        "mesh.fsdp": 8,
        "data.train_files": ("/home/user/data/gsm8k/train.parquet",),
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
        "trainer.logger": ("console", "wandb"),
        "critic.enable": True,
      },
    ),
    (
      "grpo_qwen2_7b.sh",
      {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.rollout.n": 5,
        "actor_rollout_ref.ref.fsdp_config.param_offload": True,
        "critic.enable": False,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
        "mesh.tensor": 1,
      },
    ),
    (
      "dapo_qwen2_5_32b.sh",
      {
        "data.gen_batch_size": 1536,
        "data.max_response_length": 20480,
        "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        "mesh.tensor": 1,
        "mesh.fsdp": 128,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 22528,
        "trainer.default_local_dir": "/home/user/verl/ckpts/DAPO/DAPO-Qwen2.5-32B",
        "algorithm.filter_groups.enable": True,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 8,
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 8,
      },
    ),
    # Generation TP is not training TP: verl's 72B GRPO (rollout TP 16 on 2 x 8 GPUs) trains FSDP on 16.
    (
      "generation_tp.sh",
      {"mesh.tensor": 1, "mesh.fsdp": 16, "mesh.data": 1, "actor_rollout_ref.rollout.tensor_model_parallel_size": 16},
    ),
    (
      "reader_constructs.sh",
      {
        "data.train_files": ("/home/user/data/math/train.parquet",),
        "data.val_files": ("/home/user/data/math/test.parquet", "/home/user/data/aime/test.parquet"),
        "data.max_prompt_length": 2048,
        "data.max_response_length": 8192,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 20480,  # $(( (a + b) * 2 ))
        "actor_rollout_ref.model.path": "Qwen/Qwen2.5-3B-Instruct",
        "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
        "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.rollout.temperature": 1.0,  # the elif; $SAMPLING split
        "trainer.experiment_name": "gspo-Qwen2.5-3B-Instruct-n8",
        "mesh.fsdp": 16,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
      },
    ),  # `[ -z "$X" ] && X=...`
    (
      "deprecated_micro_batch.sh",
      {  # 2 x 8 GPUs: verl divides by GPUs / Ulysses SP
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 64 // (16 // 2),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 128 // (16 // 2),
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 256 // (16 // 2),  # ref's SP: the actor's
        "critic.ppo_micro_batch_size_per_gpu": 32 // 16,
        "critic.forward_micro_batch_size_per_gpu": 64 // 16,
        "actor_rollout_ref.actor.grad_clip": 0.5,
        "critic.grad_clip": 2.0,
      },
    ),
    (
      "dapo_reward_kwargs.sh",
      {
        "reward_model.overlong_buffer.enable": True,
        "reward_model.overlong_buffer.len": 4096,
        "reward_model.overlong_buffer.penalty_factor": 1.0,
        "algorithm.filter_groups.metric": "score",
        "actor_rollout_ref.actor.grad_clip": 1.0,
        "trainer.profile_steps": (1, 3),
        "trainer.logger": ("console", "jsonl"),
      },
    ),
    (
      "script_arguments.sh",
      {  # ${1:-4}; "${@:2}" and "${A[@]:1}" give what bash gives; `key=` is ''
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
        "trainer.experiment_name": "trtllm-qwen2-7b-tp4-8gpus",
        "trainer.resume_from_path": "",
        "data.train_files": ("/home/user/data/gsm8k/train.parquet", "/home/user/data/math/train.parquet"),
        "trainer.save_freq": 20,
        "trainer.test_freq": 5,
        "trainer.total_epochs": 15,
      },
    ),
    (
      "hybrid_shard.sh",
      {  # fsdp_size=32 of 64 GPUs: groups of 32 (SP 4, rollout TP 4 inside), 2 replicas
        "mesh.data": 2,
        "mesh.fsdp": 32,
        "mesh.tensor": 1,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 4,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
      },
    ),
    (
      "ppo_otb_keys.sh",
      {
        "algorithm.adv_estimator": "optimal_token_baseline",
        "mesh.data": 1,
        "mesh.fsdp": 8,
        "trainer.max_actor_ckpt_to_keep": 2,
      },
    ),  # one checkpoint holds actor and critic
    # verl's Megatron MoE GRPO (Qwen3-30B-A3B, 4 x 8 GPUs): TP 4 is mesh.tensor, PP 4 and EP 4 stay on fsdp
    (
      "grpo_qwen3moe_30b_megatron.sh",
      {
        "mesh.data": 1,
        "mesh.fsdp": 8,
        "mesh.tensor": 4,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
        "actor_rollout_ref.model.path": "Qwen/Qwen3-30B-A3B",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1,
      },
    ),
    (
      "dapo_qwen3moe_megatron_overrides.sh",
      {  # 2 x 8 GPUs, TP 2 (PP 2, CP 2 and EP 8 on the fsdp axis); CP 2 is Ulysses 2
        "mesh.data": 1,
        "mesh.fsdp": 8,
        "mesh.tensor": 2,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2,
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 2,
        "actor_rollout_ref.actor.fsdp_config.param_offload": True,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
        "actor_rollout_ref.ref.fsdp_config.param_offload": True,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "actor_rollout_ref.model.remat_policy": "full",
        "actor_rollout_ref.model.override_config.router_aux_loss_coef": 0.001,
        "actor_rollout_ref.model.override_config.output_router_logits": True,
        "actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine",
        "actor_rollout_ref.actor.optim.min_lr_ratio": 1e-7 / 1e-6,
      },
    ),
  ],
)
def test_verl_script_resolves_like_its_printed_command(script, expected):
  command, report, parsed = verl_compat.translate_script(_script(script), env=ENV)
  assert not parsed.missing and not report.unresolved and not report.deferred
  via_command = resolve_config(_config_from_command(command))
  via_verl = resolve_config(_via_overrides(parsed))
  assert via_verl.to_dict() == via_command.to_dict()
  for key, value in expected.items():
    assert get(via_verl, key) == value, key


def test_reader_reports_what_it_did_not_translate():
  _, report, script = verl_compat.translate_script(_script("reader_constructs.sh"), env=ENV)
  assert script.script_args and not script.passthrough  # "$@"; `2>&1 | tee` is not part of the command
  assert any("$@" in note for note in report.notes)
  ignored = {key: raw for key, raw, _ in report.ignored}
  assert ignored == {
    "data.return_raw_chat": "True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "30720",
  }


def test_verls_engine_switches_are_ignored_with_their_reasons():
  _, report, _ = verl_compat.translate_script(_script("ppo_otb_keys.sh"), env=ENV)
  ignored = {key: reason for key, _, reason in report.ignored}
  assert "optimal_token_baseline" in ignored["actor_rollout_ref.actor.calculate_sum_pi_squared"]
  assert "PrefixGrouper" in ignored["actor_rollout_ref.actor.use_prefix_grouper"]
  assert {
    "actor_rollout_ref.model.mtp.enable",
    "actor_rollout_ref.model.mtp.enable_train",  # inert: mtp off
    "actor_rollout_ref.model.lora_adapter_path",
    "data.custom_cls.path",
    "actor_rollout_ref.model.lora.merge",
    "actor_rollout_ref.rollout.over_sample_rate",
    "critic.model.fsdp_config.fsdp_size",
  } <= set(ignored)
  _, report, _ = verl_compat.translate_script(_script("hybrid_shard.sh"), env=ENV)
  ignored = {key for key, _, _ in report.ignored}
  assert {
    "actor_rollout_ref.ref.strategy",
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking",
    "actor_rollout_ref.rollout.multi_stage_wake_up",
  } <= ignored


@pytest.mark.parametrize(
  "overrides, mesh, reported",
  [
    # verl's hybrid sharding: groups of k GPUs -> mesh.fsdp = k, mesh.data = GPUs / k
    (
      ["trainer.n_gpus_per_node=8", "trainer.nnodes=2", "actor_rollout_ref.actor.fsdp_config.fsdp_size=8"],
      {"mesh.data": 2, "mesh.fsdp": 8},
      None,
    ),
    (
      ["trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1"],  # verl's default
      {"mesh.data": 1, "mesh.fsdp": 8},
      None,
    ),
    (
      ["trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.fsdp_config.fsdp_size=16"],  # k >= GPUs: one group
      {"mesh.data": 1, "mesh.fsdp": 8},
      None,
    ),
    (["actor_rollout_ref.actor.fsdp_config.fsdp_size=8"], {"mesh.data": -1, "mesh.fsdp": 8}, None),  # data fills
    (["actor_rollout_ref.actor.fsdp_config.fsdp_size=-1"], {"mesh.data": 1, "mesh.fsdp": -1}, None),  # untouched
    # Ulysses SP 8 does not fit in a group of 4: full sharding, reported
    (
      [
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=2",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size=4",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=8",
      ],
      {"mesh.data": 1, "mesh.fsdp": 16},
      "full sharding over 16 GPUs kept",
    ),
    (
      [
        "trainer.n_gpus_per_node=8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size=2",
      ],
      {"mesh.data": 1, "mesh.fsdp": 8},
      "full sharding over 8 GPUs kept",
    ),
  ],
)
def test_hybrid_sharding_becomes_the_data_axis(overrides, mesh, reported):
  config = get_base_config()
  report = verl_compat.apply_overrides(config, overrides)
  assert {key: get(config, key) for key in mesh} == mesh
  dropped = [reason for key, _, reason in report.ignored if key.endswith("fsdp_size")]
  assert len(dropped) == (reported is not None) and all(reported in reason for reason in dropped)


def test_megatron_scripts_print_why_each_megatron_key_folds():
  """Pipeline and expert parallelism fold into the mesh, Megatron's engine settings are ignored: each with its
  reason, naming the key; the translated rows name the keys they came from."""
  _, report, _ = verl_compat.translate_script(_script("grpo_qwen3moe_30b_megatron.sh"), env=ENV)
  ignored = {key: reason for key, _, reason in report.ignored}
  assert "folded into FSDP" in ignored["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"]
  assert "expert parallelism is not built yet" in ignored["actor_rollout_ref.actor.megatron.expert_model_parallel_size"]
  assert "one mesh for every model" in ignored["actor_rollout_ref.ref.megatron.tensor_model_parallel_size"]
  assert "model.path" in ignored["actor_rollout_ref.actor.megatron.dist_checkpointing_path"]
  assert "one strategy" in ignored["actor_rollout_ref.actor.strategy"]
  assert "--config-name" in ignored  # ppo_megatron_trainer: verl's defaults
  rows = {key: became for key, _, became in report.translated}
  mesh_row = next(key for key in rows if "megatron.tensor_model_parallel_size" in key)
  assert "trainer.n_gpus_per_node" in mesh_row and rows[mesh_row] == "mesh.tensor=4, mesh.fsdp=8"

  _, report, _ = verl_compat.translate_script(_script("dapo_qwen3moe_megatron_overrides.sh"), env=ENV)
  ignored = {key: reason for key, _, reason in report.ignored}
  transformer = "actor_rollout_ref.actor.megatron.override_transformer_config"
  assert "Megatron-core's kernels" in ignored[f"{transformer}.moe_grouped_gemm"]
  assert "recomputes each layer" in ignored[f"{transformer}.recompute_method"]
  assert "gradient reduction" in ignored["actor_rollout_ref.actor.megatron.override_ddp_config.grad_reduce_in_fp32"]
  assert (
    "fsdp_config.optimizer_offload"
    in ignored["actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload"]
  )
  assert "gradients stay on the devices" in ignored["actor_rollout_ref.actor.megatron.grad_offload"]
  rows = {key: became for key, _, became in report.translated}
  assert "num_hidden_layers / num_experts_per_tok" in rows[f"{transformer}.moe_aux_loss_coeff"]  # the scale differs


@pytest.mark.parametrize(
  "overrides, expected",
  [
    # TP without the GPU count: mesh.tensor, the fsdp axis filled at start-up
    (["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"], {"mesh.tensor": 2, "mesh.fsdp": -1}),
    # the reference's own context parallelism sets its Ulysses size
    (
      [
        "actor_rollout_ref.actor.megatron.context_parallel_size=4",
        "actor_rollout_ref.ref.megatron.context_parallel_size=2",
        "critic.megatron.context_parallel_size=2",
      ],
      {
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 4,
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 2,
        "critic.ulysses_sequence_parallel_size": 2,
      },
    ),
    (
      ["+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=selective"],
      {
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "actor_rollout_ref.model.remat_policy": "dots_saveable",
      },
    ),
    (
      [
        "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.01",
        "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_load_balancing_type=none",
      ],
      {
        "actor_rollout_ref.model.override_config.router_aux_loss_coef": 0.0,
        "actor_rollout_ref.model.override_config.output_router_logits": False,
      },
    ),
    (
      ["critic.megatron.param_offload=True", "critic.megatron.optimizer_offload=True"],
      {"critic.model.fsdp_config.param_offload": True, "critic.model.fsdp_config.optimizer_offload": True},
    ),
    (  # verl's R3: the rollout's routes replayed (the rollout key is jaxrlhf's own; the Megatron mode adds nothing)
      [
        "actor_rollout_ref.actor.megatron.router_replay.mode=R3",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
      ],
      {"actor_rollout_ref.rollout.enable_rollout_routing_replay": True},
    ),
  ],
)
def test_megatron_keys_translate(overrides, expected):
  config = get_base_config()
  verl_compat.apply_overrides(config, overrides)
  assert {key: get(config, key) for key in expected} == expected


def test_checkpoints_to_keep_count_actor_and_critic_together():
  def kept(*overrides):
    return verl_compat.plan(list(overrides), get_base_config()).assignments["trainer.max_actor_ckpt_to_keep"]

  assert kept("trainer.max_actor_ckpt_to_keep=3", "trainer.max_critic_ckpt_to_keep=1") == 3
  assert kept("trainer.max_critic_ckpt_to_keep=2", "trainer.max_actor_ckpt_to_keep=1") == 2
  assert kept("trainer.max_critic_ckpt_to_keep=2") is None  # verl keeps every actor checkpoint then


def test_generation_tp_keeps_training_fsdp():
  _, report, _ = verl_compat.translate_script(_script("generation_tp.sh"), env=ENV)
  assert "mesh.tensor" not in report.assignments
  assert report.assignments.get("actor_rollout_ref.rollout.multi_turn.format") == "hermes"  # translated (issue 35)
  with pytest.raises(UserError, match=r"tensor_model_parallel_size=3 must divide the 16 GPUs"):
    verl_compat.apply_overrides(
      get_base_config(),
      ["actor_rollout_ref.rollout.tensor_model_parallel_size=3", "trainer.n_gpus_per_node=8", "trainer.nnodes=2"],
    )


@pytest.mark.parametrize("nodes", [2, 4])
def test_values_only_the_shell_knows_reach_the_command_and_translate_when_it_runs(nodes):
  command, report, script = verl_compat.translate_script(_script("slurm_multinode.sh"), env=ENV)
  assert script.missing == {"SLURM_JOB_NUM_NODES", "CHECKPOINT_ROOT"}
  assert 'trainer.nnodes="${SLURM_JOB_NUM_NODES}"' in command.split()
  assert 'trainer.default_local_dir="$CHECKPOINT_ROOT/gsm8k"' in command.split()
  assert "--config.mesh" not in command  # the mesh depends on the node count: train.py sizes it when it runs
  deferred = {key for key, _, _ in report.deferred}
  assert {
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "actor_rollout_ref.actor.ppo_micro_batch_size",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
  } <= deferred
  config = _config_from_command(command, {"SLURM_JOB_NUM_NODES": str(nodes), "CHECKPOINT_ROOT": "/ckpt"})
  gpus = 8 * nodes
  assert (config.mesh.fsdp, config.mesh.tensor) == (gpus, 1)
  assert config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 64 // gpus
  assert config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 128 // gpus
  assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
  assert config.trainer.default_local_dir == "/ckpt/gsm8k"


def test_null_reaches_train_py_as_none_for_every_type():
  command, _, _ = verl_compat.translate_script(_script("null_values.sh"), env=ENV)
  assert "data.val_batch_size=null" in command.split() and "--config.data.val_batch_size" not in command
  config = _config_from_command(command)
  base = get_base_config()
  keys = [
    "data.val_batch_size",
    "data.val_files",
    "actor_rollout_ref.rollout.dtype",
    "actor_rollout_ref.actor.clip_ratio_high",
    "critic.enable",
    "trainer.total_training_steps",
    "trainer.max_actor_ckpt_to_keep",
  ]
  assert get(base, "data.val_files") is not None  # a tuple with a default, not only placeholders
  for key in keys:
    assert get(config, key) is None, key
  assert config.trainer.profile_steps == ()  # global_profiler.steps=null: no step profiled


def test_refused_families_and_unknown_keys_in_one_message():
  with pytest.raises(UserError) as caught:
    verl_compat.translate_script(_script("refused_families.sh"), env=ENV)
  lines = str(caught.value).splitlines()
  assert lines[0] == "5 problems with the verl overrides:"
  body = "\n".join(lines[1:])
  assert not any("Megatron-LM" in line for line in lines)  # its Megatron parallelism translates
  assert sum("refused (MoE routing replay)" in line for line in lines) == 1  # verl's two switches, one line
  assert "replays the rollout's own routes" in body
  assert "[actor_rollout_ref.actor.megatron.router_replay.mode=R2 and 1 more]" in body
  assert "refused (vision-language)" in body and "[data.image_key]" in body
  assert "refused (reward manager): PRIME's reward manager" in body
  assert "unknown config key 'trainer.total_trainig_steps'" in body
  assert "did you mean 'trainer.total_training_steps'" in body
  unknown_pipeline = next(line for line in lines if "'critic.pipeline_model_parallel_size'" in line)
  assert "did you mean" not in unknown_pipeline


@pytest.mark.parametrize(
  "overrides, message",
  [
    (["reward_model.reward_manager=collabllm"], r"refused \(reward manager\): CollabLLM.*no user simulator"),
    (["reward_model.reward_manager=remote"], r"refused \(reward manager\): reward manager 'remote'"),
    (["actor_rollout_ref.rollout.agent.default_agent_loop=react_agent"], r"default_agent_loop"),
    (["actor_rollout_ref.actor.megatron.router_replay.mode=R2"], r"refused \(MoE routing replay\).*\(R3\)"),
    (
      ["+actor_rollout_ref.actor.megatron.override_transformer_config.moe_expert_capacity_factor=1.25"],
      r"refused \(Megatron-LM\): experts with a capacity.*dropless",
    ),
    (["actor_rollout_ref.actor.optim.lr_decay_style=WSD"], r"refused \(optimizer\): Megatron's lr_decay_style='WSD'"),
    (["+actor_rollout_ref.actor.megatron.override_mcore_model_config.num_layers=2"], r"refused \(Megatron-LM\)"),
    (
      [
        "actor_rollout_ref.actor.megatron.context_parallel_size=2",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
      ],
      r"ulysses_sequence_parallel_size=4 differs",
    ),
    (["reward_model.model.input_tokenizer=Qwen/Qwen2-7B-Instruct"], r"refused \(reward model tokenizer\)"),
    (["trainer.logger=['console','wandbb']"], r"unknown logger 'wandbb'"),
    (['trainer.logger=["console","wandb"'], r"'trainer.logger'.*an unclosed \[\] list"),
    (["trainer.logger='console"], r"'trainer.logger'.*an unclosed ' quote"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size=4"], r"ppo_micro_batch_size=4 sequences over 8 data-parallel"),
    (
      ["actor_rollout_ref.actor.ppo_micro_batch_size=64", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"],
      r"both actor_rollout_ref.actor.ppo_micro_batch_size and .*_per_gpu are set",
    ),
    (
      ["data.max_response_length=1024", "reward_model.reward_kwargs.max_resp_len=2048"],
      r"max_resp_len=2048 differs from data.max_response_length=1024",
    ),
    (
      ["actor_rollout_ref.model.lora_adapter_path=/ckpt/lora_adapter"],
      r"refused \(LoRA\): continuing from a saved "
      r"PEFT adapter",
    ),
    (["actor_rollout_ref.model.exclude_modules=['o_proj']"], r"refused \(LoRA\): modules excluded"),
    (
      ["actor_rollout_ref.model.mtp.enable=True", "actor_rollout_ref.model.mtp.enable_train=True"],
      r"refused \(multi-token prediction\).*\[actor_rollout_ref.model.mtp.enable=True and 1 more\]",
    ),
    (["data.custom_cls.path=my_dataset.py", "data.custom_cls.name=MyDataset"], r"refused \(custom dataset class\)"),
    (["+data.apply_chat_template_kwargs.tools_first=False"], r"refused \(chat template arguments\)"),
    (["actor_rollout_ref.actor.freeze_vision_tower=True"], r"refused \(vision-language\)"),
    (["actor_rollout_ref.rollout.multi_turn.interaction_config_path=i.yaml"], r"refused \(interactions\)"),
    (
      ["actor_rollout_ref.model.lora.rank=64", "actor_rollout_ref.model.lora.alpha=64"],
      r"refused \(Megatron-LM\): Megatron-Bridge's LoRA.*\[actor_rollout_ref.model.lora.rank=64 and 1 more\]",
    ),
    (
      ["trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.fsdp_config.fsdp_size=3"],
      r"fsdp_size=3 must be -1 or divide the 8 GPUs",
    ),
    (["actor_rollout_ref.actor.fsdp_config.fsdp_size=auto"], r"fsdp_size expects an int \(-1: every GPU\), got 'auto'"),
  ],
)
def test_refusals_and_bad_values_name_the_key(overrides, message):
  with pytest.raises(UserError, match=message):
    verl_compat.apply_overrides(get_base_config(), overrides)


def test_a_refusal_that_depends_on_a_value_only_the_shell_knows():
  def plan(arg):
    return verl_compat.plan([arg], get_base_config(), shell_text={arg: arg.split("=", 1)[1]})

  # Ignored when empty, refused (function tools) when set: the shell's value decides.
  with pytest.raises(UserError, match=r"function_tool_path'=\$\(pwd\)/tools.py: jaxrlhf needs this value"):
    plan("actor_rollout_ref.rollout.multi_turn.function_tool_path=$(pwd)/tools.py")
  with pytest.raises(UserError, match=r"'reward.reward_manager.source'=\$SOURCE: jaxrlhf needs this value"):
    plan("reward.reward_manager.source=$SOURCE")
  # A translated key whose value only the shell knows is translated by train.py when it runs.
  assert plan("reward_model.reward_manager=$RM").deferred == [("reward_model.reward_manager", "$RM", "$RM")]


def test_accepted_reward_managers_and_loggers():
  config = get_base_config()
  report = verl_compat.apply_overrides(
    config, ["reward_model.reward_manager=batch", "trainer.logger=['file','vemlp_wandb']", "trainer.profile_steps=[2]"]
  )
  assert config.trainer.logger == ("jsonl",) and config.trainer.profile_steps == (2,)
  assert config.reward_model.reward_manager == "batch"  # the custom function is called once per batch
  assert {(key, raw) for key, raw, _ in report.ignored} == {("trainer.logger", "vemlp_wandb")}


def test_the_dapo_recipes_older_spellings():
  config = get_base_config()
  verl_compat.apply_overrides(
    config,
    [
      "custom_reward_function.overlong_buffer.enable=True",
      "custom_reward_function.overlong_buffer.len=512",
      "actor_rollout_ref.actor.use_token_level_loss=False",
    ],
  )
  assert config.reward_model.overlong_buffer.enable and config.reward_model.overlong_buffer.len == 512
  assert config.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-mean"
  verl_compat.apply_overrides(config, ["actor_rollout_ref.actor.use_token_level_loss=True"])
  assert config.actor_rollout_ref.actor.loss_agg_mode == "token-mean"


def test_reward_workers_key_is_mapped_as_verl_names_it():
  report = verl_compat.plan(["reward_model.num_workers=4"], get_base_config())
  assert report.assignments == {"reward_model.num_workers": 4} and not report.ignored


def test_did_you_mean_only_when_close():
  candidates = list(verl_compat.base_tree_types()) + [k for k in verl_compat.TABLE if "*" not in k]
  assert verl_compat.did_you_mean("trainer.total_trainig_steps", candidates) == "trainer.total_training_steps"
  assert verl_compat.did_you_mean("actor_rollout_ref.rollout.tensor_model_paralel_size", candidates) == (
    "actor_rollout_ref.rollout.tensor_model_parallel_size"
  )
  assert verl_compat.did_you_mean("actor_rollout_ref.rollout.kl_loss_coef", candidates) == (
    "actor_rollout_ref.actor.kl_loss_coef"
  )
  for far in (
    "critic.pipeline_model_parallel_size",
    "actor_rollout_ref.model.use_rmpad",
    "trainer.bench_steps",
  ):
    assert verl_compat.did_you_mean(far, candidates) is None, far


@pytest.mark.parametrize(
  "script, line, message",
  [
    ("if_on_a_file.sh", 7, r"uses \$LR, which is set inside an `if` whose test only the shell can decide \(line 2\)"),
    ("sweep_loop.sh", 3, r"inside a loop \(line 2\)"),
    ("indirect.sh", 4, r"indirect expansion"),
    ("unclosed_quote.sh", 3, r'unclosed " quote'),
    ("two_runs.sh", 2, r"runs verl 2 times \(lines 1, 2\)"),
    ("array_operation.sh", 2, r"an operation on a whole array"),
    (
      "backslash_space.sh",
      5,
      r"`\\ ` \(a backslash before a space, not before the end of the line\) passes ' ' to verl "
      r".*the command ends there",
    ),
    ("other_program.sh", 1, r"runs verl.trainer.main_generation \(verl's offline generation"),
    ("test_and_assign.sh", 3, r"uses \$LR, which is set inside a `&&` / `\|\|` whose test only the shell can decide"),
  ],
)
def test_a_script_the_reader_cannot_read_fails_naming_the_line(script, line, message):
  path = _script(os.path.join("unreadable", script))
  with pytest.raises(UserError, match=rf"^{path}:{line}: .*{message}"):
    verl_compat.read_script(path, ENV)


def test_values_follow_hydra():
  assert verl_compat.parse_value("null") is None
  assert verl_compat.parse_value("True") is True and verl_compat.parse_value("false") is False
  assert verl_compat.parse_value("1e-6") == 1e-6 and verl_compat.parse_value("0.") == 0.0
  assert verl_compat.parse_value("-1") == -1
  assert verl_compat.parse_value("['a', \"b\",c]") == ["a", "b", "c"]
  assert verl_compat.parse_value("'error'") == "error"
  assert verl_compat.parse_value("") == "" and verl_compat.parse_value("''") == ""  # `key=$EMPTY`
  config = get_base_config()
  verl_compat.apply_overrides(
    config,
    [
      "+data.val_batch_size=null",
      "data.train_files=/d/train.parquet",
      "actor_rollout_ref.actor.optim.lr=1",
      "trainer.experiment_name=123",
      "data.seed=1",
      "data.seed=2",
    ],
  )
  assert config.data.val_batch_size is None and config.data.train_files == ("/d/train.parquet",)
  assert config.actor_rollout_ref.actor.optim.lr == 1.0 and config.trainer.experiment_name == "123"
  assert config.data.seed == 2  # a repeated key: the last wins
  with pytest.raises(UserError, match="'data.train_batch_size' expects int, got 'many'"):
    verl_compat.apply_overrides(get_base_config(), ["data.train_batch_size=many"])
  with pytest.raises(
    UserError, match="unknown config key 'trainer.total_trainig_steps'.*did you mean 'trainer.total_training_steps'"
  ):
    verl_compat.apply_overrides(get_base_config(), ["trainer.total_trainig_steps=3"])


def test_unresolved_variable_is_left_to_the_shell(tmp_path):
  script = tmp_path / "run.sh"
  script.write_text("python3 -m verl.trainer.main_ppo \\\n  data.train_batch_size=$BSZ \\\n  trainer.nnodes=1 $@\n")
  command, report, parsed = verl_compat.translate_script(str(script), env={})
  assert parsed.missing == {"BSZ"}
  assert 'data.train_batch_size="$BSZ"' in command.split()
  assert [key for key, _, _ in report.unresolved] == ["data.train_batch_size"]
  assert _config_from_command(command, {"BSZ": "48"}).data.train_batch_size == 48


def test_unknown_verl_key_fails_naming_it():
  result = run_cli(os.path.join(ROOT, "train.py"), "data.train_batch_size=8", "trainer.total_trainig_steps=1")
  assert_user_error(result, "train.py", "'trainer.total_trainig_steps'", "did you mean 'trainer.total_training_steps'")


def _tiny_fixture(root):
  """A tiny HF model directory and recall-task parquet files (GSM8K's `####` answers, data_source)."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  from jaxrlhf.data.builtin import recall_rows
  from tests.cli.test_bad_input import _write_hf_model

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
  env = subprocess_env(
    devices=2,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=ROOT,
    PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
  )
  script = tmp_path / "run_tiny.sh"
  script.write_text(VERL_TINY.format(root=tmp_path, name="translated"))
  printed = subprocess.run(
    [sys.executable, "-m", "jaxrlhf.verl_compat", str(script)],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert printed.returncode == 0, printed.stderr[-2000:]
  command = printed.stdout.split("\n\n")[0]
  assert command.startswith("python train.py \\\n    --config configs/verl_defaults.py")
  assert "--config.mesh.fsdp=2" in command
  assert "--config.actor_rollout_ref.rollout.tensor_model_parallel_size=2" in command
  assert "--config.mesh.tensor" not in command  # generation TP 2 over the fsdp devices; training is FSDP
  assert "actor_rollout_ref.rollout.name=vllm  ->  vLLM" in printed.stdout
  translated = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert translated.returncode == 0, translated.stderr[-3000:]

  _, _, parsed = verl_compat.translate_script(str(script))
  direct_args = [arg.replace("experiment_name=translated", "experiment_name=direct") for arg in parsed.overrides]
  direct = subprocess.run(
    [sys.executable, "train.py", *direct_args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
  )
  assert direct.returncode == 0, direct.stderr[-3000:]
  assert "ignored 2 verl key(s)" in direct.stdout
  assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.6: vLLM's KV-cache share" in direct.stdout

  runs = tmp_path / "runs" / "verl_tiny"
  configs = {name: json.loads((runs / name / "config.json").read_text()) for name in ("translated", "direct")}
  for config in configs.values():
    assert config["mesh"] == {"data": 1, "fsdp": 2, "tensor": 1}
    assert config["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] == 2
    assert config["algorithm"]["adv_estimator"] == "grpo" and config["actor_rollout_ref"]["rollout"]["n"] == 2
    assert config["data"]["train_files"] == [str(tmp_path / "train.parquet")]
    config["trainer"].pop("experiment_name")
  assert configs["translated"] == configs["direct"]
  for name, result in (("translated", translated), ("direct", direct)):
    # verl's trainer.logger='["console"]': no metrics.jsonl, and the last line names no file.
    last_line = result.stdout.strip().splitlines()[-1]
    assert last_line.startswith("done: 1 records, none written to a file"), result.stdout[-2000:]
    assert not (runs / name / "metrics.jsonl").exists()


def test_trainer_v1_modes_translate():
  """colocate_async maps (with verl's max_num_seqs default when the script sets none), whole warm-up batches map,
  the sampler's keys are jaxrlhf's own; a fractional warm-up is refused by key."""
  assignments = verl_compat.plan(
    [
      "trainer.v1.trainer_mode=colocate_async",
      "trainer.v1.colocate_async.num_warmup_batches=2.0",
      "trainer.v1.sampler.max_off_policy_strategy=wait",
    ],
    get_base_config(),
  ).assignments
  assert assignments["trainer.v1.trainer_mode"] == "colocate_async"
  assert assignments["actor_rollout_ref.rollout.max_num_seqs"] == 1024
  assert assignments["trainer.v1.colocate_async.num_warmup_batches"] == 2
  assert assignments["trainer.v1.sampler.max_off_policy_strategy"] == "wait"
  with pytest.raises(UserError, match="num_warmup_batches"):
    verl_compat.plan(["trainer.v1.colocate_async.num_warmup_batches=1.5"], get_base_config())
