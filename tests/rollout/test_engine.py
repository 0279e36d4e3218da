"""JetStream-style engine: ResultTokens layout, continuous batching equal to running each request alone,
the same samples as `jaxrlhf.generate` for the same seed."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf import generate as generate_cli
from jaxrlhf.models import Decoder, init_params, positions_from_mask
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.rollout import Engine, ResultTokens, SamplingParams, generate, token_log_probs

EOS = 3


@pytest.fixture(scope="module")
def setup(tiny_model_config):
  model = Decoder(tiny_model_config)
  params, _ = init_params(model, jax.random.key(0))
  rng = np.random.RandomState(0)
  prompts = [list(rng.randint(4, 64, rng.randint(1, 16))) for _ in range(7)]
  return model, params, prompts


GREEDY = SamplingParams(max_new_tokens=12, eos_token_ids=(EOS,), pad_token_id=0, do_sample=False)


@pytest.fixture(scope="module")
def greedy_engine(setup):
  # 3 slots and a cache short enough that the shared write column wraps (compaction) several times
  # while requests of lengths 1..15 come and go.
  engine = Engine(setup[0].config, GREEDY, max_concurrent_decodes=3, prefill_buckets=(4, 8, 16))
  assert engine.cache_length - (16 + 12) == 8
  return engine


@functools.lru_cache(maxsize=None)
def _batch_sampler(model, sampling):
  apply_fn = decode_model(model)
  return jax.jit(functools.partial(generate, apply_fn, sampling=sampling))


def _alone(model, params, prompt, sampling):
  """The batch sampler on a batch of this one request (left-padded to 16): the reference."""
  ids = np.zeros((1, 16), np.int32)
  ids[0, 16 - len(prompt) :] = prompt
  out = _batch_sampler(model, sampling)(
    params, prompt_ids_BxP=ids, prompt_mask_BxP=(np.arange(16) >= 16 - len(prompt))[None], rng=jax.random.key(0)
  )
  length = int(out["response_lengths"][0])
  return [int(t) for t in out["responses"][0, :length]], np.asarray(out["rollout_log_probs"][0, :length])


def test_continuous_batching_returns_the_tokens_of_each_request_run_alone(setup, greedy_engine):
  model, params, prompts = setup
  outputs = greedy_engine.serve(params, prompts)
  finished_early = 0
  for prompt, output in zip(prompts, outputs):
    tokens, log_probs = _alone(model, params, prompt, GREEDY)
    assert output["token_ids"] == tokens
    np.testing.assert_allclose(output["log_probs"], log_probs, atol=1e-5)
    finished_early += len(tokens) < 12
  assert finished_early >= 1  # some request hit EOS and freed its slot for the next one


def test_sampled_requests_do_not_depend_on_slot_or_neighbours_and_log_probs_match(setup):
  model, params, prompts = setup
  sampling = SamplingParams(max_new_tokens=8, eos_token_ids=(EOS,), pad_token_id=0, temperature=0.9, top_k=20)
  engine = Engine(model.config, sampling, max_concurrent_decodes=4, prefill_buckets=(16,))
  together = engine.serve(params, prompts)
  # Fewer neighbours, other slots and compaction times: the same per-request keys give the same samples.
  assert [o["token_ids"] for o in engine.serve(params, prompts[:3])] == [o["token_ids"] for o in together[:3]]
  assert [o["token_ids"] for o in engine.serve(params, prompts, seed=1)] != [o["token_ids"] for o in together]
  # Log-probs of the sampled tokens = the training forward over left-padded prompt + response.
  ids = np.zeros((len(prompts), 16 + 8), np.int32)
  mask = np.zeros_like(ids)
  for row, (prompt, output) in enumerate(zip(prompts, together)):
    ids[row, 16 - len(prompt) : 16 + len(output["token_ids"])] = prompt + output["token_ids"]
    mask[row, 16 - len(prompt) : 16 + len(output["token_ids"])] = 1
  logits = jax.jit(lambda p, i, m: model.apply({"params": p}, i, positions_from_mask(m), m)[0])(params, ids, mask)
  recomputed = np.asarray(token_log_probs(logits[:, 15:-1], jnp.asarray(ids[:, 16:]), 0.9))
  for row, output in enumerate(together):
    np.testing.assert_allclose(output["log_probs"], recomputed[row, : len(output["token_ids"])], atol=1e-5)


def test_generate_cli_and_serve_sample_the_same_tokens_and_log_probs(setup):
  """One decode step, one PRNG convention: `jaxrlhf.generate`'s sampling (batched, prompts left-padded
  to one bucket, batch padded) and `Engine.serve` (continuous batching over 3 slots, prefill buckets
  8/16, compaction) give every (prompt, sample) the same tokens and log-probs for the same seed."""
  model, params, prompts = setup
  sampling = SamplingParams(
    max_new_tokens=8, eos_token_ids=(EOS,), pad_token_id=0, temperature=0.8, top_k=20, top_p=0.9
  )
  rows, _ = generate_cli.sample_responses(params, model.config, prompts, sampling, n=3, seed=5, batch_size=8)
  engine = Engine(model.config, sampling, max_concurrent_decodes=3, prefill_buckets=(8, 16))
  served = engine.serve(params, prompts, seed=5, n=3)
  assert [(r["prompt_index"], r["sample"]) for r in rows] == [(i, s) for i in range(len(prompts)) for s in range(3)]
  assert [r["response_ids"] for r in rows] == [o["token_ids"] for o in served]
  for row, output in zip(rows, served):
    np.testing.assert_allclose(row["log_probs"], output["log_probs"], atol=1e-5)
  # Really sampled (a prompt's samples differ), and a sample's key ignores n: sample 0 of n=3 is n=1's.
  assert any(len({tuple(o["token_ids"]) for o in served[i * 3 : i * 3 + 3]}) > 1 for i in range(len(prompts)))
  assert [o["token_ids"] for o in engine.serve(params, prompts[:3], seed=5)] == [o["token_ids"] for o in served[0:9:3]]
  assert [o["token_ids"] for o in engine.serve(params, prompts[:3], seed=6)] != [o["token_ids"] for o in served[0:9:3]]


def test_prefill_insert_generate_follow_jetstream_shapes(setup, greedy_engine):
  model, params, prompts = setup
  engine = greedy_engine
  prompt = next(p for p in prompts if 4 < len(p) <= 8)
  padded = np.zeros(16, np.int32)  # JetStream pads on the right
  padded[: len(prompt)] = prompt
  prefix, first = engine.prefill(params=params, padded_tokens=padded, true_length=len(prompt))
  assert isinstance(first, ResultTokens) and first.data.shape == (1, 3) and first.log_probs.shape == (1, 1)
  state = engine.insert(prefix, engine.init_decode_state(), slot=1)
  first_slot = first.convert_to_numpy().get_result_at_slot(0)
  assert first_slot.valid[0, 0] == 1 and first_slot.lengths[0] == 1
  tokens, expected = [int(first_slot.tokens[0, 0])], _alone(model, params, prompt, GREEDY)[0]
  for step in range(len(expected) + 1):
    state, result = engine.generate(params, state)
    result = result.convert_to_numpy()
    assert result.data.shape == (3, 3) and result.log_probs.shape == (3, 1)
    empty, slot = result.get_result_at_slot(0), result.get_result_at_slot(1)
    assert empty.valid[0, 0] == 0
    assert slot.valid[0, 0] == (step + 1 < len(expected))
    if slot.valid[0, 0]:
      tokens.append(int(slot.tokens[0, 0]))
      assert slot.lengths[0] == step + 2
  assert tokens == expected
  with pytest.raises(ValueError, match="max_prefill_length"):
    engine.prefill(params=params, padded_tokens=np.ones(17, np.int32), true_length=17)
