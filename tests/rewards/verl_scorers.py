"""verl's own scorer modules (`verl.utils.reward_score.*`), for the oracle comparison, when verl is installed.

`pip install verl==0.9.1 --no-deps` (+ `pylatexenc`, `mathruler` for the scorers that import them) is enough:
when `import verl` itself fails for want of verl's heavy requirements (ray, tensordict), the scorer modules are
imported without running verl's package `__init__` (they import nothing of verl's but `verl.utils.import_utils`
and `verl.utils.py_functional`). Nothing here is copied from verl; nothing is installed at test time.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import types

PACKAGE = "verl.utils.reward_score"


@functools.cache  # once: after a bare `verl` module stands in sys.modules, find_spec cannot look again
def _verl_dir() -> str | None:
  spec = importlib.util.find_spec("verl")
  if spec is None or not spec.submodule_search_locations:
    return None
  return list(spec.submodule_search_locations)[0]


def _import_without_package_init(name: str):
  """`name` under verl/utils/ with `verl` and `verl.utils` as bare namespace packages (their __init__ not run)."""
  root = _verl_dir()
  for package, path in (("verl", root), ("verl.utils", os.path.join(root, "utils"))):
    if package not in sys.modules:
      module = types.ModuleType(package)
      module.__path__ = [path]
      sys.modules[package] = module
  return importlib.import_module(name)


def verl_module(name: str):
  """`verl.utils.reward_score.<name>`, or a string saying why it cannot be imported here."""
  if _verl_dir() is None:
    return "verl is not installed (pip install verl==0.9.1 --no-deps runs the oracle)"
  full = f"{PACKAGE}.{name}" if name else PACKAGE
  try:
    return importlib.import_module(full)
  except ImportError:
    pass
  try:
    return _import_without_package_init(full)
  except ImportError as error:
    return f"verl's {full} does not import here: {error}"


def verl_version() -> str | None:
  root = _verl_dir()
  try:
    with open(os.path.join(root, "version", "version")) as file:
      return file.read().strip()
  except (OSError, TypeError):
    return None
