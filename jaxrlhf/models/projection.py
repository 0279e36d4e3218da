"""The projection every linear layer runs: x [..., in...] @ kernel [in..., out...], accumulated in fp32.

Accumulation: for bf16 operands fp32 accumulation is the precision GPUs and TPUs use anyway, and on x86
CPUs with AVX512-BF16 it is the fast path (bf16 x bf16 -> fp32 runs about 2x the fp32 rate; bf16 -> bf16
does not). The result has the inputs' dtype, or fp32 where asked (the LM head's logits).

The gradient is written out (a custom VJP) for one reason: the order of the weight gradient's product.
JAX's rule for `dot_general` computes it as transpose(g^T x) ([out, in], then transposed), and XLA's CPU
compiler folds that transpose into a physical transpose of the gradient g [tokens, out], the largest
tensor of the backward, fused with the elementwise ops before it and read with a stride of a whole row:
for the MLP's [8 x 128, 1024] gradient that copy took 58 ms of a 1 s layer backward, and the MLP's two
of them were 40% of the backward. Here the weight gradient is x^T g, [in, out] as the kernel is, and no
transpose is needed. The values are the same products summed over the same tokens.

Rematerialisation policies that keep the dots (`dots_saveable`, ...) see a custom VJP as one opaque call,
not a dot: the output is named `PROJECTION` so `decoder.REMAT_POLICIES` can keep it as well.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

PROJECTION = "projection"  # checkpoint name of every projection's output


def _contract(lhs, rhs, lhs_dims, rhs_dims, dtype):
  out = jax.lax.dot_general(
    lhs, rhs, ((tuple(lhs_dims), tuple(rhs_dims)), ((), ())), preferred_element_type=jnp.float32
  )
  return out.astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _project(x, kernel, n_in: int, out_dtype):
  return _contract(x, kernel, range(x.ndim - n_in, x.ndim), range(n_in), out_dtype)


def _project_fwd(x, kernel, n_in: int, out_dtype):
  return _project(x, kernel, n_in, out_dtype), (x, kernel)


def _project_bwd(n_in: int, out_dtype, residuals, g):
  x, kernel = residuals
  lead = x.ndim - n_in
  # dx = g . kernel over the out dims: [..., in...]; dkernel = x . g over the leading (token) dims: [in..., out...].
  dx = _contract(g, kernel, range(lead, g.ndim), range(n_in, kernel.ndim), x.dtype)
  dkernel = _contract(x, g, range(lead), range(lead), kernel.dtype)
  return dx, dkernel


_project.defvjp(_project_fwd, _project_bwd)


def project(x, kernel, n_in: int = 1, out_dtype=None):
  """x @ kernel, contracting x's last `n_in` dims with the kernel's first `n_in`; fp32 accumulation,
  returned in `out_dtype` (default: the inputs' result dtype)."""
  out_dtype = jnp.result_type(x, kernel) if out_dtype is None else jnp.dtype(out_dtype)
  return checkpoint_name(_project(x, kernel, n_in, out_dtype), PROJECTION)
