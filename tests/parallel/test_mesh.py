import jax
import pytest
from jax.sharding import PartitionSpec as P

from jaxrlhf.models import Decoder, abstract_params
from jaxrlhf.parallel import GENERATION_RULES, TRAIN_RULES, batch_sharding, logical_to_shardings, make_mesh
from jaxrlhf.parallel.layouts import fit_spec
from jaxrlhf.parallel.mesh import MeshError, resolve_mesh_shape


def test_fill_axis_and_errors_state_both_numbers():
  assert resolve_mesh_shape((1, -1, 2), 8) == (1, 4, 2)
  assert resolve_mesh_shape((2, 2, 2), 8) == (2, 2, 2)
  with pytest.raises(MeshError, match="8 devices"):
    resolve_mesh_shape((2, 2, 1), 8)
  with pytest.raises(MeshError, match="at most one"):
    resolve_mesh_shape((-1, -1, 1), 8)
  with pytest.raises(MeshError, match="not divisible"):
    resolve_mesh_shape((3, -1, 1), 8)


def test_mesh_has_named_auto_axes():
  mesh = make_mesh((2, 2, 2))
  assert mesh.axis_names == ("data", "fsdp", "tensor") and mesh.size == 8
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_fit_spec_drops_axes_that_do_not_divide():
  mesh = make_mesh((2, 2, 2))
  assert fit_spec(P(("data", "fsdp"), None), (8, 3), mesh) == P(("data", "fsdp"), None)
  assert fit_spec(P(("data", "fsdp"), None), (2, 3), mesh) == P("data", None)
  assert fit_spec(P("tensor"), (5,), mesh) == P(None)
  assert batch_sharding(mesh, (6, 4)).spec == P("data", None)


def test_train_layout_splits_fsdp_and_generation_layout_gathers_it(tiny_model_config):
  mesh = make_mesh((1, 4, 2))
  shapes, logical = abstract_params(Decoder(tiny_model_config))
  train = logical_to_shardings(logical, shapes, mesh, TRAIN_RULES)
  generation = logical_to_shardings(logical, shapes, mesh, GENERATION_RULES)
  # Scanned layers: the stacked layer axis (first) is never split.
  q_train = train["layers"]["self_attn"]["q_proj"]["kernel"].spec
  q_gen = generation["layers"]["self_attn"]["q_proj"]["kernel"].spec
  assert q_train == P(None, "fsdp", "tensor", None) and q_gen == P(None, None, "tensor", None)
  assert train["layers"]["mlp"]["down_proj"]["kernel"].spec == P(None, "tensor", "fsdp")
  assert generation["embed_tokens"]["embedding"].spec == P("tensor", None)
