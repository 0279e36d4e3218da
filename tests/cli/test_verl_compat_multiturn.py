"""verl's multi-turn tool scripts translate (`python -m jaxrlhf.verl_compat`), as test_verl_compat.py's do.

verl_scripts_multiturn/ holds verl's own examples/sglang_multiturn scripts, their Hydra base YAMLs and tool
configs, laid out as in verl's checkout (the scripts run from its root: `$(pwd)/examples/...`). Each GSM8K script
must give a command whose config resolves, with the multi-turn keys on jaxrlhf's; SGLang's engine keys and the
keys verl 0.9.1 reads nowhere are reported as ignored with their reasons; what jaxrlhf lacks (a non-hermes tool
format, verl's sandbox and search tools, interactions, custom agent loops) is refused naming the key.
"""

import os
import re

import pytest

from jaxrlhf import verl_compat
from jaxrlhf.config import get, get_base_config, resolve_config
from jaxrlhf.errors import UserError
from tests.cli.test_verl_compat import ENV, ROOT, _config_from_command

EXAMPLES = os.path.join(ROOT, "tests", "cli", "verl_scripts_multiturn", "examples", "sglang_multiturn")
MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"
GSM8K_TOOLS = "examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml"


def _script(name):
  return os.path.join(EXAMPLES, name)


def _plan(*overrides):
  return verl_compat.plan(list(overrides), get_base_config())


@pytest.mark.parametrize(
  "script, shell, expected",
  [
    (
      "run_qwen2.5-3b_gsm8k_multiturn.sh",
      {},
      {  # max_assistant_turns from gsm8k_multiturn_grpo.yaml
        f"{MULTI_TURN}.enable": True,
        f"{MULTI_TURN}.max_assistant_turns": 5,
        f"{MULTI_TURN}.max_user_turns": None,
        "actor_rollout_ref.rollout.n": 16,
        "data.train_batch_size": 256,
        "mesh.fsdp": 8,
      },
    ),
    (
      "run_qwen2.5-3b_gsm8k_multiturn_4xgpu.sh",
      {},
      {
        f"{MULTI_TURN}.enable": True,
        f"{MULTI_TURN}.max_assistant_turns": 5,
        f"{MULTI_TURN}.max_user_turns": 1,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
        "mesh.fsdp": 4,
      },
    ),
    ("run_qwen2.5-3b_gsm8k_multiturn_server.sh", {}, {f"{MULTI_TURN}.enable": True, "mesh.fsdp": 8}),
    (
      "run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh",
      {"use_kl_loss": "True"},  # the script reads ${use_kl_loss}, which it never sets
      {  # the script's data.train_batch_size=32 wins over the YAML's 256
        f"{MULTI_TURN}.enable": True,
        "data.train_batch_size": 32,
        "actor_rollout_ref.rollout.n": 8,
        "mesh.fsdp": 16,
      },
    ),
    (  # its YAML builds on ppo_megatron_trainer; TP 2 is mesh.tensor, CP 2 Ulysses SP, PP 2 (virtual 2) on fsdp
      "run_qwen2.5-3b_megatron_gsm8k_multiturn.sh",
      {},
      {
        f"{MULTI_TURN}.enable": True,
        "mesh.tensor": 2,
        "mesh.fsdp": 4,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2,
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 2,
      },
    ),
    (
      "gsm8k_toolcall_shaping/run_gsm8k_grpo_toolcall_shaping.sh",
      {},
      {f"{MULTI_TURN}.enable": True, "custom_reward_function.name": "compute_score", "mesh.fsdp": 4},
    ),
  ],
)
def test_gsm8k_multiturn_scripts_resolve(script, shell, expected):
  command, report, parsed = verl_compat.translate_script(_script(script), env=ENV)
  assert parsed.missing == set(shell)
  config = resolve_config(_config_from_command(command, shell))
  assert get(config, f"{MULTI_TURN}.tool_config_path") == os.path.join(os.getcwd(), GSM8K_TOOLS)
  assert get(config, f"{MULTI_TURN}.format") == "hermes"
  for key, value in expected.items():
    assert get(config, key) == value, key
  assert any("apply before the script's own" in note for note in report.notes)
  assert any("its tools load from" in note and note.endswith("jaxrlhf's root)") for note in report.notes)


def test_toolcall_shaping_reward_and_sampler():
  command, report, _ = verl_compat.translate_script(
    _script("gsm8k_toolcall_shaping/run_gsm8k_grpo_toolcall_shaping.sh"), env=ENV
  )
  config = _config_from_command(command)
  assert config.custom_reward_function.path == os.path.join(
    os.getcwd(), "examples/sglang_multiturn/gsm8k_toolcall_shaping/gsm8k_toolcall_shaping.py"
  )
  ignored = {key: reason for key, _, reason in report.ignored}
  assert "RandomCurriculumSampler" in ignored["data.sampler.class_name"]
  with pytest.raises(UserError, match=r"refused \(custom sampler\).*\[data.sampler.class_path=my.py"):
    _plan("data.sampler.class_path=my.py", "data.sampler.class_name=Curriculum")


def test_engine_and_dead_keys_are_ignored_with_their_reasons():
  _, report, _ = verl_compat.translate_script(_script("run_qwen2.5-3b_gsm8k_multiturn_server.sh"), env=ENV)
  ignored = {key: reason for key, _, reason in report.ignored}
  assert "SGLang's early stop" in ignored["actor_rollout_ref.rollout.over_sample_rate"]
  assert "jaxrlhf generates in-graph" in ignored["actor_rollout_ref.rollout.over_sample_rate"]
  for key in (  # the script's and its YAML's (sglang_rollout_mode, server.*)
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.sglang_rollout_mode",
    "actor_rollout_ref.rollout.server.timeout",
    "actor_rollout_ref.rollout.server.max_start_wait_time",
  ):
    assert "SGLang engine setting" in ignored[key], key
  assert "multi_stage_wake_up" in " ".join(ignored) and "gpu_memory_utilization" in " ".join(ignored)
  assert ignored["data.return_raw_chat"].startswith("read nowhere in verl 0.9.1")
  report = _plan(
    f"{MULTI_TURN}.num_repeat_rollouts=2",
    f"{MULTI_TURN}.use_inference_chat_template=True",
    f"{MULTI_TURN}.tokenization_sanity_check_mode=disable",
    "actor_rollout_ref.rollout.agent.num_workers=4",
  )
  ignored = {key: reason for key, _, reason in report.ignored}
  assert all(
    ignored[f"{MULTI_TURN}.{name}"].startswith("read nowhere in verl 0.9.1")
    for name in ("num_repeat_rollouts", "use_inference_chat_template", "tokenization_sanity_check_mode")
  )
  assert "Ray actors" in ignored["actor_rollout_ref.rollout.agent.num_workers"]
  assert not report.assignments


def test_multi_turn_keys_land_on_jaxrlhfs():
  tools = "/data/tools.yaml"
  report = _plan(
    "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
    f"{MULTI_TURN}.tool_config_path={tools}",
    f"data.tool_config_path={tools}",  # verl's mirror of the rollout's
    f"{MULTI_TURN}.max_assistant_turns=3",
    f"{MULTI_TURN}.max_user_turns=2",
    f"{MULTI_TURN}.max_parallel_calls=2",
    f"{MULTI_TURN}.max_tool_response_length=512",
    f"{MULTI_TURN}.tool_response_truncate_side=left",
    f"{MULTI_TURN}.format=hermes",
    f"{MULTI_TURN}.function_tool_path=null",
    f"{MULTI_TURN}.interaction_config_path=null",
  )
  assert report.assignments == {
    f"{MULTI_TURN}.tool_config_path": tools,
    f"{MULTI_TURN}.max_assistant_turns": 3,
    f"{MULTI_TURN}.max_user_turns": 2,
    f"{MULTI_TURN}.max_parallel_calls": 2,
    f"{MULTI_TURN}.max_tool_response_length": 512,
    f"{MULTI_TURN}.tool_response_truncate_side": "left",
    f"{MULTI_TURN}.enable": True,  # tool_agent: verl 0.9.1's tool loop
    f"{MULTI_TURN}.format": "hermes",
  }
  ignored = {key for key, _, _ in report.ignored}
  assert {
    "data.tool_config_path",
    f"{MULTI_TURN}.function_tool_path",
    f"{MULTI_TURN}.interaction_config_path",
  } <= ignored
  single = _plan("actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent")
  assert not single.assignments and single.translated


def test_verl_0_9_1s_reward_function_keys():
  report = _plan("reward.custom_reward_function.path=/r.py", "reward.custom_reward_function.name=score")
  assert report.assignments == {"custom_reward_function.path": "/r.py", "custom_reward_function.name": "score"}
  report = _plan("reward.custom_reward_function.path=/r.py", "custom_reward_function.path=/legacy.py")
  assert report.assignments == {"custom_reward_function.path": "/legacy.py"}  # verl takes the top-level keys
  assert [key for key, _, _ in report.ignored] == ["reward.custom_reward_function.path"]


@pytest.mark.parametrize(
  "overrides, message",
  [
    ([f"{MULTI_TURN}.interaction_config_path=interaction.yaml"], r"refused \(interactions\).*interaction_config_path="),
    ([f"{MULTI_TURN}.format=qwen"], r"multi_turn.format=qwen: refused: tool-call format 'qwen': jaxrlhf parses hermes"),
    (
      ["actor_rollout_ref.rollout.agent.default_agent_loop=react_agent"],
      r"agent.default_agent_loop=react_agent: refused: agent loop 'react_agent'",
    ),
    (["actor_rollout_ref.rollout.agent.agent_loop_config_path=loops.yaml"], r"refused \(custom agent loops\)"),
    (["actor_rollout_ref.rollout.agent.custom_async_server.path=server.py"], r"refused \(custom agent loops\)"),
    ([f"{MULTI_TURN}.function_tool_path=tools.py"], r"refused \(function tools\).*function_tool_path=tools.py"),
    (["data.function_tool_path=tools.py"], r"refused \(function tools\).*\[data.function_tool_path"),
    (
      [f"{MULTI_TURN}.tool_config_path=a.yaml", "data.tool_config_path=b.yaml"],
      r"refused \(multi-turn\): data.tool_config_path='b.yaml' differs",
    ),
  ],
)
def test_what_jaxrlhf_lacks_is_refused_naming_the_key(overrides, message):
  with pytest.raises(UserError, match=message):
    _plan(*overrides)


@pytest.mark.parametrize(
  "script, messages",
  [
    (  # the retool recipe: its sandbox_fusion tool (a class of verl's recipe) and its dataset class
      "run_qwen3_4b_dapo_multiturn.sh",
      [
        r"refused \(multi-turn\): tool config '.*/recipe/retool/sandbox_fusion_tool_config.yaml': "
        r"tools\[0\].class_name 'recipe.retool.retool.CustomSandboxFusionTool'",
        r"refused \(custom dataset class\)",
      ],
    ),
    (
      "search_r1_like/run_qwen2.5-3b_instruct_search_multiturn.sh",
      [
        r"multi_turn.format=qwen: refused: tool-call format 'qwen'",  # from search_multiturn_grpo.yaml
        r"'verl.tools.search_tool.SearchTool' is a verl tool jaxrlhf does not have",
      ],
    ),
  ],
)
def test_scripts_jaxrlhf_cannot_run_are_refused_with_reasons(script, messages):
  with pytest.raises(UserError) as caught:
    verl_compat.translate_script(_script(script), env=ENV)
  lines = str(caught.value).splitlines()
  for message in messages:
    assert any(re.search(message, line.strip()) for line in lines), (message, lines)


def test_a_base_yaml_that_is_not_found_says_where_it_was_looked_for(tmp_path):
  script = tmp_path / "run.sh"
  script.write_text(
    "python3 -m verl.trainer.main_ppo --config-path=\"$(pwd)/config\" --config-name='my_grpo' "
    "algorithm.adv_estimator=grpo\n"
  )
  with pytest.raises(
    UserError,
    match=r"refused \(Hydra base config\): my_grpo.yaml is not found under "
    r"'\$\(pwd\)/config': run verl_compat from the folder the script runs in",
  ):
    verl_compat.translate_script(str(script), env=ENV)
