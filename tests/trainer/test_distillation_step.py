"""distillation.enabled: an HF causal-LM teacher scores the student's rollouts inside the step (teacher phase),
its log-probs equal transformers', and the actor's loss carries verl's distillation term and metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.config import ConfigError
from jaxrlhf.trainer import Trainer
from tests.helpers import rollout_of, small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def save_teacher(path, vocab_size=64, seed=1):
  import torch
  import transformers

  config = transformers.Qwen2Config(
    vocab_size=vocab_size,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
  )
  torch.manual_seed(seed)
  model = transformers.Qwen2ForCausalLM(config)
  model.save_pretrained(path)
  return model


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  path = tmp_path_factory.mktemp("teacher")
  return str(path), save_teacher(path)


def distill_config(tmp_path, teacher_path, **loss):
  overrides = {
    "mesh.fsdp": 1,
    "distillation.enabled": True,
    "distillation.teacher_model.model_path": teacher_path,
    **{f"distillation.distillation_loss.{key}": value for key, value in loss.items()},
  }
  return small_config(tmp_path, **overrides)


def hf_response_log_probs(hf_model, prompts, responses):
  """log softmax of the teacher's logits at each response position: [N, R, V] (the oracle)."""
  import torch

  ids = torch.tensor(np.concatenate([prompts, responses], 1), dtype=torch.long)
  with torch.no_grad():
    logits = hf_model(ids).logits[:, prompts.shape[1] - 1 : -1].double()
  return torch.log_softmax(logits, -1).numpy()


def random_rollout(seed=0):
  rng = np.random.default_rng(seed)
  prompts = rng.integers(5, 60, (4, 6)).astype(np.int32)
  responses = rng.integers(5, 60, (4, 3)).astype(np.int32)
  rollout = rollout_of(
    jnp.asarray(prompts), jnp.ones((4, 6), jnp.int32), jnp.asarray(responses), jnp.ones((4, 3), jnp.int32)
  )
  return prompts, responses, rollout


@pytest.fixture(scope="module")
def k3_trainer(tmp_path_factory, teacher):
  """The estimator modes on packed rows (`use_remove_padding`): the teacher's forward and the student's log-probs
  go through the packed slots."""
  config = distill_config(tmp_path_factory.mktemp("k3"), teacher[0], use_task_rewards=False, loss_max_clamp=5.0)
  config.actor_rollout_ref.model.use_remove_padding = True
  return Trainer(config, devices=jax.devices()[:1])


def test_teacher_log_probs_match_transformers(k3_trainer, teacher):
  prompts, responses, rollout = random_rollout()
  out = jax.jit(k3_trainer.ppo.teacher_log_probs)(k3_trainer.state.teacher_params, rollout)
  want = np.take_along_axis(hf_response_log_probs(teacher[1], prompts, responses), responses[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(out["teacher_log_probs"]), want, atol=2e-5)


def test_step_reports_distillation_metrics(k3_trainer):
  """A fused step: the teacher phase runs, the k3 term alone trains the student (no task reward), metrics by
  verl's names; the student's greedy answers are irrelevant here (tests/test_quickstart_distill.py learns)."""
  metrics = k3_trainer.train_step(0)
  for key in ("distillation/loss", "distillation/abs_loss", "distillation/loss_min", "distillation/loss_max"):
    assert np.isfinite(metrics[key]), (key, metrics.get(key))
  # k3 >= 0; with use_task_rewards=False and token-mean the loss is the mean per-token term: within its range.
  assert 0 <= metrics["distillation/loss_min"] <= metrics["distillation/loss"] <= metrics["distillation/loss_max"]
  assert "actor/pg_loss" in metrics


def test_topk_teacher_and_student_outputs(tmp_path, teacher):
  """forward_kl_topk: the teacher's top-k log-probs and ids equal transformers' (chunked LM head), and the
  student's log-probs at those ids equal a plain log-softmax of its logits."""
  config = distill_config(tmp_path, teacher[0], loss_mode="forward_kl_topk", topk=5)
  config.actor_rollout_ref.model.logits_chunk_size = 4  # chunks of 1 position per row: the scan path
  trainer = Trainer(config, devices=jax.devices()[:1])
  prompts, responses, rollout = random_rollout(1)
  out = jax.jit(trainer.ppo.teacher_log_probs)(trainer.state.teacher_params, rollout)
  want = hf_response_log_probs(teacher[1], prompts, responses)
  order = np.argsort(-want, -1)[..., :5]
  np.testing.assert_array_equal(np.asarray(out["teacher_topk_ids"]), order)
  np.testing.assert_allclose(np.asarray(out["teacher_topk_log_probs"]), np.take_along_axis(want, order, -1), atol=2e-5)
  micro = dict(rollout.sequences())
  student = trainer.ppo.outputs.token_outputs(
    trainer.state.actor.params, micro, teacher_topk_ids=out["teacher_topk_ids"]
  )
  full = trainer.ppo.outputs.token_outputs(trainer.state.actor.params, micro, teacher_topk_ids=None)
  assert student["topk_log_probs"].shape == (4, 3, 5) and student["topk_overlap"].shape == (4, 3)
  np.testing.assert_allclose(np.asarray(student["log_prob"]), np.asarray(full["log_prob"]), atol=1e-6)
  assert np.all(np.asarray(student["topk_log_probs"]) <= 0)


def test_teacher_with_another_vocabulary_is_refused(tmp_path):
  save_teacher(tmp_path / "teacher80", vocab_size=80)
  with pytest.raises(ConfigError, match=r"distillation.teacher_model.model_path=.*vocab_size=80.*64"):
    Trainer(distill_config(tmp_path, str(tmp_path / "teacher80")), devices=jax.devices()[:1])


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"distillation.enabled": True}, "distillation.teacher_model.model_path"),
    (
      {
        "distillation.enabled": True,
        "distillation.teacher_model.model_path": "x",
        "distillation.distillation_loss.loss_mode": "k1",
      },
      "use_policy_gradient=True",
    ),
    ({"distillation.distillation_loss.loss_mode": "reverse"}, "distillation.distillation_loss.loss_mode"),
  ],
)
def test_bad_distillation_keys_are_refused(tmp_path, overrides, message):
  from jaxrlhf.config import validate_config

  with pytest.raises(ConfigError, match=message):
    validate_config(small_config(tmp_path, **overrides))
