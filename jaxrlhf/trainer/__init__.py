"""Orchestration: the train state, the fused PPO step, the host loop."""

from jaxrlhf.trainer.ppo_step import PPOStep
from jaxrlhf.trainer.state import TrainState
from jaxrlhf.trainer.trainer import Trainer

__all__ = ["PPOStep", "TrainState", "Trainer"]
