"""Training guards (seeds' practice): detect a KL blow-up or a reward collapse from step metrics.

The host loop asks `check(metrics)` after every step; an event makes it restore the last
checkpoint and lower the learning rate. Non-finite gradients are handled inside the step (the
update is skipped and counted in `actor/update_skipped`, `critic/update_skipped`).
"""

from __future__ import annotations

import collections
import math

KL_KEYS = ("actor/kl_loss", "actor/reward_kl_penalty")


class GuardError(RuntimeError):
  """The run was stopped by a guard (too many rollbacks); the message says why."""


class Guard:
  def __init__(self, guard_config):
    self.config = guard_config
    self.enabled = bool(guard_config.enable)
    self._rewards = collections.deque(maxlen=max(1, guard_config.reward_window))
    self.rollbacks = 0

  def check(self, metrics: dict) -> str | None:
    """Returns a human-readable reason when the step should be rolled back, else None."""
    if not self.enabled:
      return None
    for key in KL_KEYS:
      value = metrics.get(key)
      if value is not None and (not math.isfinite(value) or value > self.config.kl_max):
        return f"{key}={value:.4g} > trainer.guard.kl_max={self.config.kl_max}"
    reward = metrics.get("critic/score/mean")
    if reward is not None:
      if not math.isfinite(reward):
        return f"critic/score/mean={reward}"
      if len(self._rewards) == self._rewards.maxlen:
        average = sum(self._rewards) / len(self._rewards)
        if reward < average - self.config.reward_drop * abs(average):
          return (
            f"critic/score/mean={reward:.4g} dropped more than trainer.guard.reward_drop="
            f"{self.config.reward_drop:.0%} below its {len(self._rewards)}-step average {average:.4g}"
          )
      self._rewards.append(reward)
    return None

  def record_rollback(self, reason: str) -> None:
    self.rollbacks += 1
    self._rewards.clear()
    if self.rollbacks > self.config.max_rollbacks:
      raise GuardError(
        f"stopping: {self.rollbacks} rollbacks exceed trainer.guard.max_rollbacks="
        f"{self.config.max_rollbacks}; last cause: {reason}"
      )
