"""The one exception type for bad input (config, data, models, checkpoints, reward functions).

`UserError` is what every check of user input raises (config keys, data files and columns, model and
checkpoint directories, reward functions): the message names the key, file or column and what was
expected, and `hint` (optional) says what to try. The CLIs (`jaxrlhf.cli`) print it in one or two
lines and exit 2; anything else is a bug and keeps its traceback.

This module imports nothing (not even JAX): `jaxrlhf.aot` sets up its environment before JAX starts.
"""

from __future__ import annotations


class UserError(Exception):
  """Bad input: the message names what (key, file, column), where, and what was expected.

  `hint`: one short line saying what to try (e.g. `reward_model.on_error=zero`), or None.
  """

  def __init__(self, message: str, *, hint: str | None = None):
    super().__init__(message)
    self.hint = hint


class CheckpointError(UserError, ValueError):
  """A checkpoint (a jaxrlhf `global_step_N` or a Hugging Face directory) that cannot be read as asked;
  the message names the path, file or tensor."""
