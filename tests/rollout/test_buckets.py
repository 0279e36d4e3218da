"""Prompt-length and batch buckets: smallest fitting bucket, a warning beyond the largest, batch padding rows."""

import functools
import logging

import jax
import numpy as np
import pytest

from jaxrlhf.models import Decoder, init_params
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.rollout import SamplingParams, generate, pad_prompts, pick_bucket, repeat_interleave
from jaxrlhf.rollout.buckets import response_lengths_and_clip


def test_pick_bucket_takes_the_smallest_fitting_bucket_without_warning(caplog):
  with caplog.at_level(logging.WARNING):
    assert pick_bucket(1, (8, 32, 16)) == 8
    assert pick_bucket(9, (8, 32, 16)) == 16
    assert pick_bucket(32, (8, 32, 16)) == 32
  assert not caplog.records


def test_a_prompt_beyond_every_bucket_warns_and_gets_a_power_of_two(caplog):
  with caplog.at_level(logging.WARNING, logger="jaxrlhf.rollout.buckets"):
    assert pick_bucket(33, (8, 16, 32)) == 64
  assert len(caplog.records) == 1
  message = caplog.records[0].getMessage()
  assert "33" in message and "[8, 16, 32]" in message and "extra program" in message


def test_pad_prompts_left_pads_to_length_and_batch_buckets():
  batch = pad_prompts([[5, 6, 7], [9]], pad_token_id=0, length_buckets=(2, 4, 8), batch_buckets=(1, 4))
  np.testing.assert_array_equal(batch.prompt_ids_BxP, [[0, 5, 6, 7], [0, 0, 0, 9], [0, 0, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(batch.prompt_mask_BxP, [[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(batch.active_B, [True, True, False, False])
  assert pad_prompts([[1]] * 3, 0, (4,), batch_buckets=None).prompt_ids_BxP.shape == (3, 4)
  with pytest.raises(ValueError, match="empty prompt"):
    pad_prompts([[1], []], 0)


def test_repeat_interleave_and_clip_ratio():
  assert repeat_interleave(["a", "b"], 3) == ["a", "a", "a", "b", "b", "b"]
  with pytest.raises(ValueError, match="n"):
    repeat_interleave(["a"], 0)
  lengths, clip = response_lengths_and_clip(np.array([[1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]]))
  np.testing.assert_array_equal(lengths, [3, 1, 3, 2])
  assert clip == 0.5


def test_batch_padding_rows_stay_empty_and_do_not_hold_the_loop(tiny_model_config):
  model = Decoder(tiny_model_config)
  params, _ = init_params(model, jax.random.key(0))
  apply_fn = decode_model(model)
  # Every id is EOS: real rows stop after one token; padding rows must not keep the loop running.
  sampling = SamplingParams(max_new_tokens=6, eos_token_ids=tuple(range(64)), pad_token_id=0, do_sample=False)
  batch = pad_prompts([[5, 6, 7], [9]], 0, (4,), (4,))
  out = jax.jit(functools.partial(generate, apply_fn, sampling=sampling))(
    params,
    prompt_ids_BxP=batch.prompt_ids_BxP,
    prompt_mask_BxP=batch.prompt_mask_BxP,
    rng=jax.random.key(0),
    active_B=batch.active_B,
  )
  np.testing.assert_array_equal(out["response_lengths"], [1, 1, 0, 0])
  assert int(out["num_steps"]) == 1 and (np.asarray(out["responses"])[2:] == 0).all()
