"""End-of-run PNG: reward, KL, losses, response length and throughput from metrics.jsonl."""

from __future__ import annotations

import math

from jaxrlhf.tracking.jsonl import read_metrics

_PANELS = (
  ("reward", ("critic/score/mean", "val-core/")),
  ("KL", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
  ("losses", ("actor/pg_loss", "critic/vf_loss")),
  ("response length", ("response_length/mean",)),
  ("throughput (tokens/s/device)", ("perf/throughput",)),
)


def _finite_number(value) -> bool:
  # None is how metrics.jsonl stores NaN/inf: such points are left out of the line.
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def plot_metrics(metrics_path: str, out_path: str) -> str:
  """One PNG with a panel per group: reward (train and validation), KL, losses, length, throughput."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = read_metrics(metrics_path)
  fig, axes = plt.subplots(1, len(_PANELS), figsize=(4.2 * len(_PANELS), 3.4))
  for ax, (title, prefixes) in zip(axes, _PANELS):
    keys = sorted({k for r in records for k in r if any(k.startswith(p) for p in prefixes)})
    for key in keys:
      points = [(r["step"], r[key]) for r in records if _finite_number(r.get(key))]
      if points:
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=key)
    ax.set_title(title)
    ax.set_xlabel("step")
    if keys:
      ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out_path, dpi=90)
  plt.close(fig)
  return out_path
