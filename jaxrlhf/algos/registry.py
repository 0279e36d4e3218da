"""Name -> function registries for advantage estimators and policy losses (docs/algorithms.md §1).

Keys are verl's config strings (`algorithm.adv_estimator`, `actor.policy_loss.loss_mode`), so a
verl recipe selects the same function by the same name; users add their own with the decorator.
"""

from typing import Callable, Dict


class Registry:
  """A named dict of functions with a registering decorator and a lookup that lists choices."""

  def __init__(self, kind: str):
    self.kind = kind
    self.functions: Dict[str, Callable] = {}

  def register(self, name: str) -> Callable[[Callable], Callable]:
    def decorator(fn: Callable) -> Callable:
      existing = self.functions.get(name)
      if existing is not None and existing is not fn:
        raise ValueError(f"{self.kind} {name!r} is already registered to {existing.__qualname__}")
      self.functions[name] = fn
      return fn

    return decorator

  def get(self, name: str) -> Callable:
    if name not in self.functions:
      raise ValueError(f"Unknown {self.kind} {name!r}; registered: {sorted(self.functions)}")
    return self.functions[name]

  def names(self):
    return sorted(self.functions)
