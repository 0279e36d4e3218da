"""LoRA in the PPO step: only the adapters train (and hold optimizer state), fresh adapters give the base
model's step, the reference is the base (no copy), and a checkpoint resumes adapters and moments exactly.
The critic's LoRA likewise, with its fresh value head trained beside the adapters; its export is merged."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.checkpoint import Checkpointer, read_checkpoint
from jaxrlhf.export import export_checkpoint
from jaxrlhf.models import Decoder, load_hf_config, load_hf_params, positions_from_mask
from jaxrlhf.models.decoder import model_variables
from jaxrlhf.models.lora import (
  VALUE_HEAD,
  count_adapter_params,
  critic_params_with,
  expected_adapter_params,
  merge_adapters,
)
from jaxrlhf.trainer import Trainer
from jaxrlhf.trainer.hf_weights import LORA_ADAPTER_DIR
from tests.helpers import TIMING_DEPENDENT, small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
LORA = {"actor_rollout_ref.model.lora_rank": 4, "actor_rollout_ref.model.lora_alpha": 8}
# One mini-batch, one epoch: every actor metric is measured at the step's starting weights.
ONE_UPDATE = {"actor_rollout_ref.actor.ppo_mini_batch_size": 8, "actor_rollout_ref.actor.ppo_epochs": 1, "mesh.fsdp": 1}


def _trainer(tmp_path, **overrides):
  return Trainer(small_config(tmp_path, **overrides), devices=jax.devices()[:1])


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


# An LM head adapter needs an untied head (a tied one is the input embedding too).
HEAD = {
  "actor_rollout_ref.model.override_config.tie_word_embeddings": False,
  "actor_rollout_ref.model.target_modules": "q_proj,v_proj,lm_head",
}


CRITIC_LORA = {"critic.model.lora_rank": 4, "critic.model.lora_alpha": 8}


# Scanned and unrolled layers, with and without the head adapter, with and without the critic's LoRA, in two
# whole-step compiles beside their base's.
@pytest.mark.parametrize("scan_layers,head,critic_lora", [(False, False, True), (True, True, False)])
def test_fresh_adapters_step_like_the_base_and_only_adapters_train(tmp_path, scan_layers, head, critic_lora):
  layout = {"actor_rollout_ref.model.scan_layers": scan_layers}
  if head:
    layout.update(HEAD)
  base = _trainer(tmp_path / "base", **ONE_UPDATE, **layout)
  lora = _trainer(tmp_path / "lora", **ONE_UPDATE, **layout, **LORA, **(CRITIC_LORA if critic_lora else {}))
  state = lora.state
  assert state.ref_params is None and base.state.ref_params is not None  # the base is the reference
  num_adapters = count_adapter_params(state.actor.adapters)
  assert num_adapters == expected_adapter_params(lora.model_config) > 0
  moments = [x for x in jax.tree.leaves(state.actor.opt_state) if x.ndim > 0]
  assert sum(x.size for x in moments) == 2 * num_adapters  # Adam's mu and nu over the adapters only
  base_before = _host(state.actor.params)

  if critic_lora:  # the same value head: initialised as a full critic's, then trained beside the adapters
    jax.tree.map(
      np.testing.assert_array_equal,
      _host(lora.state.critic.adapters["head"][VALUE_HEAD]),
      _host(base.state.critic.params[VALUE_HEAD]),
    )

  expected, got = base.train_step(0), lora.train_step(0)
  assert "critic/vpred_mean" in got and "critic/values/mean" in got
  not_compared = ("actor/grad_norm", "critic/grad_norm") if critic_lora else ("actor/grad_norm",)
  for key, value in expected.items():
    if key.startswith(TIMING_DEPENDENT) or key in not_compared:  # a norm is over what trains
      continue
    np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5, err_msg=key)
  jax.tree.map(np.testing.assert_array_equal, _host(lora.state.actor.params), base_before)  # frozen
  moved = [np.abs(x).max() for x in jax.tree.leaves(_host(lora.state.actor.adapters))]
  assert min(moved) > 0  # every A and B trained (B left zero)


def _save_and_restore(tmp_path, overrides: dict, fields: tuple[str, ...]):
  """Two steps of a trainer, saved at step 2 and restored onto a fresh one's state, whose `fields` must equal the
  trainer's exactly. Returns (trainer, the restored state, what the checkpoint holds, its config)."""
  trainer = _trainer(tmp_path, **overrides)
  trainer.train_step(0)
  trainer.train_step(1)
  checkpointer = Checkpointer(str(tmp_path / "ckpt"))
  trainer.save(checkpointer, 2)
  checkpointer.wait()
  saved, _, config = read_checkpoint(checkpointer.step_dir(2))
  other = _trainer(tmp_path, **overrides)
  restored, meta = checkpointer.restore(2, other.state)
  checkpointer.close()
  assert meta["step"] == 2
  for field in fields:
    role, part = field.split(".")
    want = getattr(trainer.state.role(role), part)
    jax.tree.map(np.testing.assert_array_equal, _host(getattr(restored.role(role), part)), _host(want))
  return trainer, restored, saved, config


def _next_step_from(trainer, restored, key):
  """`key` of step 3 from the trainer's state, then from the restored one (the same compiled step: a fresh
  trainer's would compile it again), which must agree."""
  want = trainer.train_step(2)[key]
  trainer.state = restored  # donated by the step below
  np.testing.assert_allclose(trainer.train_step(2)[key], want, rtol=1e-6)


def test_resume_restores_adapters_and_optimizer_state_exactly_and_exports(tmp_path):
  trainer, restored, saved, config = _save_and_restore(
    tmp_path, LORA, ("actor.adapters", "actor.opt_state", "critic.params", "critic.opt_state", "actor.params")
  )
  assert not saved["actor"].get("params")  # the frozen base is rebuilt from its source, not saved
  base, adapters = _host(restored.actor.params), _host(restored.actor.adapters)
  _next_step_from(trainer, restored, "actor/pg_loss")

  out = str(tmp_path / "export")
  export_checkpoint(os.path.join(str(tmp_path / "ckpt"), "global_step_2"), out)
  exported = load_hf_params(out, load_hf_config(out))
  expected = merge_adapters(base, adapters, config.actor_rollout_ref.model.lora_alpha)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7),
    _host(exported),
    expected,
  )
  assert sorted(os.listdir(os.path.join(out, LORA_ADAPTER_DIR))) == ["adapter_config.json", "adapter_model.safetensors"]


# ----- critic LoRA: adapters and the fresh value head train over a frozen backbone ---------------


def test_critic_lora_trains_adapters_and_value_head_only(tmp_path):
  trainer = _trainer(tmp_path, **CRITIC_LORA)
  state = trainer.state
  assert state.actor.adapters is None  # the actor fine-tunes in full
  assert set(state.critic.adapters) == {"lora", "head"} and VALUE_HEAD not in state.critic.params
  num_adapters = count_adapter_params(state.critic.adapters["lora"])
  assert num_adapters == expected_adapter_params(trainer.critic_model_config) > 0
  D = trainer.critic_model_config.hidden_size
  num_trained = count_adapter_params(state.critic.adapters)
  assert num_trained == num_adapters + D + 1  # the value head: kernel [D, 1] and bias [1]
  moments = [x for x in jax.tree.leaves(state.critic.opt_state) if x.ndim > 0]
  assert sum(x.size for x in moments) == 2 * num_trained  # Adam's mu and nu over what trains only

  backbone, head = _host(state.critic.params), _host(state.critic.adapters["head"])
  losses = [trainer.train_step(step)["critic/vf_loss"] for step in range(3)]
  assert len(set(losses)) == 3  # the critic learns
  jax.tree.map(np.testing.assert_array_equal, _host(trainer.state.critic.params), backbone)  # frozen
  moved = [np.abs(x).max() for x in jax.tree.leaves(_host(trainer.state.critic.adapters["lora"]))]
  assert min(moved) > 0  # every A and B trained (B left zero)
  changed = jax.tree.map(lambda a, b: np.abs(a - b).max(), _host(trainer.state.critic.adapters["head"]), head)
  assert min(jax.tree.leaves(changed)) > 0


def test_critic_lora_resumes_exactly_and_exports_merged(tmp_path):
  import torch
  import transformers

  trainer, restored, saved, _ = _save_and_restore(
    tmp_path, CRITIC_LORA, ("critic.adapters", "critic.opt_state", "critic.params", "actor.params", "actor.opt_state")
  )
  assert not saved["critic"].get("params") and saved["critic"]["adapters"]["head"]  # the backbone is rebuilt
  backbone, trained = _host(restored.critic.params), _host(restored.critic.adapters)
  _next_step_from(trainer, restored, "critic/vf_loss")

  out, critic_out = str(tmp_path / "export"), str(tmp_path / "critic")
  export_checkpoint(os.path.join(str(tmp_path / "ckpt"), "global_step_2"), out, critic_out=critic_out)
  ids = np.array([[3, 9, 12, 20, 7, 30, 4]], np.int64)
  mask = np.ones_like(ids)
  with torch.no_grad():
    hf_values = transformers.AutoModelForTokenClassification.from_pretrained(critic_out)(
      torch.tensor(ids)
    ).logits.numpy()[..., 0]
  # Ours: the backbone with the adapters unmerged and the trained head, as the values phase runs it.
  critic = Decoder(trainer.critic_model_config, head="value")
  ours = critic.apply(
    model_variables(critic_params_with(backbone, trained), trained["lora"]),
    jnp.asarray(ids, jnp.int32),
    positions_from_mask(jnp.asarray(mask)),
    jnp.asarray(mask),
  )[0]
  assert np.abs(np.asarray(ours)).max() > 1e-3
  np.testing.assert_allclose(hf_values, np.asarray(ours), atol=1e-4)
