"""LoRA in the PPO step: only the adapters train (and hold optimizer state), fresh adapters give the base
model's step, the reference is the base (no copy), and a checkpoint resumes adapters and moments exactly."""

import os

import jax
import numpy as np
import pytest

from jaxrlhf.checkpoint import Checkpointer, read_checkpoint
from jaxrlhf.export import LORA_ADAPTER_DIR, export_checkpoint
from jaxrlhf.models import load_hf_config, load_hf_params
from jaxrlhf.models.lora import count_adapter_params, expected_adapter_params, merge_adapters
from jaxrlhf.trainer import Trainer
from tests.helpers import TIMING_DEPENDENT, small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
LORA = {"actor_rollout_ref.model.lora_rank": 4, "actor_rollout_ref.model.lora_alpha": 8}
# One mini-batch, one epoch: every actor metric is measured at the step's starting weights.
ONE_UPDATE = {"actor_rollout_ref.actor.ppo_mini_batch_size": 8, "actor_rollout_ref.actor.ppo_epochs": 1,
              "mesh.fsdp": 1}


def _trainer(tmp_path, **overrides):
  return Trainer(small_config(tmp_path, **overrides), devices=jax.devices()[:1])


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


# An LM head adapter needs an untied head (a tied one is the input embedding too).
HEAD = {"actor_rollout_ref.model.override_config.tie_word_embeddings": False,
        "actor_rollout_ref.model.target_modules": "q_proj,v_proj,lm_head"}


@pytest.mark.parametrize("scan_layers,head", [(True, False), (False, False), (True, True)])
def test_fresh_adapters_step_like_the_base_and_only_adapters_train(tmp_path, scan_layers, head):
  layout = {"actor_rollout_ref.model.scan_layers": scan_layers}
  if head:
    layout.update(HEAD)
  base = _trainer(tmp_path / "base", **ONE_UPDATE, **layout)
  lora = _trainer(tmp_path / "lora", **ONE_UPDATE, **layout, **LORA)
  state = lora.state
  assert state.ref_params is None and base.state.ref_params is not None  # the base is the reference
  num_adapters = count_adapter_params(state.actor_adapters)
  assert num_adapters == expected_adapter_params(lora.model_config) > 0
  moments = [x for x in jax.tree.leaves(state.actor_opt_state) if x.ndim > 0]
  assert sum(x.size for x in moments) == 2 * num_adapters  # Adam's mu and nu over the adapters only
  base_before = _host(state.actor_params)

  expected, got = base.train_step(0), lora.train_step(0)
  for key, value in expected.items():
    if key.startswith(TIMING_DEPENDENT) or key == "actor/grad_norm":  # the norm is over what trains
      continue
    np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5, err_msg=key)
  jax.tree.map(np.testing.assert_array_equal, _host(lora.state.actor_params), base_before)  # frozen
  moved = [np.abs(x).max() for x in jax.tree.leaves(_host(lora.state.actor_adapters))]
  assert min(moved) > 0  # every A and B trained (B left zero)


def test_resume_restores_adapters_and_optimizer_state_exactly_and_exports(tmp_path):
  trainer = _trainer(tmp_path, **LORA)
  trainer.train_step(0)
  trainer.train_step(1)
  checkpointer = Checkpointer(str(tmp_path / "ckpt"))
  trainer.save(checkpointer, 2)
  checkpointer.wait()
  saved, _, config = read_checkpoint(checkpointer.step_dir(2))
  assert not saved.get("actor_params")  # the frozen base is rebuilt from its source, not saved

  other = _trainer(tmp_path, **LORA)
  restored, meta = checkpointer.restore(2, other.state)
  checkpointer.close()
  assert meta["step"] == 2
  for field in ("actor_adapters", "actor_opt_state", "critic_params", "critic_opt_state"):
    jax.tree.map(np.testing.assert_array_equal, _host(getattr(restored, field)), _host(getattr(trainer.state, field)))
  jax.tree.map(np.testing.assert_array_equal, _host(restored.actor_params), _host(trainer.state.actor_params))
  base, adapters = _host(restored.actor_params), _host(restored.actor_adapters)
  other.state = restored  # donated by the step below
  np.testing.assert_allclose(other.train_step(2)["actor/pg_loss"], trainer.train_step(2)["actor/pg_loss"],
                             rtol=1e-6)

  out = str(tmp_path / "export")
  export_checkpoint(os.path.join(str(tmp_path / "ckpt"), "global_step_2"), out)
  exported = load_hf_params(out, load_hf_config(out))
  expected = merge_adapters(base, adapters, config.actor_rollout_ref.model.lora_alpha)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7),
               _host(exported), expected)
  assert sorted(os.listdir(os.path.join(out, LORA_ADAPTER_DIR))) == ["adapter_config.json", "adapter_model.safetensors"]
