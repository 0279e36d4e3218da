"""Sampling: the settings, the logit filters, the PRNG convention and one decode step's token choice.

Sampled tokens' log-probs come from the temperature-scaled full distribution (the same `z = logits /
temperature` the training forward uses, docs/algorithms.md §4), so the rollout's log-probs equal the actor's
recomputed `old_log_prob` for the same weights (in the same dtype; a bf16 rollout differs slightly).
top-k / top-p only restrict what is sampled. `decode_step` and the PRNG convention (`request_key`, `token_keys`)
are what every generation path shares (the loop: `rollout/decode.py`), so `jaxrlhf.generate` and `Engine.serve`
sample the same tokens for the same seed and request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from jaxrlhf.models.attention import MASK_VALUE  # the filtered logit, as a masked key's score


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Static sampling settings (hashable: part of the compiled program)."""

  max_new_tokens: int
  eos_token_ids: tuple[int, ...]
  pad_token_id: int
  temperature: float = 1.0
  top_k: int = -1  # -1 = off
  top_p: float = 1.0
  do_sample: bool = True
  # The decode loop in this many parts, each with a KV cache only as long as it needs (None = by length).
  decode_segments: int | None = None

  @classmethod
  def from_rollout_config(
    cls, rollout, max_new_tokens: int, eos_token_ids: Sequence[int], pad_token_id: int, validation: bool = False
  ) -> "SamplingParams":
    source = rollout.val_kwargs if validation else rollout
    return cls(
      max_new_tokens=int(max_new_tokens),
      eos_token_ids=tuple(int(e) for e in eos_token_ids),
      pad_token_id=int(pad_token_id),
      temperature=float(source.temperature),
      top_k=int(source.top_k),
      top_p=float(source.top_p),
      do_sample=bool(source.do_sample),
    )

  @property
  def segment_ends(self) -> list[int]:
    """Decode steps at which each segment of the loop ends (the last at `max_new_tokens`).

    Attention (and XLA's relayout of the cache for it) costs in proportion to the cache length, so a
    step of an early segment, whose cache is shorter, is cheaper: 4 segments over 256 new tokens after
    a 128-token prompt make a batch-32 rollout 15-25% faster on CPU. Each segment is its own loop in
    the program (more to compile), so by default one segment per 64 new tokens, at most 4.
    """
    segments = self.decode_segments or min(4, max(1, self.max_new_tokens // 64))
    segments = max(1, min(segments, self.max_new_tokens))
    return [round(self.max_new_tokens * (i + 1) / segments) for i in range(segments)]

  @property
  def logprob_temperature(self) -> float:
    # Greedy decoding has no sampling temperature; score its tokens under the plain distribution.
    return self.temperature if self.do_sample and self.temperature > 0 else 1.0


def filter_logits(logits_BxV, top_k: int, top_p: float):
  """Masks tokens outside the top-k and outside the smallest set with cumulative prob >= top_p."""
  if top_k > 0:
    kth_B = jax.lax.top_k(logits_BxV, top_k)[0][:, -1]
    logits_BxV = jnp.where(logits_BxV < kth_B[:, None], MASK_VALUE, logits_BxV)
  if top_p < 1.0:
    sorted_BxV = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    # Keep a sorted token when the mass strictly before it is < top_p (the top token always stays).
    mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
    kept_BxV = mass_before_BxV < top_p
    threshold_B = jnp.min(jnp.where(kept_BxV, sorted_BxV, jnp.inf), axis=-1)
    logits_BxV = jnp.where(logits_BxV < threshold_B[:, None], MASK_VALUE, logits_BxV)
  return logits_BxV


def token_log_probs(logits_BxLxV, tokens_BxL, temperature: float):
  """log softmax(logits / temperature) at the given tokens, fp32: z[token] - logsumexp(z).

  Never materialises the [B, L, V] log-softmax: one pass for the max, one for the sum of exponentials.
  """
  z_BxLxV = logits_BxLxV.astype(jnp.float32) / temperature
  picked_BxL = jnp.take_along_axis(z_BxLxV, tokens_BxL[..., None], axis=-1)[..., 0]
  return picked_BxL - jax.nn.logsumexp(z_BxLxV, axis=-1)


def greedy_tokens(logits_BxV):
  """argmax over the vocabulary, the first index on ties (as `jnp.argmax`).

  Written as a max then a min over matching indices: two plain reductions that XLA:CPU vectorises,
  where `argmax`'s (value, index) pair reduction runs about 20x slower on a [32, 32000] block.
  """
  max_Bx1 = jnp.max(logits_BxV, axis=-1, keepdims=True)
  index_V = jnp.arange(logits_BxV.shape[-1], dtype=jnp.int32)
  first_B = jnp.min(jnp.where(logits_BxV == max_Bx1, index_V, logits_BxV.shape[-1]), axis=-1)
  return jnp.minimum(first_B, logits_BxV.shape[-1] - 1).astype(jnp.int32)  # a NaN row stays a valid id


def choose_tokens(logits_BxV, key, sampling: SamplingParams):
  """Greedy argmax, or a sample from softmax(filter(logits / T)); `key` is one key or one per row."""
  if not sampling.do_sample or sampling.temperature <= 0:
    return greedy_tokens(logits_BxV)
  scaled_BxV = filter_logits(logits_BxV / sampling.temperature, sampling.top_k, sampling.top_p)
  # `jax.random.categorical` is argmax(logits + Gumbel noise): the same noise and the same first-index
  # argmax here, so the same tokens, without the slow (value, index) argmax reduction (9 -> 3 ms a token
  # for [16, 32000] on a 2-core CPU).
  if key.ndim == 0:
    gumbel_BxV = jax.random.gumbel(key, scaled_BxV.shape, scaled_BxV.dtype)
  else:
    gumbel_BxV = jax.vmap(lambda k: jax.random.gumbel(k, scaled_BxV.shape[1:], scaled_BxV.dtype))(key)
  return greedy_tokens(scaled_BxV + gumbel_BxV)


def request_key(seed, request, sample):
  """The sampling key of sample `sample` of request (prompt) `request` under `seed`.

  fold_in(fold_in(key(seed), request), sample): `jaxrlhf.generate` and `Engine.serve` key a request
  this way, so its samples depend on (seed, request, sample) only, not on its batch, slot or `n`
  (sample 0 of a prompt is the same with n=1 or n=4). Arguments may be traced (vmap it for a batch).
  """
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), request), sample)


def token_keys(rng, index):
  """The sampling key of generated token `index` (0 = the first): `fold_in(key, index)`.

  The one PRNG convention of generation. `rng` is either one key for the whole batch (the training
  rollout: one draw over [B, V], so a row's tokens depend on its place in the batch; kept so that a
  seed's rollouts stay what they were), or a key per row, a request's own key (`request_key`: the
  serving engine and `jaxrlhf.generate`): then a request's tokens depend only on its key and its
  prompt, whichever batch, slot or step it runs in. `index`: a scalar, or one per row.
  """
  if rng.ndim == 0:
    return jax.random.fold_in(rng, index)
  return jax.vmap(jax.random.fold_in)(rng, jnp.broadcast_to(index, rng.shape))


def decode_step(
  apply_fn: Callable, params, tokens_B, positions_B, kv_mask_BxS, cache, cache_index, keys, sampling: SamplingParams
):
  """The model call and token choice of every generation path's step (`decode.step`): feed each row's last token
  (written at cache column `cache_index`), choose the next with `keys` (`token_keys`) and score it.

  Returns (token_B, log_prob_B under softmax(logits / T), cache).
  """
  logits_Bx1xV, cache = apply_fn(params, tokens_B[:, None], positions_B[:, None], kv_mask_BxS, cache, cache_index)
  logits_BxV = logits_Bx1xV[:, 0]
  token_B = choose_tokens(logits_BxV, keys, sampling)
  return token_B, token_log_probs(logits_BxV, token_B, sampling.logprob_temperature), cache
