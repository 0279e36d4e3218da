"""Shape discipline for generation: prompts padded to a few known (batch, length) buckets.

Every distinct prompt length or batch size is a new XLA program. Padding each batch to the smallest
bucket that fits keeps a run at `len(length_buckets) * len(batch_buckets)` programs at most. A prompt
longer than every bucket still runs (in a length rounded up to a power of two) but logs a warning
naming the bucket list, so a recompile is never silent.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def pick_bucket(size: int, buckets: Sequence[int], what: str = "prompt length") -> int:
  """Smallest bucket >= size; beyond every bucket: the next power of two, with a warning."""
  if size < 0:
    raise ValueError(f"{what} must be >= 0, got {size}")
  fitting = [b for b in sorted(buckets) if b >= size]
  if fitting:
    return fitting[0]
  fallback = 1 << max(size - 1, 0).bit_length()
  logger.warning(
    "%s %d is larger than every bucket %s: compiling an extra program for %d (add a larger bucket to avoid this)",
    what,
    size,
    sorted(buckets),
    fallback,
  )
  return fallback


def prompt_length_buckets(max_prompt_length: int, buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS) -> tuple[int, ...]:
  """The widths a training or validation batch of prompts is padded to: `buckets` below the maximum, and it.

  The data set's prompts are at most `max_prompt_length` tokens, so no batch ever falls past the last
  bucket: a run compiles at most one step program per bucket.
  """
  return tuple(b for b in sorted(buckets) if b < max_prompt_length) + (max_prompt_length,)


@dataclasses.dataclass(frozen=True)
class PaddedPrompts:
  """A left-padded batch; rows >= num_prompts are batch padding (all-zero mask, `active_B` False)."""

  prompt_ids_BxP: np.ndarray  # int32
  prompt_mask_BxP: np.ndarray  # int32
  num_prompts: int

  @property
  def active_B(self) -> np.ndarray:
    return np.arange(self.prompt_ids_BxP.shape[0]) < self.num_prompts


def pad_prompts(
  prompts: Sequence[Sequence[int]],
  pad_token_id: int,
  length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
  batch_buckets: Sequence[int] | None = DEFAULT_BATCH_BUCKETS,
) -> PaddedPrompts:
  """Left-pads token lists to the smallest fitting length bucket and the batch to a batch bucket.

  batch_buckets=None keeps the batch size as it is.
  """
  if not prompts:
    raise ValueError("pad_prompts needs at least one prompt")
  if any(len(p) == 0 for p in prompts):
    raise ValueError("every prompt needs at least one token (got an empty prompt)")
  length = pick_bucket(max(len(p) for p in prompts), length_buckets)
  batch = len(prompts) if batch_buckets is None else pick_bucket(len(prompts), batch_buckets, "batch size")
  ids_BxP = np.full((batch, length), pad_token_id, np.int32)
  mask_BxP = np.zeros((batch, length), np.int32)
  for row, tokens in enumerate(prompts):
    ids_BxP[row, length - len(tokens) :] = tokens
    mask_BxP[row, length - len(tokens) :] = 1
  return PaddedPrompts(ids_BxP, mask_BxP, len(prompts))


def repeat_interleave(items: Sequence, n: int) -> list:
  """[a, b] -> [a, a, b, b] for n=2: the `n` samples of a prompt sit next to each other (docs/algorithms.md §5)."""
  if n < 1:
    raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
  return [item for item in items for _ in range(n)]


def response_lengths_and_clip(response_mask_BxR) -> tuple[np.ndarray, float]:
  """Per-row response lengths and the fraction that hit the maximum length (`response_length/clip_ratio`)."""
  mask_BxR = np.asarray(response_mask_BxR)
  lengths_B = mask_BxR.sum(axis=1)
  return lengths_B, float(np.mean(lengths_B == mask_BxR.shape[1])) if len(lengths_B) else 0.0
