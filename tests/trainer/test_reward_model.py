"""reward_model.enable: an HF sequence-classification checkpoint scores rollouts inside the step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.trainer import Trainer
from tests.helpers import rollout_of, small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def reward_checkpoint(tmp_path_factory):
  import torch
  import transformers

  path = tmp_path_factory.mktemp("rm")
  config = transformers.Qwen2Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_labels=1,
    pad_token_id=0,
    max_position_embeddings=64,
  )
  torch.manual_seed(1)
  model = transformers.Qwen2ForSequenceClassification(config)
  model.save_pretrained(path)
  return str(path), model


@pytest.mark.parametrize("combine", [False, True])
def test_reward_model_scores_match_transformers(tmp_path, reward_checkpoint, combine):
  import torch

  path, hf_model = reward_checkpoint
  trainer = Trainer(
    small_config(
      tmp_path,
      **{
        "mesh.fsdp": 1,
        "reward_model.enable": True,
        "reward_model.model.path": path,
        "reward_model.combine_with_rule": combine,
      },
    ),
    devices=jax.devices()[:1],
  )
  rng = np.random.default_rng(0)
  prompts = rng.integers(5, 60, (3, 6)).astype(np.int32)
  responses = rng.integers(5, 60, (3, 3)).astype(np.int32)
  rollout = rollout_of(
    jnp.asarray(prompts), jnp.ones((3, 6), jnp.int32), jnp.asarray(responses), jnp.ones((3, 3), jnp.int32)
  )
  rule = np.zeros(3, np.float32)
  if combine:
    rule = np.asarray(trainer.ppo.reward_fn(rollout.responses, rollout.response_mask, rollout.sample_index)[0])
  scores = np.asarray(trainer.ppo.score(rollout, trainer.state.reward_params).scores)
  with torch.no_grad():
    expected = hf_model(torch.tensor(np.concatenate([prompts, responses], 1), dtype=torch.long)).logits[:, 0].numpy()
  np.testing.assert_allclose(scores, expected + rule, atol=1e-4)
  metrics = trainer.train_step(0)
  assert np.isfinite(metrics["critic/score/mean"]) and metrics["critic/score/mean"] != 0.0
