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

Records: what a model keeps per written token beside its state, which generation returns with each row's response
(`records(cache, written_BxS) -> {name: [B, S, ...]}`, "rollout_<name>" in the rollout's outputs). A Decoder with
experts built with `record_routes` records the experts each token was routed to in every layer (rollout routing
replay: the training forwards route by them, `Decoder(replay_BxLxYxk=...)`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from jaxrlhf.models import moe
from jaxrlhf.models.decoder import ROUTES, Decoder, cache_axes, init_cache

_no_records = lambda cache, written_BxS: {}


@dataclasses.dataclass(frozen=True, eq=False)
class DecodeModel:
  """A model as the decode loop sees it (see the module docstring for the contract)."""

  apply: Callable  # (params, ids_BxL, positions_BxL, kv_mask_BxS, cache, cache_index) -> (logits_BxLxV, cache)
  init_cache: Callable  # (batch, length) -> the zeroed per-layer state of `batch` rows, `length` columns
  cache_axes: Any  # the tree of `init_cache`, each leaf's logical axes (a tuple of names) in its place
  records: Callable = _no_records  # (cache, written_BxS) -> {name: [B, S, ...]}: per-token records (docstring)


def decode_model(module: Decoder, variables: Callable | None = None, record_routes: bool = False) -> DecodeModel:
  """The `DecodeModel` of a `Decoder` (lm head). `variables(params) -> dict` what `apply` takes (default
  {"params": params}; e.g. `model_variables(params, adapters)` to decode with unmerged LoRA adapters).
  `record_routes` (a model with experts): the records hold "routes" [B, S, layers, k], each written token's experts
  (`moe.no_route` at columns not written)."""
  variables = variables or (lambda params: {"params": params})
  config = module.config
  records = _no_records
  if record_routes:

    def records(cache, written_BxS):
      routes_YxBxSxk, width = cache[ROUTES], written_BxS.shape[1]
      routes_YxBxSxk = jnp.pad(routes_YxBxSxk, ((0, 0), (0, 0), (0, max(width - routes_YxBxSxk.shape[2], 0)), (0, 0)))
      routes_BxSxYxk = jnp.moveaxis(routes_YxBxSxk[:, :, :width], 0, 2)
      unwritten = jnp.asarray(moe.no_route(config.num_experts), routes_BxSxYxk.dtype)
      return {ROUTES: jnp.where(written_BxS[:, :, None, None] > 0, routes_BxSxYxk, unwritten)}

  return DecodeModel(
    apply=lambda params, *inputs: module.apply(variables(params), *inputs),
    init_cache=functools.partial(init_cache, config, record_routes=record_routes),
    cache_axes=cache_axes(config, record_routes),
    records=records,
  )
