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


@register_adv_estimator("grpo_vectorized")  # verl's vectorised GRPO: the same numbers (ours is vectorised)
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


@register_adv_estimator("rloo_vectorized")
def compute_rloo_vectorized_outcome_advantage(token_level_rewards, response_mask, index):
    """verl's vectorised RLOO: R_i - mean_{j != i} R_j as `rloo`, but 0 for a group of size 1
    (verl's two RLOO implementations differ there; each name keeps its own behaviour)."""
    advantages_BxT, _ = compute_rloo_outcome_advantage(token_level_rewards, response_mask, index)
    _, _, _, row_valid_B = _prepare(token_level_rewards, response_mask)
    advantages_BxT = advantages_BxT * (_Groups(index, row_valid_B).size_B > 1)[:, None]
    return advantages_BxT, advantages_BxT


@register_adv_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma=1.0):
    """REINFORCE++ (arXiv 2501.03262): G = masked discounted return-to-go, advantages =
    masked_whiten(G) over the batch, returns = G. Masked tokens inside a response (multi-turn
    observations) carry the running return through unchanged, as verl 0.9.1:
    run = m * (r + gamma * run) + (1 - m) * run, so a final reward reaches earlier turns."""
    rewards_BxT, mask_BxT, _, _ = _prepare(token_level_rewards, response_mask)
    returns_BxT = _discounted_return_scan(rewards_BxT, mask_BxT, gamma) * mask_BxT
    return masked_whiten(returns_BxT, mask_BxT) * mask_BxT, returns_BxT


@jax.jit
def _discounted_return_scan(rewards_BxT, mask_BxT, gamma):
    def step(running_B, xs):
        reward_B, m_B = xs
        new_running_B = reward_B + gamma * running_B
        running_B = m_B * new_running_B + (1.0 - m_B) * running_B  # carried through masked spans
        return running_B, new_running_B * m_B

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


@register_adv_estimator("gdpo")
def compute_gdpo_outcome_advantage(token_level_rewards, response_mask, index, reward_components=None,
                                   reward_weights=None, norm_adv_by_std_in_grpo=True, epsilon=1e-6):
    """GDPO (arXiv 2601.05242): each reward component is GRPO-normalised within its group on its
    own, the results are summed with `reward_weights` (`algorithm.gdpo_reward_weights`; None = 1
    each), then `masked_whiten` over the batch. returns = advantages.

    `reward_components`: the per-sequence scores of the components named by
    `algorithm.gdpo_reward_keys`, as a mapping name -> [B] (in that key order) or an array [K, B].
    None falls back to the one component `token_level_rewards` (as verl without components).
    """
    _, mask_BxT, _, _ = _prepare(token_level_rewards, response_mask)
    if reward_components is None:
        components = [token_level_rewards]
    else:
        values = list(reward_components.values()) if hasattr(reward_components, "values") else reward_components
        # A component score [B] acts as a token-level reward on the row (R_b = the score).
        components = [_broadcast(jnp.asarray(v, jnp.float32).reshape(-1), _first_token(mask_BxT)) for v in values]
    weights = [1.0] * len(components) if reward_weights is None else list(reward_weights)
    if len(weights) != len(components):
        raise ValueError(f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(components)} "
                         "reward components (algorithm.gdpo_reward_keys)")
    total_BxT = jnp.zeros(mask_BxT.shape, jnp.float32)
    for weight, component_BxT in zip(weights, components):
        normalised_BxT, _ = compute_grpo_outcome_advantage(component_BxT, mask_BxT, index, norm_adv_by_std_in_grpo,
                                                           epsilon)
        total_BxT = total_BxT + weight * normalised_BxT
    advantages_BxT = masked_whiten(total_BxT, mask_BxT) * mask_BxT
    return advantages_BxT, advantages_BxT


def _first_token(mask_BxT):
    """One-hot of each row's first valid token (where a sequence score is placed; any valid token works)."""
    return jax.nn.one_hot(jnp.argmax(mask_BxT > 0, axis=-1), mask_BxT.shape[-1]) * mask_BxT


def _reverse_cumsum(x_BxT):
    return jnp.flip(jnp.cumsum(jnp.flip(x_BxT, -1), axis=-1), -1)


def _path_variance(mask_BxT, old_log_probs, sum_pi_squared, rollout_is_weights):
    """W_t = sum_{j<=t} m_j w_j, w_j = 1 - 2 pi_j + sum_v pi_v^2 (times rho_j^2 with rollout IS weights)."""
    sg = jax.lax.stop_gradient
    w_BxT = 1.0 - 2.0 * jnp.exp(zero_masked(sg(old_log_probs), mask_BxT)) + zero_masked(sg(sum_pi_squared), mask_BxT)
    if rollout_is_weights is not None:
        w_BxT = w_BxT * jnp.square(zero_masked(sg(rollout_is_weights), mask_BxT))
    return jnp.cumsum(w_BxT * mask_BxT, axis=-1)


def _token_baseline(groups, returns_BxT, path_variance_BxT, valid_BxT, lengths_B, handle_zero_tail, epsilon):
    """B_t = sum_group(G_t W_t m_t) / (sum_group(W_t m_t) + eps) per position t, 0 for groups of size 1;
    with `handle_zero_tail`, 0 on a group's unique longest row from the second-longest length on."""
    num_groups = groups.batch_size
    segment_sum = lambda x: jax.ops.segment_sum(x, groups.group_B, num_segments=num_groups)[groups.group_B]  # noqa
    real_BxT = valid_BxT * groups.row_valid_B[:, None]
    numerator_BxT = segment_sum(returns_BxT * path_variance_BxT * real_BxT)
    denominator_BxT = segment_sum(path_variance_BxT * real_BxT) + epsilon
    baseline_BxT = jnp.where((groups.size_B > 1)[:, None], numerator_BxT / denominator_BxT, 0.0)
    if handle_zero_tail:
        longest_B = groups.max(lengths_B)
        is_longest_B = groups.row_valid_B & (lengths_B == longest_B)
        unique_B = groups.sum(is_longest_B.astype(jnp.float32)) == 1
        second_B = groups.max(jnp.where(is_longest_B, -jnp.inf, lengths_B))
        tail_B = is_longest_B & unique_B & (groups.size_B > 1) & (longest_B > second_B)
        positions_T = jnp.arange(returns_BxT.shape[-1], dtype=jnp.float32)
        baseline_BxT = jnp.where(tail_B[:, None] & (positions_T[None, :] >= second_B[:, None]), 0.0, baseline_BxT)
    return baseline_BxT


@register_adv_estimator("optimal_token_baseline")
def compute_optimal_token_baseline_advantage(token_level_rewards, response_mask, index, old_log_probs,
                                             sum_pi_squared, rollout_is_weights=None, handle_zero_tail=True,
                                             epsilon=1e-8):
    """Optimal Token Baseline (verl 0.9.1): a baseline per response position t within each group,
    B_t = E_group[G_t W_t] / E_group[W_t], with G_t the undiscounted return-to-go and W_t the
    cumulative path-variance proxy sum_{j<=t} (1 - 2 pi_j + sum_v pi_v^2), pi_j = exp(old_log_probs).

    `sum_pi_squared` [B, T] is sum_v softmax(logits)_v^2 of the old-log-prob forward
    (`sum_pi_squared_from_logits`); `rollout_is_weights` (rollout correction) scale w by rho^2.
    Groups of size 1 get no baseline. `handle_zero_tail` zeroes the baseline of a group's unique
    longest response past the second-longest length (no other sample informs it).
    advantages = (G - B) * m, returns = G.
    """
    rewards_BxT, mask_BxT, _, row_valid_B = _prepare(token_level_rewards, response_mask)
    groups = _Groups(index, row_valid_B)
    returns_BxT = _reverse_cumsum(rewards_BxT) * mask_BxT
    path_variance_BxT = _path_variance(mask_BxT, old_log_probs, sum_pi_squared, rollout_is_weights)
    baseline_BxT = _token_baseline(groups, returns_BxT, path_variance_BxT, mask_BxT, jnp.sum(mask_BxT, axis=-1),
                                   handle_zero_tail, epsilon)
    return (returns_BxT - baseline_BxT) * mask_BxT, returns_BxT


@register_adv_estimator("tir_optimal_token_baseline")
def compute_tir_optimal_token_baseline_advantage(token_level_rewards, response_mask, index, old_log_probs,
                                                 sum_pi_squared, rollout_is_weights=None, handle_zero_tail=True,
                                                 epsilon=1e-8):
    """Optimal Token Baseline for multi-turn (tool-integrated) responses, verl 0.9.1: as
    `optimal_token_baseline`, but positions are counted over valid tokens only (the k-th generated
    token of each response shares a baseline, whatever observation spans lie between), i.e. the
    rows are compacted to their valid tokens before the group statistics. Identical to
    `optimal_token_baseline` when every response mask is a prefix."""
    rewards_BxT, mask_BxT, _, row_valid_B = _prepare(token_level_rewards, response_mask)
    groups = _Groups(index, row_valid_B)
    batch, length = mask_BxT.shape
    returns_BxT = _reverse_cumsum(rewards_BxT) * mask_BxT
    path_variance_BxT = _path_variance(mask_BxT, old_log_probs, sum_pi_squared, rollout_is_weights)
    # rank_BxT: index of each valid token among its row's valid tokens (its compacted position).
    valid_BxT = mask_BxT > 0
    rank_BxT = jnp.where(valid_BxT, jnp.cumsum(valid_BxT, axis=-1) - 1, length - 1)
    rows_BxT = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, length))

    def compact(x_BxT):
        return jnp.zeros((batch, length), jnp.float32).at[rows_BxT, rank_BxT].add(jnp.where(valid_BxT, x_BxT, 0.0))

    lengths_B = jnp.sum(mask_BxT, axis=-1)
    compact_valid_BxT = (jnp.arange(length)[None, :] < lengths_B[:, None]).astype(jnp.float32)
    compact_returns_BxT = compact(returns_BxT)
    baseline_BxT = _token_baseline(groups, compact_returns_BxT, compact(path_variance_BxT), compact_valid_BxT,
                                   lengths_B, handle_zero_tail, epsilon)
    compact_advantages_BxT = compact_returns_BxT - baseline_BxT
    advantages_BxT = jnp.take_along_axis(compact_advantages_BxT, rank_BxT, axis=-1) * mask_BxT
    return advantages_BxT, returns_BxT


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
    reward_components=None,
    reward_weights=None,
    old_log_probs=None,
    sum_pi_squared=None,
    rollout_is_weights=None,
):
    """Runs the registered estimator `adv_estimator`, passing only the arguments it declares.

    A required argument that is missing (values for gae, index for group estimators,
    reward_baselines for remax, old_log_probs and sum_pi_squared for the optimal token baselines)
    raises a ValueError naming it. `reward_components` / `reward_weights` feed gdpo.
    """
    fn = get_adv_estimator(adv_estimator)
    available = dict(
        token_level_rewards=token_level_rewards, response_mask=response_mask, values=values, index=index,
        reward_baselines=reward_baselines, gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        reward_components=reward_components, reward_weights=reward_weights, old_log_probs=old_log_probs,
        sum_pi_squared=sum_pi_squared, rollout_is_weights=rollout_is_weights,
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
