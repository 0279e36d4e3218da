"""KL estimators, KL coefficient controllers and entropy (docs/algorithms.md §2, §4 "Entropy").

Per-token estimators of KL(pi || ref) from the log-probs of the sampled token (J. Schulman,
"Approximating KL divergence", 2020), the exact KL over the vocabulary from both logits, and the
fixed / adaptive controllers as pure updates of a coefficient carried in the train state.
All math is fp32.
"""

import jax
import jax.numpy as jnp

from jaxrlhf.algos.stats import as_f32

_BASE_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_PENALTY_TYPES = _BASE_ESTIMATORS + tuple(name + "+" for name in _BASE_ESTIMATORS) + ("full",)


def _k2(log_ratio):
  return 0.5 * jnp.square(log_ratio)


def _base_kl(logprob, ref_logprob, name):
  log_ratio = logprob - ref_logprob
  if name in ("kl", "k1"):
    return log_ratio
  if name == "abs":
    return jnp.abs(log_ratio)
  if name in ("mse", "k2"):
    return _k2(log_ratio)
  # low_var_kl / k3: both clips are for numerical stability far off-policy (as verl).
  x = jnp.clip(ref_logprob - logprob, -20.0, 20.0)
  return jnp.clip(jnp.exp(x) - x - 1.0, -10.0, 10.0)


def kl_penalty(logprob, ref_logprob, kl_penalty: str):
  """Per-token KL estimate (docs/algorithms.md §2 table), same shape as the inputs.

  `<name>+` is the straight-through variant: the value of `<name>`, the gradient of k2
  (k2's gradient is the unbiased KL gradient, whatever estimator is reported).
  """
  if kl_penalty == "full":
    raise ValueError(
      "kl_penalty='full' needs the full logits of both policies, not log-probs of the sampled "
      "token: call jaxrlhf.algos.full_kl(logits, ref_logits) instead."
    )
  if kl_penalty not in KL_PENALTY_TYPES:
    raise ValueError(f"Unknown kl_penalty {kl_penalty!r}; expected one of {list(KL_PENALTY_TYPES)}")
  logprob, ref_logprob = as_f32(logprob), as_f32(ref_logprob)
  if not kl_penalty.endswith("+"):
    return _base_kl(logprob, ref_logprob, kl_penalty)
  base = _base_kl(logprob, ref_logprob, kl_penalty[:-1])
  k2 = _k2(logprob - ref_logprob)
  return jax.lax.stop_gradient(base) + k2 - jax.lax.stop_gradient(k2)


def full_kl(logits, ref_logits):
  """Exact per-token KL(pi || ref) = sum_v pi_v (log pi_v - log ref_v); logits [..., V] -> [...]."""
  log_p = jax.nn.log_softmax(as_f32(logits), axis=-1)
  log_q = jax.nn.log_softmax(as_f32(ref_logits), axis=-1)
  return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def entropy_from_logits(logits):
  """Per-token entropy H = logsumexp(z) - sum(softmax(z) * z) in fp32; [..., V] -> [...].

  Callers divide logits by the rollout temperature first (docs/algorithms.md §4), as for the log-probs.
  """
  z = as_f32(logits)
  return jax.nn.logsumexp(z, axis=-1) - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)


def sum_pi_squared_from_logits(logits):
  """Per-token sum_v softmax(z)_v^2 in fp32; [..., V] -> [...]. The optimal token baselines need it
  from the old-log-prob forward (verl's `calculate_sum_pi_squared`); scale logits by the rollout
  temperature first, as for the log-probs."""
  return jnp.sum(jnp.square(jax.nn.softmax(as_f32(logits), axis=-1)), axis=-1)


def fixed_kl_update(coef, current_kl=None, n_steps=None):
  """Fixed controller: the coefficient never changes (same signature as the adaptive one)."""
  del current_kl, n_steps
  return coef


def adaptive_kl_update(coef, current_kl, n_steps, target_kl, horizon):
  """Adaptive controller of Ziegler et al. 2019 (docs/algorithms.md §2):
  e = clip(current_kl/target_kl - 1, -0.2, 0.2); coef * (1 + e * n_steps / horizon).
  `n_steps` is the number of sequences in the batch."""
  error = jnp.clip(as_f32(current_kl) / target_kl - 1.0, -0.2, 0.2)
  return coef * (1.0 + error * n_steps / horizon)
