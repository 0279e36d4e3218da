"""Ulysses sequence parallelism: the split forward equals the unsplit one, and the step's metrics equal
sp=1's on 8 simulated devices (padded and packed rows); bad combinations are start-up errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.config import ConfigError
from jaxrlhf.models.decoder import Decoder, DecoderConfig, init_params
from jaxrlhf.models.sequence_parallel import SequenceParallel
from jaxrlhf.parallel.mesh import make_mesh
from jaxrlhf.trainer.trainer import Trainer
from tests.helpers import TIMING_DEPENDENT, small_config


def _tiny(impl, kv_heads=4):
  return DecoderConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=kv_heads,
    attention_impl=impl,
    attention_block_size=4,
    rope_theta=100.0,
  )


@pytest.mark.parametrize(
  "impl,packed,sp,kv_heads,rollout_tp",
  [
    ("xla", False, 2, 4, 1),
    ("blockwise", True, 4, 4, 1),
    ("blockwise", False, 4, 4, 2),
    ("xla", False, 4, 2, 1),
    ("blockwise", True, 8, 2, 1),
  ],
)
def test_split_forward_and_gradient_equal_unsplit(impl, packed, sp, kv_heads, rollout_tp):
  """Length 14 (not a multiple of 4: padded inside), left padding or two packed segments per row. With
  fewer key/value heads than sp (2 at sp 4 and 8) each is repeated and its query group split. With a generation
  TP of 2 inside the sp group of 4 the mesh is (fsdp 2, sp 2, rollout_tp 2): sequences split over the pair."""
  config = _tiny(impl, kv_heads)
  params, _ = init_params(Decoder(config), jax.random.key(0))
  rng = np.random.default_rng(0)
  ids_BxL = jnp.asarray(rng.integers(0, 64, (4, 14)), jnp.int32)
  mask_BxL = jnp.ones((4, 14), jnp.int32).at[1, :5].set(0)
  segments_BxL = None
  positions_BxL = jnp.maximum(jnp.cumsum(mask_BxL, axis=1) - 1, 0)
  if packed:
    segments_BxL = jnp.asarray(np.repeat([[1] * 6 + [2] * 6 + [0] * 2], 4, axis=0), jnp.int32)
    positions_BxL = jnp.asarray(np.repeat([list(range(6)) * 2 + [0, 0]], 4, axis=0), jnp.int32)
    mask_BxL = (segments_BxL > 0).astype(jnp.int32)
  mesh = make_mesh((1, 8, 1), sequence_parallel=sp, rollout_tensor_parallel=rollout_tp)
  split = SequenceParallel(mesh)
  assert split.size == sp and split.sequence_axes == (("sp", "rollout_tp") if rollout_tp > 1 else ("sp",))

  def loss(params, model):
    logits_BxLxV, _ = model.apply({"params": params}, ids_BxL, positions_BxL, mask_BxL, segment_ids_BxL=segments_BxL)
    return jnp.sum(jnp.where(mask_BxL[..., None] > 0, jax.nn.log_softmax(logits_BxLxV), 0.0) ** 2), logits_BxLxV

  (_, want), want_grads = jax.jit(jax.value_and_grad(lambda p: loss(p, Decoder(config)), has_aux=True))(params)
  (_, got), got_grads = jax.jit(jax.value_and_grad(lambda p: loss(p, Decoder(config, layout=split)), has_aux=True))(
    params
  )
  valid = np.asarray(mask_BxL)[..., None] > 0
  np.testing.assert_allclose(np.where(valid, got, 0), np.where(valid, want, 0), atol=1e-5, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4), got_grads, want_grads)


def _config(tmp_path, sp: int, packed: bool, **overrides):
  # Packed rows run the blockwise kernel (segment ids), padded rows the xla one: both under the all-to-all.
  impl = "blockwise" if packed else "xla"
  return small_config(
    tmp_path,
    **{
      "mesh.fsdp": 8,
      "actor_rollout_ref.model.use_remove_padding": packed,
      "actor_rollout_ref.model.attention_impl": impl,
      "critic.model.attention_impl": impl,
      "actor_rollout_ref.actor.ulysses_sequence_parallel_size": sp,
      "critic.ulysses_sequence_parallel_size": sp,
      **overrides,
    },
  )


@pytest.fixture(scope="module")
def unsplit_steps(tmp_path_factory):
  """sp=1 on the same 8 devices, padded and packed: {packed: (metrics, actor params)}."""
  steps = {}
  for packed in (False, True):
    trainer = Trainer(_config(tmp_path_factory.mktemp(f"sp1_{packed}"), 1, packed))
    steps[packed] = trainer.train_step(0), jax.device_get(trainer.state.actor.params)
  return steps


# Both SP widths and both layouts in two whole-step compiles (each 1-3 minutes on two cores), not four.
@pytest.mark.parametrize("packed,sp", [(False, 2), (True, 4)])
def test_step_metrics_equal_sp1(tmp_path, unsplit_steps, sp, packed):
  """Prompt 12 + response 3 = 15 tokens: padded to a multiple of sp inside the forward. The actor, the
  reference (use_kl_loss) and the critic all split; micro-batches are devices / sp rows."""
  want_metrics, want_actor = unsplit_steps[packed]
  trainer = Trainer(_config(tmp_path, sp, packed))
  assert dict(trainer.mesh.shape) == {"data": 1, "fsdp": 8 // sp, "sp": sp, "tensor": 1}
  assert trainer.ppo.actor.sequence_parallel.size == sp and trainer.ppo.critic.sequence_parallel.size == sp
  assert trainer.ppo.generation.rollout_actor.sequence_parallel is None  # generation never splits
  metrics = trainer.train_step(0)
  for key, value in want_metrics.items():
    if not key.startswith(TIMING_DEPENDENT):
      np.testing.assert_allclose(metrics[key], value, rtol=1e-5, atol=1e-5, err_msg=key)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
    want_actor,
    jax.device_get(trainer.state.actor.params),
  )


@pytest.mark.parametrize(
  "overrides,message",
  [
    (
      {"actor_rollout_ref.actor.ulysses_sequence_parallel_size": 3},
      "actor_rollout_ref.actor.ulysses_sequence_parallel_size=3 must divide mesh.fsdp=8",
    ),
    (
      {"actor_rollout_ref.actor.ulysses_sequence_parallel_size": 8, "num_attention_heads": 4},
      "actor_rollout_ref.actor.ulysses_sequence_parallel_size=8 x mesh.tensor=1 must divide num_attention_heads=4",
    ),
    (
      {
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2,
        "mesh.fsdp": 2,
        "mesh.tensor": 4,
        "num_attention_heads": 4,
      },
      "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 x mesh.tensor=4 must divide num_attention_heads=4",
    ),
    (
      {
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2,
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 1,
      },
      "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1 and "
      "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    ),
    (
      {"actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2, "critic.ulysses_sequence_parallel_size": 4},
      "critic.ulysses_sequence_parallel_size=4 and actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    ),
  ],
)
def test_bad_combinations_are_config_errors(tmp_path, overrides, message):
  overrides = dict(overrides)
  heads = overrides.pop("num_attention_heads", None)
  config = small_config(tmp_path, **{"mesh.fsdp": -1, **overrides})
  config.actor_rollout_ref.model.override_config.num_key_value_heads = 4
  if heads:
    config.actor_rollout_ref.model.override_config.num_attention_heads = heads
  with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
    Trainer(config)
