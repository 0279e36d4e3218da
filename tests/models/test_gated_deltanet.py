"""Gated DeltaNet math against transformers' own torch functions (Qwen3.5), in fp32 on tiny shapes.

Chunked and recurrent gated delta rule (grouped value heads, K != V, K = 12, L not a multiple of the
chunk, with and without an initial state) equal HF's and each other; a chunked prefill followed by
single-token steps equals the whole sequence; invalid tokens leave the state unchanged and the valid ones
see the sequence as if they were removed; gradients equal torch's autograd through HF's chunked form and
the recurrent form's; the causal conv equals `causal_conv1d_fn` and `causal_conv1d_update`; the gated
RMSNorm equals `Qwen3_5RMSNormGated`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.models.qwen3_5.modeling_qwen3_5 import (  # noqa: E402
  Qwen3_5RMSNormGated,
  causal_conv1d_fn,
  causal_conv1d_update,
  torch_chunk_gated_delta_rule,
  torch_recurrent_gated_delta_rule,
)

from jaxrlhf.models import gated_deltanet  # noqa: E402

# Jitted once per shape: op-by-op dispatch of the scans would cost more than their compiles.
chunk_gated_delta_rule = jax.jit(gated_deltanet.chunk_gated_delta_rule, static_argnames="chunk_size")
recurrent_gated_delta_rule = jax.jit(gated_deltanet.recurrent_gated_delta_rule)
causal_conv1d = jax.jit(gated_deltanet.causal_conv1d)
gated_rms_norm = gated_deltanet.gated_rms_norm

B, L, Hk, Hv, K, V = 2, 37, 2, 4, 12, 8
CHUNK = 16
C, W = 10, 4
ATOL = 1e-5


def _inputs(seed, length=L, with_state=True):
  """q, k, v, g, beta (and an initial state) as numpy fp32, g and beta distributed as the layer makes them."""
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((B, length, Hk, K), np.float32)
  k = rng.standard_normal((B, length, Hk, K), np.float32)
  v = rng.standard_normal((B, length, Hv, V), np.float32)
  # g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b), as Qwen3_5GatedDeltaNet.forward.
  a_log = np.log(rng.uniform(0.01, 16, Hv)).astype(np.float32)
  a = rng.standard_normal((B, length, Hv)).astype(np.float32) - 2.0
  g = (-np.exp(a_log) * np.logaddexp(0.0, a)).astype(np.float32)
  beta = (1 / (1 + np.exp(-rng.standard_normal((B, length, Hv))))).astype(np.float32)
  state = rng.standard_normal((B, Hv, K, V), np.float32) if with_state else None
  return q, k, v, g, beta, state


def _hf(fn, q, k, v, g, beta, state, **kwargs):
  out, final = fn(
    *(torch.from_numpy(x) for x in (q, k, v, g, beta)),
    initial_state=None if state is None else torch.from_numpy(state),
    output_final_state=True,
    use_qk_l2norm_in_kernel=True,
    **kwargs,
  )
  return out.numpy(), final.numpy()


def _max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_and_recurrent_match_hf_and_each_other(with_state):
  q, k, v, g, beta, state = _inputs(0, with_state=with_state)
  hf_chunk_out, hf_chunk_state = _hf(torch_chunk_gated_delta_rule, q, k, v, g, beta, state, chunk_size=CHUNK)
  hf_rec_out, hf_rec_state = _hf(torch_recurrent_gated_delta_rule, q, k, v, g, beta, state)
  chunk_out, chunk_state = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=CHUNK, initial_state_BxHvxKxV=state)
  rec_out, rec_state = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state_BxHvxKxV=state)
  assert chunk_out.shape == (B, L, Hv, V) and chunk_state.shape == (B, Hv, K, V)
  np.testing.assert_allclose(chunk_out, hf_chunk_out, atol=ATOL, rtol=0)
  np.testing.assert_allclose(chunk_state, hf_chunk_state, atol=ATOL, rtol=0)
  np.testing.assert_allclose(rec_out, hf_rec_out, atol=ATOL, rtol=0)
  np.testing.assert_allclose(rec_state, hf_rec_state, atol=ATOL, rtol=0)
  np.testing.assert_allclose(chunk_out, rec_out, atol=ATOL, rtol=0)
  np.testing.assert_allclose(chunk_state, rec_state, atol=ATOL, rtol=0)
  # A chunk longer than the sequence: one padded chunk.
  long_out, long_state = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=64, initial_state_BxHvxKxV=state)
  np.testing.assert_allclose(long_out, rec_out, atol=ATOL, rtol=0)
  np.testing.assert_allclose(long_state, rec_state, atol=ATOL, rtol=0)


def test_dtypes_follow_hf():
  q, k, v, g, beta, state = _inputs(1)
  bf16 = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)]
  for fn in (recurrent_gated_delta_rule, chunk_gated_delta_rule):
    out, final = fn(*bf16, g, beta, initial_state_BxHvxKxV=state)
    assert out.dtype == jnp.bfloat16 and final.dtype == jnp.float32


def test_chunked_prefill_then_single_token_steps_equal_the_whole_sequence():
  q, k, v, g, beta, state = _inputs(2)
  whole_out, whole_state = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=CHUNK, initial_state_BxHvxKxV=state)
  prefill = 21
  outs = []
  out, running = chunk_gated_delta_rule(
    *(x[:, :prefill] for x in (q, k, v, g, beta)), chunk_size=CHUNK, initial_state_BxHvxKxV=state
  )
  outs.append(out)
  step = recurrent_gated_delta_rule
  for t in range(prefill, L):
    out, running = step(*(x[:, t : t + 1] for x in (q, k, v, g, beta)), initial_state_BxHvxKxV=running)
    outs.append(out)
  np.testing.assert_allclose(np.concatenate(outs, axis=1), whole_out, atol=ATOL, rtol=0)
  np.testing.assert_allclose(running, whole_state, atol=ATOL, rtol=0)


def _nan_where_invalid(x_BxLx_, valid_BxL):
  x_BxLx_ = x_BxLx_.copy()
  x_BxLx_[~valid_BxL] = np.nan
  return x_BxLx_


def _valid_mask():
  valid = np.ones((B, L), bool)
  valid[0, :3] = False  # left padding
  valid[0, [7, 8, 20, 33]] = False  # interleaved (paused) tokens
  valid[1, 16:32] = False  # a whole chunk
  valid[1, 35:] = False  # right padding (a finished row)
  return valid


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_invalid_tokens_are_as_if_removed(form):
  fn = (
    (lambda *a, **kw: chunk_gated_delta_rule(*a, chunk_size=CHUNK, **kw))
    if form == "chunk"
    else recurrent_gated_delta_rule
  )
  q, k, v, g, beta, state = _inputs(3)
  valid = _valid_mask()
  garbage = [_nan_where_invalid(x, valid) for x in (q, k, v, g, beta)]  # invalid tokens are never read
  out, final = fn(*garbage, initial_state_BxHvxKxV=state, valid_BxL=valid)
  assert np.all(np.asarray(out)[~valid] == 0)
  for row in range(B):
    kept = valid[row]
    row_out, row_final = fn(
      *(x[row : row + 1, kept] for x in (q, k, v, g, beta)), initial_state_BxHvxKxV=state[row : row + 1]
    )
    np.testing.assert_allclose(np.asarray(out)[row, kept], row_out[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(final[row], row_final[0], atol=ATOL, rtol=0)
  # A row with no valid token, and a single-token decode step of an invalid token: the state bit for bit.
  none_valid = np.zeros((B, L), bool)
  _, unchanged = fn(q, k, v, g, beta, initial_state_BxHvxKxV=state, valid_BxL=none_valid)
  np.testing.assert_array_equal(unchanged, state)
  step_valid = np.array([[True], [False]])
  _, stepped = fn(*(x[:, :1] for x in (q, k, v, g, beta)), initial_state_BxHvxKxV=state, valid_BxL=step_valid)
  np.testing.assert_array_equal(stepped[1], state[1])
  assert np.max(np.abs(np.asarray(stepped[0]) - state[0])) > 1e-3


def test_gradients_match_torch_and_the_recurrent_form():
  q, k, v, g, beta, state = _inputs(4, length=21)
  rng = np.random.default_rng(5)
  out_cotangent = rng.standard_normal((B, 21, Hv, V), np.float32)
  state_cotangent = rng.standard_normal((B, Hv, K, V), np.float32)

  def loss(fn, *args, **kwargs):
    out, final = fn(*args[:5], initial_state_BxHvxKxV=args[5], **kwargs)
    return jnp.sum(out * out_cotangent) + jnp.sum(final * state_cotangent)

  argnums = tuple(range(6))
  chunk_grads = jax.jit(jax.grad(lambda *a: loss(chunk_gated_delta_rule, *a, chunk_size=8), argnums))(
    q, k, v, g, beta, state
  )
  rec_grads = jax.jit(jax.grad(lambda *a: loss(recurrent_gated_delta_rule, *a), argnums))(q, k, v, g, beta, state)
  torch_args = [torch.tensor(x, requires_grad=True) for x in (q, k, v, g, beta, state)]
  torch_out, torch_final = torch_chunk_gated_delta_rule(
    *torch_args[:5], chunk_size=8, initial_state=torch_args[5], output_final_state=True, use_qk_l2norm_in_kernel=True
  )
  (torch_out * torch.from_numpy(out_cotangent)).sum().add(
    (torch_final * torch.from_numpy(state_cotangent)).sum()
  ).backward()
  for chunk_grad, rec_grad, torch_arg in zip(chunk_grads, rec_grads, torch_args):
    assert np.all(np.isfinite(chunk_grad))
    np.testing.assert_allclose(chunk_grad, rec_grad, atol=1e-4, rtol=0)
    np.testing.assert_allclose(chunk_grad, torch_arg.grad.numpy(), atol=1e-4, rtol=0)
  # With NaN at invalid tokens (a whole chunk of them in row 1): finite, and the two forms agree.
  valid = _valid_mask()[:, :21]
  masked = [
    jax.jit(jax.grad(lambda *a: loss(fn, *a, valid_BxL=valid), argnums))(
      *(_nan_where_invalid(x, valid) for x in (q, k, v, g, beta)), state
    )
    for fn in (lambda *a, **kw: chunk_gated_delta_rule(*a, chunk_size=8, **kw), recurrent_gated_delta_rule)
  ]
  for index, (chunk_grad, rec_grad) in enumerate(zip(*masked)):
    assert np.all(np.isfinite(chunk_grad))
    np.testing.assert_allclose(chunk_grad, rec_grad, atol=1e-4, rtol=0)
    if index < 5:  # q, k, v, g, beta: nothing flows to an invalid token
      assert np.all(np.asarray(chunk_grad)[~valid] == 0)


def _conv_inputs(seed, length=L):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((B, length, C), np.float32)
  weight = rng.standard_normal((C, W), np.float32)
  state = rng.standard_normal((B, C, W - 1), np.float32)
  return x, weight, state


def test_causal_conv_matches_hf_whole_sequence_and_single_token_updates():
  x, weight, _ = _conv_inputs(6)
  hf_out = causal_conv1d_fn(torch.from_numpy(x).transpose(1, 2), torch.from_numpy(weight), activation="silu")
  out, state = causal_conv1d(x, weight)
  np.testing.assert_allclose(out, hf_out.transpose(1, 2).numpy(), atol=ATOL, rtol=0)
  np.testing.assert_array_equal(state, np.swapaxes(x[:, -(W - 1) :], 1, 2))
  # Prefill, then one token at a time against HF's update, whose cache holds W columns (the last W inputs).
  prefill = 2  # fewer tokens than W - 1: the state keeps zeros from before the sequence
  outs = []
  out, state = causal_conv1d(x[:, :prefill], weight)
  outs.append(out)
  hf_state = torch.zeros(B, C, W)
  hf_state[:, :, -prefill:] = torch.from_numpy(x[:, :prefill]).transpose(1, 2)
  step = causal_conv1d
  for t in range(prefill, L):
    out, state = step(x[:, t : t + 1], weight, conv_state_BxCxW1=state)
    hf_out = causal_conv1d_update(
      torch.from_numpy(x[:, t : t + 1]).transpose(1, 2), hf_state, torch.from_numpy(weight), activation="silu"
    )
    np.testing.assert_allclose(out, hf_out.transpose(1, 2).numpy(), atol=ATOL, rtol=0)
    np.testing.assert_array_equal(state, hf_state[:, :, 1:].numpy())
    outs.append(out)
  whole_out, whole_state = causal_conv1d(x, weight)
  np.testing.assert_allclose(np.concatenate(outs, axis=1), whole_out, atol=ATOL, rtol=0)
  np.testing.assert_array_equal(state, whole_state)


def test_causal_conv_invalid_tokens_are_as_if_removed():
  x, weight, state = _conv_inputs(7, length=12)
  valid = np.ones((B, 12), bool)
  valid[0, [0, 1, 5, 6, 11]] = False
  valid[1, 2:] = False  # two valid tokens, fewer than W - 1: the state keeps its last old column
  out, new_state = causal_conv1d(_nan_where_invalid(x, valid), weight, conv_state_BxCxW1=state, valid_BxL=valid)
  assert np.all(np.asarray(out)[~valid] == 0)
  for row in range(B):
    kept = valid[row]
    row_out, row_state = causal_conv1d(x[row : row + 1, kept], weight, conv_state_BxCxW1=state[row : row + 1])
    np.testing.assert_allclose(np.asarray(out)[row, kept], row_out[0], atol=ATOL, rtol=0)
    np.testing.assert_array_equal(new_state[row], row_state[0])
  np.testing.assert_array_equal(new_state[1], np.concatenate([state[1, :, -1:], x[1, :2].T], axis=1))
  _, unchanged = causal_conv1d(x, weight, conv_state_BxCxW1=state, valid_BxL=np.zeros((B, 12), bool))
  np.testing.assert_array_equal(unchanged, state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm_matches_hf(dtype):
  rng = np.random.default_rng(8)
  x, gate = (rng.standard_normal((B, 5, Hv, V), np.float32) for _ in range(2))
  norm = Qwen3_5RMSNormGated(V, eps=1e-6).to(dtype)
  with torch.no_grad():
    norm.weight.copy_(torch.from_numpy(rng.standard_normal(V, np.float32)))
    hf = norm(torch.from_numpy(x).to(dtype), torch.from_numpy(gate).to(dtype)).float().numpy()
  jax_dtype = jnp.float32 if dtype == torch.float32 else jnp.bfloat16
  weight = jnp.asarray(norm.weight.detach().float().numpy(), jax_dtype)
  ours = gated_rms_norm(jnp.asarray(x, jax_dtype), jnp.asarray(gate, jax_dtype), weight, 1e-6)
  assert ours.dtype == jax_dtype
  np.testing.assert_allclose(np.asarray(ours, np.float32), hf, atol=ATOL if dtype == torch.float32 else 0, rtol=0)
