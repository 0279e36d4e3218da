"""The step program's model configs: which section's keys reach which model."""

from jaxrlhf.config import resolve_config
from jaxrlhf.trainer.program import model_configs
from tests.helpers import small_config


def test_critic_compute_keys_apply_without_its_own_path(tmp_path):
  config = small_config(tmp_path, **{"critic.model.dtype": "bfloat16",
                                     "critic.model.enable_gradient_checkpointing": True,
                                     "critic.model.remat_policy": "dots_saveable"})
  actor, critic, reward = model_configs(resolve_config(config))
  assert (actor.dtype, actor.remat_policy) == ("float32", "none")
  assert (critic.dtype, critic.remat_policy) == ("bfloat16", "dots_saveable")
  # Otherwise the actor's architecture: the critic starts from the same backbone.
  assert (critic.hidden_size, critic.num_hidden_layers, critic.vocab_size) == (
      actor.hidden_size, actor.num_hidden_layers, actor.vocab_size)
  assert reward is None
