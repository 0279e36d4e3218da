"""The recipe configs in configs/: each builds and validates; the GSM8K recipes run two steps on tiny
local fixtures (a random Qwen2 checkpoint, parquet from examples/data_preprocess/gsm8k.py); the
architecture files in configs/models/ load at their published sizes and the big-model recipes' layouts
fit their targets (shapes only, nothing allocated); the quickstart GRPO and DAPO variants learn the
built-in task (slow)."""

import functools
import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import pytest
from jax.sharding import AbstractMesh

from jaxrlhf.config import resolve_config
from jaxrlhf.data.builtin import build_tokenizer
from jaxrlhf.models import Decoder, abstract_params, config_from_hf_dict, hf_config_dict, load_hf_config
from jaxrlhf.models.decoder import kv_heads_repeated
from jaxrlhf.parallel import TRAIN_RULES
from jaxrlhf.parallel.layouts import generation_kv_repeat, generation_rules, logical_to_shardings
from jaxrlhf.parallel.mesh import mesh_axes, resolve_mesh_shape
from jaxrlhf.trainer import Trainer
from tests.helpers import VAL_KEY, run_train

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GSM8K_RECIPES = ("ppo_gsm8k_qwen2_5_0_5b", "grpo_gsm8k_qwen2_5_0_5b", "dapo_gsm8k_qwen2_5_1_5b")
QUICKSTARTS = ("quickstart", "quickstart_grpo", "quickstart_dapo", "quickstart_distill")
# Recipe: (its architecture file in configs/models/, the GSM8K recipe it keeps the algorithm of,
# ((aot target, devices), ...)).
BIG_RECIPES = {
  "ppo_gsm8k_qwen2_5_1_5b": ("qwen2.5-1.5b-instruct", "ppo_gsm8k_qwen2_5_0_5b", (("h100x8", 8),)),
  "ppo_gsm8k_qwen2_5_7b": ("qwen2.5-7b-instruct", "ppo_gsm8k_qwen2_5_0_5b", (("h100x8", 8),)),
  "ppo_gsm8k_llama3_1_8b": ("llama-3.1-8b-instruct", "ppo_gsm8k_qwen2_5_0_5b", (("v5p-64", 32), ("h100x8", 8))),
  "grpo_gsm8k_qwen2_5_7b": ("qwen2.5-7b-instruct", "grpo_gsm8k_qwen2_5_0_5b", (("h100x8", 8),)),
  "grpo_gsm8k_qwen2_5_32b": ("qwen2.5-32b-instruct", "grpo_gsm8k_qwen2_5_0_5b", (("h100:4x8", 32),)),
  "grpo_gsm8k_qwen2_5_72b": ("qwen2.5-72b-instruct", "grpo_gsm8k_qwen2_5_0_5b", (("h200:8x8", 64),)),
  "grpo_gsm8k_llama3_1_70b": ("llama-3.1-70b-instruct", "grpo_gsm8k_qwen2_5_0_5b", (("h200:8x8", 64),)),
  "grpo_gsm8k_qwen3_5_4b": ("qwen3.5-4b", "grpo_gsm8k_qwen2_5_0_5b", (("h100x8", 8),)),
  "grpo_gsm8k_qwen3_5_27b": ("qwen3.5-27b", "grpo_gsm8k_qwen2_5_0_5b", (("h100x8", 8),)),
  "grpo_gsm8k_qwen3_30b_a3b": ("qwen3-30b-a3b", "grpo_gsm8k_qwen2_5_0_5b", (("h100x8", 8),)),
  "grpo_gsm8k_qwen3_235b_a22b": ("qwen3-235b-a22b", "grpo_gsm8k_qwen2_5_0_5b", (("h200:8x8", 64),)),
  "grpo_gsm8k_gemma3_12b": ("gemma-3-12b-it", "grpo_gsm8k_qwen2_5_0_5b", (("h100x8", 8),)),
  "grpo_gsm8k_gpt_oss_20b": ("gpt-oss-20b", "grpo_gsm8k_qwen2_5_0_5b", (("h100x8", 8),)),
}
# What a big recipe may change from its 0.5B parent: model, layout, micro-batch size, run name.
BIG_RECIPE_CHANGES = (
  "actor_rollout_ref.model.path",
  "actor_rollout_ref.rollout.tensor_model_parallel_size",
  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
  "critic.forward_micro_batch_size_per_gpu",
  "trainer.experiment_name",
  "actor_rollout_ref.rollout.max_num_seqs",
  "actor_rollout_ref.model.use_remove_padding",  # off for Qwen3.5: packing is refused for its recurrent layers
  "actor_rollout_ref.actor.fsdp_config.optimizer_offload",  # Qwen3-30B-A3B: Adam's moments in host memory
  "mesh.data",
  "mesh.fsdp",
  "mesh.tensor",
)
# Published sizes (the Hub model cards), in parameters.
PUBLIC_SIZES = {
  "qwen2.5-0.5b-instruct": 0.49e9,
  "qwen2.5-1.5b-instruct": 1.54e9,
  "qwen2.5-7b-instruct": 7.61e9,
  "qwen2.5-32b-instruct": 32.8e9,
  "qwen2.5-72b-instruct": 72.7e9,
  "llama-3.1-8b-instruct": 8.03e9,
  "llama-3.1-70b-instruct": 70.6e9,
  "qwen3-8b": 8.19e9,
  # Qwen3.5's Hub names round text + vision tower; the text model (what loads; transformers' Qwen3_5ForCausalLM
  # counts the same for these files) is 4.21e9 (tied head), 8.95e9 and 26.9e9.
  "qwen3.5-4b": 4.21e9,
  "qwen3.5-9b": 9e9,
  "qwen3.5-27b": 27e9,
  "qwen3-30b-a3b": 30.5e9,  # 3.3e9 of them active per token
  "qwen3-235b-a22b": 235e9,  # 22e9 active
  # Gemma 3's Hub name rounds text + vision tower; the text model (what loads; transformers' Gemma3ForCausalLM counts
  # the same) is 11.77e9.
  "gemma-3-12b-it": 12e9,
  "gpt-oss-20b": 21e9,  # 3.6e9 active per token; the bf16 (dequantised) checkpoint's config, as transformers counts it
}


def load_config(name):
  spec = importlib.util.spec_from_file_location(f"recipe_{name}", os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module, module.get_config()


# ----- every recipe builds and validates ------------------------------------------------------------


@pytest.mark.parametrize("name", GSM8K_RECIPES + tuple(BIG_RECIPES) + QUICKSTARTS)
def test_recipe_builds_validates_and_documents_its_command(name):
  module, config = load_config(name)
  resolved = resolve_config(config)
  assert f"python train.py --config configs/{name}.py" in module.__doc__
  assert resolved.critic.enable == (resolved.algorithm.adv_estimator == "gae")


@pytest.mark.parametrize("name", GSM8K_RECIPES)
def test_gsm8k_recipes_carry_the_gpu_settings(name):
  module, config = load_config(name)
  assert "examples/data_preprocess/gsm8k.py" in module.__doc__
  assert config.data.train_files[0].endswith(os.path.join("data", "gsm8k", "train.parquet"))
  assert "Qwen2.5-" in config.actor_rollout_ref.model.path
  actor = config.actor_rollout_ref.actor
  assert (config.data.train_batch_size, actor.ppo_mini_batch_size, actor.optim.lr) == (256, 64, 1e-6)
  assert config.data.max_prompt_length == 512 and config.data.max_response_length in (512, 1024)
  assert config.mesh.fsdp == -1
  algorithm = config.algorithm
  if name.startswith("ppo"):
    assert algorithm.adv_estimator == "gae" and config.critic.optim.lr == 1e-5 and actor.clip_ratio == 0.2
    assert (algorithm.gamma, algorithm.lam) == (0.99, 0.95)
    assert actor.use_kl_loss and (actor.kl_loss_coef, actor.kl_loss_type) == (0.001, "low_var_kl")
  elif name.startswith("grpo"):
    assert algorithm.adv_estimator == "grpo" and config.critic.enable is False
    assert config.actor_rollout_ref.rollout.n == 5 and actor.clip_ratio == 0.2
    assert actor.use_kl_loss and (actor.kl_loss_coef, actor.kl_loss_type) == (0.001, "low_var_kl")
    assert not algorithm.use_kl_in_reward and actor.entropy_coeff == 0.0
  else:
    assert algorithm.adv_estimator == "grpo" and config.critic.enable is False
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert algorithm.filter_groups.enable and algorithm.filter_groups.metric == "score"
    overlong = config.reward_model.overlong_buffer
    assert overlong.enable and (overlong.len, overlong.penalty_factor) == (512, 1.0)
    assert config.data.gen_batch_size > config.data.train_batch_size
    assert not actor.use_kl_loss and not algorithm.use_kl_in_reward and actor.entropy_coeff == 0.0


def test_recipes_name_their_runs_distinctly():
  names = [load_config(name)[1].trainer.experiment_name for name in GSM8K_RECIPES + tuple(BIG_RECIPES)]
  assert len(set(names)) == len(names), names


# ----- architecture files and the big-model recipes (shapes only) ----------------------------------


@functools.lru_cache
def model_shapes(model, head):
  """(config, param shapes, logical axes) of configs/models/<model> with `head`; eval_shape, no memory."""
  config = load_hf_config(os.path.join(ROOT, "configs", "models", model))
  return (config,) + abstract_params(Decoder(config, head=head))


def test_every_architecture_file_has_a_published_size():
  folders = sorted(
    f
    for f in os.listdir(os.path.join(ROOT, "configs", "models"))
    if os.path.isdir(os.path.join(ROOT, "configs", "models", f))
  )
  assert folders == sorted(PUBLIC_SIZES)


@pytest.mark.parametrize("model", sorted(PUBLIC_SIZES))
def test_architecture_file_loads_at_its_published_size(model):
  config, shapes, _ = model_shapes(model, "lm")
  count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))
  assert abs(count / PUBLIC_SIZES[model] - 1) < 0.03, (model, count)
  assert config_from_hf_dict(hf_config_dict(config)) == config  # our export reads back the same model


@pytest.mark.parametrize("name", sorted(BIG_RECIPES))
def test_big_recipe_documents_its_ahead_of_time_check(name):
  module, config = load_config(name)
  model, _, targets = BIG_RECIPES[name]
  assert f"python -m jaxrlhf.aot --config configs/{name}.py" in module.__doc__
  assert f"--config.actor_rollout_ref.model.path=configs/models/{model} " in module.__doc__
  for target, _ in targets:
    assert f"--target {target}\n" in module.__doc__, target
  # The default path is the Hub download of the same model: ~/models/Qwen2.5-7B-Instruct <-> qwen2.5-7b-instruct.
  path = config.actor_rollout_ref.model.path
  assert path == os.path.expanduser(os.path.join("~", "models", os.path.basename(path)))
  assert os.path.basename(path).lower() == model
  assert f"--local-dir ~/models/{os.path.basename(path)}" in module.__doc__


@pytest.mark.parametrize("name", sorted(BIG_RECIPES))
def test_big_recipe_keeps_its_parents_algorithm(name):
  """Only the model, the layout, micro-batch sizes and the run name differ from the 0.5B recipe."""
  _, parent = BIG_RECIPES[name][:2]
  mine, theirs = _resolved_leaves(name), _resolved_leaves(parent)
  changed = sorted(key for key in mine if mine[key] != theirs[key])
  assert set(changed) <= set(BIG_RECIPE_CHANGES), changed


def _resolved_leaves(name):
  """{dotted key: value} of a recipe's resolved config."""

  def leaves(tree, prefix):
    for key, value in tree.items():
      if isinstance(value, dict):
        yield from leaves(value, f"{prefix}{key}.")
      else:
        yield f"{prefix}{key}", value

  return dict(leaves(resolve_config(load_config(name)[1]).to_dict(), ""))


@pytest.mark.parametrize("name", sorted(BIG_RECIPES))
def test_big_recipe_layout_fits_its_targets(name):
  """Every parameter divides by its mesh axes, in the train and the generation layout, on each target."""
  config = resolve_config(load_config(name)[1])
  model, _, targets = BIG_RECIPES[name]
  heads = ("lm", "value") if config.critic.enable else ("lm",)
  for _, devices in targets:
    shape = resolve_mesh_shape((config.mesh.data, config.mesh.fsdp, config.mesh.tensor), devices)
    k = config.actor_rollout_ref.rollout.tensor_model_parallel_size
    mesh = AbstractMesh(*mesh_axes(shape, 1, k))  # fsdp refined for a generation TP beyond mesh.tensor
    rules = generation_rules(mesh, k)
    for head in heads:
      model_config, shapes, logical = model_shapes(model, head)
      logical_to_shardings(logical, shapes, mesh, TRAIN_RULES)
      if head == "lm":  # the rollout model: key/value heads repeated where generation TP outnumbers them
        repeat = generation_kv_repeat(mesh, model_config.num_attention_heads, model_config.num_key_value_heads)
        rollout = Decoder(kv_heads_repeated(model_config, repeat), head="lm") if repeat > 1 else None
        shapes, logical = abstract_params(rollout) if rollout else (shapes, logical)
        logical_to_shardings(logical, shapes, mesh, rules)


# ----- two steps of each GSM8K recipe on tiny fixtures ---------------------------------------------


def _gsm8k_style_rows(count, offset):
  rows = []
  for i in range(count):
    a, b = (i + offset) % 10, (3 * i + offset) % 10
    rows.append(
      {
        "question": f"Tom has {a} apples and buys {b} more . How many apples does Tom have ?",
        "answer": f"Tom has {a} + {b} = {a + b} apples .\n#### {a + b}",
      }
    )
  return rows


@pytest.fixture(scope="module")
def gsm8k_parquet(tmp_path_factory):
  """verl-format train/test parquet, written by the repository's own preprocessing script."""
  raw, out = tmp_path_factory.mktemp("gsm8k_raw"), tmp_path_factory.mktemp("gsm8k")
  for split, count, offset in (("train", 16, 0), ("test", 8, 5)):
    with open(raw / f"{split}.jsonl", "w") as f:
      f.writelines(json.dumps(row) + "\n" for row in _gsm8k_style_rows(count, offset))
  result = subprocess.run(
    [sys.executable, "examples/data_preprocess/gsm8k.py", "--local_dir", str(raw), "--output_dir", str(out)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert (out / "train.parquet").exists() and (out / "test.parquet").exists()
  return str(out)


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
  """A random Qwen2 checkpoint with the built-in word-level tokenizer saved next to it."""
  import torch
  import transformers

  path = tmp_path_factory.mktemp("tiny_qwen2")
  tokenizer = build_tokenizer(save_dir=str(path))
  config = transformers.Qwen2Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    max_position_embeddings=128,
    pad_token_id=tokenizer.pad_token_id,
    eos_token_id=tokenizer.eos_token_id,
  )
  assert config.vocab_size >= len(tokenizer)
  torch.manual_seed(0)
  transformers.Qwen2ForCausalLM(config).save_pretrained(path)
  return str(path)


# Sums of character codes have either parity, so the two samples of a group often score differently:
# DAPO's dynamic sampling keeps some groups of a random model (the GSM8K rule would score all 0).
_PARITY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  return float(sum(map(ord, solution_str)) % 2)
'''


def shrink_to_fixtures(config, model_path, data_dir, run_dir):
  """The recipe, with paths on the fixtures and sizes a CPU runs in seconds; the algorithm untouched."""
  data = config.data
  data.train_files = (os.path.join(data_dir, "train.parquet"),)
  data.val_files = (os.path.join(data_dir, "test.parquet"),)
  data.max_prompt_length, data.truncation, data.filter_overlong_prompts = 64, "left", False
  data.max_response_length = 8
  data.train_batch_size, data.val_batch_size = 4, 8
  if data.gen_batch_size is not None:
    data.gen_batch_size = 6
  config.actor_rollout_ref.model.path = model_path
  actor = config.actor_rollout_ref.actor
  actor.ppo_mini_batch_size = 2
  actor.ppo_micro_batch_size_per_gpu = 2
  rollout = config.actor_rollout_ref.rollout
  rollout.n = min(rollout.n, 2)
  if config.critic.ppo_micro_batch_size_per_gpu is not None:
    config.critic.ppo_micro_batch_size_per_gpu = 2
  if config.reward_model.overlong_buffer.enable:
    config.reward_model.overlong_buffer.len = 4
  config.trainer.default_local_dir = str(run_dir)
  config.trainer.total_training_steps = 2
  config.trainer.logger = ("jsonl",)
  return config


@pytest.mark.parametrize("name", GSM8K_RECIPES)
def test_gsm8k_recipe_runs_two_steps_on_tiny_fixtures(name, tmp_path, tiny_qwen2, gsm8k_parquet):
  _, config = load_config(name)
  config = shrink_to_fixtures(config, tiny_qwen2, gsm8k_parquet, tmp_path)
  if config.algorithm.filter_groups.enable:
    reward_file = tmp_path / "parity_reward.py"
    reward_file.write_text(_PARITY_REWARD)
    config.custom_reward_function.path = str(reward_file)
  trainer = Trainer(config, devices=jax.devices()[:1])
  assert trainer.model_config.model_type == "qwen2"
  for step in range(2):
    metrics = trainer.train_step(step)
    assert metrics["training/global_step"] == step + 1
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean", "perf/throughput"):
      assert key in metrics and math.isfinite(metrics[key]), (name, step, key, metrics.get(key))
    if config.algorithm.adv_estimator == "gae":
      assert math.isfinite(metrics["critic/vf_loss"]) and math.isfinite(metrics["critic/values/mean"])
    if config.actor_rollout_ref.actor.use_kl_loss:
      assert math.isfinite(metrics["actor/kl_loss"])
  assert int(trainer.state.step) == 2


# ----- the quickstart variants learn (slow) --------------------------------------------------------


def _run_quickstart(name, tmp_path, stop_when=None):
  run_train(
    f"configs/{name}.py",
    f"--config.trainer.default_local_dir={tmp_path}",
    "--config.trainer.logger=('jsonl',)",
    stop_when=stop_when,
  )
  _, config = load_config(name)
  run_dir = tmp_path / config.trainer.project_name / config.trainer.experiment_name
  with open(run_dir / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  return config, records


@pytest.mark.slow
@pytest.mark.parametrize("name", ("quickstart_grpo", "quickstart_dapo"))
def test_quickstart_variant_learns(name, tmp_path):
  """The run stops once its validation reward has gained 0.4 (or at its last step)."""
  learned = lambda val: len(val) > 1 and val[-1] >= val[0] + 0.4
  config, records = _run_quickstart(name, tmp_path, stop_when=learned)
  val = [r[VAL_KEY] for r in records if VAL_KEY in r]
  assert val[-1] >= val[0] + 0.4, val
  train = [r for r in records if "training/global_step" in r]
  assert [r["step"] for r in train] == list(range(1, len(train) + 1))
  assert all(math.isfinite(r["actor/pg_loss"]) for r in train)
  assert not any(key.startswith("critic/vf_loss") for key in train[-1])
