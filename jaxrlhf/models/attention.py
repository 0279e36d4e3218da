"""Attention kernels of the decoder: which keys a query sees, and softmax(q k^T / sqrt(H)) v over them.

Every implementation computes the same thing (`models/decoder.py` explains the masks): query at
sequence index `offset + l` sees key `s` iff s <= offset + l (causal), s > offset + l - window (sliding
window, when on), `kv_mask_BxS[s]` > 0 (padding) and, for packed rows, the same segment id > 0.

  xla        the whole [L, S] score matrix per head (`xla_attention`); a decode step (L = 1) always runs
             `decode_attention`, over the KV cache in its own layout.
  blockwise  online softmax over blocks of queries and keys in plain JAX (`blockwise_attention`), with
             its own backward (FlashAttention-2's), so neither pass holds more than one [block, block]
             score tile per head; blocks entirely above the diagonal or outside the window are skipped.
             Every backend, every mask.
  cudnn      `jax.nn.dot_product_attention(implementation="cudnn")` on NVIDIA GPUs (bf16/fp16): causal,
             right padding by lengths, a static sliding window. Left padding is handled by rotating each
             row so its first valid token sits at column 0 (RoPE is already applied, so this is exact
             when each row's valid tokens are one contiguous run, as the trainer's prompt + response rows
             are; columns between a row's first and last valid token count as valid).
  splash     Pallas splash attention on TPU (`jax.experimental.pallas.ops.tpu.splash_attention`): causal,
             sliding window, padding and packing as segment ids. XLA cannot partition a Mosaic kernel
             ("Mosaic kernels cannot be automatically partitioned. Please wrap the call in a shard_map."),
             so on a mesh of several devices the decoder runs it in a `shard_map` over rows and key/value
             heads (`ActivationLayout.attention`; the Decoder needs its `layout`, as the trainer's have).
What a vendor kernel cannot express falls back to blockwise (`choose_kernel` says why): fp32 inputs or
packed segment ids for cudnn, a per-layer (traced) window flag, a cache prefill (queries offset into
a longer cache), learned attention sinks, and a process without cuDNN (an ahead-of-time compile for GPUs on a CPU
host).

Attention sinks (gpt-oss, `sinks_KxG`): a learned logit per query head that joins every query's softmax
denominator and carries no value: out = sum_s exp(score_s) v_s / (exp(sink) + sum_s exp(score_s)). xla and decode
add it as one more column; blockwise scales its output by sigmoid(lse - sink), the same quotient (lse: the log of
the keys' denominator), its backward taking lse's cotangent.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf.config import ATTENTION_IMPLS  # noqa: F401  (re-exported: the kernels' names)

log = logging.getLogger(__name__)

# Added to the score of a masked key (and to a filtered-out logit when sampling): finite, so a query
# with no valid key (a left pad) gives no NaN, and exp() of it underflows to exactly 0.
MASK_VALUE = -1e9


def auto_attention_impl(platform: str) -> str:
  """`attention_impl="auto"` on a device platform: cudnn on NVIDIA GPUs, splash on TPU, xla elsewhere."""
  platform = platform.lower()
  if platform in ("cuda", "gpu"):
    return "cudnn"
  if platform == "tpu":
    return "splash"
  return "xla"


def resolve_impl(impl: str, platform: str | None = None) -> str:
  """`attention_impl` with "auto" replaced by the kernel for `platform` (default: JAX's default backend)."""
  return auto_attention_impl(platform or jax.default_backend()) if impl == "auto" else impl


@functools.lru_cache(maxsize=None)
def _log_fallback(impl: str, reason: str) -> None:
  log.info("attention_impl=%s falls back to blockwise: %s", impl, reason)


def choose_kernel(impl: str, *, dtype, cached: bool, packed: bool, traced_window: bool, sinks: bool = False) -> str:
  """The kernel one attention call runs (see the module docstring); logs each fallback once."""
  if impl in ("xla", "blockwise"):
    return impl
  reason = None
  if sinks:
    reason = "learned attention sinks (gpt-oss): an extra softmax logit per head, which neither cuDNN nor splash takes"
  elif cached:
    reason = "a cache prefill (queries offset into a longer cache)"
  elif traced_window:
    reason = "the sliding window covers only some layers (a per-layer flag inside the layer scan)"
  elif impl == "cudnn" and packed:
    reason = "packed segment ids (cuDNN's API here takes per-row lengths only)"
  elif impl == "cudnn" and jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    reason = f"cuDNN attention needs bf16/fp16, the compute dtype is {jnp.dtype(dtype).name}"
  if reason is None:
    return impl
  _log_fallback(impl, reason)
  return "blockwise"


def _run_xla(
  q_BxLxKxGxH,
  keys_BxSxKxH,
  values_BxSxKxH,
  kv_mask_BxS,
  segment_ids_BxL,
  window_on,
  *,
  offset,
  window,
  block_size,
  sinks_KxG=None,
):
  del block_size
  query_index_L = offset + jnp.arange(q_BxLxKxGxH.shape[1])
  return xla_attention(
    q_BxLxKxGxH,
    keys_BxSxKxH,
    values_BxSxKxH,
    query_index_L,
    kv_mask_BxS,
    segment_ids_BxL,
    window,
    window_on,
    sinks_KxG,
  )


def _run_blockwise(
  q_BxLxKxGxH,
  keys_BxSxKxH,
  values_BxSxKxH,
  kv_mask_BxS,
  segment_ids_BxL,
  window_on,
  *,
  offset,
  window,
  block_size,
  sinks_KxG=None,
):
  return blockwise_attention(
    q_BxLxKxGxH,
    keys_BxSxKxH,
    values_BxSxKxH,
    offset,
    kv_mask_BxS,
    segment_ids_BxL,
    window,
    window_on,
    block_size,
    sinks_KxG,
  )


def _run_cudnn(
  q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, kv_mask_BxS, segment_ids_BxL, window_on, *, offset, window, block_size
):
  del segment_ids_BxL, window_on, offset  # choose_kernel sent packed rows, a traced window and a prefill elsewhere
  out_BxLxKxGxH = cudnn_attention(q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, kv_mask_BxS, window)
  if out_BxLxKxGxH is None:  # no cuDNN in this process (compiling ahead of time on a CPU host) or its shape
    out_BxLxKxGxH = blockwise_attention(
      q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, 0, kv_mask_BxS, None, window, None, block_size
    )
  return out_BxLxKxGxH


def _run_splash(
  q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, kv_mask_BxS, segment_ids_BxL, window_on, *, offset, window, block_size
):
  del window_on, offset  # choose_kernel sent a traced window and a prefill elsewhere
  return splash_attention(q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, kv_mask_BxS, segment_ids_BxL, window, block_size)


_KERNELS = {"xla": _run_xla, "blockwise": _run_blockwise, "cudnn": _run_cudnn, "splash": _run_splash}


def kernel_fn(kernel: str, *, offset, window: int | None, block_size: int, sinks_KxG=None):
  """`core(q, keys, values, kv_mask, segment_ids, window_on) -> out [B, L, K, G, H]`: one kernel (as
  `choose_kernel` gives it) with a call's static settings bound; `ActivationLayout.attention` takes it as is.
  `sinks_KxG`: learned attention sinks (xla and blockwise only; `choose_kernel` sends them nowhere else)."""
  sinks = {} if sinks_KxG is None else {"sinks_KxG": sinks_KxG}
  return functools.partial(_KERNELS[kernel], offset=offset, window=window, block_size=block_size, **sinks)


def _softmax_with_sinks(scores_BxKxGx_xS, sinks_KxG):
  """softmax over the last axis with each head's sink logit as one more column, dropped after (module docstring);
  plain softmax without sinks. `scores`: [B, K, G, ..., S] fp32."""
  if sinks_KxG is None:
    return jax.nn.softmax(scores_BxKxGx_xS, axis=-1)
  sink = sinks_KxG.astype(jnp.float32).reshape(sinks_KxG.shape + (1,) * (scores_BxKxGx_xS.ndim - 3))
  sink = jnp.broadcast_to(sink[None], scores_BxKxGx_xS.shape[:-1] + (1,))
  return jax.nn.softmax(jnp.concatenate([scores_BxKxGx_xS, sink], axis=-1), axis=-1)[..., :-1]


def _allowed(query_index_L, key_index_S, kv_mask_BxS, segment_q_BxL, segment_k_BxS, window, window_on):
  """[B, L, S] bool: which keys each query may see."""
  allowed_LxS = key_index_S[None, :] <= query_index_L[:, None]
  if window is not None:
    in_window_LxS = key_index_S[None, :] > query_index_L[:, None] - window
    allowed_LxS &= in_window_LxS if window_on is None else (in_window_LxS | ~window_on)
  allowed_BxLxS = allowed_LxS[None] & (kv_mask_BxS[:, None, :] > 0)
  if segment_q_BxL is not None:
    same_BxLxS = segment_q_BxL[:, :, None] == segment_k_BxS[:, None, :]
    allowed_BxLxS &= same_BxLxS & (segment_k_BxS[:, None, :] > 0)
  return allowed_BxLxS


def xla_attention(
  q_BxLxKxGxH,
  keys_BxSxKxH,
  values_BxSxKxH,
  query_index_L,
  kv_mask_BxS,
  segment_ids_BxL=None,
  window=None,
  window_on=None,
  sinks_KxG=None,
):
  """The whole score matrix [B, K, G, L, S] in fp32; probabilities in the compute dtype (q's)."""
  dtype, head_dim = q_BxLxKxGxH.dtype, q_BxLxKxGxH.shape[-1]
  scores_BxKxGxLxS = jnp.einsum(
    "blkgh,bskh->bkgls", q_BxLxKxGxH, keys_BxSxKxH.astype(dtype), preferred_element_type=jnp.float32
  ) / jnp.sqrt(head_dim).astype(jnp.float32)
  key_index_S = jnp.arange(keys_BxSxKxH.shape[1])
  allowed_BxLxS = _allowed(query_index_L, key_index_S, kv_mask_BxS, segment_ids_BxL, segment_ids_BxL, window, window_on)
  scores_BxKxGxLxS = jnp.where(allowed_BxLxS[:, None, None], scores_BxKxGxLxS, MASK_VALUE)
  probs_BxKxGxLxS = _softmax_with_sinks(scores_BxKxGxLxS, sinks_KxG).astype(dtype)
  return jnp.einsum("bkgls,bskh->blkgh", probs_BxKxGxLxS, values_BxSxKxH.astype(dtype))


def decode_attention(
  q_BxKxGxH, keys_BxKxSxH, values_BxKxSxH, query_index, kv_mask_BxS, window=None, window_on=None, sinks_KxG=None
):
  """One query per row (a decode step) over the KV cache in its own [B, K, S, H] layout -> [B, K, G, H].
  `query_index`: the query's cache column, one for every row (a scalar) or one per row ([B]).

  Both products are batched matmuls over (B, K) with S or H as the contracted axis in place, so XLA
  moves no part of the cache. Read as [B, S, K, H] (the cache-free calls' layout), with transposes and a
  multiply-reduce for the value sum, one layer's decode attention took 1.6x as long on CPU (155K shapes).
  """
  dtype, head_dim = q_BxKxGxH.dtype, q_BxKxGxH.shape[-1]
  scores_BxKxGxS = jnp.einsum(
    "bkgh,bksh->bkgs", q_BxKxGxH, keys_BxKxSxH.astype(dtype), preferred_element_type=jnp.float32
  ) / jnp.sqrt(head_dim).astype(jnp.float32)
  key_index_S = jnp.arange(keys_BxKxSxH.shape[2])
  query_index = jnp.asarray(query_index)
  if query_index.ndim == 0:  # every row's query at one cache column
    allowed_BxS = _allowed(query_index[None], key_index_S, kv_mask_BxS, None, None, window, window_on)[:, 0]
  else:  # one column per row ([B]: the rollout's slots)
    row_allowed = lambda index, mask_S: _allowed(index[None], key_index_S, mask_S[None], None, None, window, window_on)
    allowed_BxS = jax.vmap(row_allowed)(query_index, kv_mask_BxS)[:, 0, 0]
  scores_BxKxGxS = jnp.where(allowed_BxS[:, None, None], scores_BxKxGxS, MASK_VALUE)
  probs_BxKxGxS = _softmax_with_sinks(scores_BxKxGxS, sinks_KxG).astype(dtype)
  return jnp.einsum(
    "bkgs,bksh->bkgh", probs_BxKxGxS, values_BxKxSxH.astype(dtype), preferred_element_type=jnp.float32
  ).astype(dtype)


# ----- blockwise ---------------------------------------------------------------------------------


def _pad_axis(x, axis: int, size: int, value=0):
  if x is None or x.shape[axis] == size:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def _key_block_range(i, offset, block_q, block_k, num_k, window, window_on):
  """Key blocks [lo, hi) that queries of block i can see (causal bound, and the window's)."""
  hi = jnp.clip((offset + (i + 1) * block_q - 1) // block_k + 1, 0, num_k)
  lo = jnp.zeros_like(hi)
  if window is not None:
    lo_window = jnp.clip((offset + i * block_q - window + 1) // block_k, 0, num_k)
    lo = lo_window if window_on is None else jnp.where(window_on, lo_window, 0)
  return lo, hi


def _query_block_range(j, offset, block_q, block_k, num_q, window, window_on):
  """Query blocks [lo, hi) that can see key block j."""
  lo = jnp.clip((j * block_k - offset) // block_q, 0, num_q)
  hi = jnp.full_like(lo, num_q)
  if window is not None:
    hi_window = jnp.clip(-(-((j + 1) * block_k - 1 + window - offset) // block_q), 0, num_q)
    hi = hi_window if window_on is None else jnp.where(window_on, hi_window, num_q)
  return lo, hi


class _Blocks:
  """Shapes and the per-tile mask and scores shared by the forward and backward passes."""

  def __init__(self, q, k, block_q, block_k, window):
    self.batch, self.length, self.kv_heads, self.group, self.head_dim = q.shape
    self.keys = k.shape[1]
    self.block_q, self.block_k, self.window = block_q, block_k, window
    self.num_q, self.num_k = self.length // block_q, self.keys // block_k
    self.scale = np.float32(1.0 / np.sqrt(self.head_dim))

  def q_tile(self, x, i):  # [B, L, ...] -> block i of queries
    return jax.lax.dynamic_slice_in_dim(x, i * self.block_q, self.block_q, axis=1)

  def k_tile(self, x, j):
    return jax.lax.dynamic_slice_in_dim(x, j * self.block_k, self.block_k, axis=1)

  def scores(self, q_i, k_j, i, j, offset, kv_mask, segment_q, segment_k, window_on):
    """Masked scores [B, K, G, bq, bk] fp32 and the mask [B, 1, 1, bq, bk]."""
    s = jnp.einsum("blkgh,bskh->bkgls", q_i, k_j, preferred_element_type=jnp.float32) * self.scale
    query_index = offset + i * self.block_q + jnp.arange(self.block_q)
    key_index = j * self.block_k + jnp.arange(self.block_k)
    seg_q = None if segment_q is None else self.q_tile(segment_q, i)
    seg_k = None if segment_k is None else self.k_tile(segment_k, j)
    allowed = _allowed(query_index, key_index, self.k_tile(kv_mask, j), seg_q, seg_k, self.window, window_on)
    allowed = allowed[:, None, None]
    return jnp.where(allowed, s, MASK_VALUE), allowed


def _blockwise_forward(q, k, v, offset, kv_mask, segment_q, segment_k, window_on, block_q, block_k, window):
  blocks = _Blocks(q, k, block_q, block_k, window)
  b, kh, g, h = blocks.batch, blocks.kv_heads, blocks.group, blocks.head_dim

  def query_block(_, i):
    q_i = blocks.q_tile(q, i)

    def key_block(j, carry):
      m, row_sum, acc = carry  # running max and softmax denominator of each query
      k_j, v_j = blocks.k_tile(k, j), blocks.k_tile(v, j)
      s, allowed = blocks.scores(q_i, k_j, i, j, offset, kv_mask, segment_q, segment_k, window_on)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      p = jnp.where(allowed, jnp.exp(s - m_new[..., None]), 0.0)
      correction = jnp.exp(m - m_new)
      row_sum = row_sum * correction + jnp.sum(p, axis=-1)
      acc = acc * correction[..., None] + jnp.einsum(
        "bkgls,bskh->bkglh", p.astype(v.dtype), v_j, preferred_element_type=jnp.float32
      )
      return m_new, row_sum, acc

    init = (
      jnp.full((b, kh, g, block_q), MASK_VALUE, jnp.float32),
      jnp.zeros((b, kh, g, block_q), jnp.float32),
      jnp.zeros((b, kh, g, block_q, h), jnp.float32),
    )
    lo, hi = _key_block_range(i, offset, block_q, block_k, blocks.num_k, window, window_on)
    m, row_sum, acc = jax.lax.fori_loop(lo, hi, key_block, init)
    out = acc / jnp.maximum(row_sum, 1e-30)[..., None]  # a query with no valid key: 0
    lse = m + jnp.log(jnp.maximum(row_sum, 1e-30))
    return None, (out.transpose(0, 3, 1, 2, 4).astype(q.dtype), lse)

  _, (out_n, lse_n) = jax.lax.scan(query_block, None, jnp.arange(blocks.num_q))
  # [nq, B, bq, K, G, H] -> [B, L, K, G, H];  lse [nq, B, K, G, bq] -> [B, K, G, L]
  out = out_n.transpose(1, 0, 2, 3, 4, 5).reshape(b, blocks.length, kh, g, h)
  lse = lse_n.transpose(1, 2, 3, 0, 4).reshape(b, kh, g, blocks.length)
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10))
def _blockwise(q, k, v, offset, kv_mask, segment_q, segment_k, window_on, block_q, block_k, window):
  """(out [B, L, K, G, H], lse [B, K, G, L] fp32: the log of each query's softmax denominator)."""
  return _blockwise_forward(q, k, v, offset, kv_mask, segment_q, segment_k, window_on, block_q, block_k, window)


def _blockwise_fwd(q, k, v, offset, kv_mask, segment_q, segment_k, window_on, block_q, block_k, window):
  out, lse = _blockwise_forward(q, k, v, offset, kv_mask, segment_q, segment_k, window_on, block_q, block_k, window)
  return (out, lse), (q, k, v, offset, kv_mask, segment_q, segment_k, window_on, out, lse)


def _blockwise_bwd(block_q, block_k, window, residuals, cotangents):
  """FlashAttention-2's backward: per key block, recompute each visible tile's probabilities from the
  saved log-sum-exp; dk, dv accumulate over query blocks, dq over key blocks."""
  q, k, v, offset, kv_mask, segment_q, segment_k, window_on, out, lse = residuals
  d_out, d_lse = cotangents
  blocks = _Blocks(q, k, block_q, block_k, window)
  b, kh, h = blocks.batch, blocks.kv_heads, blocks.head_dim
  d_out32 = d_out.astype(jnp.float32)
  # D_i = rowsum(dO * O): [B, K, G, L]; lse's cotangent adds p_ij d_lse_i to each score's (d lse / d s_ij = p_ij).
  delta = jnp.einsum("blkgh,blkgh->bkgl", d_out32, out.astype(jnp.float32)) - d_lse.astype(jnp.float32)

  def key_block(dq, j):
    k_j, v_j = blocks.k_tile(k, j), blocks.k_tile(v, j)

    def query_block(i, carry):
      dq, dk_j, dv_j = carry
      q_i, do_i = blocks.q_tile(q, i), blocks.q_tile(d_out32, i)
      s, allowed = blocks.scores(q_i, k_j, i, j, offset, kv_mask, segment_q, segment_k, window_on)
      lse_i = jax.lax.dynamic_slice_in_dim(lse, i * block_q, block_q, axis=3)
      delta_i = jax.lax.dynamic_slice_in_dim(delta, i * block_q, block_q, axis=3)
      p = jnp.where(allowed, jnp.exp(s - lse_i[..., None]), 0.0)  # [B, K, G, bq, bk]
      dv_j = dv_j + jnp.einsum("bkgls,blkgh->bskh", p, do_i)
      dp = jnp.einsum("blkgh,bskh->bkgls", do_i, v_j.astype(jnp.float32))
      ds = p * (dp - delta_i[..., None]) * blocks.scale
      dk_j = dk_j + jnp.einsum("bkgls,blkgh->bskh", ds, q_i.astype(jnp.float32))
      dq_i = jnp.einsum("bkgls,bskh->blkgh", ds, k_j.astype(jnp.float32))
      dq = jax.lax.dynamic_update_slice_in_dim(dq, blocks.q_tile(dq, i) + dq_i, i * block_q, axis=1)
      return dq, dk_j, dv_j

    lo, hi = _query_block_range(j, offset, block_q, block_k, blocks.num_q, window, window_on)
    zeros = jnp.zeros((b, block_k, kh, h), jnp.float32)
    dq, dk_j, dv_j = jax.lax.fori_loop(lo, hi, query_block, (dq, zeros, zeros))
    return dq, (dk_j, dv_j)

  dq, (dk_n, dv_n) = jax.lax.scan(key_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(blocks.num_k))
  to_keys = lambda x_n: x_n.transpose(1, 0, 2, 3, 4).reshape(k.shape)  # [nk, B, bk, K, H] -> [B, S, K, H]
  return (
    dq.astype(q.dtype),
    to_keys(dk_n).astype(k.dtype),
    to_keys(dv_n).astype(v.dtype),
    None,
    None,
    None,
    None,
    None,
  )


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def blockwise_attention(
  q_BxLxKxGxH,
  keys_BxSxKxH,
  values_BxSxKxH,
  offset,
  kv_mask_BxS,
  segment_ids_BxL=None,
  window=None,
  window_on=None,
  block_size: int = 512,
  sinks_KxG=None,
):
  """Online-softmax attention over [block, block] tiles; queries at sequence indices offset + [0, L).
  `sinks_KxG`: learned attention sinks (module docstring).

  Without a cache S == L (offset 0); with one, the keys are the whole cache (S >= offset + L).
  Lengths that the block does not divide are padded (masked keys, discarded queries).
  """
  batch, length = q_BxLxKxGxH.shape[:2]
  keys = keys_BxSxKxH.shape[1]
  block_q, block_k = min(block_size, length), min(block_size, keys)
  padded_q, padded_k = -(-length // block_q) * block_q, -(-keys // block_k) * block_k
  dtype = q_BxLxKxGxH.dtype
  q = _pad_axis(q_BxLxKxGxH, 1, padded_q)
  k = _pad_axis(keys_BxSxKxH.astype(dtype), 1, padded_k)
  v = _pad_axis(values_BxSxKxH.astype(dtype), 1, padded_k)
  kv_mask = _pad_axis(kv_mask_BxS.astype(jnp.int32), 1, padded_k)
  segment_q = segment_k = None
  if segment_ids_BxL is not None:
    segment_q = _pad_axis(segment_ids_BxL.astype(jnp.int32), 1, padded_q)
    segment_k = _pad_axis(segment_ids_BxL.astype(jnp.int32), 1, padded_k)
  offset = jnp.asarray(offset, jnp.int32)
  if window_on is not None:
    window_on = jnp.asarray(window_on, bool)
  out, lse_BxKxGxL = _blockwise(q, k, v, offset, kv_mask, segment_q, segment_k, window_on, block_q, block_k, window)
  if sinks_KxG is not None:  # keys' denominator e^lse against e^lse + e^sink
    keep_BxKxGxL = jax.nn.sigmoid(lse_BxKxGxL - sinks_KxG.astype(jnp.float32)[None, :, :, None])
    out = (out.astype(jnp.float32) * keep_BxKxGxL.transpose(0, 3, 1, 2)[..., None]).astype(out.dtype)
  return out[:, :length]


# ----- vendor kernels ----------------------------------------------------------------------------


def cudnn_attention(q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, kv_mask_BxS, window=None):
  """cuDNN flash attention (no cache, no packing). Each row is rotated left by its first valid column so
  its tokens start at 0 (right padding, which cuDNN takes as lengths), then rotated back.

  Returns None where cuDNN cannot run the call: no cuDNN in this process (compiling ahead of time on a
  CPU host, where the GPU compile then uses blockwise) or a shape it refuses; the caller falls back."""
  batch, length, kv_heads, group, head_dim = q_BxLxKxGxH.shape
  mask_BxL = kv_mask_BxS > 0
  index_L = jnp.arange(length, dtype=jnp.int32)
  first_B = jnp.argmax(mask_BxL, axis=1).astype(jnp.int32)
  last_B = jnp.max(jnp.where(mask_BxL, index_L, -1), axis=1)
  lengths_B = jnp.maximum(last_B - first_B + 1, 0).astype(jnp.int32)
  rotate_BxL = (index_L[None] + first_B[:, None]) % length
  take = lambda x, index_BxL: jnp.take_along_axis(x, index_BxL.reshape(index_BxL.shape + (1,) * (x.ndim - 2)), axis=1)
  q_BxLxQxH = take(q_BxLxKxGxH.reshape(batch, length, kv_heads * group, head_dim), rotate_BxL)
  dtype = q_BxLxKxGxH.dtype
  try:
    out_BxLxQxH = jax.nn.dot_product_attention(
      q_BxLxQxH,
      take(keys_BxSxKxH.astype(dtype), rotate_BxL),
      take(values_BxSxKxH.astype(dtype), rotate_BxL),
      is_causal=True,
      query_seq_lengths=lengths_B,
      key_value_seq_lengths=lengths_B,
      local_window_size=None if window is None else (window - 1, 0),
      implementation="cudnn",
    )
  except (RuntimeError, NotImplementedError, ValueError) as e:  # raised while tracing, before any compute
    _log_fallback("cudnn", f"cuDNN attention is not available for this call ({e})")
    return None
  unrotate_BxL = (index_L[None] - first_B[:, None]) % length
  out_BxLxQxH = jnp.where((lengths_B > 0)[:, None, None, None], take(out_BxLxQxH, unrotate_BxL), 0)
  return out_BxLxQxH.reshape(batch, length, kv_heads, group, head_dim)


def splash_attention(
  q_BxLxKxGxH,
  keys_BxSxKxH,
  values_BxSxKxH,
  kv_mask_BxS,
  segment_ids_BxL=None,
  window=None,
  block_size: int = 512,
  interpret: bool = False,
):
  """Pallas TPU splash attention (no cache). Padding and packing both become segment ids: a packed row's
  own, or 1 for valid and 0 for padding (a pad query then sees only pads, and its output is unused)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

  batch, length, kv_heads, group, head_dim = q_BxLxKxGxH.shape
  dtype = q_BxLxKxGxH.dtype
  # The kernel's tiles are multiples of 128 that divide the length: pad it (padding is segment 0).
  block = min(max(128, block_size // 128 * 128), -(-length // 128) * 128)
  padded = -(-length // block) * block
  if window is None:
    mask = mask_lib.CausalMask((padded, padded))
  else:  # LocalMask's window is (left, right) inclusive offsets from the query: (window - 1, 0) is ours
    mask = mask_lib.LocalMask((padded, padded), (window - 1, 0), offset=0)
  sizes = kernel_lib.BlockSizes(
    block_q=block,
    block_kv=block,
    block_kv_compute=block,
    block_q_dkv=block,
    block_kv_dkv=block,
    block_kv_dkv_compute=block,
    block_q_dq=block,
    block_kv_dq=block,
  )
  kernel = kernel_lib.make_splash_mqa_single_device(
    mask_lib.MultiHeadMask([mask] * group), block_sizes=sizes, interpret=interpret
  )  # interpret: the tests, on CPU
  segment_BxL = segment_ids_BxL if segment_ids_BxL is not None else (kv_mask_BxS > 0)
  segment_BxL = _pad_axis(segment_BxL.astype(jnp.int32), 1, padded)
  scale = np.float32(1.0 / np.sqrt(head_dim))
  # [B, L, K, G, H] -> [B, K, G, L, H]: one MQA call (G query heads over one key/value head) per (row, kv head).
  q_BxKxGxLxH = (_pad_axis(q_BxLxKxGxH, 1, padded).transpose(0, 2, 3, 1, 4).astype(jnp.float32) * scale).astype(dtype)
  k_BxKxSxH = _pad_axis(keys_BxSxKxH.astype(dtype), 1, padded).transpose(0, 2, 1, 3)
  v_BxKxSxH = _pad_axis(values_BxSxKxH.astype(dtype), 1, padded).transpose(0, 2, 1, 3)

  def one_row(q_KxGxLxH, k_KxSxH, v_KxSxH, segment_L):
    segments = kernel_lib.SegmentIds(q=segment_L, kv=segment_L)
    return jax.vmap(lambda q, k_, v_: kernel(q, k_, v_, segment_ids=segments))(q_KxGxLxH, k_KxSxH, v_KxSxH)

  out_BxKxGxLxH = jax.vmap(one_row)(q_BxKxGxLxH, k_BxKxSxH, v_BxKxSxH, segment_BxL)
  return out_BxKxGxLxH.transpose(0, 3, 1, 2, 4)[:, :length].astype(dtype)
