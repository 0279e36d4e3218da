"""The learning-rate schedules against a transcription of verl 0.9.1's (utils/torch_functional.py
get_constant_schedule_with_warmup / get_cosine_schedule_with_warmup, and the warm-up fallback of
workers/engine/fsdp/transformer_impl.py _build_lr_scheduler)."""

import math

import numpy as np
import pytest

from jaxrlhf.config import get_base_config
from jaxrlhf.trainer.state import make_lr_schedule


def _verl_lr(optim, total_steps, step):
  warmup = optim.lr_warmup_steps
  if warmup <= 0:
    warmup = int(optim.lr_warmup_steps_ratio * total_steps)
  if optim.lr_scheduler_type == "constant":
    ratio = step / max(1.0, warmup) if step < warmup else 1.0
  else:
    min_ratio = optim.min_lr_ratio
    coef, intercept = (1 - min_ratio) * 0.5, (1 + min_ratio) * 0.5
    if step < warmup:
      ratio = step / max(1, warmup)
    else:
      progress = (step - warmup) / max(1, total_steps - warmup)
      ratio = max(min_ratio, math.cos(math.pi * optim.num_cycles * 2.0 * progress) * coef + intercept)
  return optim.lr * ratio


@pytest.mark.parametrize("kind", ["constant", "cosine"])
@pytest.mark.parametrize(
  "warmup_steps,warmup_ratio,min_lr_ratio,num_cycles",
  [(-1, 0.0, 0.0, 0.5), (5, 0.0, 0.0, 0.5), (0, 0.25, 0.1, 0.5), (-1, 0.3, 0.0, 1.0), (3, 0.9, 0.2, 0.5)],
)
def test_schedule_matches_verl(kind, warmup_steps, warmup_ratio, min_lr_ratio, num_cycles):
  optim = get_base_config().actor_rollout_ref.actor.optim
  optim.lr, optim.lr_scheduler_type = 1e-3, kind
  optim.lr_warmup_steps, optim.lr_warmup_steps_ratio = warmup_steps, warmup_ratio
  optim.min_lr_ratio, optim.num_cycles = min_lr_ratio, num_cycles
  total = 20
  schedule = make_lr_schedule(optim, total)
  got = [float(schedule(step)) for step in range(total)]
  want = [_verl_lr(optim, total, step) for step in range(total)]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * optim.lr)  # fp32 cos near 0


def test_warmup_starts_at_zero_and_ratio_fallback():
  optim = get_base_config().actor_rollout_ref.actor.optim
  optim.lr, optim.lr_warmup_steps, optim.lr_warmup_steps_ratio = 1.0, 0, 0.5  # 0 falls back to the ratio
  schedule = make_lr_schedule(optim, 8)
  np.testing.assert_allclose([float(schedule(s)) for s in range(6)], [0, 0.25, 0.5, 0.75, 1, 1], atol=1e-7)
