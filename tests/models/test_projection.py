"""`projection.project`: the value and both gradients equal plain `dot_general`'s (its custom VJP only
reorders the weight gradient's product), and the dot remat policies still keep it."""

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.models.decoder import REMAT_POLICIES
from jaxrlhf.models.projection import project


def _reference(x, kernel, n_in, out_dtype):
  dims = ((tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in))), ((), ()))
  return jax.lax.dot_general(x, kernel, dims, preferred_element_type=jnp.float32).astype(out_dtype)


@pytest.mark.parametrize(
  "x_shape, kernel_shape, n_in",
  [
    ((3, 5, 8), (8, 6), 1),  # [B, L, D] @ [D, F]
    ((3, 5, 4, 2), (4, 2, 8), 2),  # o_proj: [B, L, Q, H] @ [Q, H, D]
    ((3, 5, 8), (8, 2, 3), 1),  # q_proj: [B, L, D] @ [D, Q, H]
  ],
)
def test_value_and_gradients_equal_dot_general(x_shape, kernel_shape, n_in):
  rng = np.random.RandomState(0)
  x = jnp.asarray(rng.randn(*x_shape), jnp.float32)
  kernel = jnp.asarray(rng.randn(*kernel_shape), jnp.float32)
  weights = jnp.asarray(rng.randn(*(x_shape[: x.ndim - n_in] + kernel_shape[n_in:])), jnp.float32)
  loss = lambda fn: lambda x, k: jnp.sum(jnp.sin(fn(x, k)) * weights)
  ours = jax.value_and_grad(loss(lambda x, k: project(x, k, n_in)), argnums=(0, 1))(x, kernel)
  ref = jax.value_and_grad(loss(lambda x, k: _reference(x, k, n_in, jnp.float32)), argnums=(0, 1))(x, kernel)
  for got, want in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("out_dtype", [None, jnp.float32])
def test_bf16_gradients_have_the_operands_dtypes(out_dtype):
  rng = np.random.RandomState(1)
  x = jnp.asarray(rng.randn(4, 16), jnp.bfloat16)
  kernel = jnp.asarray(rng.randn(16, 8), jnp.bfloat16)
  out = project(x, kernel, out_dtype=out_dtype)
  assert out.dtype == (jnp.bfloat16 if out_dtype is None else jnp.float32)
  grads = jax.grad(lambda x, k: jnp.sum(project(x, k, out_dtype=out_dtype).astype(jnp.float32) ** 2), argnums=(0, 1))(
    x, kernel
  )
  ref = jax.grad(lambda x, k: jnp.sum(_reference(x, k, 1, out.dtype).astype(jnp.float32) ** 2), argnums=(0, 1))(
    x, kernel
  )
  for got, want in zip(grads, ref):
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2**-7, atol=1e-2)


@pytest.mark.parametrize(
  "policy, kept", [("dots_saveable", True), ("dots_with_no_batch_dims_saveable", True), ("full", False)]
)
def test_dot_policies_keep_projections(policy, kept, capsys):
  """Under remat, a policy that keeps dots keeps the projections' outputs as it keeps plain dots'."""
  x = jnp.ones((4, 8))
  k1, k2 = jnp.ones((8, 16)), jnp.ones((16, 8))
  f = lambda k1, k2: jnp.sum(jnp.sin(project(jnp.sin(project(x, k1)), k2)))
  jax.ad_checkpoint.print_saved_residuals(jax.checkpoint(f, policy=REMAT_POLICIES[policy]), k1, k2)
  saved = [line for line in capsys.readouterr().out.splitlines() if "named 'projection'" in line]
  assert len(saved) == (2 if kept else 0), saved
