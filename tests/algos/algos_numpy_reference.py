"""Independent NumPy (float64, plain loops) implementations of the docs/algorithms.md §2-4
formulas, written from that text (and verl's loops), sharing no code with jaxrlhf.algos. Conventions that are
ours (see jaxrlhf/algos/advantages.py): rewards are masked, rows without a valid token are padding
(outside every group, outputs 0), outputs are 0 outside the mask."""

import math
from collections import defaultdict

import numpy as np


def f64(x):
  return np.asarray(x, dtype=np.float64)


def random_batch(rng, batch, length, empty_rows=(), dtype=np.float32):
  """Random mask with a valid prefix per row (right padding) plus a few interior holes."""
  lengths = rng.integers(1, length + 1, size=batch)
  mask = (np.arange(length)[None, :] < lengths[:, None]).astype(dtype)
  holes = rng.random((batch, length)) < 0.1
  mask[holes] = 0
  mask[:, 0] = 1
  for row in empty_rows:
    mask[row] = 0
  return mask


# ---------------------------------------------------------------- masked statistics / agg_loss
def masked_mean(x, m):
  x, m = f64(x), f64(m)
  n = m.sum()
  return 0.0 if n == 0 else float((x * m).sum() / n)


def masked_var(x, m, unbiased=True):
  x, m = f64(x), f64(m)
  vals = [x.flat[i] for i in range(x.size) if m.flat[i] != 0]
  n = len(vals)
  if n == 0 or (unbiased and n == 1):
    return 0.0
  mu = sum(vals) / n
  ss = sum((v - mu) ** 2 for v in vals)
  return ss / (n - 1) if unbiased else ss / n


def masked_whiten(x, m, shift_mean=True):
  mu, var = masked_mean(x, m), masked_var(x, m)
  out = (f64(x) - mu) / math.sqrt(var + 1e-8)
  return out + mu if not shift_mean else out


def agg_loss(loss, m, mode, loss_scale_factor=None):
  loss, m = f64(loss), f64(m)
  B, T = loss.shape
  if mode == "token-mean":
    return masked_mean(loss, m)
  if mode == "token-sum":
    return float(sum(loss[b, t] for b in range(B) for t in range(T) if m[b, t] != 0))
  rows = []
  for b in range(B):
    n = m[b].sum()
    if n == 0:
      continue
    s = sum(loss[b, t] for t in range(T) if m[b, t] != 0)
    rows.append(s / n if mode == "seq-mean-token-mean" else s)
  seq_mean = float(np.mean(rows)) if rows else 0.0
  if mode == "seq-mean-token-sum-norm":  # verl 0.9.1: seq-mean of token sums, / loss_scale_factor (default T)
    return seq_mean / (T if loss_scale_factor is None else loss_scale_factor)
  return seq_mean


# ---------------------------------------------------------------- KL
def kl_penalty(lp, ref, name):
  lp, ref = f64(lp), f64(ref)
  base = name.rstrip("+")
  if base in ("kl", "k1"):
    return lp - ref
  if base == "abs":
    return np.abs(lp - ref)
  if base in ("mse", "k2"):
    return 0.5 * (lp - ref) ** 2
  x = np.clip(ref - lp, -20, 20)
  return np.clip(np.exp(x) - x - 1, -10, 10)


def full_kl(logits, ref_logits):
  logits, ref_logits = f64(logits), f64(ref_logits)
  out = np.zeros(logits.shape[:-1])
  for idx in np.ndindex(*logits.shape[:-1]):
    z, q = logits[idx], ref_logits[idx]
    logp = z - (np.log(np.sum(np.exp(z - z.max()))) + z.max())
    logq = q - (np.log(np.sum(np.exp(q - q.max()))) + q.max())
    out[idx] = sum(math.exp(logp[v]) * (logp[v] - logq[v]) for v in range(len(z)))
  return out


def entropy(logits):
  logits = f64(logits)
  out = np.zeros(logits.shape[:-1])
  for idx in np.ndindex(*logits.shape[:-1]):
    z = logits[idx]
    p = np.exp(z - z.max())
    p /= p.sum()
    out[idx] = -sum(p[v] * math.log(p[v]) for v in range(len(z)) if p[v] > 0)
  return out


# ---------------------------------------------------------------- losses
def ratio_of(old, lp):
  return np.exp(np.clip(f64(lp) - f64(old), -20, 20))


def policy_vanilla(old, lp, adv, m, lo, hi, c, mode="token-mean"):
  old, lp, adv, m = f64(old), f64(lp), f64(adv), f64(m)
  B, T = lp.shape
  loss = np.zeros((B, T))
  clip, lower = np.zeros((B, T)), np.zeros((B, T))
  for b in range(B):
    for t in range(T):
      r = math.exp(min(max(lp[b, t] - old[b, t], -20), 20))
      a = adv[b, t]
      l1, l2 = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
      lc = max(l1, l2)
      l3 = -a * c
      loss[b, t] = min(l3, lc) if a < 0 else lc
      clip[b, t] = float(l2 > l1)
      lower[b, t] = float(lc > l3 and a < 0)
  return agg_loss(loss, m, mode), dict(
    pg_clipfrac=masked_mean(clip, m),
    pg_clipfrac_lower=masked_mean(lower, m),
    ppo_kl=masked_mean(-np.clip(lp - old, -20, 20), m),
  )


def policy_gspo(old, lp, adv, m, lo, hi, mode="seq-mean-token-mean"):
  old, lp, adv, m = f64(old), f64(lp), f64(adv), f64(m)
  B, T = lp.shape
  loss = np.zeros((B, T))
  for b in range(B):
    n = m[b].sum()
    s_log = sum((lp[b, t] - old[b, t]) for t in range(T) if m[b, t]) / n if n else 0.0
    s = math.exp(min(s_log, 10.0))
    for t in range(T):
      a = adv[b, t]
      loss[b, t] = max(-a * s, -a * min(max(s, 1 - lo), 1 + hi))
  return agg_loss(loss, m, mode)


def policy_gpg(old, lp, adv, m, mode):
  return agg_loss(-f64(lp) * f64(adv), m, mode)


def policy_cispo(old, lp, adv, m, lo, hi, mode):
  w = np.clip(ratio_of(old, lp), 1 - lo, 1 + hi)
  return agg_loss(-w * f64(adv) * f64(lp), m, mode)


def policy_geo_mean(old, lp, adv, m, lo, hi):
  old, lp, adv, m = f64(old), f64(lp), f64(adv), f64(m)
  B, T = lp.shape
  rows = []
  for b in range(B):
    n = m[b].sum()
    if n == 0:
      continue
    acc, adv_sum = 0.0, 0.0
    for t in range(T):
      if not m[b, t]:
        continue
      x = min(max(lp[b, t] - old[b, t], -20), 20)
      a = adv[b, t]
      if a > 0:
        x = min(x, hi)  # only the upside is clipped for a good action
      elif a < 0:
        x = max(x, -lo)
      else:
        x = 0.0
      acc += x
      adv_sum += a
    rows.append(-(adv_sum / n) * math.exp(acc / n))
  return float(np.mean(rows)) if rows else 0.0


def policy_kl_cov(old, lp, adv, m, ratio, coef, mode):
  old, lp, adv, m = f64(old), f64(lp), f64(adv), f64(m)
  B, T = lp.shape
  valid = [(b, t) for b in range(B) for t in range(T) if m[b, t]]
  loss = -adv * ratio_of(old, lp)
  if valid:
    a_mean = np.mean([adv[i] for i in valid])
    l_mean = np.mean([lp[i] for i in valid])
    cov = [(adv[i] - a_mean) * (lp[i] - l_mean) for i in valid]
    k = max(1, int(len(valid) * ratio))
    order = sorted(range(len(valid)), key=lambda j: -cov[j])  # stable: ties by position
    for j in order[:k]:
      b, t = valid[j]
      loss[b, t] += coef * abs(min(max(lp[b, t] - old[b, t], -20), 20))
  return agg_loss(loss, m, mode)


def value_loss(vpreds, values, returns, m, c, mode="token-mean"):
  v, vo, ret, m = f64(vpreds), f64(values), f64(returns), f64(m)
  vclip = np.clip(v, vo - c, vo + c)
  l1, l2 = (v - ret) ** 2, (vclip - ret) ** 2
  return 0.5 * agg_loss(np.maximum(l1, l2), m, mode), masked_mean((l2 > l1).astype(float), m)


# ---------------------------------------------------------------- advantages
def _scores(r, m):
  r, m = f64(r), f64(m)
  return np.array([sum(r[b, t] for t in range(r.shape[1]) if m[b, t]) for b in range(r.shape[0])])


def _groups(index, m):
  """group id -> list of real rows (rows with >= 1 valid token)."""
  groups = defaultdict(list)
  for b in range(len(index)):
    if f64(m)[b].sum() > 0:
      groups[int(index[b])].append(b)
  return groups


def _broadcast(score, m):
  return f64(score)[:, None] * f64(m)


def gae(r, v, m, gamma, lam):
  r, v, m = f64(r) * f64(m), f64(v) * f64(m), f64(m)
  B, T = r.shape
  adv = np.zeros((B, T))
  for b in range(B):
    next_v, last = 0.0, 0.0
    for t in reversed(range(T)):
      delta = r[b, t] + gamma * next_v - v[b, t]
      g = delta + gamma * lam * last
      if m[b, t]:
        next_v, last = v[b, t], g
      adv[b, t] = last
  returns = (adv + v) * m
  return masked_whiten(adv, m) * m, returns


def grpo(r, m, index, norm=True, eps=1e-6):
  return _broadcast(_grpo_scores(_scores(r, m), m, index, norm, eps), m)


def _grpo_scores(s, m, index, norm=True, eps=1e-6):
  out = np.zeros(len(s))
  for rows in _groups(index, m).values():
    vals = s[rows]
    if len(rows) == 1:
      mean, std = 0.0, 1.0
    else:
      mean, std = vals.mean(), vals.std(ddof=1)
    for b in rows:
      out[b] = (s[b] - mean) / (std + eps) if norm else s[b] - mean
  return out


def gdpo(r, m, index, components=None, weights=None, norm=True, eps=1e-6):
  comps = [_scores(r, m)] if components is None else [f64(c) for c in components]
  weights = [1.0] * len(comps) if weights is None else weights
  total = sum(w * _grpo_scores(c, m, index, norm, eps) for w, c in zip(weights, comps))
  return masked_whiten(_broadcast(total, m), m) * f64(m)


def rloo_vectorized(r, m, index):
  out = rloo(r, m, index)
  for rows in _groups(index, m).values():
    if len(rows) == 1:
      out[rows[0]] = 0.0
  return out


def optimal_token_baseline(r, m, index, old, sum_pi_sq, rollout_w=None, tail=True, eps=1e-8, tir=False):
  """docs/algorithms.md §3 optimal_token_baseline / tir_optimal_token_baseline with our padding convention."""
  r, m = f64(r) * f64(m), f64(m)
  B, T = r.shape
  G = np.array([[r[b, t:].sum() * m[b, t] for t in range(T)] for b in range(B)])
  w = 1 - 2 * np.exp(f64(old) * m) + f64(sum_pi_sq) * m
  if rollout_w is not None:
    w = w * (f64(rollout_w) * m) ** 2
  W = np.cumsum(w * m, axis=-1)
  # positions[b]: the positions that share a baseline slot k (absolute t, or the k-th valid token for TIR)
  positions = [list(np.nonzero(m[b])[0]) if tir else list(range(T)) for b in range(B)]
  valid = [[m[b, t] != 0 for t in positions[b]] for b in range(B)]
  adv = np.zeros((B, T))
  for rows in _groups(index, m).values():
    slots = max(len(positions[b]) for b in rows)
    base = {b: np.zeros(slots) for b in rows}
    if len(rows) > 1:
      for k in range(slots):
        num = sum(G[b, positions[b][k]] * W[b, positions[b][k]] for b in rows if k < len(positions[b]) and valid[b][k])
        den = sum(W[b, positions[b][k]] for b in rows if k < len(positions[b]) and valid[b][k]) + eps
        for b in rows:
          base[b][k] = num / den
      lengths = {b: m[b].sum() for b in rows}
      ordered = sorted(lengths.values())
      longest = [b for b in rows if lengths[b] == ordered[-1]]
      if tail and len(longest) == 1 and ordered[-1] > ordered[-2]:
        base[longest[0]][int(ordered[-2]) :] = 0.0
    for b in rows:
      for k, t in enumerate(positions[b]):
        if m[b, t]:
          adv[b, t] = G[b, t] - base[b][k]
  return adv, G


def grpo_passk(r, m, index, norm=True, eps=1e-6):
  s = _scores(r, m)
  out = np.zeros(len(s))
  for rows in _groups(index, m).values():
    if len(rows) < 2:
      continue
    vals = [s[b] for b in rows]
    best = rows[int(np.argmax(vals))]  # first of the tied maxima
    second = max(s[b] for b in rows if b != best)
    a = s[best] - second
    if norm:
      a /= np.std(vals, ddof=1) + eps
    out[best] = a
  return _broadcast(out, m)


def rloo(r, m, index):
  s = _scores(r, m)
  out = np.zeros(len(s))
  for rows in _groups(index, m).values():
    for b in rows:
      others = [s[j] for j in rows if j != b]
      out[b] = s[b] - np.mean(others) if others else s[b]
  return _broadcast(out, m)


def reinforce_pp(r, m, gamma):
  r, m = f64(r) * f64(m), f64(m)
  B, T = r.shape
  ret = np.zeros((B, T))
  for b in range(B):
    running = 0.0
    for t in reversed(range(T)):
      if m[b, t]:  # masked tokens carry the running return through unchanged (verl 0.9.1)
        running = r[b, t] + gamma * running
        ret[b, t] = running
  return masked_whiten(ret, m) * m, ret


def reinforce_pp_baseline(r, m, index):
  s = _scores(r, m)
  out = np.zeros(len(s))
  for rows in _groups(index, m).values():
    mean = 0.0 if len(rows) == 1 else np.mean(s[rows])
    for b in rows:
      out[b] = s[b] - mean
  a = _broadcast(out, m)
  return masked_whiten(a, m) * f64(m)


def remax(r, m, baselines):
  r, m = f64(r) * f64(m), f64(m)
  B, T = r.shape
  ret = np.zeros((B, T))
  for b in range(B):
    for t in range(T):
      ret[b, t] = r[b, t:].sum() * m[b, t]
  return ret - f64(baselines)[:, None] * m, ret


def opo(r, m, index):
  s = _scores(r, m)
  lengths = f64(m).sum(-1)
  out = np.zeros(len(s))
  for rows in _groups(index, m).values():
    bsl = 0.0 if len(rows) == 1 else sum(lengths[b] * s[b] for b in rows) / sum(lengths[b] for b in rows)
    for b in rows:
      out[b] = s[b] - bsl
  return _broadcast(out, m)


def gpg(r, m, index):
  s = _scores(r, m)
  real = [b for b in range(len(s)) if f64(m)[b].sum() > 0]
  alpha = len(real) / max(1, sum(1 for b in real if s[b] != 0))
  out = np.zeros(len(s))
  for rows in _groups(index, m).values():
    mean = 0.0 if len(rows) == 1 else np.mean(s[rows])
    for b in rows:
      out[b] = alpha * (s[b] - mean)
  return _broadcast(out, m)


# ---------------------------------------------------------------- reward shaping
def overlong_penalty(lengths, max_len, buffer_len, factor):
  out = []
  for length in lengths:
    over = length - (max_len - buffer_len)
    out.append(0.0 if over <= 0 else -over / buffer_len * factor)
  return np.array(out)


def place_scores(scores, m):
  out = np.zeros(m.shape)
  for b in range(m.shape[0]):
    valid = np.nonzero(m[b])[0]
    if len(valid):
      out[b, valid[-1]] = scores[b]
  return out


def apply_kl_penalty(scores_tok, lp, ref, m, coef, name, ctrl, target, horizon, scale=1.0):
  kl = kl_penalty(lp, ref, name) * m
  rewards = f64(scores_tok) - scale * coef * kl
  per_seq = [kl[b][m[b] > 0].mean() if m[b].sum() else 0.0 for b in range(m.shape[0])]
  current = float(np.mean(per_seq))
  if ctrl == "adaptive":
    error = float(np.clip(current / target - 1, -0.2, 0.2))
    coef = coef * (1 + error * m.shape[0] / horizon)
  return rewards, coef, current
