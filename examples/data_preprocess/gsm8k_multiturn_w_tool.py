"""Convert a local copy of GSM8K into verl's multi-turn tool rows (its gsm8k_multiturn_w_tool layout); no network.

    python examples/data_preprocess/gsm8k_multiturn_w_tool.py --local_dir ~/raw/gsm8k/main \
        --output_dir ~/data/gsm8k_multiturn

The rows of ``gsm8k.py`` plus what verl's multi-turn preprocessing writes: a system message that asks the model
to check its answer with the ``calc_gsm8k_reward`` tool before answering after ``####``, and
``extra_info.need_tools_kwargs`` / ``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth``, which
the GSM8K tool reads when a trajectory calls it (docs/tools.md). Train with a multi-turn config
(``actor_rollout_ref.rollout.multi_turn.enable=True``, ``tool_config_path=builtin:gsm8k``), e.g.
configs/grpo_gsm8k_multiturn_qwen2_5_7b.py.
"""

import os
import sys
from typing import Any, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gsm8k  # noqa: E402  (the sibling module: reading, ground truths, writing)

TOOL_NAME = "calc_gsm8k_reward"
SYSTEM_PROMPT = (
  "You are a math expert. Solve the question step by step. Before you give the final answer, check it at least "
  f"once with the `{TOOL_NAME}` tool and refine it if needed. Put the final answer after `####`."
)


def multiturn_row(
  data_source: str, split: str, index: int, question: str, answer: str, ground_truth: str, instruction: str
) -> dict[str, Any]:
  row = gsm8k.make_row(data_source, split, index, question, answer, ground_truth, instruction)
  row["prompt"] = [{"role": "system", "content": SYSTEM_PROMPT}, *row["prompt"]]
  row["extra_info"].update(
    need_tools_kwargs=True,
    tools_kwargs={TOOL_NAME: {"create_kwargs": {"ground_truth": ground_truth}}},
  )
  return row


def main(argv: Optional[Sequence[str]] = None) -> dict[str, str]:
  return gsm8k.convert(
    argv,
    description=__doc__.splitlines()[0],
    default_output_dir="~/data/gsm8k_multiturn",
    default_data_source=gsm8k.DATA_SOURCE,
    question_column="question",
    answer_column="answer",
    ground_truth_fn=gsm8k.extract_ground_truth,
    instruction=gsm8k.INSTRUCTION,
    row_fn=multiturn_row,
  )


if __name__ == "__main__":
  main()
