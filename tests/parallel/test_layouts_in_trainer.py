"""Issue 4 on 8 simulated devices: layouts on real train states, memory scaling, the compiled step."""

import re

import jax
import pytest
from jax.sharding import PartitionSpec as P

from jaxrlhf.parallel import TRAIN_RULES
from jaxrlhf.parallel.layouts import GENERATION_RULES, ShardingError, mesh_spec
from jaxrlhf.parallel.report import per_device_bytes
from jaxrlhf.trainer import Trainer
from tests.helpers import small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _mesh_config(tmp_path, mesh, **extra):
  data, fsdp, tensor = mesh
  return small_config(tmp_path, **{"mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor, **extra})


def _expected_spec(logical_axes, rules, mesh):
  table = dict(rules)
  return mesh_spec(P(*(table.get(name) if name is not None else None for name in logical_axes)), mesh)


def _logical_axes(trainer):
  from jaxrlhf.models import Decoder, abstract_params

  return abstract_params(Decoder(trainer.model_config))[1]


@pytest.mark.parametrize("mesh,generation_tp", [((1, 8, 1), 1), ((2, 2, 2), 1), ((1, 2, 4), 8), ((1, 4, 2), 4)])
def test_every_parameter_follows_the_rules_table_in_both_layouts(tmp_path, mesh, generation_tp):
  trainer = Trainer(
    _mesh_config(tmp_path, mesh, **{"actor_rollout_ref.rollout.tensor_model_parallel_size": generation_tp})
  )
  logical = _logical_axes(trainer)
  flat_params = jax.tree_util.tree_flatten_with_path(trainer.state.actor.params)[0]
  flat_logical = jax.tree.leaves(logical, is_leaf=lambda x: isinstance(x, tuple))
  flat_gen = jax.tree.leaves(trainer.layouts.actor_generation)
  flat_mu = jax.tree.leaves(trainer.state.actor.opt_state[1].mu)
  assert len(flat_params) == len(flat_logical) == len(flat_gen) == len(flat_mu)
  for (path, param), names, gen, mu in zip(flat_params, flat_logical, flat_gen, flat_mu):
    assert param.sharding.spec == _expected_spec(names, TRAIN_RULES, trainer.mesh), path
    assert mu.sharding.spec == param.sharding.spec, path  # Adam moments live with their parameter
    assert gen.spec == _expected_spec(names, GENERATION_RULES, trainer.mesh), path
  for ref, (path, param) in zip(jax.tree.leaves(trainer.state.ref_params), flat_params):
    assert ref.sharding.spec == param.sharding.spec, path  # the reference stays in the train layout
  if generation_tp > mesh[2]:  # the start-up report: FSDP over every fsdp device in training, heads k ways after
    report = trainer.layout_report()
    q_proj = next(re.split(r"\s{2,}", line.strip()) for line in report.splitlines() if "q_proj/kernel" in line)
    assert q_proj[1:] == [
      "(None, ('fsdp', 'rollout_tp'), 'tensor', None)",
      "(None, None, ('rollout_tp', 'tensor'), None)",
    ], report


def test_memory_per_device_scales_with_fsdp_and_tensor(tmp_path):
  def actor_bytes(mesh, devices=None):
    trainer = Trainer(_mesh_config(tmp_path / "x".join(map(str, mesh)), mesh), devices=devices)
    return per_device_bytes(trainer.state.actor.params) + per_device_bytes(trainer.state.actor.opt_state)

  single = actor_bytes((1, 1, 1), jax.devices()[:1])
  for mesh in ((1, 8, 1), (1, 1, 8)):
    assert actor_bytes(mesh) <= single / 8 * 1.05, mesh


def test_compiled_step_gathers_params_for_generation_and_moves_no_params_to_host(tmp_path):
  trainer = Trainer(_mesh_config(tmp_path, (1, 8, 1)))
  from jaxrlhf.data import batch_arrays

  batch = trainer._device_batch(batch_arrays(trainer.train_data, trainer.schedule.indices(0)))
  hlo = trainer.jitted_step.lower(trainer.state, batch, trainer.rng).compile().as_text()
  assert "all-gather" in hlo
  # Host traffic: only the reward callback, whose operands are token ids / masks / row indices.
  callbacks = [line for line in hlo.splitlines() if "custom-call" in line and "callback" in line]
  assert len(callbacks) == 1, callbacks
  operand_types = re.findall(r"(f32|bf16|s32|u32|pred)\[", callbacks[0].split("custom-call(")[1])
  assert operand_types and set(operand_types) <= {"s32"}, callbacks[0]
  assert " send(" not in hlo and " recv(" not in hlo


def test_heads_not_divisible_by_tensor_is_an_error_naming_them(tmp_path):
  config = _mesh_config(tmp_path, (1, 1, 8))
  config.actor_rollout_ref.model.override_config.num_key_value_heads = 4
  with pytest.raises(ShardingError, match=r"kv_heads' of size 4 is not divisible by mesh axis tensor of size 8"):
    Trainer(config)
  bad_tp = _mesh_config(tmp_path, (1, 2, 4), **{"actor_rollout_ref.rollout.tensor_model_parallel_size": 6})
  with pytest.raises(ValueError, match="tensor_model_parallel_size=6"):
    Trainer(bad_tp)
