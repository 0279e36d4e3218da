"""Generation in `max_num_seqs` slots refilled in-graph (`rollout/slots.py`): a row samples the same tokens with the
same log-probs whichever number of slots, slot or loop step it ran in, and as the static sampler with the same
per-row keys. Tokens are compared exactly; log-probs to 1e-6: XLA:CPU's matmuls round a row differently for a
different number of rows (the static sampler on 3 rows vs 12 differs by 4.8e-7 too)."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.config import resolve_config
from jaxrlhf.models import Decoder, init_params, positions_from_mask
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.parallel.mesh import mesh_from_config
from jaxrlhf.parallel.step_layouts import build_step_layouts
from jaxrlhf.rollout import SamplingParams, generate, generate_in_slots, row_keys, token_log_probs
from jaxrlhf.trainer.generation import Generation
from jaxrlhf.trainer.state import RoleState
from tests.helpers import small_config, tiny_fp32_model

MODEL = tiny_fp32_model()
ROWS, PROMPT, RESPONSE = 12, 6, 10
# Six EOS ids of 64: responses end anywhere from the first token to the limit.
EOS = (3, 5, 7, 9, 11, 13)


@functools.cache
def _setup():
  model = Decoder(MODEL)
  params, _ = init_params(model, jax.random.key(0))
  apply_fn = decode_model(model)
  mask = jnp.ones((ROWS, PROMPT), jnp.int32).at[1, :2].set(0).at[3, :5].set(0).at[7, :3].set(0)
  prompts = jnp.where(mask > 0, jax.random.randint(jax.random.key(1), (ROWS, PROMPT), 4, 64), 0)
  return model, params, apply_fn, prompts, mask


def _sampling(do_sample: bool, eos=EOS):
  return SamplingParams(
    max_new_tokens=RESPONSE, eos_token_ids=eos, pad_token_id=0, temperature=0.9, do_sample=do_sample, decode_segments=1
  )


@functools.cache
def _slots(do_sample: bool, slots: int, shards: int = 1, repeat: int = 1, eos=EOS):
  model, params, apply_fn, prompts, mask = _setup()
  run = functools.partial(generate_in_slots, apply_fn, sampling=_sampling(do_sample, eos), slots=slots, shards=shards)
  prompts, mask = (jnp.repeat(x, repeat, axis=0) for x in (prompts, mask))
  return jax.device_get(jax.jit(run)(params, prompt_ids_NxP=prompts, prompt_mask_NxP=mask, rng=jax.random.key(7)))


def _assert_same(got, want, atol=1e-6):
  for name in ("responses", "response_mask", "response_lengths"):
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  np.testing.assert_allclose(got["rollout_log_probs"], want["rollout_log_probs"], atol=atol, rtol=0)


@pytest.mark.parametrize("do_sample", [False, True])
def test_the_static_sampler_with_per_row_keys_is_every_row_in_its_own_slot(do_sample):
  model, params, apply_fn, prompts, mask = _setup()
  run = functools.partial(generate, apply_fn, sampling=_sampling(do_sample))
  want = jax.device_get(
    jax.jit(run)(params, prompt_ids_BxP=prompts, prompt_mask_BxP=mask, rng=row_keys(jax.random.key(7), ROWS))
  )
  got = _slots(do_sample, ROWS)
  # The same tokens; log-probs to the last bit on some CPUs only: one column for the batch and one per row are two
  # programs (a slice update against a scatter), whose fusions may order a reduction differently.
  _assert_same(got, want, atol=1e-6)
  assert int(got["num_steps"]) == RESPONSE
  lengths = want["response_lengths"]
  # The batch these tests read: EOS spread over it.
  assert len(set(lengths.tolist())) >= 5 and lengths.min() <= 2 and lengths.max() == RESPONSE


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize(
  "slots,shards",
  [(5, 1), (1, 1), (2, 2), (4, 3)],  # 5 and 4 do not divide their shard's rows (12, 4)
)
def test_rows_sample_the_same_whichever_slots_they_run_in(do_sample, slots, shards):
  got, want = _slots(do_sample, slots, shards), _slots(do_sample, ROWS)
  _assert_same(got, want)
  # Fewer slots than rows: the loop runs past the longest response (slots were refilled), and no longer than
  # every row one after the other.
  per_shard = ROWS // shards
  if slots < per_shard:
    assert RESPONSE < int(got["num_steps"]) <= (per_shard // slots + 1) * RESPONSE


@pytest.mark.parametrize("shards", [1, 2])
def test_a_chunk_prefilled_in_groups_is_the_chunk_prefilled_at_once(monkeypatch, shards):
  """`PREFILL_TOKENS` bounds one prefill call's prompt tokens per shard: a chunk of 4 rows per shard (slots 4, the
  window 8) then prefills 2 or 1 rows of every shard at a time, in a loop, and the rows sample what they did."""
  from jaxrlhf.rollout import slots as slots_module

  model, params, apply_fn, prompts, mask = _setup()
  want = _slots(True, 4, shards)
  monkeypatch.setattr(slots_module, "PREFILL_TOKENS", 2 * PROMPT if shards == 1 else PROMPT)
  run = functools.partial(generate_in_slots, apply_fn, sampling=_sampling(True), slots=4, shards=shards)
  got = jax.device_get(jax.jit(run)(params, prompt_ids_NxP=prompts, prompt_mask_NxP=mask, rng=jax.random.key(7)))
  _assert_same(got, want)


def test_a_row_longer_than_all_others_holds_its_slot_while_the_others_cycle():
  # Greedy tokens do not depend on the EOS ids (only where a row stops): EOS = the other rows' first tokens that row
  # `long` never emits, so row `long` runs to the limit while every other row ends within a few tokens.
  free = _slots(False, ROWS, eos=(999,))["responses"]
  for long in range(ROWS):
    eos = tuple(sorted({int(free[row, 0]) for row in range(ROWS) if row != long} - set(free[long].tolist())))
    lengths = _slots(False, ROWS, eos=eos)["response_lengths"]
    if lengths[long] == RESPONSE and (np.delete(lengths, long) < RESPONSE // 2).all():
      break
  else:
    pytest.fail("no row of the test batch outlives the others")
  got = _slots(False, 2, eos=eos)
  _assert_same(got, _slots(False, ROWS, eos=eos))
  assert int(got["num_steps"]) >= RESPONSE


def test_samples_of_one_prompt_differ_and_keep_their_rows():
  """n > 1: the batch repeats each prompt (interleaved); per-row keys make the copies differ."""
  got, want = _slots(True, 4, repeat=3), _slots(True, ROWS * 3, repeat=3)
  _assert_same(got, want)
  groups = got["responses"].reshape(ROWS, 3, RESPONSE)
  assert any(len({tuple(r) for r in group}) > 1 for group in groups)


def test_log_probs_equal_the_training_forward():
  model, params, _, prompts, mask = _setup()
  out = _slots(True, 3)
  responses = jnp.asarray(out["responses"])
  ids = jnp.concatenate([prompts, responses], axis=1)
  full_mask = jnp.concatenate([mask, jnp.ones_like(responses)], axis=1)
  logits = model.apply({"params": params}, ids, positions_from_mask(full_mask), full_mask)[0][:, PROMPT - 1 : -1]
  recomputed = np.asarray(token_log_probs(logits, responses, 0.9))
  valid = out["response_mask"] > 0
  np.testing.assert_allclose(recomputed[valid], out["rollout_log_probs"][valid], atol=1e-5)
  assert (out["responses"][~valid] == 0).all() and (out["rollout_log_probs"][~valid] == 0).all()


@functools.cache
def _mesh_rollout(slots):
  """Sampled fp32 generation through the trainer's path on a (1, 4, 2) mesh (4 generation shards of 8 rows,
  heads over tensor): (outputs, compiled HLO text)."""
  overrides = {"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2, "actor_rollout_ref.rollout.max_num_seqs": slots}
  config = resolve_config(small_config("/tmp/unused", **overrides))
  model = dataclasses.replace(MODEL, num_attention_heads=8, num_key_value_heads=4)
  layouts = build_step_layouts(config, mesh_from_config(config), model, model, None)
  assert layouts.generation_shards(32).count == 4
  sampling = _sampling(True)
  generation = Generation(config, model, sampling, layouts)
  params = jax.device_put(init_params(Decoder(model), jax.random.key(0))[0], layouts.actor_train)
  prompts = jax.random.randint(jax.random.key(1), (32, PROMPT), 4, 64)
  mask = jnp.ones((32, PROMPT), jnp.int32).at[1, :2].set(0).at[9, :4].set(0).at[30, :5].set(0)
  weights = lambda p: RoleState(params=p, opt_state=None)
  run = jax.jit(
    lambda p, x, m: generation.sample(generation.generation_params(weights(p)), x, m, jax.random.key(0), sampling)
  )
  compiled = run.lower(params, prompts, mask).compile()
  return jax.device_get(compiled(params, prompts, mask)), compiled.as_text()


def test_slots_on_a_mesh_hold_their_rows_per_device(capfd):
  want, _ = _mesh_rollout(8)  # every row of a shard in its own slot
  got, hlo = _mesh_rollout(2)
  _assert_same(got, want)
  assert int(got["num_steps"]) > int(want["num_steps"])
  # Per device: the slot cache [layers, 2 slots, 4 kv heads / 2, P + R - 1, head dim] and the prompt cache of its
  # 8 rows; the whole batch's cache (8 rows x the full length) is not there.
  shapes = set(re.findall(r"f32\[2,\d+,2,\d+,4\]", hlo))
  assert f"f32[2,2,2,{PROMPT + RESPONSE - 1},4]" in shapes, shapes
  assert f"f32[2,8,2,{PROMPT + RESPONSE - 1},4]" not in shapes, shapes
  assert "Involuntary full rematerialization" not in capfd.readouterr().err
