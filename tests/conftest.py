"""Test set-up: 8 simulated CPU devices (set before JAX starts) and small shared fixtures."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")

import jax  # noqa: E402  (after XLA_FLAGS on purpose)
import pytest  # noqa: E402

from jaxrlhf.models import DecoderConfig  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_config() -> DecoderConfig:
  return DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6)


def pytest_configure(config):
  assert jax.device_count() == 8, "tests expect 8 simulated CPU devices (XLA_FLAGS set too late?)"
