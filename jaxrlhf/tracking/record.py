"""Reading one step's record (metric name -> plain Python value) the same way in every backend."""

from __future__ import annotations

import re

_KL_KEYS = ("actor/kl_loss", "actor/reward_kl_penalty")
# MLflow and TensorBoard allow only alphanumerics and `_ - . /` (MLflow also `:` and space).
_RESTRICTED_NAME_CHARS = re.compile(r"[^\w\-./]")


def is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def scalars(record: dict) -> dict[str, float]:
  """The scalar metrics as floats (non-finite kept); arrays are left to jsonl."""
  return {key: float(value) for key, value in record.items() if isinstance(value, (int, float))}


def restricted_name(key: str) -> str:
  """`val-core/gsm8k/reward/mean@4` -> `val-core/gsm8k/reward/mean_at_4`, identical in MLflow and TensorBoard."""
  return _RESTRICTED_NAME_CHARS.sub("_", key.replace("@", "_at_"))


def tokens_per_second(record: dict) -> float | None:
  """Tokens (prompt + response) processed per second over the whole step, all devices together."""
  tokens, seconds = record.get("perf/total_num_tokens"), record.get("perf/time_per_step")
  if is_number(tokens) and is_number(seconds) and seconds > 0:
    return tokens / seconds
  return None


def kl(record: dict) -> float | None:
  """The KL the run is regularised by: the actor's KL loss, else the in-reward KL penalty."""
  return next((record[key] for key in _KL_KEYS if is_number(record.get(key))), None)
