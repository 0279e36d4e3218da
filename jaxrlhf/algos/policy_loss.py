"""Policy-gradient losses keyed by verl's `actor.policy_loss.loss_mode` (SPEC §4 "Policy").

Every registered loss has the signature

    fn(old_log_prob, log_prob, advantages, response_mask, *, clip_ratio_low, clip_ratio_high,
       clip_ratio_c, loss_agg_mode, agg_kwargs, rng, **mode_kwargs) -> (loss, metrics)

with [B, T] fp32 inputs already zeroed outside the mask. `agg_kwargs` (global_token_count,
global_seq_count, loss_scale_factor) must be forwarded to `agg_loss`, and `global_token_count`
also normalises the per-token metrics, so that with the mini-batch normalisers every output is
additive over micro-batches. `metrics` holds at least pg_clipfrac, pg_clipfrac_lower and ppo_kl.

The importance ratio is exp(clip(lp - old, -20, 20)) in every mode (verl clips only in vanilla;
the clip only matters for ratios beyond e^20 and keeps every mode finite).
"""

import inspect

import jax
import jax.numpy as jnp

from jaxrlhf.algos.registry import Registry
from jaxrlhf.algos.stats import agg_loss, masked_mean, seq_mean, token_mean, zero_masked

POLICY_LOSSES = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register
get_policy_loss = POLICY_LOSSES.get

AGG_KWARG_NAMES = ("global_token_count", "global_seq_count", "loss_scale_factor")
# Keys of verl's `actor.policy_loss` block. A trainer may pass all of them whatever the mode;
# each mode receives only those it declares, any other unknown keyword is a TypeError.
POLICY_LOSS_CONFIG_KEYS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")


def _log_ratio(old_log_prob, log_prob):
    return jnp.clip(log_prob - old_log_prob, -20.0, 20.0)


def _float(x):
    return jnp.asarray(x, jnp.float32)


def _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower=0.0):
    return dict(pg_clipfrac=_float(pg_clipfrac), ppo_kl=_float(ppo_kl), pg_clipfrac_lower=_float(pg_clipfrac_lower))


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob, log_prob, advantages, response_mask, *, clip_ratio_low, clip_ratio_high, clip_ratio_c,
    loss_agg_mode, agg_kwargs, rng=None,
):
    """PPO clipped surrogate with asymmetric clip ("clip-higher") and dual clip for A < 0."""
    del rng
    mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
    log_ratio_BxT = _log_ratio(old_log_prob, log_prob)
    ratio_BxT = jnp.exp(log_ratio_BxT)
    loss_unclipped_BxT = -advantages * ratio_BxT
    loss_clipped_BxT = -advantages * jnp.clip(ratio_BxT, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_ppo_BxT = jnp.maximum(loss_unclipped_BxT, loss_clipped_BxT)
    # Dual clip: for A < 0 a huge ratio would give an unbounded loss; cap it at -A * clip_ratio_c.
    loss_dual_BxT = -advantages * clip_ratio_c
    negative_adv_BxT = advantages < 0
    pg_losses_BxT = jnp.where(negative_adv_BxT, jnp.minimum(loss_dual_BxT, loss_ppo_BxT), loss_ppo_BxT)
    pg_loss = agg_loss(pg_losses_BxT, mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, _metrics(
        pg_clipfrac=token_mean((loss_clipped_BxT > loss_unclipped_BxT).astype(jnp.float32), mask, n_tokens),
        ppo_kl=token_mean(-log_ratio_BxT, mask, n_tokens),
        pg_clipfrac_lower=token_mean(
            ((loss_ppo_BxT > loss_dual_BxT) & negative_adv_BxT).astype(jnp.float32), mask, n_tokens
        ),
    )


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob, log_prob, advantages, response_mask, *, clip_ratio_low, clip_ratio_high, clip_ratio_c,
    loss_agg_mode, agg_kwargs, rng=None,
):
    """GSPO (arXiv 2507.18071): the sequence ratio s = exp(mean_m(lp - old)) replaces the token ratio.

    Per token the ratio is exp(lp - sg(lp) + sg(log s)): value s, gradient s * d lp. Aggregated
    seq-mean-token-mean whatever `loss_agg_mode` says, as in verl (the objective is per sequence).
    """
    del clip_ratio_c, loss_agg_mode, rng
    mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
    log_ratio_BxT = _log_ratio(old_log_prob, log_prob)
    log_seq_ratio_B = masked_mean(log_ratio_BxT, mask, axis=-1)
    sg = jax.lax.stop_gradient
    # The sg(log s) term is added last to avoid cancellation error (verl PR 2775); clamp as verl.
    log_token_ratio_BxT = jnp.minimum(log_prob - sg(log_prob) + sg(log_seq_ratio_B)[:, None], 10.0)
    ratio_BxT = jnp.exp(log_token_ratio_BxT)
    loss_unclipped_BxT = -advantages * ratio_BxT
    loss_clipped_BxT = -advantages * jnp.clip(ratio_BxT, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses_BxT = jnp.maximum(loss_unclipped_BxT, loss_clipped_BxT)
    pg_loss = agg_loss(pg_losses_BxT, mask, "seq-mean-token-mean", **agg_kwargs)
    return pg_loss, _metrics(
        pg_clipfrac=token_mean((loss_clipped_BxT > loss_unclipped_BxT).astype(jnp.float32), mask, n_tokens),
        ppo_kl=token_mean(-log_ratio_BxT, mask, n_tokens),
    )


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob, log_prob, advantages, response_mask, *, clip_ratio_low, clip_ratio_high, clip_ratio_c,
    loss_agg_mode, agg_kwargs, rng=None,
):
    """GPG: plain policy gradient -lp * A (no ratio, no clip)."""
    del clip_ratio_low, clip_ratio_high, clip_ratio_c, rng
    pg_loss = agg_loss(-log_prob * advantages, response_mask, loss_agg_mode, **agg_kwargs)
    ppo_kl = token_mean(-_log_ratio(old_log_prob, log_prob), response_mask, agg_kwargs.get("global_token_count"))
    return pg_loss, _metrics(pg_clipfrac=0.0, ppo_kl=ppo_kl)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob, log_prob, advantages, response_mask, *, clip_ratio_low, clip_ratio_high, clip_ratio_c,
    loss_agg_mode, agg_kwargs, rng=None,
):
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(ratio, 1-eps_low, 1+eps_high)) * A * lp.

    The clipped weight is a constant, so clipped tokens still get a gradient (unlike PPO).
    pg_clipfrac = fraction of tokens whose weight was clipped; pg_clipfrac_lower = those clipped at
    the lower bound.
    """
    del clip_ratio_c, rng
    mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
    log_ratio_BxT = _log_ratio(old_log_prob, log_prob)
    ratio_BxT = jnp.exp(log_ratio_BxT)
    weight_BxT = jax.lax.stop_gradient(jnp.clip(ratio_BxT, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high))
    pg_loss = agg_loss(-weight_BxT * advantages * log_prob, mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, _metrics(
        pg_clipfrac=token_mean((weight_BxT != ratio_BxT).astype(jnp.float32), mask, n_tokens),
        ppo_kl=token_mean(-log_ratio_BxT, mask, n_tokens),
        pg_clipfrac_lower=token_mean((ratio_BxT < 1.0 - clip_ratio_low).astype(jnp.float32), mask, n_tokens),
    )


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob, log_prob, advantages, response_mask, *, clip_ratio_low, clip_ratio_high, clip_ratio_c,
    loss_agg_mode, agg_kwargs, rng=None,
):
    """GMPO (arXiv 2507.20673): geometric mean of token ratios, clipped per token in log space.

    Per token, the log-ratio is clipped to [-eps_low, eps_high] only on the side that would raise
    the objective (pessimistic, as PPO): log r' = sign(A) * min(sign(A) log r, sign(A) clip(log r)).
    Per row: loss = -mean_m(A) * exp(mean_m(log r')); rows are averaged (over rows with a valid
    token, with `global_seq_count` when given). `loss_agg_mode` is ignored, as in verl.
    """
    del clip_ratio_c, loss_agg_mode, rng
    mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
    log_ratio_BxT = _log_ratio(old_log_prob, log_prob)
    sign_adv_BxT = jnp.sign(advantages)
    log_ratio_clipped_BxT = jnp.clip(log_ratio_BxT, -clip_ratio_low, clip_ratio_high)
    log_ratio_pessimistic_BxT = sign_adv_BxT * jnp.minimum(
        sign_adv_BxT * log_ratio_BxT, sign_adv_BxT * log_ratio_clipped_BxT
    )
    seq_ratio_B = jnp.exp(masked_mean(log_ratio_pessimistic_BxT, mask, axis=-1))
    seq_advantage_B = masked_mean(advantages, mask, axis=-1)
    tokens_per_seq_B = jnp.sum(jnp.asarray(mask, jnp.float32), axis=-1)
    pg_loss = seq_mean(-seq_advantage_B * seq_ratio_B, tokens_per_seq_B > 0, agg_kwargs.get("global_seq_count"))
    clipped_BxT = log_ratio_BxT != log_ratio_clipped_BxT
    return pg_loss, _metrics(
        pg_clipfrac=token_mean((clipped_BxT & (advantages > 0)).astype(jnp.float32), mask, n_tokens),
        ppo_kl=token_mean(-log_ratio_BxT, mask, n_tokens),
        pg_clipfrac_lower=token_mean((clipped_BxT & (advantages < 0)).astype(jnp.float32), mask, n_tokens),
    )


def _centered_covariance(advantages, log_prob, mask):
    """Per-token (A - mean_m A) * (lp - mean_m lp); only used to *select* tokens, so no gradient."""
    advantages, log_prob = jax.lax.stop_gradient(advantages), jax.lax.stop_gradient(log_prob)
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


def _rank(keys_BxT):
    """0-based rank of each element in ascending order of `keys` (ties by position)."""
    order = jnp.argsort(keys_BxT.reshape(-1), stable=True)
    ranks = jnp.zeros(order.shape, jnp.int32).at[order].set(jnp.arange(order.size, dtype=jnp.int32))
    return ranks.reshape(keys_BxT.shape)


def _count_from_ratio(ratio, mask):
    # verl: max(int(ratio * #valid tokens), 1)
    n_valid = jnp.sum(jnp.asarray(mask, jnp.float32))
    return jnp.maximum(jnp.floor(ratio * n_valid), 1.0)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob, log_prob, advantages, response_mask, *, clip_ratio_low, clip_ratio_high, clip_ratio_c,
    loss_agg_mode, agg_kwargs, rng=None, clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0,
):
    """Clip-Cov (arXiv 2505.22617): PPO clip, plus the gradient of a few high-covariance tokens cut.

    Candidates are valid tokens not already clipped by PPO with clip_cov_lb < cov < clip_cov_ub;
    max(floor(clip_cov_ratio * #valid), 1) of them, drawn uniformly at random with `rng`, get their
    loss multiplied by 0. pg_clipfrac = fraction of detached tokens (as verl). No dual clip.
    """
    del clip_ratio_c
    if rng is None:
        raise ValueError("loss_mode='clip_cov' draws the detached tokens at random: pass a PRNG key as rng=")
    if clip_cov_ratio <= 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
    valid_BxT = jnp.asarray(mask) != 0
    log_ratio_BxT = _log_ratio(old_log_prob, log_prob)
    ratio_BxT = jnp.exp(log_ratio_BxT)
    loss_unclipped_BxT = -advantages * ratio_BxT
    loss_clipped_BxT = -advantages * jnp.clip(ratio_BxT, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped_by_ppo_BxT = loss_clipped_BxT > loss_unclipped_BxT
    cov_BxT = _centered_covariance(advantages, log_prob, mask)
    candidate_BxT = valid_BxT & ~clipped_by_ppo_BxT & (cov_BxT > clip_cov_lb) & (cov_BxT < clip_cov_ub)
    # A uniformly random subset of the candidates = those with the smallest i.i.d. uniform keys.
    keys_BxT = jnp.where(candidate_BxT, jax.random.uniform(rng, cov_BxT.shape), jnp.inf)
    detached_BxT = candidate_BxT & (_rank(keys_BxT) < _count_from_ratio(clip_cov_ratio, mask))
    pg_losses_BxT = jnp.where(detached_BxT, 0.0, jnp.maximum(loss_unclipped_BxT, loss_clipped_BxT))
    pg_loss = agg_loss(pg_losses_BxT, mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, _metrics(
        pg_clipfrac=token_mean(detached_BxT.astype(jnp.float32), mask, n_tokens),
        ppo_kl=token_mean(-log_ratio_BxT, mask, n_tokens),
    )


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob, log_prob, advantages, response_mask, *, clip_ratio_low, clip_ratio_high, clip_ratio_c,
    loss_agg_mode, agg_kwargs, rng=None, kl_cov_ratio=0.0002, ppo_kl_coef=1.0,
):
    """KL-Cov (arXiv 2505.22617): unclipped -A * ratio, plus ppo_kl_coef * |lp - old| on the
    max(floor(kl_cov_ratio * #valid), 1) valid tokens of largest covariance.

    The selection is a deterministic top-k as in verl (ties by position), so `rng` is unused.
    ppo_kl reports mean_m |lp - old|, as verl.
    """
    del clip_ratio_low, clip_ratio_high, clip_ratio_c, rng
    if kl_cov_ratio <= 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
    valid_BxT = jnp.asarray(mask) != 0
    log_ratio_BxT = _log_ratio(old_log_prob, log_prob)
    abs_kl_BxT = jnp.abs(log_ratio_BxT)
    loss_pg_BxT = -advantages * jnp.exp(log_ratio_BxT)
    cov_BxT = _centered_covariance(advantages, log_prob, mask)
    descending_rank_BxT = _rank(jnp.where(valid_BxT, -cov_BxT, jnp.inf))
    penalised_BxT = valid_BxT & (descending_rank_BxT < _count_from_ratio(kl_cov_ratio, mask))
    pg_losses_BxT = jnp.where(penalised_BxT, loss_pg_BxT + ppo_kl_coef * abs_kl_BxT, loss_pg_BxT)
    pg_loss = agg_loss(pg_losses_BxT, mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, _metrics(pg_clipfrac=0.0, ppo_kl=token_mean(abs_kl_BxT, mask, n_tokens))


def _accepted(fn, kwargs):
    """Drops verl policy_loss config keys that `fn` does not declare; keeps everything else."""
    parameters = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in parameters or k not in POLICY_LOSS_CONFIG_KEYS}


def compute_policy_loss(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    *,
    loss_mode="vanilla",
    clip_ratio=0.2,
    clip_ratio_low=None,
    clip_ratio_high=None,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    rng=None,
    **agg_and_mode_kwargs,
):
    """Policy loss of `loss_mode` -> (loss, metrics) (SPEC §1, §4).

    clip_ratio_low/high default to clip_ratio. `agg_and_mode_kwargs` holds the `agg_loss`
    normalisers (global_token_count, global_seq_count, loss_scale_factor; see
    `loss_normalizers`) and mode hyper-parameters (clip_cov_ratio/lb/ub, kl_cov_ratio, ppo_kl_coef).
    Inputs may be bf16; the loss is computed in fp32 and masked positions never matter.
    """
    fn = get_policy_loss(loss_mode)
    if loss_mode == "vanilla" and isinstance(clip_ratio_c, (int, float)) and clip_ratio_c <= 1.0:
        raise ValueError(f"actor.clip_ratio_c (dual-clip lower bound of the ratio) must be > 1, got {clip_ratio_c}")
    agg_kwargs = {k: agg_and_mode_kwargs.pop(k) for k in AGG_KWARG_NAMES if k in agg_and_mode_kwargs}
    agg_kwargs = {k: v for k, v in agg_kwargs.items() if v is not None}
    mode_kwargs = _accepted(fn, agg_and_mode_kwargs)
    mode_kwargs = {k: v for k, v in mode_kwargs.items() if not (k in POLICY_LOSS_CONFIG_KEYS and v is None)}
    return fn(
        zero_masked(old_log_prob, response_mask),
        zero_masked(log_prob, response_mask),
        zero_masked(advantages, response_mask),
        response_mask,
        clip_ratio_low=clip_ratio if clip_ratio_low is None else clip_ratio_low,
        clip_ratio_high=clip_ratio if clip_ratio_high is None else clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        agg_kwargs=agg_kwargs,
        rng=rng,
        **mode_kwargs,
    )
