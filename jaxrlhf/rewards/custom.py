"""Loading a user's reward function from a .py file (verl's ``custom_reward_function.path`` / ``.name``).

The function is called like verl's: ``fn(data_source, solution_str, ground_truth, extra_info)``.
A function loaded here remembers where it came from (`source_of`), so that reward worker processes
load it themselves from the same file instead of receiving it pickled.
"""

import dataclasses
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import weakref
from typing import Any, Callable, Optional

from jaxrlhf.rewards.registry import default_compute_score


@dataclasses.dataclass(frozen=True)
class RewardSource:
  """Where a reward function comes from: a file's `path` and function `name` (custom_reward_function),
  or, with `path` "", the registry (by data_source); `reward_kwargs` bound to it, as sorted items."""

  path: str = ""
  name: str = "compute_score"
  reward_kwargs: tuple = ()

  def load(self) -> Callable[..., Any]:
    return get_compute_score_fn(self.path, self.name, dict(self.reward_kwargs))

  def describe(self) -> str:
    return f"{self.name!r} from {self.path!r}" if self.path else "the registry's, by data_source"


_SOURCES: "weakref.WeakKeyDictionary[Callable, RewardSource]" = weakref.WeakKeyDictionary()


def source_of(fn: Optional[Callable[..., Any]]) -> Optional[RewardSource]:
  """How another process can load `fn`: None (the registry), or a function this module returned; else None."""
  if fn is None or fn is default_compute_score:
    return RewardSource()
  try:
    return _SOURCES.get(fn)
  except TypeError:  # not weak-referenceable: not one of ours
    return None


def load_custom_reward_function(
  path: str, name: str = "compute_score", reward_kwargs: Optional[dict[str, Any]] = None
) -> Callable[..., Any]:
  """Imports the file at ``path`` and returns its callable ``name``.

  ``reward_kwargs`` (verl's ``custom_reward_function.reward_kwargs``) are bound as keyword
  arguments. Every failure names the file: missing file, an import-time error inside it, or a
  ``name`` that it does not define or that is not callable.
  """
  if not path:
    raise ValueError("custom_reward_function.path is empty")
  resolved = os.path.abspath(os.path.expanduser(str(path)))
  if not os.path.isfile(resolved):
    raise FileNotFoundError(f"custom_reward_function.path: reward file {resolved!r} does not exist")

  # A stable module name per file keeps pickling/dataclasses in the user's file working, and two
  # custom files never collide.
  module_name = "jaxrlhf_custom_reward_" + hashlib.sha1(resolved.encode()).hexdigest()[:12]
  loader = importlib.machinery.SourceFileLoader(module_name, resolved)  # any suffix, not just .py
  spec = importlib.util.spec_from_loader(module_name, loader)
  module = importlib.util.module_from_spec(spec)
  sys.modules[module_name] = module
  try:
    loader.exec_module(module)
  except Exception as error:
    sys.modules.pop(module_name, None)
    raise ImportError(
      f"custom_reward_function.path: importing reward file {resolved!r} failed: {type(error).__name__}: {error}"
    ) from error

  if not hasattr(module, name):
    defined = sorted(
      attr
      for attr, value in vars(module).items()
      if callable(value) and not attr.startswith("_") and getattr(value, "__module__", None) == module_name
    )
    raise AttributeError(
      f"custom_reward_function.name: reward file {resolved!r} defines no {name!r}; functions it defines: {defined}"
    )
  fn = getattr(module, name)
  if not callable(fn):
    raise TypeError(
      f"custom_reward_function.name: {name!r} in reward file {resolved!r} is a {type(fn).__name__}, not a function"
    )
  if reward_kwargs:
    fn = functools.partial(fn, **dict(reward_kwargs))
  _SOURCES[fn] = RewardSource(resolved, name, tuple(sorted(dict(reward_kwargs or {}).items())))
  return fn


def get_compute_score_fn(
  path: Optional[str] = None, name: str = "compute_score", reward_kwargs: Optional[dict[str, Any]] = None
) -> Callable[..., Any]:
  """The reward function a run uses: the custom one when ``path`` is set, else the registry's."""
  if path:
    return load_custom_reward_function(path, name, reward_kwargs)
  if not reward_kwargs:
    return default_compute_score
  fn = functools.partial(default_compute_score, **reward_kwargs)
  _SOURCES[fn] = RewardSource(reward_kwargs=tuple(sorted(reward_kwargs.items())))
  return fn
