"""Built-in synthetic tasks and their word-level tokenizer: verifiable prompts that need no download.

`recall`: the user asks for the first or the last number of a short list of digits, e.g.
"last : 5 8 2 7" -> "#### 7". The answer is checked by the GSM8K rule (flexible extraction: the last
number in the response), so a policy is rewarded for the right number with or without the `####`
marker. A constant guess scores 0.1; attention to the right position solves it for every list, so a
tiny model trained from scratch with PPO generalises to the held-out validation lists.

Rows follow verl's format (SPEC §8), so the same trainer code reads them and parquet files.
"""

from __future__ import annotations

import itertools
import os

import numpy as np

from jaxrlhf.rewards.registry import RECALL_DATA_SOURCE  # its rule is registered with the built-in rules

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>")
WORDS = ("####", ":", "first", "last", "+", "=", "?")
NUMBERS = tuple(str(i) for i in range(20))
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")

_LIST_LENGTH = 4
_NUM_DIGITS = 10
_VAL_SIZE = 256


def build_tokenizer(save_dir: str | None = None):
  """A real HF fast tokenizer (word level, with a chat template); saved with save_pretrained if asked."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {word: i for i, word in enumerate(SPECIAL_TOKENS + WORDS + NUMBERS)}
  backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                      unk_token="<unk>",
                                      additional_special_tokens=["<|user|>", "<|assistant|>"])
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
  combos = [(which, digits) for which in ("first", "last")
            for digits in itertools.product(range(_NUM_DIGITS), repeat=_LIST_LENGTH)]
  order = np.random.default_rng(1234).permutation(len(combos))
  chosen = order[:_VAL_SIZE] if split == "test" else order[_VAL_SIZE:]
  return [_recall_row(*combos[i], split, n) for n, i in enumerate(chosen)]


TASKS = {"recall": recall_rows}


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
