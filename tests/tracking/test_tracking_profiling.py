"""`maybe_profile` traces exactly the listed steps of a jitted computation."""

import glob

import jax
import jax.numpy as jnp
import pytest

from jaxrlhf.tracking import maybe_profile


def test_trace_covers_the_listed_steps(tmp_path):
  square = jax.jit(lambda x_NxN: x_NxN @ x_NxN)
  x_NxN = jnp.ones((8, 8))
  for step in range(1, 5):
    with maybe_profile(step, [2, 3], str(tmp_path)):
      if step == 4:  # after the last listed step the trace is closed and written
        assert glob.glob(str(tmp_path / "profile" / "plugins" / "profile" / "*" / "*.xplane.pb"))
      square(x_NxN).block_until_ready()
  assert len(glob.glob(str(tmp_path / "profile" / "plugins" / "profile" / "*"))) == 1


def test_off_without_profile_steps(tmp_path):
  with maybe_profile(1, (), str(tmp_path)):
    pass
  assert not (tmp_path / "profile").exists()


def test_a_failing_step_still_closes_the_trace(tmp_path):
  with pytest.raises(RuntimeError, match="boom"):
    with maybe_profile(1, [1, 2], str(tmp_path)):
      raise RuntimeError("boom")
  assert glob.glob(str(tmp_path / "profile" / "plugins" / "profile" / "*" / "*.xplane.pb"))
  with maybe_profile(1, [1], str(tmp_path / "again")):  # a new trace can start afterwards
    pass
