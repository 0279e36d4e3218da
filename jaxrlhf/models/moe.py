"""The mixture-of-experts feed-forward block (Qwen3-MoE's `Qwen3MoeSparseMoeBlock`; with Qwen3.5-MoE's shared expert).

Router: logits x W_r in fp32, softmax over the experts, the top `num_experts_per_tok`, renormalised to sum to 1 with
`norm_topk_prob` (HF's order: softmax, then top-k, then the renormalisation).

Experts, dropless: every (token, chosen expert) pair is computed, none dropped for capacity. The T x k pairs are
sorted by expert, so that each expert's rows are contiguous, and each SwiGLU projection is one grouped matmul over
the sorted rows (`grouped_matmul`: a loop over tiles of one expert's rows, the group sizes from a histogram): T x k x
D x F multiply-adds per projection, never the dense E x T x D x F of running every expert on every token (which is
what `jax.lax.ragged_dot` lowers to on CPU and GPU in jax 0.10). The pairs' outputs, scaled by
their routing weights, are summed back into their tokens (a scatter-add).

Shared expert (Qwen3.5-MoE): a dense SwiGLU MLP on every token, scaled by sigmoid(x w_g), added to the experts'
output.

Load balancing (`load_balance_stats`): each call sows, per layer, the tokens each expert was chosen for and the sum
of each expert's router probability over the call's valid tokens; `load_balancing_loss` turns the layers' sums into
HF's `load_balancing_loss_func` (Switch Transformer's auxiliary loss) and the trainer into its expert-load metrics.

Parameter axes: the router `gate/kernel` [D, E] ("embed", None: whole on its expert dim, which `experts` would
split over fsdp as embed is); the experts' `experts/{gate,up}_proj` [E, D, F]
and `experts/down_proj` [E, F, D] ("experts", "expert_embed", "expert_mlp"): names of their own, so that a layout
can split the experts over devices (expert parallelism) where the dense layers split their embed dim
(`parallel/layouts.py`).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrlhf.models import layers
from jaxrlhf.models.layers import DTYPES, INIT_STD, logical_init

STATS = "load_balance"  # the sown collection's entry: per layer (tokens per expert [E], router probability [E], tokens)
EXPERT_AXES = {"gate_proj": ("expert_embed", "expert_mlp"), "up_proj": ("expert_embed", "expert_mlp")}
EXPERT_AXES["down_proj"] = ("expert_mlp", "expert_embed")
KERNEL_AXES = {name: ("experts",) + axes for name, axes in EXPERT_AXES.items()}  # the whole [E, ...] kernels'


def route(logits_TxE, top_k: int, norm_topk_prob: bool, replay_Txk=None):
  """(weights [T, k] fp32, experts [T, k] int32, probabilities [T, E] fp32) of router logits, HF's order.

  `replay_Txk` (rollout routing replay): experts recorded for each token; a token whose record is `no_route(E)`
  (or any value >= E) is routed by its own logits. A replayed token's weights are its current probabilities of
  the recorded experts (renormalised with `norm_topk_prob`), so the router's gradient flows as without replay."""
  probs_TxE = jax.nn.softmax(logits_TxE.astype(jnp.float32), axis=-1)
  weights_Txk, experts_Txk = jax.lax.top_k(probs_TxE, top_k)
  if replay_Txk is not None:
    replay_Txk = replay_Txk.astype(jnp.int32)
    recorded_Tx1 = jnp.all(replay_Txk < probs_TxE.shape[-1], axis=-1, keepdims=True)
    experts_Txk = jnp.where(recorded_Tx1, replay_Txk, experts_Txk)
    weights_Txk = jnp.take_along_axis(probs_TxE, experts_Txk, axis=-1)
  if norm_topk_prob:
    weights_Txk = weights_Txk / jnp.sum(weights_Txk, axis=-1, keepdims=True)
  return weights_Txk, experts_Txk.astype(jnp.int32), probs_TxE


def route_dtype(num_experts: int):
  """The smallest integer dtype that holds an expert index and `no_route(num_experts)`: a record of routes per token
  and layer (rollout routing replay) is then a byte per choice for up to 255 experts."""
  return jnp.uint8 if num_experts < 255 else jnp.int16 if num_experts < 2**15 - 1 else jnp.int32


def no_route(num_experts: int) -> int:
  """The record of a token whose routing was not recorded (`route` routes it by its logits)."""
  return num_experts


TILE_ROWS = 256  # rows of one expert per step of the grouped matmul's loop


def _tiles(group_sizes_E, rows: int, tile: int):
  """The row tiles of groups laid out one after another (group e: rows start_e .. start_e + n_e): each tile `tile`
  rows of one group, a group's last tile partly valid. Returns (group [NT], first row [NT], valid rows [NT]) for
  NT = ceil(rows / tile) + E, a bound on sum_e ceil(n_e / tile); the tiles past the last hold 0 valid rows."""
  num_groups = group_sizes_E.shape[0]
  count = -(-rows // tile) + num_groups
  tiles_E = (group_sizes_E + tile - 1) // tile
  tile_end_E = jnp.cumsum(tiles_E)
  start_E = jnp.cumsum(group_sizes_E) - group_sizes_E
  t = jnp.arange(count, dtype=jnp.int32)
  group = jnp.minimum(jnp.searchsorted(tile_end_E, t, side="right"), num_groups - 1).astype(jnp.int32)
  row = start_E[group] + (t - (tile_end_E - tiles_E)[group]) * tile
  valid = jnp.where(t < tile_end_E[-1], jnp.clip(start_E[group] + group_sizes_E[group] - row, 0, tile), 0)
  return group, jnp.minimum(row, rows), valid


def _tiled_matmul(lhs_PxK, rhs_GxKxN, tiles, tile: int):
  """[P, N] in `lhs`'s dtype (each tile's product accumulated in fp32): row p of `lhs` times the matrix of its group,
  one tile of one group's rows per loop step."""
  group, row, valid = tiles
  rows, width = lhs_PxK.shape
  padded = jnp.pad(lhs_PxK, ((0, tile), (0, 0)))  # a tile never runs past the end (dynamic_slice would shift it)

  def step(t, out_PxN):
    y_CxN = jax.lax.dot(
      jax.lax.dynamic_slice(padded, (row[t], 0), (tile, width)), rhs_GxKxN[group[t]], preferred_element_type=jnp.float32
    )
    old_CxN = jax.lax.dynamic_slice(out_PxN, (row[t], 0), (tile, out_PxN.shape[1]))
    keep_Cx1 = (jnp.arange(tile) < valid[t])[:, None]
    return jax.lax.dynamic_update_slice(out_PxN, jnp.where(keep_Cx1, y_CxN.astype(out_PxN.dtype), old_CxN), (row[t], 0))

  out = jnp.zeros((rows + tile, rhs_GxKxN.shape[-1]), lhs_PxK.dtype)
  return jax.lax.fori_loop(0, group.shape[0], step, out)[:rows]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def grouped_matmul(lhs_PxK, rhs_GxKxN, group_sizes_G, tile: int = TILE_ROWS):
  """[P, N] in `lhs`'s dtype, accumulated in fp32: rows of `lhs` in groups laid out one after another (sizes
  `group_sizes_G`, summing to at most P; rows past them give 0), each group's times its own matrix of `rhs`: what
  `jax.lax.ragged_dot` computes. Not that: XLA (jax 0.10) lowers ragged_dot on CPU and GPU to dense masked products
  over every group, [G, P, K] at once (32 GiB at P = 65536 tokens x experts, K = 2048, G = 128; docs/architecture.md,
  "Mixture of experts"). Here a loop over tiles of `tile` rows of one group each: P x K x N multiply-adds and one
  tile's buffers; the backward is two such loops."""
  return _tiled_matmul(lhs_PxK, rhs_GxKxN, _tiles(group_sizes_G, lhs_PxK.shape[0], tile), tile)


def _grouped_matmul_fwd(lhs_PxK, rhs_GxKxN, group_sizes_G, tile):
  tiles = _tiles(group_sizes_G, lhs_PxK.shape[0], tile)
  return _tiled_matmul(lhs_PxK, rhs_GxKxN, tiles, tile), (lhs_PxK, rhs_GxKxN, tiles)


def _grouped_matmul_bwd(tile, residuals, d_out_PxN):
  lhs_PxK, rhs_GxKxN, tiles = residuals
  group, row, valid = tiles
  d_out_PxN = d_out_PxN.astype(lhs_PxK.dtype)
  d_lhs = _tiled_matmul(d_out_PxN, jnp.swapaxes(rhs_GxKxN, 1, 2), tiles, tile).astype(lhs_PxK.dtype)
  lhs_pad, d_out_pad = (jnp.pad(x, ((0, tile), (0, 0))) for x in (lhs_PxK, d_out_PxN))

  def step(t, d_rhs_GxKxN):  # each tile adds lhs_tile^T d_out_tile to its group's matrix
    keep_Cx1 = (jnp.arange(tile) < valid[t])[:, None]
    lhs_CxK = jnp.where(keep_Cx1, jax.lax.dynamic_slice(lhs_pad, (row[t], 0), (tile, lhs_PxK.shape[1])), 0)
    d_out_CxN = jax.lax.dynamic_slice(d_out_pad, (row[t], 0), (tile, d_out_PxN.shape[1]))
    update_KxN = jax.lax.dot(lhs_CxK.T, d_out_CxN, preferred_element_type=jnp.float32)
    return d_rhs_GxKxN.at[group[t]].add(update_KxN)

  d_rhs = jax.lax.fori_loop(0, group.shape[0], step, jnp.zeros(rhs_GxKxN.shape, jnp.float32))
  return d_lhs, d_rhs.astype(rhs_GxKxN.dtype), None


grouped_matmul.defvjp(_grouped_matmul_fwd, _grouped_matmul_bwd)


def grouped_swiglu(x_TxD, experts_Txk, weights_Txk, kernels):
  """sum_j weights[t, j] * expert_{experts[t, j]}(x[t]) for each token t: the dropless experts (module docstring).

  The experts' SwiGLU: down(silu(x gate) * up), `kernels` {gate_proj, up_proj: [E, D, F], down_proj: [E, F, D]}.
  Matmuls in the weights' dtype, accumulated in fp32, their outputs in the weights' dtype (fp32 pair buffers of a bf16
  model were the largest of Qwen3-30B-A3B's step, 16 GiB each)."""

  def swiglu(x_PxD, group_sizes_E, expert_P):
    del expert_P
    grouped = lambda lhs, name: grouped_matmul(lhs, kernels[name], group_sizes_E)
    gate_PxF, up_PxF = grouped(x_PxD, "gate_proj"), grouped(x_PxD, "up_proj")
    return grouped(jax.nn.silu(gate_PxF) * up_PxF, "down_proj")  # in the compute dtype, as a dense MLP's

  gate_ExDxF = kernels["gate_proj"]
  return grouped_experts(x_TxD, experts_Txk, weights_Txk, swiglu, gate_ExDxF.dtype, gate_ExDxF.shape[0])


def grouped_experts(x_TxD, experts_Txk, weights_Txk, expert_fn, dtype, num_experts: int):
  """The dropless experts around any expert function: the T x k (token, expert) pairs sorted by expert, `expert_fn(
  x_PxD, group_sizes_E, expert_P) -> out_PxD` on the sorted pairs (each expert's rows contiguous; `expert_P`: each
  row's expert), the outputs weighted and summed back into their tokens, in fp32: [T, D]."""
  tokens, top_k = experts_Txk.shape
  expert_P = experts_Txk.reshape(-1)  # P = T x k (token, expert) pairs, token-major
  order_P = jnp.argsort(expert_P, stable=True)
  token_P = order_P // top_k
  group_sizes_E = jnp.bincount(expert_P, length=num_experts).astype(jnp.int32)
  x_PxD = jnp.take(x_TxD, token_P, axis=0).astype(dtype)
  out_PxD = expert_fn(x_PxD, group_sizes_E, jnp.take(expert_P, order_P))
  # Back to token-major order (a gather by the inverse permutation), each token's k outputs weighted and summed in fp32,
  # one choice at a time: a [T, k, D] fp32 product was the 30B step's largest buffer (16 GiB; XLA materialised it).
  inverse_P = jnp.zeros_like(order_P).at[order_P].set(jnp.arange(order_P.shape[0], dtype=order_P.dtype))
  inverse_Txk = inverse_P.reshape(tokens, top_k)
  out_TxD = jnp.zeros((tokens, out_PxD.shape[-1]), jnp.float32)
  for j in range(top_k):
    choice_TxD = jnp.take(out_PxD, inverse_Txk[:, j], axis=0) * weights_Txk[:, j, None].astype(dtype)
    out_TxD = out_TxD + choice_TxD.astype(jnp.float32)
  return out_TxD


def run_experts(layout, local, x_TxD, experts_Txk, weights_Txk, kernels, kernel_axes):
  """`local(x, experts, weights, kernels) -> [T, D]` on the call's tokens: in a cache-free forward on a mesh on each
  device's own tokens (`ActivationLayout.experts`, `layout`), else on all of them at once (decode calls, one device).
  `kernel_axes` {name: the kernel's logical axes}."""
  if layout is None:
    return local(x_TxD, experts_Txk, weights_Txk, kernels)
  return layout.experts(local, x_TxD, experts_Txk, weights_Txk, kernels, kernel_axes)


def load_balance_stats(experts_Txk, probs_TxE, valid_T, native_Txk=None):
  """(tokens routed to each expert [E], sum of each expert's probability [E], valid tokens [], tokens whose experts
  differ from their own top-k `native_Txk` (replayed routes; 0 without) []) over valid tokens."""
  valid_T = valid_T.astype(jnp.float32)
  num_experts = probs_TxE.shape[-1]
  counts_E = (
    jnp.zeros((num_experts,), jnp.float32).at[experts_Txk.reshape(-1)].add(jnp.repeat(valid_T, experts_Txk.shape[-1]))
  )
  differ_T = jnp.zeros_like(valid_T)
  if native_Txk is not None:
    differ_T = jnp.any(jnp.sort(experts_Txk, axis=-1) != jnp.sort(native_Txk, axis=-1), axis=-1).astype(jnp.float32)
  return counts_E, jnp.sum(probs_TxE * valid_T[:, None], axis=0), jnp.sum(valid_T), jnp.sum(differ_T * valid_T)


def load_balancing_loss(counts_LxE, prob_sums_LxE, tokens_L):
  """HF's `load_balancing_loss_func` from every MoE layer's `load_balance_stats` (stacked over layers):
  E * sum_e f_e P_e, f_e the share of (token, layer) rows that chose expert e (summing to top-k), P_e its mean router
  probability, both over all layers' rows together."""
  rows = jnp.maximum(jnp.sum(tokens_L), 1.0)
  tokens_per_expert_E = jnp.sum(counts_LxE, axis=0) / rows
  prob_per_expert_E = jnp.sum(prob_sums_LxE, axis=0) / rows
  return counts_LxE.shape[-1] * jnp.sum(tokens_per_expert_E * prob_per_expert_E)


def router_stats(intermediates):
  """Every MoE layer's sown `load_balance_stats` from a call's "intermediates" collection (`Decoder.apply(...,
  mutable=["intermediates"])`), whatever the stack's layout (scanned, grouped, a loop of layers): (tokens per expert
  [layers, E], router probability sums [layers, E], valid tokens [layers], replayed tokens routed otherwise than by
  their own logits [layers]), the layers in no particular order."""
  found = []

  def walk(node):
    for key, value in node.items():
      if key == STATS:
        found.extend(value)  # sow keeps a tuple of the values sown
      elif isinstance(value, dict):
        walk(value)

  walk(intermediates)
  if not found:
    raise ValueError("the call sowed no load-balancing statistics (a model without experts, or a decode call)")
  experts = found[0][0].shape[-1]
  return tuple(
    jnp.concatenate([entry[i].reshape((-1, experts) if i < 2 else (-1,)) for entry in found]) for i in range(4)
  )


class SparseMoeBlock(nn.Module):
  """x [B, L, D] -> (the experts' (and shared expert's) output [B, L, D], the experts each token was routed to
  [B, L, k] int32); `valid_BxL` (cache-free calls): which tokens count in the load-balancing statistics it sows;
  `replay_BxLxk`: recorded routes to route by (`route`). Parameters by HF's module names: `gate` (the router),
  `experts/{gate,up,down}_proj`, and with a shared expert `shared_expert/{gate,up,down}_proj` and
  `shared_expert_gate`."""

  config: Any  # the model's DecoderConfig
  layout: Any = None  # a cache-free call's ActivationLayout: the experts then run on each device's own tokens

  @nn.compact
  def __call__(self, x_BxLxD, valid_BxL=None, replay_BxLxk=None):
    cfg = self.config
    dtype = DTYPES[cfg.dtype]
    batch, length, hidden = x_BxLxD.shape
    x_TxD = x_BxLxD.reshape(-1, hidden)
    router_DxE = Weight((hidden, cfg.num_experts), ("embed", None), cfg.param_dtype, name="gate")()
    logits_TxE = x_TxD.astype(jnp.float32) @ router_DxE.astype(jnp.float32)
    replay_Txk = None if replay_BxLxk is None else replay_BxLxk.reshape(-1, cfg.num_experts_per_tok)
    weights_Txk, experts_Txk, probs_TxE = route(logits_TxE, cfg.num_experts_per_tok, cfg.norm_topk_prob, replay_Txk)
    if valid_BxL is not None:
      native_Txk = None if replay_Txk is None else jax.lax.top_k(probs_TxE, cfg.num_experts_per_tok)[1]
      self.sow("intermediates", STATS, load_balance_stats(experts_Txk, probs_TxE, valid_BxL.reshape(-1), native_Txk))
    kernels = {name: kernel.astype(dtype) for name, kernel in ExpertWeights(cfg, name="experts")().items()}
    out_TxD = run_experts(
      self.layout, grouped_swiglu, x_TxD.astype(dtype), experts_Txk, weights_Txk, kernels, KERNEL_AXES
    )
    out_TxD = out_TxD.astype(dtype)
    if cfg.shared_expert_intermediate_size:
      gate_Tx1 = layers.dense(cfg, "shared_expert_gate", (1,), ("embed",), (None,), False)(x_TxD)
      shared_TxD = SharedExpert(cfg, name="shared_expert")(x_TxD)
      out_TxD = out_TxD + (jax.nn.sigmoid(gate_Tx1.astype(jnp.float32)) * shared_TxD).astype(dtype)
    return out_TxD.reshape(batch, length, hidden), experts_Txk.reshape(batch, length, -1)


class SharedExpert(nn.Module):
  """Qwen3.5-MoE's shared expert: down(silu(x gate) * up), a dense SwiGLU MLP on every token."""

  config: Any

  @nn.compact
  def __call__(self, x_TxD):
    cfg, features = self.config, self.config.shared_expert_intermediate_size
    dense = lambda name, size, ins, outs: layers.dense(cfg, name, (size,), ins, outs, False)
    gate_TxF = dense("gate_proj", features, ("embed",), ("mlp",))(x_TxD)
    up_TxF = dense("up_proj", features, ("embed",), ("mlp",))(x_TxD)
    return dense("down_proj", cfg.hidden_size, ("mlp",), ("embed",))(jax.nn.silu(gate_TxF) * up_TxF)


class Weight(nn.Module):
  """One parameter `kernel` of `shape`, normal(INIT_STD)-initialised, with logical `axes`."""

  shape: tuple[int, ...]
  axes: tuple[str | None, ...]
  param_dtype: str

  @nn.compact
  def __call__(self):
    init = logical_init(nn.initializers.normal(INIT_STD), self.axes)
    return self.param("kernel", init, self.shape, DTYPES[self.param_dtype])


class ExpertWeights(nn.Module):
  """Every expert's projections, {name: [E, ...]}, as `experts/{gate,up,down}_proj/kernel`: the paths HF's
  `experts.{e}.{gate,up,down}_proj.weight` map to."""

  config: Any

  @nn.compact
  def __call__(self):
    cfg = self.config
    sizes = {"expert_embed": cfg.hidden_size, "expert_mlp": cfg.moe_intermediate_size}
    return {
      name: Weight(
        (cfg.num_experts,) + tuple(sizes[a] for a in axes), ("experts",) + axes, cfg.param_dtype, name=name
      )()
      for name, axes in EXPERT_AXES.items()
    }
