"""The checkpoint's tokenizer and the token ids generation needs (eos set, pad).

Chat models stop on more than one token (Llama-3 Instruct: `<|eot_id|>` and `<|end_of_text|>`,
Qwen2.5 Instruct: `<|im_end|>` and `<|endoftext|>`); the full set lives in generation_config.json,
not in the tokenizer, so both are read.
"""

from __future__ import annotations

import json
import os

from jaxrlhf.errors import CheckpointError, UserError

# The class transformers 5 writes for a tokenizer that is its tokenizer.json alone (the built-in tasks' word tokenizer).
_PLAIN_TOKENIZER = "TokenizersBackend"


def load_tokenizer(path: str):
  """`transformers.AutoTokenizer` from a local checkpoint directory, never running repository code.

  A tokenizer saved as a plain `TokenizersBackend` is loaded as one: beside a config.json whose model type
  transformers lists as having wrong hub tokenizer classes (qwen2, qwen3_5, phi3, ...), AutoTokenizer would build
  that family's class instead, with its own pre-tokenizer (the built-in word tokenizer of an exported quickstart
  model then split "10" into "1" "0", dropped "####" and decoded "3 3" as "33")."""
  if not os.path.isdir(path):
    raise CheckpointError(f"tokenizer path {path!r} is not a directory")
  from transformers import AutoTokenizer

  if _tokenizer_class(path) == _PLAIN_TOKENIZER:
    from transformers import TokenizersBackend

    return TokenizersBackend.from_pretrained(path)
  return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def _tokenizer_class(path: str) -> str | None:
  config = os.path.join(path, "tokenizer_config.json")
  if not os.path.exists(config):
    return None
  with open(config) as f:
    try:
      return json.load(f).get("tokenizer_class")
    except (json.JSONDecodeError, AttributeError):
      return None  # AutoTokenizer names the broken file


def _as_ids(value) -> list[int]:
  if value is None:
    return []
  return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def generation_eos_ids(path: str | None, tokenizer) -> tuple[int, ...]:
  """EOS ids: the tokenizer's eos first, then generation_config.json's `eos_token_id` (int or list)."""
  ids = _as_ids(getattr(tokenizer, "eos_token_id", None))
  config_path = os.path.join(path, "generation_config.json") if path else None
  if config_path and os.path.exists(config_path):
    with open(config_path) as f:
      try:
        generation_config = json.load(f)
      except json.JSONDecodeError as e:
        raise CheckpointError(f"{config_path} is not valid JSON: {e}") from None
    ids += _as_ids(generation_config.get("eos_token_id"))
  ids = tuple(dict.fromkeys(ids))  # de-duplicated, order kept
  if not ids:
    raise CheckpointError(
      f"no eos token id: neither the tokenizer nor {config_path or 'a generation_config.json'} defines eos_token_id"
    )
  return ids


def pad_token_id(tokenizer, eos_ids: tuple[int, ...]) -> int:
  """The tokenizer's pad id, else the first eos id (Llama tokenizers have no pad token)."""
  return int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else int(eos_ids[0])


def encode_prompt(tokenizer, prompt, chat: bool) -> list[int]:
  """A prompt's token ids as `jaxrlhf.generate` and a judge (`trainer/judge.py`) tokenize it: a list of chat
  messages, or text with `chat`, through the chat template (with the generation prompt); text as-is, no special
  tokens added."""
  if isinstance(prompt, list) or chat:
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if not getattr(tokenizer, "chat_template", None):
      raise UserError("--chat (or a prompt given as chat messages) needs a tokenizer with a chat template")
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  if not isinstance(prompt, str):
    raise UserError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
  return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
