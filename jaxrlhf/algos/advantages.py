"""Advantage estimators keyed by verl's `algorithm.adv_estimator` (docs/algorithms.md §3).

All return (advantages, returns), both [N, R] fp32. Conventions shared by every estimator:
- R_b = sum_t token_level_rewards * m (the outcome score; rewards on padding are ignored).
- `index` is an integer group id per row (the `rollout.n` samples of a prompt share one). Any
  integer values work: they are renumbered to 0..N-1 with a sized `jnp.unique`, so segment ops run
  with static `num_segments = N` under jit.
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
  """(masked fp32 rewards [N, R], fp32 mask [N, R], outcome scores R [N], row-is-real [N])."""
  mask_NxR = as_f32(response_mask)
  rewards_NxR = jax.lax.stop_gradient(zero_masked(token_level_rewards, mask_NxR))
  return rewards_NxR, mask_NxR, jnp.sum(rewards_NxR, axis=-1), jnp.sum(mask_NxR, axis=-1) > 0


class _Groups:
  """Per-row group reductions over the real rows of each row's group, gathered back to [N]."""

  def __init__(self, index, row_valid_N):
    index_N = jnp.asarray(index).reshape(-1)
    self.batch_size = index_N.shape[0]
    _, group_N = jnp.unique(index_N, return_inverse=True, size=self.batch_size)
    self.group_N = group_N.reshape(-1)
    self.row_valid_N = row_valid_N
    self.size_N = self.sum(jnp.ones(self.batch_size, jnp.float32))

  def _gather(self, per_group):
    return per_group[self.group_N]

  def sum(self, x_N):
    x_N = jnp.where(self.row_valid_N, x_N, 0.0)
    return self._gather(jax.ops.segment_sum(x_N, self.group_N, num_segments=self.batch_size))

  def max(self, x_N):
    x_N = jnp.where(self.row_valid_N, x_N, -jnp.inf)
    return self._gather(jax.ops.segment_max(x_N, self.group_N, num_segments=self.batch_size))

  def min(self, x_N, fill):
    x_N = jnp.where(self.row_valid_N, x_N, fill)
    return self._gather(jax.ops.segment_min(x_N, self.group_N, num_segments=self.batch_size))

  def mean(self, x_N):
    """Group mean; 0 for a group of size 1 (no baseline without a second sample, as verl)."""
    return jnp.where(self.size_N > 1, self.sum(x_N) / jnp.maximum(self.size_N, 1.0), 0.0)

  def std(self, x_N):
    """Unbiased group std (torch.std); 1 for a group of size 1 (as verl)."""
    mean_N = self.sum(x_N) / jnp.maximum(self.size_N, 1.0)
    var_N = self.sum(jnp.square(x_N - mean_N)) / jnp.maximum(self.size_N - 1.0, 1.0)
    return jnp.where(self.size_N > 1, jnp.sqrt(var_N), 1.0)


def _broadcast(score_N, mask_NxR):
  return score_N[:, None] * mask_NxR


def _reverse_scan(step, carry, xs_RxN):
  """Runs `step` from the last response position to the first; xs and outputs are time-major."""
  _, ys_RxN = jax.lax.scan(step, carry, xs_RxN, reverse=True)
  return ys_RxN


@register_adv_estimator("gae")
def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
  """GAE with a mask-aware carry, so masked (e.g. observation) tokens are skipped:
  delta = r_t + gamma*nextV - V_t; g = delta + gamma*lam*lastgae;
  nextV = m*V_t + (1-m)*nextV; lastgae = m*g + (1-m)*lastgae.
  returns = adv + V; advantages = masked_whiten(adv, m) over the batch."""
  rewards_NxR, mask_NxR, _, _ = _prepare(token_level_rewards, response_mask)
  values_NxR = jax.lax.stop_gradient(zero_masked(values, mask_NxR))
  advantages_NxR = _gae_scan(rewards_NxR, values_NxR, mask_NxR, gamma, lam)
  returns_NxR = (advantages_NxR + values_NxR) * mask_NxR
  return masked_whiten(advantages_NxR, mask_NxR) * mask_NxR, returns_NxR


# Module-level jit: an eager lax.scan would be retraced and recompiled on every call.
@jax.jit
def _gae_scan(rewards_NxR, values_NxR, mask_NxR, gamma, lam):
  def step(carry, xs):
    next_value_N, last_gae_N = carry
    reward_N, value_N, m_N = xs
    delta_N = reward_N + gamma * next_value_N - value_N
    gae_N = delta_N + gamma * lam * last_gae_N
    next_value_N = m_N * value_N + (1.0 - m_N) * next_value_N
    last_gae_N = m_N * gae_N + (1.0 - m_N) * last_gae_N
    return (next_value_N, last_gae_N), last_gae_N

  zeros_N = jnp.zeros(rewards_NxR.shape[0], jnp.float32)
  return _reverse_scan(step, (zeros_N, zeros_N), (rewards_NxR.T, values_NxR.T, mask_NxR.T)).T


@register_adv_estimator("grpo_vectorized")  # verl's vectorised GRPO: the same numbers (ours is vectorised)
@register_adv_estimator("grpo")
def compute_grpo_outcome_advantage(
  token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=True, epsilon=1e-6
):
  """GRPO: (R - group mean) / (group std + eps), or R - group mean when not normalising by std
  (Dr.GRPO). A group of size 1 has mean 0 and std 1. returns = advantages."""
  _, mask_NxR, scores_N, row_valid_N = _prepare(token_level_rewards, response_mask)
  groups = _Groups(index, row_valid_N)
  advantage_N = scores_N - groups.mean(scores_N)
  if norm_adv_by_std_in_grpo:
    advantage_N = advantage_N / (groups.std(scores_N) + epsilon)
  advantages_NxR = _broadcast(advantage_N, mask_NxR)
  return advantages_NxR, advantages_NxR


@register_adv_estimator("grpo_passk")
def compute_grpo_passk_outcome_advantage(
  token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=True, epsilon=1e-6
):
  """Pass@k (arXiv 2503.19595): only the best row of each group gets r_max - r_second_max
  (divided by the unbiased group std + eps when normalising); the others get 0. Among tied best
  rows the first one wins. A group of size 1 has no second score and gets 0 (verl raises)."""
  _, mask_NxR, scores_N, row_valid_N = _prepare(token_level_rewards, response_mask)
  groups = _Groups(index, row_valid_N)
  row_N = jnp.arange(groups.batch_size)
  best_score_N = groups.max(scores_N)
  best_row_N = groups.min(jnp.where(scores_N == best_score_N, row_N, groups.batch_size), fill=groups.batch_size)
  is_best_N = row_valid_N & (row_N == best_row_N)
  second_score_N = groups.max(jnp.where(is_best_N, -jnp.inf, scores_N))
  advantage_N = jnp.where(is_best_N & (groups.size_N > 1), best_score_N - second_score_N, 0.0)
  if norm_adv_by_std_in_grpo:
    advantage_N = advantage_N / (groups.std(scores_N) + epsilon)
  advantages_NxR = _broadcast(advantage_N, mask_NxR)
  return advantages_NxR, advantages_NxR


@register_adv_estimator("rloo")
def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index):
  """RLOO (arXiv 2402.14740): R_i - mean_{j != i} R_j = (n R_i - sum_j R_j) / (n - 1);
  R_i itself for a group of size 1."""
  _, mask_NxR, scores_N, row_valid_N = _prepare(token_level_rewards, response_mask)
  groups = _Groups(index, row_valid_N)
  n_N = groups.size_N
  leave_one_out_N = (n_N * scores_N - groups.sum(scores_N)) / jnp.maximum(n_N - 1.0, 1.0)
  advantages_NxR = _broadcast(jnp.where(n_N > 1, leave_one_out_N, scores_N), mask_NxR)
  return advantages_NxR, advantages_NxR


@register_adv_estimator("rloo_vectorized")
def compute_rloo_vectorized_outcome_advantage(token_level_rewards, response_mask, index):
  """verl's vectorised RLOO: R_i - mean_{j != i} R_j as `rloo`, but 0 for a group of size 1
  (verl's two RLOO implementations differ there; each name keeps its own behaviour)."""
  advantages_NxR, _ = compute_rloo_outcome_advantage(token_level_rewards, response_mask, index)
  _, _, _, row_valid_N = _prepare(token_level_rewards, response_mask)
  advantages_NxR = advantages_NxR * (_Groups(index, row_valid_N).size_N > 1)[:, None]
  return advantages_NxR, advantages_NxR


@register_adv_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma=1.0):
  """REINFORCE++ (arXiv 2501.03262): G = masked discounted return-to-go, advantages =
  masked_whiten(G) over the batch, returns = G. Masked tokens inside a response (multi-turn
  observations) carry the running return through unchanged, as verl 0.9.1:
  run = m * (r + gamma * run) + (1 - m) * run, so a final reward reaches earlier turns."""
  rewards_NxR, mask_NxR, _, _ = _prepare(token_level_rewards, response_mask)
  returns_NxR = _discounted_return_scan(rewards_NxR, mask_NxR, gamma) * mask_NxR
  return masked_whiten(returns_NxR, mask_NxR) * mask_NxR, returns_NxR


@jax.jit
def _discounted_return_scan(rewards_NxR, mask_NxR, gamma):
  def step(running_N, xs):
    reward_N, m_N = xs
    new_running_N = reward_N + gamma * running_N
    running_N = m_N * new_running_N + (1.0 - m_N) * running_N  # carried through masked spans
    return running_N, new_running_N * m_N

  zeros_N = jnp.zeros(rewards_NxR.shape[0], jnp.float32)
  return _reverse_scan(step, zeros_N, (rewards_NxR.T, mask_NxR.T)).T


@register_adv_estimator("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index):
  """REINFORCE++-baseline: R - group mean (0 for a group of size 1), broadcast over the
  response, then masked_whiten over the batch. returns = advantages."""
  _, mask_NxR, scores_N, row_valid_N = _prepare(token_level_rewards, response_mask)
  groups = _Groups(index, row_valid_N)
  advantages_NxR = _broadcast(scores_N - groups.mean(scores_N), mask_NxR)
  advantages_NxR = masked_whiten(advantages_NxR, mask_NxR) * mask_NxR
  return advantages_NxR, advantages_NxR


@register_adv_estimator("remax")
def compute_remax_outcome_advantage(token_level_rewards, response_mask, reward_baselines):
  """ReMax (arXiv 2310.10505): returns = reverse cumsum of masked rewards,
  advantages = returns - b * m, with b [N] the reward of a greedy rollout of the same prompt."""
  rewards_NxR, mask_NxR, _, _ = _prepare(token_level_rewards, response_mask)
  returns_NxR = jnp.flip(jnp.cumsum(jnp.flip(rewards_NxR, -1), axis=-1), -1) * mask_NxR
  baselines_N = jax.lax.stop_gradient(as_f32(reward_baselines)).reshape(-1)
  return returns_NxR - baselines_N[:, None] * mask_NxR, returns_NxR


@register_adv_estimator("opo")
def compute_opo_outcome_advantage(token_level_rewards, response_mask, index):
  """OPO (arXiv 2505.23585): R - length-weighted group mean sum(|y| R) / sum(|y|);
  baseline 0 for a group of size 1. returns = advantages."""
  _, mask_NxR, scores_N, row_valid_N = _prepare(token_level_rewards, response_mask)
  groups = _Groups(index, row_valid_N)
  lengths_N = jnp.sum(mask_NxR, axis=-1)
  baseline_N = groups.sum(lengths_N * scores_N) / jnp.maximum(groups.sum(lengths_N), 1.0)
  baseline_N = jnp.where(groups.size_N > 1, baseline_N, 0.0)
  advantages_NxR = _broadcast(scores_N - baseline_N, mask_NxR)
  return advantages_NxR, advantages_NxR


@register_adv_estimator("gpg")
def compute_gpg_outcome_advantage(token_level_rewards, response_mask, index):
  """GPG: alpha * (R - group mean), alpha = N / max(1, #rows with R != 0), where N counts the
  real rows; group mean 0 for a group of size 1. returns = advantages."""
  _, mask_NxR, scores_N, row_valid_N = _prepare(token_level_rewards, response_mask)
  groups = _Groups(index, row_valid_N)
  n_rows = jnp.sum(row_valid_N.astype(jnp.float32))
  n_nonzero = jnp.sum((row_valid_N & (scores_N != 0)).astype(jnp.float32))
  alpha = n_rows / jnp.maximum(n_nonzero, 1.0)
  advantages_NxR = _broadcast(alpha * (scores_N - groups.mean(scores_N)), mask_NxR)
  return advantages_NxR, advantages_NxR


@register_adv_estimator("gdpo")
def compute_gdpo_outcome_advantage(
  token_level_rewards,
  response_mask,
  index,
  reward_components=None,
  reward_weights=None,
  norm_adv_by_std_in_grpo=True,
  epsilon=1e-6,
):
  """GDPO (arXiv 2601.05242): each reward component is GRPO-normalised within its group on its
  own, the results are summed with `reward_weights` (`algorithm.gdpo_reward_weights`; None = 1
  each), then `masked_whiten` over the batch. returns = advantages.

  `reward_components`: the per-sequence scores of the components named by
  `algorithm.gdpo_reward_keys`, as a mapping name -> [N] (in that key order) or an array [components, N].
  None falls back to the one component `token_level_rewards` (as verl without components).
  """
  _, mask_NxR, _, _ = _prepare(token_level_rewards, response_mask)
  if reward_components is None:
    components = [token_level_rewards]
  else:
    values = list(reward_components.values()) if hasattr(reward_components, "values") else reward_components
    # A component score [N] acts as a token-level reward on the row (R_b = the score).
    components = [_broadcast(jnp.asarray(v, jnp.float32).reshape(-1), _first_token(mask_NxR)) for v in values]
  weights = [1.0] * len(components) if reward_weights is None else list(reward_weights)
  if len(weights) != len(components):
    raise ValueError(
      f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(components)} "
      "reward components (algorithm.gdpo_reward_keys)"
    )
  total_NxR = jnp.zeros(mask_NxR.shape, jnp.float32)
  for weight, component_NxR in zip(weights, components):
    normalised_NxR, _ = compute_grpo_outcome_advantage(component_NxR, mask_NxR, index, norm_adv_by_std_in_grpo, epsilon)
    total_NxR = total_NxR + weight * normalised_NxR
  advantages_NxR = masked_whiten(total_NxR, mask_NxR) * mask_NxR
  return advantages_NxR, advantages_NxR


def _first_token(mask_NxR):
  """One-hot of each row's first valid token (where a sequence score is placed; any valid token works)."""
  return jax.nn.one_hot(jnp.argmax(mask_NxR > 0, axis=-1), mask_NxR.shape[-1]) * mask_NxR


def _reverse_cumsum(x_NxR):
  return jnp.flip(jnp.cumsum(jnp.flip(x_NxR, -1), axis=-1), -1)


def _path_variance(mask_NxR, old_log_probs, sum_pi_squared, rollout_is_weights):
  """W_t = sum_{j<=t} m_j w_j, w_j = 1 - 2 pi_j + sum_v pi_v^2 (times rho_j^2 with rollout IS weights)."""
  sg = jax.lax.stop_gradient
  w_NxR = 1.0 - 2.0 * jnp.exp(zero_masked(sg(old_log_probs), mask_NxR)) + zero_masked(sg(sum_pi_squared), mask_NxR)
  if rollout_is_weights is not None:
    w_NxR = w_NxR * jnp.square(zero_masked(sg(rollout_is_weights), mask_NxR))
  return jnp.cumsum(w_NxR * mask_NxR, axis=-1)


def _token_baseline(groups, returns_NxR, path_variance_NxR, valid_NxR, lengths_N, handle_zero_tail, epsilon):
  """B_t = sum_group(G_t W_t m_t) / (sum_group(W_t m_t) + eps) per position t, 0 for groups of size 1;
  with `handle_zero_tail`, 0 on a group's unique longest row from the second-longest length on."""
  num_groups = groups.batch_size
  segment_sum = lambda x: jax.ops.segment_sum(x, groups.group_N, num_segments=num_groups)[groups.group_N]  # noqa
  real_NxR = valid_NxR * groups.row_valid_N[:, None]
  numerator_NxR = segment_sum(returns_NxR * path_variance_NxR * real_NxR)
  denominator_NxR = segment_sum(path_variance_NxR * real_NxR) + epsilon
  baseline_NxR = jnp.where((groups.size_N > 1)[:, None], numerator_NxR / denominator_NxR, 0.0)
  if handle_zero_tail:
    longest_N = groups.max(lengths_N)
    is_longest_N = groups.row_valid_N & (lengths_N == longest_N)
    unique_N = groups.sum(is_longest_N.astype(jnp.float32)) == 1
    second_N = groups.max(jnp.where(is_longest_N, -jnp.inf, lengths_N))
    tail_N = is_longest_N & unique_N & (groups.size_N > 1) & (longest_N > second_N)
    positions_R = jnp.arange(returns_NxR.shape[-1], dtype=jnp.float32)
    baseline_NxR = jnp.where(tail_N[:, None] & (positions_R[None, :] >= second_N[:, None]), 0.0, baseline_NxR)
  return baseline_NxR


@register_adv_estimator("optimal_token_baseline")
def compute_optimal_token_baseline_advantage(
  token_level_rewards,
  response_mask,
  index,
  old_log_probs,
  sum_pi_squared,
  rollout_is_weights=None,
  handle_zero_tail=True,
  epsilon=1e-8,
):
  """Optimal Token Baseline (verl 0.9.1): a baseline per response position t within each group,
  B_t = E_group[G_t W_t] / E_group[W_t], with G_t the undiscounted return-to-go and W_t the
  cumulative path-variance proxy sum_{j<=t} (1 - 2 pi_j + sum_v pi_v^2), pi_j = exp(old_log_probs).

  `sum_pi_squared` [N, R] is sum_v softmax(logits)_v^2 of the old-log-prob forward
  (`sum_pi_squared_from_logits`); `rollout_is_weights` (rollout correction) scale w by rho^2.
  Groups of size 1 get no baseline. `handle_zero_tail` zeroes the baseline of a group's unique
  longest response past the second-longest length (no other sample informs it).
  advantages = (G - B) * m, returns = G.
  """
  rewards_NxR, mask_NxR, _, row_valid_N = _prepare(token_level_rewards, response_mask)
  groups = _Groups(index, row_valid_N)
  returns_NxR = _reverse_cumsum(rewards_NxR) * mask_NxR
  path_variance_NxR = _path_variance(mask_NxR, old_log_probs, sum_pi_squared, rollout_is_weights)
  baseline_NxR = _token_baseline(
    groups, returns_NxR, path_variance_NxR, mask_NxR, jnp.sum(mask_NxR, axis=-1), handle_zero_tail, epsilon
  )
  return (returns_NxR - baseline_NxR) * mask_NxR, returns_NxR


@register_adv_estimator("tir_optimal_token_baseline")
def compute_tir_optimal_token_baseline_advantage(
  token_level_rewards,
  response_mask,
  index,
  old_log_probs,
  sum_pi_squared,
  rollout_is_weights=None,
  handle_zero_tail=True,
  epsilon=1e-8,
):
  """Optimal Token Baseline for multi-turn (tool-integrated) responses, verl 0.9.1: as
  `optimal_token_baseline`, but positions are counted over valid tokens only (the k-th generated
  token of each response shares a baseline, whatever observation spans lie between), i.e. the
  rows are compacted to their valid tokens before the group statistics. Identical to
  `optimal_token_baseline` when every response mask is a prefix."""
  rewards_NxR, mask_NxR, _, row_valid_N = _prepare(token_level_rewards, response_mask)
  groups = _Groups(index, row_valid_N)
  batch, length = mask_NxR.shape
  returns_NxR = _reverse_cumsum(rewards_NxR) * mask_NxR
  path_variance_NxR = _path_variance(mask_NxR, old_log_probs, sum_pi_squared, rollout_is_weights)
  # rank_NxR: index of each valid token among its row's valid tokens (its compacted position).
  valid_NxR = mask_NxR > 0
  rank_NxR = jnp.where(valid_NxR, jnp.cumsum(valid_NxR, axis=-1) - 1, length - 1)
  rows_NxR = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, length))

  def compact(x_NxR):
    return jnp.zeros((batch, length), jnp.float32).at[rows_NxR, rank_NxR].add(jnp.where(valid_NxR, x_NxR, 0.0))

  lengths_N = jnp.sum(mask_NxR, axis=-1)
  compact_valid_NxR = (jnp.arange(length)[None, :] < lengths_N[:, None]).astype(jnp.float32)
  compact_returns_NxR = compact(returns_NxR)
  baseline_NxR = _token_baseline(
    groups, compact_returns_NxR, compact(path_variance_NxR), compact_valid_NxR, lengths_N, handle_zero_tail, epsilon
  )
  compact_advantages_NxR = compact_returns_NxR - baseline_NxR
  advantages_NxR = jnp.take_along_axis(compact_advantages_NxR, rank_NxR, axis=-1) * mask_NxR
  return advantages_NxR, returns_NxR


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
    token_level_rewards=token_level_rewards,
    response_mask=response_mask,
    values=values,
    index=index,
    reward_baselines=reward_baselines,
    gamma=gamma,
    lam=lam,
    norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
    reward_components=reward_components,
    reward_weights=reward_weights,
    old_log_probs=old_log_probs,
    sum_pi_squared=sum_pi_squared,
    rollout_is_weights=rollout_is_weights,
  )
  kwargs = {}
  for name, parameter in inspect.signature(fn).parameters.items():
    if available.get(name) is not None:
      kwargs[name] = available[name]
    elif parameter.default is inspect.Parameter.empty and parameter.kind not in (
      inspect.Parameter.VAR_POSITIONAL,
      inspect.Parameter.VAR_KEYWORD,
    ):
      raise ValueError(f"adv_estimator {adv_estimator!r} needs `{name}`, which was not given")
  return fn(**kwargs)
