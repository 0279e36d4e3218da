"""verl 0.9.1's own distillation loss functions, run unmodified (torch, CPU) as the oracle for
`jaxrlhf.algos.distillation` (tests/algos/test_verl_distillation_parity.py).

`import verl.trainer.distillation.losses` needs verl's whole runtime (ray, tensordict, omegaconf), which the
test environment does not install. The functions themselves need only torch: each is read from verl's
installed source file by name (`ast`), decorators dropped (they only register the function), and executed in
a namespace that binds the names it calls. The bindings are verl's own functions read the same way
(`kl_penalty`, `agg_loss`, `compute_policy_loss_vanilla`, `masked_sum`/`masked_mean`), plus stand-ins for
what only moves data between verl's layouts: `no_padding_2_padding` (our tensors are padded already),
`Metric` (a value with an aggregation tag), the sequence-parallel world size (1) and a config object that
holds the loss config's fields. Nothing of verl's arithmetic is rewritten here.
"""

from __future__ import annotations
import __future__

import ast
import importlib.util
import os
import types

import torch
import torch.nn.functional as F


def verl_dir() -> str | None:
  spec = importlib.util.find_spec("verl")
  if spec is None or not spec.submodule_search_locations:
    return None
  return list(spec.submodule_search_locations)[0]


def _functions(relative_path: str, names: tuple[str, ...], namespace: dict) -> dict:
  """verl's functions `names` from `relative_path` (under verl/), compiled in `namespace` (which they update)."""
  path = os.path.join(verl_dir(), relative_path)
  with open(path) as f:
    tree = ast.parse(f.read(), filename=path)
  found = {}
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name in names:
      node.decorator_list = []
      found[node.name] = node
  missing = set(names) - set(found)
  if missing:
    raise LookupError(f"{relative_path} has no {sorted(missing)} (not verl 0.9.1?)")
  module = ast.Module(body=[found[name] for name in names], type_ignores=[])
  # Annotations stay unevaluated: they name verl's config classes, which are not loaded.
  exec(compile(module, path, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True), namespace)
  return {name: namespace[name] for name in names}


class Metric:
  """verl's `Metric(aggregation, value)`: the value is what the comparison reads."""

  def __init__(self, aggregation=None, value=None):
    self.aggregation, self.value = aggregation, value


class LossConfig(types.SimpleNamespace):
  """verl's `DistillationLossConfig` / `ActorConfig` fields as attributes, with the `.get` BaseConfig has."""

  def get(self, key, default=None):
    return getattr(self, key, default)


def load() -> types.SimpleNamespace:
  """verl's distillation functions, ready to call: `distillation_loss(config, distillation_config, model_output,
  data)`, `compute_forward_kl_topk` (the fsdp logits-processor one: `fsdp_forward_kl_topk`) and the rest."""
  utils_ns = {"torch": torch}
  verl_F = types.SimpleNamespace(**_functions("utils/torch_functional.py", ("masked_sum", "masked_mean"), utils_ns))
  core_ns = {"torch": torch, "verl_F": verl_F, "AlgoConfig": type("AlgoConfig", (), {})}
  core = _functions(
    "trainer/ppo/core_algos.py",
    ("kl_penalty", "kl_penalty_forward", "agg_loss", "compute_policy_loss_vanilla"),
    core_ns,
  )
  fsdp_ns = {
    "torch": torch,
    "F": F,
    "get_ulysses_sequence_parallel_world_size": lambda: 1,
    "slice_input_tensor": None,
  }
  fsdp = _functions(
    "trainer/distillation/fsdp/losses.py",
    ("_chunked_topk_log_probs", "kl_divergence", "compute_forward_kl_topk"),
    fsdp_ns,
  )
  registry = {}
  losses_ns = {
    "torch": torch,
    "Metric": Metric,
    "AggregationType": types.SimpleNamespace(MIN="min", MAX="max", MEAN="mean", SUM="sum"),
    "no_padding_2_padding": lambda tensor, data: tensor,
    "kl_penalty": core["kl_penalty"],
    "agg_loss": core["agg_loss"],
    "get_policy_loss_fn": {"vanilla": core["compute_policy_loss_vanilla"]}.__getitem__,
    "get_distillation_loss_fn": registry.__getitem__,
  }
  losses = _functions(
    "trainer/distillation/losses.py",
    (
      "compute_distillation_loss_range",
      "distillation_loss",
      "compute_forward_kl_topk",
      "compute_distillation_loss_reverse_kl_estimator",
    ),
    losses_ns,
  )
  for name in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"):
    registry[name] = losses["compute_distillation_loss_reverse_kl_estimator"]
  registry["forward_kl_topk"] = losses["compute_forward_kl_topk"]
  return types.SimpleNamespace(
    **core, **losses, fsdp_forward_kl_topk=fsdp["compute_forward_kl_topk"], kl_divergence=fsdp["kl_divergence"]
  )
