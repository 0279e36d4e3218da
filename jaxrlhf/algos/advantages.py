"""Advantage estimators keyed by verl's `algorithm.adv_estimator` (SPEC §3).

All return (advantages, returns), both [B, T] fp32. Conventions shared by every estimator:
- R_b = sum_t token_level_rewards * m (the outcome score; rewards on padding are ignored).
- `index` is an integer group id per row (the `rollout.n` samples of a prompt share one). Any
  integer values work: they are renumbered to 0..B-1 with a sized `jnp.unique`, so segment ops run
  with static `num_segments = B` under jit.
- Rows with no valid response token are padding: they belong to no group, count in no statistic,
  and get advantages and returns of 0 (beyond verl, which would count them). Outputs are 0
  outside the mask everywhere (verl leaves unmasked garbage in some estimators).
- Advantages are constants of the policy update (verl runs these under no_grad): inputs are
  wrapped in stop_gradient, so `jax.grad` through an estimator is 0, never NaN.
"""

import inspect

import jax
import jax.numpy as jnp

from jaxrlhf.algos.registry import Registry
from jaxrlhf.algos.stats import as_f32, masked_whiten, zero_masked

ADV_ESTIMATORS = Registry("advantage estimator")
register_adv_estimator = ADV_ESTIMATORS.register
get_adv_estimator = ADV_ESTIMATORS.get

def _prepare(token_level_rewards, response_mask):
    """(masked fp32 rewards [B,T], fp32 mask [B,T], outcome scores R [B], row-is-real [B])."""
    mask_BxT = as_f32(response_mask)
    rewards_BxT = jax.lax.stop_gradient(zero_masked(token_level_rewards, mask_BxT))
    return rewards_BxT, mask_BxT, jnp.sum(rewards_BxT, axis=-1), jnp.sum(mask_BxT, axis=-1) > 0


class _Groups:
    """Per-row group reductions over the real rows of each row's group, gathered back to [B]."""

    def __init__(self, index, row_valid_B):
        index_B = jnp.asarray(index).reshape(-1)
        self.batch_size = index_B.shape[0]
        _, group_B = jnp.unique(index_B, return_inverse=True, size=self.batch_size)
        self.group_B = group_B.reshape(-1)
        self.row_valid_B = row_valid_B
        self.size_B = self.sum(jnp.ones(self.batch_size, jnp.float32))

    def _gather(self, per_group_G):
        return per_group_G[self.group_B]

    def sum(self, x_B):
        x_B = jnp.where(self.row_valid_B, x_B, 0.0)
        return self._gather(jax.ops.segment_sum(x_B, self.group_B, num_segments=self.batch_size))

    def max(self, x_B):
        x_B = jnp.where(self.row_valid_B, x_B, -jnp.inf)
        return self._gather(jax.ops.segment_max(x_B, self.group_B, num_segments=self.batch_size))

    def min(self, x_B, fill):
        x_B = jnp.where(self.row_valid_B, x_B, fill)
        return self._gather(jax.ops.segment_min(x_B, self.group_B, num_segments=self.batch_size))

    def mean(self, x_B):
        """Group mean; 0 for a group of size 1 (no baseline without a second sample, as verl)."""
        return jnp.where(self.size_B > 1, self.sum(x_B) / jnp.maximum(self.size_B, 1.0), 0.0)

    def std(self, x_B):
        """Unbiased group std (torch.std); 1 for a group of size 1 (as verl)."""
        mean_B = self.sum(x_B) / jnp.maximum(self.size_B, 1.0)
        var_B = self.sum(jnp.square(x_B - mean_B)) / jnp.maximum(self.size_B - 1.0, 1.0)
        return jnp.where(self.size_B > 1, jnp.sqrt(var_B), 1.0)


def _broadcast(score_B, mask_BxT):
    return score_B[:, None] * mask_BxT


def _reverse_scan(step, carry, xs_TxB):
    """Runs `step` from the last response position to the first; xs and outputs are time-major."""
    _, ys_TxB = jax.lax.scan(step, carry, xs_TxB, reverse=True)
    return ys_TxB


@register_adv_estimator("gae")
def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
    """GAE with a mask-aware carry, so masked (e.g. observation) tokens are skipped:
    delta = r_t + gamma*nextV - V_t; g = delta + gamma*lam*lastgae;
    nextV = m*V_t + (1-m)*nextV; lastgae = m*g + (1-m)*lastgae.
    returns = adv + V; advantages = masked_whiten(adv, m) over the batch."""
    rewards_BxT, mask_BxT, _, _ = _prepare(token_level_rewards, response_mask)
    values_BxT = jax.lax.stop_gradient(zero_masked(values, mask_BxT))
    advantages_BxT = _gae_scan(rewards_BxT, values_BxT, mask_BxT, gamma, lam)
    returns_BxT = (advantages_BxT + values_BxT) * mask_BxT
    return masked_whiten(advantages_BxT, mask_BxT) * mask_BxT, returns_BxT


# Module-level jit: an eager lax.scan would be retraced and recompiled on every call.
@jax.jit
def _gae_scan(rewards_BxT, values_BxT, mask_BxT, gamma, lam):
    def step(carry, xs):
        next_value_B, last_gae_B = carry
        reward_B, value_B, m_B = xs
        delta_B = reward_B + gamma * next_value_B - value_B
        gae_B = delta_B + gamma * lam * last_gae_B
        next_value_B = m_B * value_B + (1.0 - m_B) * next_value_B
        last_gae_B = m_B * gae_B + (1.0 - m_B) * last_gae_B
        return (next_value_B, last_gae_B), last_gae_B

    zeros_B = jnp.zeros(rewards_BxT.shape[0], jnp.float32)
    return _reverse_scan(step, (zeros_B, zeros_B), (rewards_BxT.T, values_BxT.T, mask_BxT.T)).T


@register_adv_estimator("grpo")
def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=True,
                                   epsilon=1e-6):
    """GRPO: (R - group mean) / (group std + eps), or R - group mean when not normalising by std
    (Dr.GRPO). A group of size 1 has mean 0 and std 1. returns = advantages."""
    _, mask_BxT, scores_B, row_valid_B = _prepare(token_level_rewards, response_mask)
    groups = _Groups(index, row_valid_B)
    advantage_B = scores_B - groups.mean(scores_B)
    if norm_adv_by_std_in_grpo:
        advantage_B = advantage_B / (groups.std(scores_B) + epsilon)
    advantages_BxT = _broadcast(advantage_B, mask_BxT)
    return advantages_BxT, advantages_BxT


@register_adv_estimator("grpo_passk")
def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=True,
                                         epsilon=1e-6):
    """Pass@k (arXiv 2503.19595): only the best row of each group gets r_max - r_second_max
    (divided by the unbiased group std + eps when normalising); the others get 0. Among tied best
    rows the first one wins. A group of size 1 has no second score and gets 0 (verl raises)."""
    _, mask_BxT, scores_B, row_valid_B = _prepare(token_level_rewards, response_mask)
    groups = _Groups(index, row_valid_B)
    row_B = jnp.arange(groups.batch_size)
    best_score_B = groups.max(scores_B)
    best_row_B = groups.min(jnp.where(scores_B == best_score_B, row_B, groups.batch_size), fill=groups.batch_size)
    is_best_B = row_valid_B & (row_B == best_row_B)
    second_score_B = groups.max(jnp.where(is_best_B, -jnp.inf, scores_B))
    advantage_B = jnp.where(is_best_B & (groups.size_B > 1), best_score_B - second_score_B, 0.0)
    if norm_adv_by_std_in_grpo:
        advantage_B = advantage_B / (groups.std(scores_B) + epsilon)
    advantages_BxT = _broadcast(advantage_B, mask_BxT)
    return advantages_BxT, advantages_BxT


@register_adv_estimator("rloo")
def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index):
    """RLOO (arXiv 2402.14740): R_i - mean_{j != i} R_j = (n R_i - sum_j R_j) / (n - 1);
    R_i itself for a group of size 1."""
    _, mask_BxT, scores_B, row_valid_B = _prepare(token_level_rewards, response_mask)
    groups = _Groups(index, row_valid_B)
    n_B = groups.size_B
    leave_one_out_B = (n_B * scores_B - groups.sum(scores_B)) / jnp.maximum(n_B - 1.0, 1.0)
    advantages_BxT = _broadcast(jnp.where(n_B > 1, leave_one_out_B, scores_B), mask_BxT)
    return advantages_BxT, advantages_BxT


@register_adv_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma=1.0):
    """REINFORCE++ (arXiv 2501.03262): G = masked discounted return-to-go (reset at masked
    tokens), advantages = masked_whiten(G) over the batch, returns = G."""
    rewards_BxT, mask_BxT, _, _ = _prepare(token_level_rewards, response_mask)
    returns_BxT = _discounted_return_scan(rewards_BxT, mask_BxT, gamma) * mask_BxT
    return masked_whiten(returns_BxT, mask_BxT) * mask_BxT, returns_BxT


@jax.jit
def _discounted_return_scan(rewards_BxT, mask_BxT, gamma):
    def step(running_B, xs):
        reward_B, m_B = xs
        running_B = reward_B + gamma * running_B
        return running_B * m_B, running_B  # reset at masked tokens, as verl

    zeros_B = jnp.zeros(rewards_BxT.shape[0], jnp.float32)
    return _reverse_scan(step, zeros_B, (rewards_BxT.T, mask_BxT.T)).T


@register_adv_estimator("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index):
    """REINFORCE++-baseline: R - group mean (0 for a group of size 1), broadcast over the
    response, then masked_whiten over the batch. returns = advantages."""
    _, mask_BxT, scores_B, row_valid_B = _prepare(token_level_rewards, response_mask)
    groups = _Groups(index, row_valid_B)
    advantages_BxT = _broadcast(scores_B - groups.mean(scores_B), mask_BxT)
    advantages_BxT = masked_whiten(advantages_BxT, mask_BxT) * mask_BxT
    return advantages_BxT, advantages_BxT


@register_adv_estimator("remax")
def compute_remax_outcome_advantage(token_level_rewards, response_mask, reward_baselines):
    """ReMax (arXiv 2310.10505): returns = reverse cumsum of masked rewards,
    advantages = returns - b * m, with b [B] the reward of a greedy rollout of the same prompt."""
    rewards_BxT, mask_BxT, _, _ = _prepare(token_level_rewards, response_mask)
    returns_BxT = jnp.flip(jnp.cumsum(jnp.flip(rewards_BxT, -1), axis=-1), -1) * mask_BxT
    baselines_B = jax.lax.stop_gradient(as_f32(reward_baselines)).reshape(-1)
    return returns_BxT - baselines_B[:, None] * mask_BxT, returns_BxT


@register_adv_estimator("opo")
def compute_opo_outcome_advantage(token_level_rewards, response_mask, index):
    """OPO (arXiv 2505.23585): R - length-weighted group mean sum(|y| R) / sum(|y|);
    baseline 0 for a group of size 1. returns = advantages."""
    _, mask_BxT, scores_B, row_valid_B = _prepare(token_level_rewards, response_mask)
    groups = _Groups(index, row_valid_B)
    lengths_B = jnp.sum(mask_BxT, axis=-1)
    baseline_B = groups.sum(lengths_B * scores_B) / jnp.maximum(groups.sum(lengths_B), 1.0)
    baseline_B = jnp.where(groups.size_B > 1, baseline_B, 0.0)
    advantages_BxT = _broadcast(scores_B - baseline_B, mask_BxT)
    return advantages_BxT, advantages_BxT


@register_adv_estimator("gpg")
def compute_gpg_outcome_advantage(token_level_rewards, response_mask, index):
    """GPG: alpha * (R - group mean), alpha = B / max(1, #rows with R != 0), where B counts the
    real rows; group mean 0 for a group of size 1. returns = advantages."""
    _, mask_BxT, scores_B, row_valid_B = _prepare(token_level_rewards, response_mask)
    groups = _Groups(index, row_valid_B)
    n_rows = jnp.sum(row_valid_B.astype(jnp.float32))
    n_nonzero = jnp.sum((row_valid_B & (scores_B != 0)).astype(jnp.float32))
    alpha = n_rows / jnp.maximum(n_nonzero, 1.0)
    advantages_BxT = _broadcast(alpha * (scores_B - groups.mean(scores_B)), mask_BxT)
    return advantages_BxT, advantages_BxT


def compute_advantage(
    adv_estimator,
    *,
    token_level_rewards,
    response_mask,
    values=None,
    index=None,
    reward_baselines=None,
    gamma=1.0,
    lam=1.0,
    norm_adv_by_std_in_grpo=True,
):
    """Runs the registered estimator `adv_estimator`, passing only the arguments it declares.

    A required argument that is missing (values for gae, index for group estimators,
    reward_baselines for remax) raises a ValueError naming it.
    """
    fn = get_adv_estimator(adv_estimator)
    available = dict(
        token_level_rewards=token_level_rewards, response_mask=response_mask, values=values, index=index,
        reward_baselines=reward_baselines, gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
    )
    kwargs = {}
    for name, parameter in inspect.signature(fn).parameters.items():
        if available.get(name) is not None:
            kwargs[name] = available[name]
        elif parameter.default is inspect.Parameter.empty and parameter.kind not in (
            inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD
        ):
            raise ValueError(f"adv_estimator {adv_estimator!r} needs `{name}`, which was not given")
    return fn(**kwargs)
