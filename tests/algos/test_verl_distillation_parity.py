"""`jaxrlhf.algos.distillation` equals verl 0.9.1's own distillation losses (run unmodified in torch,
`verl_distillation.py`) on random masked inputs with a padding row: every loss mode, both clamps, each
aggregation, with and without `use_policy_gradient`; loss values, metrics and gradients (fp32 vs fp64)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import verl_distillation

from jaxrlhf import algos

pytestmark = pytest.mark.skipif(verl_distillation.verl_dir() is None, reason="verl 0.9.1 is not installed")
torch = pytest.importorskip("torch")

N, R, V, K = 4, 6, 13, 4
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def verl():
  return verl_distillation.load()


def inputs(seed: int) -> dict:
  """Student/teacher logits far enough apart that k3 and the clamps bite; a padding row and ragged lengths."""
  rng = np.random.default_rng(seed)
  student = rng.normal(0, 2.0, (N, R, V))
  teacher = rng.normal(0, 2.0, (N, R, V))
  tokens = rng.integers(0, V, (N, R))
  lengths = np.array([R, 3, 0, 5])
  mask = (np.arange(R)[None, :] < lengths[:, None]).astype(np.float64)
  log_softmax = lambda z: z - np.log(np.exp(z).sum(-1, keepdims=True))
  pick = lambda z: np.take_along_axis(log_softmax(z), tokens[..., None], -1)[..., 0]
  old = pick(student) + rng.normal(0, 0.3, (N, R))  # ratios off 1: the PPO clip is reached
  return dict(student=student, teacher=teacher, tokens=tokens, mask=mask, old=old, pick=pick)


def verl_configs(loss_mode, agg, clamp, use_pg, log_prob_min_clamp=None):
  actor = verl_distillation.LossConfig(loss_agg_mode=agg, global_batch_info={}, loss_scale_factor=None)
  loss = verl_distillation.LossConfig(
    loss_mode=loss_mode,
    topk=K,
    loss_max_clamp=clamp,
    log_prob_min_clamp=log_prob_min_clamp,
    use_policy_gradient=use_pg,
    policy_loss_mode="vanilla",
    clip_ratio=0.2,
    clip_ratio_low=0.2,
    clip_ratio_high=0.28,
    global_batch_info={},
  )
  return actor, verl_distillation.LossConfig(distillation_loss=loss)


def verl_data(x, **extra):
  t = lambda a: torch.tensor(a, dtype=torch.float64)
  return dict(
    response_mask=t(x["mask"]).bool(),
    old_log_probs=t(x["old"]),
    dp_size=1,
    batch_num_tokens=None,
    global_batch_size=None,
    **extra,
  )


def ours(token_losses_fn, x, agg, clamp, use_pg):
  """(loss, metrics) of jaxrlhf's functions as a function of the student's logits [N, R, V] (fp32)."""

  def loss_fn(student):
    log_prob = jnp.take_along_axis(jax.nn.log_softmax(student), jnp.asarray(x["tokens"])[..., None], -1)[..., 0]
    token_losses, extra = token_losses_fn(student, log_prob)
    loss, metrics = algos.compute_distillation_loss(
      token_losses,
      jnp.asarray(x["mask"], jnp.float32),
      loss_agg_mode=agg,
      loss_max_clamp=clamp,
      use_policy_gradient=use_pg,
      log_prob=log_prob,
      old_log_prob=jnp.asarray(x["old"], jnp.float32),
      clip_ratio=0.2,
      clip_ratio_low=0.2,
      clip_ratio_high=0.28,
    )
    return loss, {**metrics, **extra}

  (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(x["student"], jnp.float32))
  return float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(grad)


def compare(loss, metrics, grad, want_loss, want_metrics, want_grad):
  np.testing.assert_allclose(loss, want_loss, **TOL)
  for name, value in metrics.items():
    want = want_metrics[f"distillation/{name}"]
    want = want.value if isinstance(want, verl_distillation.Metric) else want
    want = want.detach() if isinstance(want, torch.Tensor) else want
    np.testing.assert_allclose(value, float(want), **TOL, err_msg=name)
  np.testing.assert_allclose(grad, want_grad, **TOL)


CASES = list(itertools.product(algos.DISTILLATION_ESTIMATOR_MODES, (None, 0.5), (False, True)))


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("seed", (0,))
def test_estimator_modes_match_verl(verl, seed, agg):
  """Reverse-KL estimators of the sampled token: value, loss_min/max, pg metrics, d loss / d student logits."""
  x = inputs(seed)
  for loss_mode, clamp, use_pg in CASES:
    student = torch.tensor(x["student"], dtype=torch.float64, requires_grad=True)
    log_probs = torch.log_softmax(student, -1).gather(-1, torch.tensor(x["tokens"])[..., None])[..., 0]
    teacher_lp = torch.tensor(x["pick"](x["teacher"]), dtype=torch.float64)
    data = verl_data(x, teacher_logprobs=teacher_lp[..., None])
    want_loss, want_metrics = verl.distillation_loss(
      *verl_configs(loss_mode, agg, clamp, use_pg), {"log_probs": log_probs}, data
    )
    want_loss.backward()
    teacher = jnp.asarray(teacher_lp.numpy(), jnp.float32)
    loss, metrics, grad = ours(
      lambda _, lp: (algos.distillation_token_losses(loss_mode, lp, teacher), {}), x, agg, clamp, use_pg
    )
    label = f"{loss_mode} clamp={clamp} pg={use_pg}"
    try:
      compare(loss, metrics, grad, want_loss.item(), want_metrics, student.grad.numpy())
    except AssertionError as e:
      raise AssertionError(f"{label}: {e}") from None


@pytest.mark.parametrize("agg", ("token-mean", "seq-mean-token-mean"))
@pytest.mark.parametrize("seed", (0,))
def test_forward_kl_topk_matches_verl(verl, seed, agg):
  """Top-k forward KL: verl's fsdp logits processor (student logits, teacher top-k) then its loss; both
  clamps, with and without policy gradient; masses, overlap ratio and the gradient over the whole vocabulary."""
  x = inputs(seed)
  teacher_topk_lp, teacher_ids = algos.topk_log_probs(jnp.asarray(x["teacher"], jnp.float32), K)
  want_teacher = torch.topk(torch.log_softmax(torch.tensor(x["teacher"]), -1), K, -1)
  np.testing.assert_allclose(np.asarray(teacher_topk_lp), want_teacher.values.numpy(), **TOL)
  np.testing.assert_array_equal(np.asarray(teacher_ids), want_teacher.indices.numpy())
  for clamp, min_clamp, use_pg in itertools.product((None, 0.3), (None, -2.0), (False, True)):
    actor_config, distill_config = verl_configs("forward_kl_topk", agg, clamp, use_pg, min_clamp)
    student = torch.tensor(x["student"], dtype=torch.float64, requires_grad=True)
    nested = lambda a: torch.nested.as_nested_tensor(list(torch.as_tensor(a)), layout=torch.jagged)
    processed = verl.fsdp_forward_kl_topk(
      student.reshape(1, N * R, V),
      nested(want_teacher.values.to(torch.float64)),
      nested(want_teacher.indices),
      distill_config,
      "thd",
    )
    model_output = {name: value.reshape(N, R) for name, value in processed.items()}
    model_output["log_probs"] = torch.log_softmax(student, -1).gather(-1, torch.tensor(x["tokens"])[..., None])[..., 0]
    want_loss, want_metrics = verl.distillation_loss(actor_config, distill_config, model_output, verl_data(x))
    want_loss.backward()

    def token_losses(student_logits, _):
      student_topk = algos.gather_log_probs(student_logits, teacher_ids)
      out = algos.forward_kl_topk(student_topk, teacher_topk_lp, min_clamp)
      valid = jnp.asarray(x["mask"]) != 0
      mean = lambda v: jnp.sum(jnp.where(valid, v, 0.0)) / jnp.sum(valid)
      overlap = algos.topk_overlap_count(student_logits, teacher_ids)
      extra = dict(student_mass=mean(out["student_mass"]), teacher_mass=mean(out["teacher_mass"]))
      extra["overlap_ratio"] = mean(overlap.astype(jnp.float32)) / K
      return out["losses"], extra

    loss, metrics, grad = ours(token_losses, x, agg, clamp, use_pg)
    label = f"clamp={clamp} log_prob_min_clamp={min_clamp} pg={use_pg}"
    try:
      compare(loss, metrics, grad, want_loss.item(), want_metrics, student.grad.numpy())
    except AssertionError as e:
      raise AssertionError(f"{label}: {e}") from None


def test_inputs_reach_the_clamps():
  """The random inputs push k3 and forward-KL losses past the clamp and ratios past the clip (else vacuous)."""
  x = inputs(0)
  teacher = jnp.asarray(x["pick"](x["teacher"]), jnp.float32)
  log_prob = jnp.asarray(x["pick"](x["student"]), jnp.float32)
  valid = x["mask"] != 0
  k3 = np.asarray(algos.distillation_token_losses("k3", log_prob, teacher))[valid]
  assert (k3 > 0.5).any() and (k3 < 0.5).any()
  k1 = np.asarray(algos.distillation_token_losses("k1", log_prob, teacher))[valid]
  assert (k1 < -0.5).any()
  _, metrics = algos.compute_distillation_loss(
    algos.distillation_token_losses("k3", log_prob, teacher),
    x["mask"],
    use_policy_gradient=True,
    log_prob=log_prob,
    old_log_prob=jnp.asarray(x["old"], jnp.float32),
  )
  assert float(metrics["pg_clipfrac"]) > 0


def test_unknown_mode_is_refused():
  with pytest.raises(ValueError, match="forward_kl_topk"):
    algos.uses_topk("reverse_kl")
