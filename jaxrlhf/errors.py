"""The one exception type for bad input (config, data, models, checkpoints, reward functions).

`UserError` is what every check of user input raises (config keys, data files and columns, model and
checkpoint directories, reward functions): the message names the key, file or column and what was
expected, and `hint` (optional) says what to try. The CLIs (`jaxrlhf.cli`) print it in one or two
lines and exit 2; anything else is a bug and keeps its traceback.

This module imports nothing (not even JAX): `jaxrlhf.aot` sets up its environment before JAX starts.
"""

from __future__ import annotations

import importlib.util
import sys


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


def missing_extra(module: str, extra: str, what: str) -> UserError | None:
  """The one-line error for `what` needing `module`, which is not importable here, naming the extra
  of pyproject.toml that installs it; None when it is installed. Looks the module up without importing it."""
  try:
    installed = sys.modules.get(module, ...) is not None and importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):  # a parent package missing, or a module set to None (not importable)
    installed = False
  if installed:
    return None
  return UserError(f"{what} needs the {module} package, which is not installed: pip install -e '.[{extra}]'")
