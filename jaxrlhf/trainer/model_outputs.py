"""What the step reads from its models: response log-probs (+ entropy) from the actor or the reference,
values from the critic. Every phase and every loss calls these two, for padded rows or a packed slot.

A response token's log-prob and value are read at the position *before* it (docs/algorithms.md §4): the logits or
value at position t score token t + 1. Padded rows hold prompt (left-padded) + response in one
sequence of length S = P + R; a packed slot (`use_remove_padding`, see `packing`) holds several
sequences per row and is read back into the [N, R] layout (rows outside the slot hold garbage: the
caller masks them).

Only the positions that matter reach a head: padded rows slice the backbone's hidden states to the R
response positions first (the prompt's logits are never computed). The LM head then runs in chunks of
positions (`logits_chunk_size` tokens per device): the [rows, length, vocab] logits never exist at
once, and the backward recomputes each chunk's (`jax.checkpoint`), so a 152K vocabulary at 8K tokens
holds one chunk of fp32 logits, not the batch's.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxrlhf import algos
from jaxrlhf.models import moe
from jaxrlhf.models.decoder import Decoder, head_outputs, model_variables, positions_from_mask
from jaxrlhf.models.lora import critic_variables
from jaxrlhf.rollout import token_log_probs
from jaxrlhf.trainer import packing


def sequence_inputs(prompts_NxP, prompt_mask_NxP, responses_NxR):
  """(ids_NxS, positions_NxS, mask_NxS) of prompt + response; the response counts as valid everywhere."""
  ids_NxS = jnp.concatenate([prompts_NxP, responses_NxR], axis=1)
  mask_NxS = jnp.concatenate([prompt_mask_NxP.astype(jnp.int32), jnp.ones_like(responses_NxR)], axis=1)
  return ids_NxS, positions_from_mask(mask_NxS), mask_NxS


def chunk_length(rows: int, length: int, chunk_tokens: int, num_batch_shards: int) -> int:
  """Positions per chunk so that one chunk holds about `chunk_tokens` tokens per device (0: all)."""
  if chunk_tokens <= 0:
    return length
  rows_per_device = max(1, -(-rows // num_batch_shards))
  return max(1, min(length, chunk_tokens // rows_per_device))


# Per-token statistics of the distribution softmax(z), z = logits / temperature, beside the log-prob.
TOKEN_STATISTICS = {"entropy": algos.entropy_from_logits, "sum_pi_squared": algos.sum_pi_squared_from_logits}


def lm_token_outputs(
  config,
  params,
  hidden_BxLxD,
  tokens_BxL,
  temperature: float,
  statistics: tuple[str, ...],
  chunk_len: int,
  constrain: Callable = lambda x, logical_axes: x,
  ref=None,
  adapters=None,
  topk: int = 0,
  gather_ids_BxLxK=None,
) -> dict:
  """{"log_prob": [B, L], and each of `statistics` (TOKEN_STATISTICS names): [B, L]} of `tokens` under
  softmax(head(hidden) / T), fp32.

  Distillation (docs/algorithms.md "On-policy distillation"), both read one chunk of logits at a time, never
  [B, L, V]: `topk` > 0 (the teacher) adds "topk_log_probs" [B, L, k] and "topk_ids" [B, L, k] of the k most
  likely tokens; `gather_ids_BxLxK` (the student, the teacher's top-k ids) adds "topk_log_probs" [B, L, K] at
  those ids and "topk_overlap" [B, L], how many of them are among the student's own top K.

  `adapters`: the actor's LoRA adapters (the head reads an "lm_head" adapter; the reference runs without).
  `ref`: (ref_params, ref_hidden_BxLxD) of the reference policy at the same positions; adds
  "ref_log_prob" and "full_kl" (the exact KL(pi || ref) over the vocabulary, `algos.full_kl`), so the
  two policies' logits meet one chunk at a time.

  With `chunk_len` < L the positions run as a `lax.scan` over chunks of `chunk_len` (the last one padded);
  each chunk's logits are recomputed in the backward instead of kept. `constrain(x, logical_axes)`
  pins the chunk's hidden states and logits to the train layout (`ActivationLayout.constrain`).
  """

  def logits(head_params, h_BxCxD, head_adapters=None):
    h_BxCxD = constrain(h_BxCxD, ("batch", "length", None))
    return (
      constrain(head_outputs(config, "lm", head_params, h_BxCxD, head_adapters), ("batch", "length", "vocab"))
      / temperature
    )

  def outputs(h_BxCxD, tokens_BxC, ids_BxCxK=None, ref_h_BxCxD=None):
    z_BxCxV = logits(params, h_BxCxD, adapters)
    out = {
      "log_prob": token_log_probs(z_BxCxV, tokens_BxC, 1.0),
      **{name: TOKEN_STATISTICS[name](z_BxCxV) for name in statistics},
    }
    if topk:
      out["topk_log_probs"], out["topk_ids"] = algos.topk_log_probs(z_BxCxV, topk)
    if ids_BxCxK is not None:
      out["topk_log_probs"] = algos.gather_log_probs(z_BxCxV, ids_BxCxK)
      out["topk_overlap"] = algos.topk_overlap_count(z_BxCxV, ids_BxCxK)
    if ref_h_BxCxD is not None:
      ref_z_BxCxV = logits(ref[0], ref_h_BxCxD)
      out.update(
        ref_log_prob=token_log_probs(ref_z_BxCxV, tokens_BxC, 1.0), full_kl=algos.full_kl(z_BxCxV, ref_z_BxCxV)
      )
    return out

  rows, length = tokens_BxL.shape
  inputs = (hidden_BxLxD, tokens_BxL, gather_ids_BxLxK) + ((ref[1],) if ref is not None else ())
  if chunk_len >= length:
    return outputs(*inputs)
  num_chunks = -(-length // chunk_len)
  pad = num_chunks * chunk_len - length
  to_chunks = lambda x: jnp.moveaxis(
    jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)).reshape((rows, num_chunks, chunk_len) + x.shape[2:]), 1, 0
  )
  chunk_outputs = jax.checkpoint(lambda _, chunk: (None, outputs(*chunk)), prevent_cse=False)
  chunks = tuple(None if x is None else to_chunks(x) for x in inputs)
  _, out_KxBxC = jax.lax.scan(chunk_outputs, None, chunks)
  return jax.tree.map(
    lambda x_KxBxC: jnp.moveaxis(x_KxBxC, 0, 1).reshape((rows, num_chunks * chunk_len) + x_KxBxC.shape[3:])[:, :length],
    out_KxBxC,
  )


# Rollout routing replay (`actor_rollout_ref.rollout.enable_rollout_routing_replay`): the rollout's record of each
# token's experts per layer, [N, P + R, layers, k] (`Generation`), and its packed rows' [B, S, layers, k].
REPLAYED = "rollout_routes"


class ModelOutputs:
  """The actor's (or reference's: same module, other params) and the critic's per-response-token outputs.

  `chunk_tokens` (`logits_chunk_size`) and `num_batch_shards` (devices a batch is split over) size the
  LM head's chunks.
  """

  def __init__(
    self,
    actor: Decoder,
    critic: Decoder,
    temperature: float,
    chunk_tokens: int = 0,
    num_batch_shards: int = 1,
    constrain: Callable = lambda x, logical_axes: x,
  ):
    self.actor = actor
    self.critic = critic
    self.temperature = temperature  # the rollout's: log-probs are those of the distribution sampled from
    self.chunk_tokens = chunk_tokens
    self.num_batch_shards = num_batch_shards
    self.constrain = constrain

  def _hidden(
    self, model: Decoder, params, micro: dict, adapters=None, router_stats: bool = False, replay: bool = False
  ):
    """Final hidden states at the positions that predict response tokens: [N, R, D] of padded rows, or
    [B, S, D] of a packed slot's rows (every position: `packing.response_outputs` reads them back).
    `router_stats` (a model with experts): (hidden, the MoE layers' `moe.router_stats` over every valid token).
    `replay`: the experts route by the rollout's record (`REPLAYED`) where the micro-batch has one."""
    apply = lambda *args, **kwargs: model.apply(
      model_variables(params, adapters),
      *args,
      return_hidden=True,
      mutable=["intermediates"] if router_stats else False,
      **kwargs,
    )
    if "packed" in micro:
      packed = micro["packed"]
      out = apply(
        packed["input_ids"],
        packed["positions"],
        (packed["segment_ids"] > 0).astype(jnp.int32),
        segment_ids_BxL=packed["segment_ids"],
        replay_BxLxYxk=packed.get(REPLAYED) if replay else None,
      )
      (hidden_BxLxD, _), variables = out if router_stats else (out, None)
    else:
      prompt_len, response_len = micro["prompts"].shape[1], micro["responses"].shape[1]
      out = apply(
        *sequence_inputs(micro["prompts"], micro["prompt_mask"], micro["responses"]),
        replay_BxLxYxk=micro.get(REPLAYED) if replay else None,
      )
      (hidden_NxSxD, _), variables = out if router_stats else (out, None)
      hidden_BxLxD = hidden_NxSxD[:, prompt_len - 1 : prompt_len + response_len - 1]
    if router_stats:
      return hidden_BxLxD, moe.router_stats(variables["intermediates"])
    return hidden_BxLxD

  def _to_responses(self, per_token, micro: dict):
    """A packed slot's per-position outputs [B, S] as [N, R]; padded outputs are [N, R] already."""
    if "packed" not in micro:
      return per_token
    return packing.response_outputs(per_token, micro["packed"], micro["prompts"].shape[1], micro["responses"].shape[1])

  def token_outputs(
    self,
    params,
    micro: dict,
    statistics: tuple[str, ...] = (),
    adapters=None,
    ref_params=None,
    router_stats: bool = False,
    replay: bool = False,
    teacher_topk_ids=None,
  ) -> dict:
    """{"log_prob": [N, R] of the response tokens, and each of `statistics` (TOKEN_STATISTICS): [N, R]}.

    `adapters`: LoRA adapters on `params` (None: the model as `params` has it, e.g. the reference).
    With `ref_params` (the reference policy's, run without adapters) also "ref_log_prob" and "full_kl"
    [N, R] (exact KL over the vocabulary, `kl_penalty` / `kl_loss_type` "full"); the reference's forward
    carries no gradient. `router_stats` (a model with experts) adds "router_stats": its layers'
    `moe.router_stats` over the call's valid tokens (the load-balancing loss's and the expert-load metrics' input;
    not [N, R], so only a loss asks for it). `replay`: the forward routes by the rollout's record (`REPLAYED`)
    where the micro-batch has one (rollout routing replay): the actor's old-log-prob and update forwards ask for it,
    the reference's forward never does (as verl's, it routes by the reference's own router).
    `teacher_topk_ids` [N, R, K] (distillation's forward_kl_topk, padded rows only): adds "topk_log_probs"
    [N, R, K], the log-probs at those ids, and "topk_overlap" [N, R] (`lm_token_outputs`).
    """
    with_stats = router_stats and bool(self.actor.config.num_experts)
    hidden_BxLxD = self._hidden(self.actor, params, micro, adapters, router_stats=with_stats, replay=replay)
    router_stats = None
    if with_stats:
      hidden_BxLxD, router_stats = hidden_BxLxD
    ref = None
    if ref_params is not None:
      ref_params = jax.lax.stop_gradient(ref_params)
      ref = (ref_params, self._hidden(self.actor, ref_params, micro))
    tokens_BxL = packing.next_tokens(micro["packed"]["input_ids"]) if "packed" in micro else micro["responses"]
    chunk_len = chunk_length(tokens_BxL.shape[0], tokens_BxL.shape[1], self.chunk_tokens, self.num_batch_shards)
    out = lm_token_outputs(
      self.actor.config,
      params,
      hidden_BxLxD,
      tokens_BxL,
      self.temperature,
      statistics,
      chunk_len,
      self.constrain,
      ref,
      adapters,
      gather_ids_BxLxK=teacher_topk_ids,
    )
    out = {name: self._to_responses(x, micro) for name, x in out.items()}
    return out if router_stats is None else dict(out, router_stats=router_stats)

  def teacher_outputs(self, teacher: Decoder, params, micro: dict, topk: int = 0) -> dict:
    """The distillation teacher's view of the response tokens: {"log_prob": [N, R]}, and with `topk` > 0
    "topk_log_probs" / "topk_ids" [N, R, topk] (padded rows only), at the rollout's temperature like the
    student's. `teacher`: its module (its own architecture, the student's vocabulary); no gradient."""
    params = jax.lax.stop_gradient(params)
    hidden_BxLxD = self._hidden(teacher, params, micro)
    tokens_BxL = packing.next_tokens(micro["packed"]["input_ids"]) if "packed" in micro else micro["responses"]
    chunk_len = chunk_length(tokens_BxL.shape[0], tokens_BxL.shape[1], self.chunk_tokens, self.num_batch_shards)
    out = lm_token_outputs(
      teacher.config, params, hidden_BxLxD, tokens_BxL, self.temperature, (), chunk_len, self.constrain, topk=topk
    )
    return {name: self._to_responses(x, micro) for name, x in out.items()}

  def log_probs(self, params, micro: dict, with_entropy: bool = True, adapters=None):
    """(log_prob_NxR, entropy_NxR or None) of the response tokens; logits in fp32 / temperature."""
    out = self.token_outputs(params, micro, ("entropy",) if with_entropy else (), adapters)
    return out["log_prob"], out.get("entropy")

  def values(self, params, micro: dict, adapters=None):
    """V at the state before each response token, [N, R].

    `adapters`: a LoRA critic's trained part (`RoleState.adapters`: {"lora", "head"}); `params` is
    then its frozen backbone, run with the adapters unmerged and the trained value head."""
    params, adapters = critic_variables(params, adapters)
    hidden_BxLxD = self._hidden(self.critic, params, micro, adapters)
    return self._to_responses(head_outputs(self.critic.config, "value", params, hidden_BxLxD), micro)
