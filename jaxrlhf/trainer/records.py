"""What the step's phases hand each other: typed records (pytrees), one per phase output.

N = prompts x n sequences, P the padded prompt length, R the padded response length. Every record is a
`flax.struct` dataclass, so it crosses `jax.jit` boundaries (phased mode, `jaxrlhf.aot`) like the dicts it
replaces, and a field a mode does not produce is None (a static absence, not a missing key). Metrics travel
only in `metrics` fields; arrays that later phases read travel only in array fields (docs/architecture.md
"One step's data flow").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import numpy as np

SEQUENCE_FIELDS = ("prompts", "prompt_mask", "responses", "response_mask")  # what a model's forward reads


@flax.struct.dataclass
class Rollout:
  """Phase `gen`: the sampled sequences, in the train layout."""

  prompts: jax.Array  # [N, P] left-padded prompt ids, each prompt repeated n times (interleaved)
  prompt_mask: jax.Array  # [N, P]
  responses: jax.Array  # [N, R]
  response_mask: jax.Array  # [N, R] up to and including the first end-of-sequence token
  rollout_log_probs: jax.Array  # [N, R] the sampler's log-probs of its tokens
  sample_index: jax.Array  # [N] each row's prompt's row in the dataset
  group_index: jax.Array  # [N] each row's prompt within the batch (GRPO's groups)
  decode_steps: jax.Array  # [] decode loop iterations run
  baseline_responses: jax.Array | None = None  # [N, R] ReMax: the greedy response of each row's prompt
  baseline_response_mask: jax.Array | None = None
  # Multi-turn rollouts (`rollout.multi_turn`): `response_mask` is then the loss mask (the policy's own tokens) and
  # this one every token of the response, tool responses included (verl's attention mask over the response).
  response_attention_mask: jax.Array | None = None  # [N, R]
  num_turns: jax.Array | None = None  # [N] verl's num_turns: assistant turns + tool turns + 1
  tool_rewards: jax.Array | None = None  # [N, C] each tool call's step reward, NaN past the row's calls
  # Rollout routing replay: each token's experts in every layer as the sampler routed it, [N, P + R, layers, k]
  # (`moe.no_route` where it recorded none: padding, the last response token).
  rollout_routes: jax.Array | None = None

  def sequences(self) -> dict[str, jax.Array]:
    """What a model's forward reads (`SEQUENCE_FIELDS`, and a multi-turn rollout's `response_attention_mask`, the
    routes a forward may replay)."""
    fields = {name: getattr(self, name) for name in SEQUENCE_FIELDS}
    for name in ("response_attention_mask", "rollout_routes"):
      if getattr(self, name) is not None:
        fields[name] = getattr(self, name)
    return fields

  def sequence_mask(self) -> jax.Array:
    """[N, R] every token of each response: the attention mask of a multi-turn rollout, else `response_mask`."""
    return self.response_mask if self.response_attention_mask is None else self.response_attention_mask


@flax.struct.dataclass
class Scored:
  """Phase `reward`."""

  scores: jax.Array  # [N] sequence scores (+ DAPO's overlong penalty)
  reward_errors: jax.Array  # [N] 1 where the reward function failed (`reward_model.on_error=zero`)
  null_ground_truths: jax.Array  # [N] 1 where the row's ground truth was null
  token_level_scores: jax.Array  # [N, R] the score on the last valid token
  reward_components: jax.Array | None = None  # [K, N] GDPO: the rule reward's named components
  reward_baselines: jax.Array | None = None  # [N] ReMax: the greedy baseline's score


@flax.struct.dataclass
class OldLogProbs:
  """Phase `old_log_prob`: the rollout policy's log-probs and what the same forward gives beside them."""

  log_probs: jax.Array | None  # [N, R]; None when the actor update's first epoch gives them
  metrics: dict[str, jax.Array]  # `actor/entropy` (as verl), when this phase ran the forward
  sum_pi_squared: jax.Array | None = None  # [N, R] the optimal token baselines' sum_v pi_v^2
  full_kl: jax.Array | None = None  # [N, R] exact KL to the reference over the vocabulary (full KL in reward)
  ref_log_probs: jax.Array | None = None  # [N, R] the reference's, from the same pass (full KL in reward)


@flax.struct.dataclass
class Advantages:
  """Phase `adv`."""

  advantages: jax.Array  # [N, R]
  returns: jax.Array  # [N, R]
  token_level_rewards: jax.Array  # [N, R] scores minus the KL penalty in the reward
  response_mask: jax.Array  # [N, R] after any rollout rejection (decoupled correction)
  kl_coef: jax.Array  # [] the KL controller's next coefficient
  metrics: dict[str, jax.Array]
  rollout_is_weights: jax.Array | None = None  # [N, R] decoupled rollout correction's weights


# Fields whose rows are not the leading axis ([K, N]).
_ROW_AXIS = {"reward_components": 1}


def take_rows(record, rows: np.ndarray):
  """`record` (numpy leaves) with only `rows` (indices or a boolean mask) of its per-sequence fields."""
  taken = {}
  for field in dataclasses.fields(record):
    value = getattr(record, field.name)
    if value is None or isinstance(value, dict) or np.ndim(value) == 0:
      continue
    taken[field.name] = np.take(
      np.asarray(value), np.flatnonzero(rows) if rows.dtype == bool else rows, axis=_ROW_AXIS.get(field.name, 0)
    )
  return record.replace(**taken)


def concatenate_rows(records: list) -> Any:
  """One record of `records`' rows in order (per-sequence fields joined; the first record's scalars kept)."""
  first, joined = records[0], {}
  for field in dataclasses.fields(first):
    value = getattr(first, field.name)
    if value is None or isinstance(value, dict) or np.ndim(value) == 0:
      continue
    axis = _ROW_AXIS.get(field.name, 0)
    joined[field.name] = np.concatenate([np.asarray(getattr(r, field.name)) for r in records], axis=axis)
  return first.replace(**joined)
