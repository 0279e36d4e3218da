"""What generation needs of a model: its cached forward and the per-layer state it keeps between tokens.

The decode loop (`rollout/decode.py`) never looks inside the cache. It creates it with `init_cache`, hands it to
`apply` and moves rows and columns of it by the logical axes of each leaf (`cache_axes`): "batch" (every leaf has
it: a row's state) and "length" (leaves that grow with the sequence, such as keys and values; a recurrent
state has none). A new kind of layer therefore changes only the model: what its leaves hold, and how `apply`
writes and reads them (docs/architecture.md, "Adding a layer kind").

The contract of `apply(params, ids_BxL, positions_BxL, kv_mask_BxS, cache, cache_index) -> (logits_BxLxV, cache)`:
- the L new tokens are written at sequence column `cache_index` (a scalar, or one per row [B] when L = 1);
- `kv_mask_BxS` marks the sequence columns written so far (left padding and unused columns are 0), this
  call's included: a token whose column is 0 there must leave its row's state as a later step reads it (a KV
  cache is rewritten at that column before it is read; a recurrent state must not advance);
- a column past the cache's end is dropped, not clamped (a finished row may be stepped once more).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from jaxrlhf.models.decoder import Decoder, cache_axes, init_cache


@dataclasses.dataclass(frozen=True, eq=False)
class DecodeModel:
  """A model as the decode loop sees it (see the module docstring for the contract)."""

  apply: Callable  # (params, ids_BxL, positions_BxL, kv_mask_BxS, cache, cache_index) -> (logits_BxLxV, cache)
  init_cache: Callable  # (batch, length) -> the zeroed per-layer state of `batch` rows, `length` columns
  cache_axes: Any  # the tree of `init_cache`, each leaf's logical axes (a tuple of names) in its place


def decode_model(module: Decoder, variables: Callable | None = None) -> DecodeModel:
  """The `DecodeModel` of a `Decoder` (lm head). `variables(params) -> dict` what `apply` takes (default
  {"params": params}; e.g. `model_variables(params, adapters)` to decode with unmerged LoRA adapters)."""
  variables = variables or (lambda params: {"params": params})
  return DecodeModel(
    apply=lambda params, *inputs: module.apply(variables(params), *inputs),
    init_cache=functools.partial(init_cache, module.config),
    cache_axes=cache_axes(module.config),
  )
