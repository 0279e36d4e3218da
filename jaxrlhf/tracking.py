"""Metric sinks chosen by `trainer.logger`: console progress bar, metrics.jsonl, wandb; PNG plots.

Only process 0 writes. The console shows a tqdm bar whose postfix carries step, reward, KL and
tokens/s, plus a concise line per validation.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence

import jax
import numpy as np

_CONSOLE_KEYS = (("critic/score/mean", "reward"), ("actor/kl_loss", "kl"), ("actor/reward_kl_penalty", "kl_rew"),
                 ("response_length/mean", "resp_len"), ("perf/throughput", "tok/s/dev"))


def _plain(value):
  value = np.asarray(value)
  return value.item() if value.ndim == 0 else value.tolist()


class Tracking:
  def __init__(self, loggers: Sequence[str], run_dir: str, *, total_steps: int, config=None,
               project: str = "jaxrlhf", experiment: str = "run"):
    self.is_writer = jax.process_index() == 0
    self.loggers = tuple(loggers)
    self.run_dir = run_dir
    self.metrics_path = os.path.join(run_dir, "metrics.jsonl")
    self._bar = None
    self._wandb = None
    if not self.is_writer:
      return
    os.makedirs(run_dir, exist_ok=True)
    if "jsonl" in self.loggers:
      self._jsonl = open(self.metrics_path, "a")
    if "console" in self.loggers:
      from tqdm.auto import tqdm
      self._bar = tqdm(total=total_steps, desc=experiment, dynamic_ncols=True, mininterval=0.5)
    if "wandb" in self.loggers:
      import wandb
      self._wandb = wandb.init(project=project, name=experiment, dir=run_dir,
                               config=config.to_dict() if config is not None else None)

  def log(self, metrics: Mapping[str, float], step: int) -> None:
    if not self.is_writer:
      return
    record = {k: _plain(v) for k, v in metrics.items()}
    if "jsonl" in self.loggers:
      self._jsonl.write(json.dumps({"step": step, **record}) + "\n")
      self._jsonl.flush()
    if self._wandb is not None:
      self._wandb.log(record, step=step)
    if self._bar is not None:
      if "training/global_step" in record:
        self._bar.n = int(record["training/global_step"])
        postfix = {short: f"{record[key]:.3g}" for key, short in _CONSOLE_KEYS if key in record}
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.refresh()
      val = {k: v for k, v in record.items() if k.startswith("val-core/")}
      if val:
        self._bar.write(f"step {step}: " + ", ".join(f"{k}={v:.3f}" for k, v in val.items()))

  def close(self) -> None:
    if not self.is_writer:
      return
    if self._bar is not None:
      self._bar.close()
    if "jsonl" in self.loggers:
      self._jsonl.close()
    if self._wandb is not None:
      self._wandb.finish()


def read_metrics(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


_PANELS = (
    ("reward", ("critic/score/mean", "val-core/")),
    ("KL", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    ("losses", ("actor/pg_loss", "critic/vf_loss")),
    ("response length", ("response_length/mean",)),
    ("throughput (tokens/s/device)", ("perf/throughput",)),
)


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
      points = [(r["step"], r[key]) for r in records
                if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
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
