import jax
import numpy as np
import pytest

from jaxrlhf.models import DecoderConfig
from jaxrlhf.trainer.flops import (
  actor_step_flops,
  device_peak_flops,
  forward_flops_per_token,
  layer_matmul_flops_per_token,
  update_flops,
)


def test_actor_step_flops_formula():
  config = DecoderConfig(
    vocab_size=100,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
  )
  num_params = 5000
  per_token = forward_flops_per_token(num_params, 1600, 2, 16, context=5.0)
  assert per_token == 2 * 3400 + 4 * 2 * 16 * 5.0
  # 4 sequences of 6 prompt + 4 response tokens: 40 tokens, context 10 / 2 = 5.
  flops = actor_step_flops(
    config, num_params, prompt_tokens=24, response_tokens=16, num_sequences=4, ppo_epochs=2, use_reference=True
  )
  assert flops == pytest.approx(per_token * 40 * (3 + 6))


def test_update_flops_count_real_tokens_and_the_lm_head_at_responses_only():
  config = DecoderConfig(
    vocab_size=100,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
  )
  # 4 sequences of 6 prompt + 4 response tokens: 40 tokens, mean context 5; 2 epochs of 3 forwards.
  body = 40 * 2 * (layer_matmul_flops_per_token(config) + 4 * 2 * 8 * 5.0)
  lm = update_flops(config, prompt_tokens=24, response_tokens=16, num_sequences=4, epochs=2, head="lm")
  value = update_flops(config, prompt_tokens=24, response_tokens=16, num_sequences=4, epochs=2, head="value")
  assert lm == pytest.approx(6 * (body + 16 * 2 * 16 * 100))
  assert value == pytest.approx(6 * (body + 16 * 2 * 16))


def test_peak_flops_from_config_table_or_measurement():
  assert device_peak_flops(jax.devices()[0], 123.0) == 123.0

  class H200:
    device_kind = "NVIDIA H200"

  assert device_peak_flops(H200()) == 989e12
  measured = device_peak_flops(jax.devices()[0])
  assert 1e6 < measured < 1e14 and np.isfinite(measured)
