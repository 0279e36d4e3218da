"""What the step reads from its models: response log-probs (+ entropy) from the actor or the reference,
values from the critic. Every phase and every loss calls these two, for padded rows or a packed slot.

A response token's log-prob and value are read at the position *before* it (SPEC §4): the logits or
value at position t score token t + 1. Padded rows hold prompt (left-padded) + response in one
sequence of length S = P + R; a packed slot (`use_remove_padding`, see `packing`) holds several
sequences per row and is read back into the [N, R] layout (rows outside the slot hold garbage: the
caller masks them).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxrlhf import algos
from jaxrlhf.models.decoder import Decoder, positions_from_mask
from jaxrlhf.rollout import token_log_probs
from jaxrlhf.trainer import packing


def sequence_inputs(prompts_NxP, prompt_mask_NxP, responses_NxR):
  """(ids_NxS, positions_NxS, mask_NxS) of prompt + response; the response counts as valid everywhere."""
  ids_NxS = jnp.concatenate([prompts_NxP, responses_NxR], axis=1)
  mask_NxS = jnp.concatenate([prompt_mask_NxP.astype(jnp.int32), jnp.ones_like(responses_NxR)], axis=1)
  return ids_NxS, positions_from_mask(mask_NxS), mask_NxS


def _packed_apply(model: Decoder, params, packed: dict):
  return model.apply({"params": params}, packed["input_ids"], packed["positions"],
                     (packed["segment_ids"] > 0).astype(jnp.int32), segment_ids_BxL=packed["segment_ids"])[0]


class ModelOutputs:
  """The actor's (or reference's: same module, other params) and the critic's per-response-token outputs."""

  def __init__(self, actor: Decoder, critic: Decoder, temperature: float):
    self.actor = actor
    self.critic = critic
    self.temperature = temperature  # the rollout's: log-probs are those of the distribution sampled from

  def log_probs(self, params, micro: dict, with_entropy: bool = True):
    """(log_prob_NxR, entropy_NxR or None) of the response tokens; logits in fp32 / temperature."""
    prompt_len, response_len = micro["prompts"].shape[1], micro["responses"].shape[1]
    if "packed" in micro:
      packed = micro["packed"]
      logits_BxSxV = _packed_apply(self.actor, params, packed)
      log_prob_BxS = token_log_probs(logits_BxSxV, packing.next_tokens(packed["input_ids"]), self.temperature)
      log_prob_NxR = packing.response_outputs(log_prob_BxS, packed, prompt_len, response_len)
      entropy = lambda: packing.response_outputs(algos.entropy_from_logits(logits_BxSxV / self.temperature),
                                                 packed, prompt_len, response_len)
    else:
      ids_NxS, positions_NxS, mask_NxS = sequence_inputs(micro["prompts"], micro["prompt_mask"], micro["responses"])
      logits_NxSxV, _ = self.actor.apply({"params": params}, ids_NxS, positions_NxS, mask_NxS)
      logits_NxRxV = logits_NxSxV[:, prompt_len - 1:prompt_len + response_len - 1]
      log_prob_NxR = token_log_probs(logits_NxRxV, micro["responses"], self.temperature)
      entropy = lambda: algos.entropy_from_logits(logits_NxRxV / self.temperature)
    return log_prob_NxR, entropy() if with_entropy else None

  def values(self, params, micro: dict):
    """V at the state before each response token, [N, R]."""
    prompt_len, response_len = micro["prompts"].shape[1], micro["responses"].shape[1]
    if "packed" in micro:
      packed = micro["packed"]
      return packing.response_outputs(_packed_apply(self.critic, params, packed), packed, prompt_len, response_len)
    ids_NxS, positions_NxS, mask_NxS = sequence_inputs(micro["prompts"], micro["prompt_mask"], micro["responses"])
    values_NxS, _ = self.critic.apply({"params": params}, ids_NxS, positions_NxS, mask_NxS)
    return values_NxS[:, prompt_len - 1:prompt_len + response_len - 1]
