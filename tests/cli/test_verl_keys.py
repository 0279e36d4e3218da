"""Every key of verl 0.9.1's generated PPO trainer config is known to jaxrlhf (docs/verl_scripts.md counts them).

The keys and defaults come from the installed verl (`verl/trainer/config/_generated_ppo_trainer.yaml`) when it is
importable, else from tests/cli/verl_0_9_1_keys.txt (copied from the verl==0.9.1 wheel). Each key is mapped,
translated, ignored with a reason or refused with one, never unknown; verl's own defaults pass (no ignored key
is refused at its default), so a verl 0.9.1 config written out in full runs. Both spellings of the keys 0.9.1 moved
(`reward_model.*` / `reward.reward_model.*`, `custom_reward_function.*` / `reward.custom_reward_function.*`,
`critic.model.fsdp_config.*` / `critic.fsdp.*`) set the same jaxrlhf key, the older one winning as in verl.
"""

import collections
import importlib.util
import os
import sys

import pytest

from jaxrlhf import verl_compat
from jaxrlhf.config import get_base_config
from jaxrlhf.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "docs"))
from gen_verl_scripts_md import VERL_KEYS, VERL_MEGATRON_KEYS, verl_keys  # noqa: E402

GENERATED = os.path.join("trainer", "config", "_generated_ppo_trainer.yaml")
GENERATED_MEGATRON = os.path.join("trainer", "config", "_generated_ppo_megatron_trainer.yaml")


def _installed_verl_yaml(name: str = GENERATED) -> str | None:
  spec = importlib.util.find_spec("verl")
  if spec is None or not spec.submodule_search_locations:
    return None
  path = os.path.join(list(spec.submodule_search_locations)[0], name)
  return path if os.path.isfile(path) else None


def _flatten(node, prefix=""):
  if isinstance(node, dict) and node:
    for key, value in node.items():
      yield from _flatten(value, f"{prefix}{key}.")
  else:
    yield prefix[:-1], node


def verl_config_keys() -> list[tuple[str, object]]:
  path = _installed_verl_yaml()
  if path is None:
    return verl_keys()
  import yaml

  with open(path) as file:
    return list(_flatten(yaml.safe_load(file)))


def verl_megatron_keys() -> list[tuple[str, object]]:
  """The keys of verl's Megatron config that its FSDP config lacks (the megatron sections, Megatron's optimizer)."""
  path = _installed_verl_yaml(GENERATED_MEGATRON)
  if path is None:
    return verl_keys(VERL_MEGATRON_KEYS)
  import yaml

  with open(path) as file:
    keys = list(_flatten(yaml.safe_load(file)))
  fsdp = {key for key, _ in verl_config_keys()}
  return [(key, value) for key, value in keys if key not in fsdp]


KEYS = verl_config_keys()
MEGATRON_KEYS = verl_megatron_keys()
TREE = verl_compat.base_tree_types()


def test_the_key_list_is_verl_0_9_1s():
  with open(VERL_KEYS) as file:
    assert "verl 0.9.1" in file.readline()
  assert len(KEYS) == 898 or _installed_verl_yaml() is not None


def test_no_key_of_verls_config_is_unknown():
  classes = {key: verl_compat.classify(key, TREE) for key, _ in KEYS}
  unknown = [key for key, kind in classes.items() if kind == "unknown"]
  assert not unknown, f"{len(unknown)} unknown: {unknown[:20]}"
  counts = collections.Counter(classes.values())
  with open(os.path.join(ROOT, "docs", "verl_scripts.md")) as file:
    page = file.read()
  assert ", ".join(f"{counts[name]} {name}" for name in verl_compat.CLASSES) in page


def _default_override(key, value) -> str | None:
  """`key=value` for verl's default, None where verl's default is an interpolation of another key."""
  if isinstance(value, str) and ("${" in value or value == "???"):
    return None
  text = "{}" if value == {} else verl_compat._hydra_text(value)
  return None if text is None else f"{key}={text}"


def test_verls_defaults_run_and_only_refused_families_refuse():
  args, refused = [], []
  for key, value in KEYS:
    override = _default_override(key, value)
    if override is None:
      continue
    (refused if verl_compat.classify(key, TREE) == "refused" else args).append(override)
  report = verl_compat.plan(args, get_base_config())
  assert not report.deferred
  assert len(report.ignored) > 500
  for override in refused:  # megatron's and vision's keys: refused, naming their family
    with pytest.raises(UserError, match=r"refused \((Megatron-LM|vision-language)\)"):
      verl_compat.plan([override], get_base_config())


@pytest.mark.parametrize(
  "new, old, target, value",
  [
    ("reward.reward_model.enable", "reward_model.enable", "reward_model.enable", True),
    ("reward.reward_model.model_path", "reward_model.model.path", "reward_model.model.path", "/rm"),
    ("reward.num_workers", "reward_model.num_workers", "reward_model.num_workers", 3),
    ("reward.custom_reward_function.path", "custom_reward_function.path", "custom_reward_function.path", "/r.py"),
    ("reward.reward_manager.name", "reward_model.reward_manager", "reward_model.reward_manager", "batch"),
    # A generative reward model's sampler.
    *(
      (f"reward.reward_model.rollout.{name}", f"reward_model.rollout.{name}", f"reward_model.rollout.{name}", value)
      for name, value in (("prompt_length", 1024), ("response_length", 64), ("max_num_seqs", 16), ("do_sample", True))
    ),
    ("critic.fsdp.param_offload", None, "critic.model.fsdp_config.param_offload", True),
    ("critic.fsdp.ulysses_sequence_parallel_size", None, "critic.ulysses_sequence_parallel_size", 2),
    (
      "reward.reward_kwargs.overlong_buffer_cfg.len",
      "reward_model.reward_kwargs.overlong_buffer_cfg.len",
      "reward_model.overlong_buffer.len",
      128,
    ),
  ],
)
def test_old_and_new_spellings_set_the_same_key(new, old, target, value):
  text = lambda v: str(v).lower() if isinstance(v, bool) else str(v)
  for key in filter(None, (new, old)):
    assert verl_compat.plan([f"{key}={text(value)}"], get_base_config()).assignments[target] == value, key
  if old is not None and not new.startswith("reward.reward_kwargs"):
    other = "false" if value is True else "/other" if isinstance(value, str) else "5"
    other = "naive" if target == "reward_model.reward_manager" else other
    report = verl_compat.plan([f"{old}={text(value)}", f"{new}={other}"], get_base_config())
    assert report.assignments[target] == value  # verl migrates the older key over the new one when it is set


@pytest.mark.parametrize(
  "override, message",
  [
    ("reward.sandbox_fusion.url=http://sandbox:8080", "refused (sandbox fusion)"),
    ("sandbox_fusion.url=http://sandbox:8080", "refused (sandbox fusion)"),
    ("reward.reward_manager.name=prime", "PRIME's reward manager"),
    ("reward.reward_manager.source=importlib", "refused (custom reward loop)"),
    ("data.apply_chat_template_kwargs.tools_first=True", "refused (chat template arguments)"),
    ("trainer.v1.trainer_mode=separate_async", "refused (v1)"),
    ("algorithm.use_pf_ppo=True", "refused (PF-PPO)"),
    ("+distillation.teacher_models.math_teacher.model_path=/m", "refused (distillation teachers)"),
    ("reward_model.reward_manager=nonesuch", "reward manager 'nonesuch'"),
  ],
)
def test_refusals_name_their_family(override, message):
  with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
    verl_compat.plan([override], get_base_config())


def test_chat_template_kwargs_and_the_new_trainer_keys_are_read():
  report = verl_compat.plan(
    [
      "+data.apply_chat_template_kwargs.enable_thinking=False",
      "actor_rollout_ref.model.custom_chat_template='{{ messages }}'",
      "trainer.val_only=True",
      "trainer.rollout_data_dir=/tmp/rollouts",
      "trainer.validation_data_dir=/tmp/val",
    ],
    get_base_config(),
  )
  assert report.assignments == {
    "data.apply_chat_template_kwargs.enable_thinking": False,
    "actor_rollout_ref.model.custom_chat_template": "{{ messages }}",
    "trainer.val_only": True,
    "trainer.rollout_data_dir": "/tmp/rollouts",
    "trainer.validation_data_dir": "/tmp/val",
  }


def test_every_key_of_verls_megatron_config_is_known_and_its_defaults_run():
  """verl's ppo_megatron_trainer: every megatron key is translated, ignored with a reason or refused with one, and
  verl's Megatron defaults (verl_0_9_1_megatron_keys.txt when verl is not installed) change nothing but the optimizer's
  and strategy's spelling."""
  with open(VERL_MEGATRON_KEYS) as file:
    listed = sum(1 for line in file if line.strip() and not line.startswith("#"))
  assert len(MEGATRON_KEYS) == listed
  classes = {key: verl_compat.classify(key, TREE) for key, _ in MEGATRON_KEYS}
  assert not [key for key, kind in classes.items() if kind == "unknown"]
  counts = collections.Counter(classes.values())
  with open(os.path.join(ROOT, "docs", "verl_scripts.md")) as file:
    assert ", ".join(f"{counts[name]} {name}" for name in verl_compat.CLASSES) in file.read()
  args = [override for key, value in MEGATRON_KEYS if (override := _default_override(key, value)) is not None]
  args += ["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron", "critic.optim.optimizer=adam"]
  report = verl_compat.plan(args, get_base_config())
  assert not report.deferred and len(report.ignored) > 100
  assert report.assignments == {  # verl's Megatron defaults: one device of tensor parallelism, no context parallelism
    "mesh.tensor": 1,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "critic.model.fsdp_config.param_offload": False,
    "critic.model.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
    "actor_rollout_ref.actor.optim.min_lr_ratio": 0.0,
    "critic.optim.lr_scheduler_type": "constant",
    "critic.optim.min_lr_ratio": 0.0,
  }
