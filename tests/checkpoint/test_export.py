"""Train from an HF checkpoint, checkpoint, export with `python -m jaxrlhf.export`, reload in transformers."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.checkpoint import Checkpointer
from jaxrlhf.data.builtin import build_tokenizer
from jaxrlhf.models import Decoder, positions_from_mask
from jaxrlhf.trainer import Trainer
from tests.helpers import small_config, subprocess_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
  import torch
  import transformers

  path = tmp_path_factory.mktemp("qwen2")
  config = transformers.Qwen2Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
    max_position_embeddings=64,
    pad_token_id=0,
    eos_token_id=1,
  )
  torch.manual_seed(0)
  model = transformers.Qwen2ForCausalLM(config)
  model.save_pretrained(path)
  build_tokenizer(save_dir=str(path))
  return str(path)


def test_train_from_hf_checkpoint_export_and_reload_in_transformers(tmp_path, hf_checkpoint):
  import torch
  import transformers

  config = small_config(tmp_path)
  for key in config.actor_rollout_ref.model.override_config.keys():
    config.actor_rollout_ref.model.override_config[key] = None
  config.actor_rollout_ref.model.path = hf_checkpoint
  config.data.tokenizer = ""
  trainer = Trainer(config, devices=jax.devices()[:1])
  assert trainer.model_config.model_type == "qwen2" and trainer.model_config.qkv_bias
  trainer.train_step(0)
  checkpointer = Checkpointer(trainer.run_dir)
  trainer.save(checkpointer, 1)
  checkpointer.close()

  out, critic_out = tmp_path / "actor_hf", tmp_path / "critic_hf"
  env = subprocess_env()
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "jaxrlhf.export",
      "--checkpoint",
      os.path.join(trainer.run_dir, "global_step_1"),
      "--out",
      str(out),
      "--critic_out",
      str(critic_out),
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 0, result.stderr[-2000:]

  ids = np.array([[3, 9, 12, 20, 7, 30, 4]], np.int64)
  mask = np.ones_like(ids)
  ours = lambda model, params: np.asarray(
    model.apply(
      {"params": params}, jnp.asarray(ids, jnp.int32), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
    )[0]
  )
  with torch.no_grad():
    hf_logits = transformers.AutoModelForCausalLM.from_pretrained(out)(torch.tensor(ids)).logits.numpy()
    hf_values = transformers.AutoModelForTokenClassification.from_pretrained(critic_out)(
      torch.tensor(ids)
    ).logits.numpy()[..., 0]
  actor_params = jax.device_get(trainer.state.actor.params)
  np.testing.assert_allclose(hf_logits, ours(Decoder(trainer.model_config), actor_params), atol=1e-4)
  critic_params = jax.device_get(trainer.state.critic.params)
  np.testing.assert_allclose(hf_values, ours(Decoder(trainer.model_config, head="value"), critic_params), atol=1e-4)
  assert os.path.exists(out / "tokenizer_config.json")


def test_export_of_a_missing_checkpoint_is_a_clear_error(tmp_path):
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "jaxrlhf.export",
      "--checkpoint",
      str(tmp_path / "global_step_9"),
      "--out",
      str(tmp_path / "o"),
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 2 and "does not exist" in result.stderr
