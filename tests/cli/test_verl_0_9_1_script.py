"""A run script written for verl 0.9.1 runs through train.py as it is: its `reward.*` key names, Qwen3's
`apply_chat_template_kwargs.enable_thinking=False`, a custom chat template, a `reward_manager.name=batch` function
(called once per batch with verl's lists) and verl's generation dumps. 2 steps on the CPU quickstart model; then
`trainer.val_only=True` validates and exits.
"""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxrlhf import verl_compat
from jaxrlhf.data.builtin import recall_rows
from tests.cli.test_bad_input import MODEL, _write_hf_model
from tests.helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH_REWARD = """\
import json, os

def compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
    with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as f:
        f.write(json.dumps([type(x).__name__ for x in (data_sources, solution_strs, ground_truths, extra_infos)]
                           + [len(solution_strs)]) + "\\n")
    return [{"score": float(s.strip()[-1:] == str(g)), "acc": s.strip()[-1:] == str(g)}
            for s, g in zip(solution_strs, ground_truths)]
"""

# Renders "####" after the prompt exactly when enable_thinking=False reaches the template.
TEMPLATE = (
  "{% for message in messages %}<|user|> {{ message['content'] }} {% endfor %}"
  "{% if enable_thinking is defined and not enable_thinking %}####{% endif %}<|assistant|>"
)

SCRIPT = """\
# verl 0.9.1's names throughout
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files={root}/train.parquet \\
    data.val_files={root}/val.parquet \\
    data.train_batch_size=4 \\
    data.max_prompt_length=16 \\
    data.max_response_length=4 \\
    +data.apply_chat_template_kwargs.enable_thinking=False \\
    actor_rollout_ref.model.path={root}/model \\
    actor_rollout_ref.model.custom_chat_template="{template}" \\
    actor_rollout_ref.actor.optim.lr=1e-3 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \\
    actor_rollout_ref.rollout.n=2 \\
    actor_rollout_ref.rollout.name=vllm \\
    reward.reward_manager.name=batch \\
    reward.custom_reward_function.path={root}/batch_reward.py \\
    reward.custom_reward_function.name=compute_score \\
    reward.num_workers=2 \\
    reward.reward_model.enable=False \\
    reward.sandbox_fusion.url=null \\
    critic.fsdp.param_offload=False \\
    trainer.logger='["console","file"]' \\
    trainer.project_name=verl091 \\
    trainer.experiment_name=run \\
    trainer.default_local_dir={root}/runs \\
    trainer.rollout_data_dir={root}/rollouts \\
    trainer.validation_data_dir={root}/validation \\
    trainer.total_training_steps=2 \\
    trainer.test_freq=-1 \\
    trainer.use_v1=True \\
    trainer.n_gpus_per_node=2 \\
    trainer.nnodes=1
"""


@pytest.mark.slow
def test_a_verl_0_9_1_script_trains_then_validates_only(tmp_path):
  _write_hf_model(tmp_path / "model", MODEL.num_hidden_layers)
  rows = recall_rows("train")
  pq.write_table(pa.Table.from_pylist(rows[:32]), tmp_path / "train.parquet")
  pq.write_table(pa.Table.from_pylist(rows[32:36]), tmp_path / "val.parquet")
  (tmp_path / "batch_reward.py").write_text(BATCH_REWARD)
  script = tmp_path / "run_qwen3.sh"
  script.write_text(SCRIPT.format(root=tmp_path, template=TEMPLATE.replace('"', '\\"')))
  _, _, parsed = verl_compat.translate_script(str(script))
  env = subprocess_env(devices=2, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)

  def train(*extra):
    args = [sys.executable, "train.py", *map(str, parsed.overrides), *extra]
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result

  train()
  run_dir = tmp_path / "runs" / "verl091" / "run"
  records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["training/global_step"] for r in records if "training/global_step" in r] == [1, 2]
  calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
  # The try before compiling (4 rows, each with its ground truth and an empty response), one call per validation
  # (4 rows) and per training step (4 prompts x 2), each with verl's four lists.
  assert calls == [[*["list"] * 4, 8], [*["list"] * 4, 4], [*["list"] * 4, 8], [*["list"] * 4, 8]]
  for step in (1, 2):  # verl's _dump_generations: one line per sample
    lines = [json.loads(line) for line in (tmp_path / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and {"input", "output", "gts", "score", "step"} <= set(lines[0])
    assert all(line["step"] == step and line["input"].endswith("####") for line in lines)  # enable_thinking=False
  validation = [json.loads(line) for line in (tmp_path / "validation" / "0.jsonl").read_text().splitlines()]
  assert len(validation) == 4 and {"input", "output", "gts", "score", "step", "acc"} <= set(validation[0])

  result = train("trainer.val_only=True", "trainer.experiment_name=val_only", "trainer.val_before_train=False")
  val_records = [
    json.loads(line) for line in (tmp_path / "runs" / "verl091" / "val_only" / "metrics.jsonl").read_text().splitlines()
  ]
  assert not any("training/global_step" in r for r in val_records), result.stdout[-2000:]
  assert any(key.startswith("val-core/jaxrlhf/recall/acc") for r in val_records for key in r)
