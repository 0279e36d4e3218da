"""Built-in synthetic tasks and their word-level tokenizer: verifiable prompts that need no download.

`recall`: the user asks for the first or the last number of a short list of digits, e.g.
"last : 5 8 2 7" -> "#### 7". The answer is checked by the GSM8K rule (flexible extraction: the last
number in the response), so a policy is rewarded for the right number with or without the `####`
marker. A constant guess scores 0.1; attention to the right position solves it for every list, so a
tiny model trained from scratch with PPO generalises to the held-out validation lists.

`lookup`: "secret ?" asks for a digit only the row's `lookup` tool knows (multi-turn rollouts with tools,
configs/quickstart_tools.py): the policy calls the tool (its call is one word of the vocabulary), then answers
`#### <digit>` in a second turn.

`arith`: one addition or subtraction of two numbers below 20 for a pretrained chat model (the recipe
configs/grpo_smollm2_arith.py), as chat messages its own template renders: two worked examples as earlier
turns ("What is 3 + 4?" -> "3 + 4 = 7\n#### 7"), then the question. Scored by the strict GSM8K rule, so
the reward needs the `#### N` line as well as the right number: SmolLM2-135M-Instruct gets some right
from the start, which gives GRPO its signal.

Rows follow verl's format (docs/algorithms.md §8), so the same trainer code reads them and parquet files.
"""

from __future__ import annotations

import itertools
import os

import numpy as np

from jaxrlhf.rewards import gsm8k, register_reward
from jaxrlhf.rewards.registry import RECALL_DATA_SOURCE  # its rule is registered with the built-in rules

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>")
WORDS = ("####", ":", "first", "last", "+", "=", "?")
NUMBERS = tuple(str(i) for i in range(20))
# The `lookup` task's words (`build_tokenizer(task="lookup")`, data.tokenizer=builtin:lookup), after the others: the
# tool turn's role, the question, and the task's one tool call written as a single word, a hermes call the parser
# reads (a tiny model from scratch learns one token, not a JSON string). Only that tokenizer has them: a policy of
# another task that samples an id past the base words decodes it as before.
LOOKUP_CALL = '<tool_call>{"name":"lookup","arguments":{}}</tool_call>'
TOOL_WORDS = ("<|tool|>", "secret", LOOKUP_CALL)
CHAT_TEMPLATE = (
  "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
  "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_LIST_LENGTH = 4
_NUM_DIGITS = 10
_VAL_SIZE = 256


def build_tokenizer(save_dir: str | None = None, extra_words: tuple[str, ...] = (), task: str = "recall"):
  """A real HF fast tokenizer (word level, with a chat template); saved with save_pretrained if asked.
  `task="lookup"` adds the tool task's words; `extra_words`: more words after those (tests write tool calls as
  single words)."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  tool_words = TOOL_WORDS if task == "lookup" else ()
  vocab = {word: i for i, word in enumerate(SPECIAL_TOKENS + WORDS + NUMBERS + tool_words + tuple(extra_words))}
  backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=backend,
    pad_token="<pad>",
    eos_token="<eos>",
    unk_token="<unk>",
    additional_special_tokens=["<|user|>", "<|assistant|>"] + (["<|tool|>"] if tool_words else []),
  )
  tokenizer.chat_template = CHAT_TEMPLATE
  if save_dir:
    os.makedirs(save_dir, exist_ok=True)
    tokenizer.save_pretrained(save_dir)
  return tokenizer


def _recall_row(which: str, digits: tuple[int, ...], split: str, index: int) -> dict:
  answer = digits[0] if which == "first" else digits[-1]
  return {
    "data_source": RECALL_DATA_SOURCE,
    "prompt": [{"role": "user", "content": f"{which} : " + " ".join(str(d) for d in digits)}],
    "ability": "recall",
    "reward_model": {"style": "rule", "ground_truth": str(answer)},
    "extra_info": {"split": split, "index": index},
  }


def recall_rows(split: str) -> list[dict]:
  """All (first|last, digit list) prompts; a fixed, seeded subset is held out as `test`."""
  combos = [
    (which, digits)
    for which in ("first", "last")
    for digits in itertools.product(range(_NUM_DIGITS), repeat=_LIST_LENGTH)
  ]
  order = np.random.default_rng(1234).permutation(len(combos))
  chosen = order[:_VAL_SIZE] if split == "test" else order[_VAL_SIZE:]
  return [_recall_row(*combos[i], split, n) for n, i in enumerate(chosen)]


ARITH_DATA_SOURCE = "jaxrlhf/arith"
_ARITH_MAX = 20  # operands in [0, 20): 610 problems, 128 of them held out
_ARITH_VAL_SIZE = 128
# Earlier turns of every arith prompt: the answer format, shown rather than described.
ARITH_EXAMPLES = (("What is 3 + 4?", "3 + 4 = 7\n#### 7"), ("What is 15 - 6?", "15 - 6 = 9\n#### 9"))
ARITH_SYSTEM = "Solve the arithmetic problem. End with #### and the answer."


# Registered here, as a user's rule would be: reward worker processes import the module of every registered rule.
@register_reward(ARITH_DATA_SOURCE)
def arith_score(data_source, solution_str, ground_truth, extra_info=None):
  return gsm8k.compute_score(solution_str, ground_truth, method="strict")


def arith_messages(question: str) -> list[dict]:
  """The chat of one arith prompt: a short system line, the worked examples, then `question`."""
  messages = [{"role": "system", "content": ARITH_SYSTEM}]
  for example_question, example_answer in ARITH_EXAMPLES:
    messages += [{"role": "user", "content": example_question}, {"role": "assistant", "content": example_answer}]
  return messages + [{"role": "user", "content": question}]


def arith_rows(split: str) -> list[dict]:
  """Every `a + b` and `a - b` (a >= b) with operands below 20; a fixed, seeded subset is held out as `test`."""
  problems = [
    (a, op, b) for a in range(_ARITH_MAX) for b in range(_ARITH_MAX) for op in ("+", "-") if op == "+" or a >= b
  ]
  order = np.random.default_rng(4321).permutation(len(problems))
  chosen = order[:_ARITH_VAL_SIZE] if split == "test" else order[_ARITH_VAL_SIZE:]
  rows = []
  for n, i in enumerate(chosen):
    a, op, b = problems[i]
    rows.append(
      {
        "data_source": ARITH_DATA_SOURCE,
        "prompt": arith_messages(f"What is {a} {op} {b}?"),
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(a + b if op == "+" else a - b)},
        "extra_info": {"split": split, "index": n},
      }
    )
  return rows


LOOKUP_DATA_SOURCE = "jaxrlhf/lookup"
_LOOKUP_TRAIN_SIZE, _LOOKUP_VAL_SIZE = 4096, 256
LOOKUP_TOOL_BONUS = 0.1  # verl's tool-call shaping (examples' gsm8k_toolcall_shaping): a response that calls a tool


@register_reward(LOOKUP_DATA_SOURCE)
def lookup_score(data_source, solution_str, ground_truth, extra_info=None):
  """verl's tool-call shaping (its gsm8k_toolcall_shaping example), for an answer only a lookup can back: a
  trajectory that called the tool (more than verl's 2 turns) scores `LOOKUP_TOOL_BONUS`, plus the strict GSM8K rule
  (`#### N`; the tool's own text has no `####`, so reading it back is not answering) with 0.1 for the format
  alone; one that did not scores 0. `acc`: the rule alone, 1 or 0."""
  acc = gsm8k.compute_score(solution_str, ground_truth, method="strict")
  if (extra_info or {}).get("num_turns", 0) <= 2:
    return {"score": 0.0, "acc": acc}
  shaped = gsm8k.compute_score(solution_str, ground_truth, method="strict", format_score=LOOKUP_TOOL_BONUS)
  return {"score": LOOKUP_TOOL_BONUS + shaped, "acc": acc}


def lookup_rows(split: str) -> list[dict]:
  """Multi-turn tool task: every prompt asks for "secret ?", a digit only the row's `lookup` tool knows (its
  `tools_kwargs`, as verl's preprocessors write them), so guessing scores 0.1 and calling the tool then copying its
  answer after `####` scores 1."""
  rng = np.random.default_rng(99 if split == "test" else 98)
  rows = []
  for index, digit in enumerate(rng.integers(0, 10, _LOOKUP_VAL_SIZE if split == "test" else _LOOKUP_TRAIN_SIZE)):
    rows.append(
      {
        "data_source": LOOKUP_DATA_SOURCE,
        "prompt": [{"role": "user", "content": "secret ?"}],
        "ability": "tool",
        "reward_model": {"style": "rule", "ground_truth": str(digit)},
        "extra_info": {
          "split": split,
          "index": index,
          "need_tools_kwargs": True,
          "tools_kwargs": {"lookup": {"create_kwargs": {"table": {"secret": str(digit)}}}},
        },
      }
    )
  return rows


TASKS = {"recall": recall_rows, "arith": arith_rows, "lookup": lookup_rows}


def builtin_rows(spec: str) -> list[dict]:
  """`builtin:<task>:<split>` -> rows; errors name the unknown task or split."""
  parts = spec.split(":")
  if len(parts) != 3 or parts[0] != "builtin":
    raise ValueError(f"built-in dataset {spec!r} must look like 'builtin:<task>:<train|test>'")
  _, task, split = parts
  if task not in TASKS:
    raise ValueError(f"unknown built-in task {task!r} in {spec!r}; known: {sorted(TASKS)}")
  if split not in ("train", "test"):
    raise ValueError(f"unknown split {split!r} in {spec!r}; expected 'train' or 'test'")
  return TASKS[task](split)
