"""Rule rewards selected by a row's ``data_source`` (docs/algorithms.md §8), as verl's ``default_compute_score``.

Every registered function has the custom-reward signature
``fn(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``, so a user's
``compute_score`` can be registered as is::

    from jaxrlhf.rewards import register_reward

    @register_reward("my_org/my_task")
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str.strip() == ground_truth)

A dict result carries the reward under ``"score"``; its other numeric entries are logged as extras.

A name ending in ``*`` registers a prefix (verl's ``aime*``): it scores every data_source that starts with the rest,
when no exact name does.

The built-in rules follow verl 0.9.1's ``default_compute_score``, by verl's names: GSM8K, Hendrycks MATH, DAPO's
math (``math``, ``math_dapo``, ``math_dapo_reasoning``, ``aime*``), PRIME's math (``numina_*``), Geometry3K's text
reward (``hiyouga/geometry3k``), Search-R1's exact match (``searchR1_*``) and the code sources (``codecontests``,
``apps``, ``codeforces``, ``taco``: each program runs in a sandboxed process of its own);
tests/rewards/test_verl_scorer_oracle.py holds them to verl's results. ``numina_*`` and ``hiyouga/geometry3k`` grade
with sympy and pylatexenc, the ``math`` extra: without it, scoring them raises `ScorerUnavailableError`, naming it.
"""

from typing import Any, Callable, Optional, Union

from jaxrlhf.errors import UserError, missing_extra
from jaxrlhf.rewards import code, exact_match, geometry3k, gsm8k, math_dapo, prime_math, prm800k, search_r1
from jaxrlhf.rewards import math as math_reward

RewardResult = Union[float, dict]
RewardFn = Callable[..., RewardResult]

_REGISTRY: dict[str, RewardFn] = {}


class UnknownDataSourceError(UserError, ValueError):
  """No reward function is registered for a data_source: a data/config error, never a sample's."""


class ScorerUnavailableError(UnknownDataSourceError):
  """A built-in scorer whose packages are not installed: a setup error, which (like an unknown data_source)
  stops the run rather than failing one sample after another."""


def require_extra(data_source: str, modules: tuple[str, ...], extra: str) -> None:
  """Raises `ScorerUnavailableError` naming `extra` when one of `modules` is not installed."""
  for module in modules:
    error = missing_extra(module, extra, f"the reward of data_source {data_source!r}")
    if error is not None:
      raise ScorerUnavailableError(str(error))


def register_reward(*data_sources: str, overwrite: bool = False) -> Callable[[RewardFn], RewardFn]:
  """Decorator registering ``fn`` as the reward for each of ``data_sources``.

  Re-registering a taken data_source with a different function raises unless ``overwrite=True``,
  so two tasks cannot silently fight over one name.
  """
  if not data_sources:
    raise ValueError("register_reward needs at least one data_source name")
  for name in data_sources:
    if not isinstance(name, str) or not name:
      raise ValueError(f"data_source names must be non-empty strings, got {name!r}")

  def decorator(fn: RewardFn) -> RewardFn:
    if not callable(fn):
      raise TypeError(f"register_reward{data_sources} was applied to non-callable {fn!r}")
    for name in data_sources:
      existing = _REGISTRY.get(name)
      if existing is not None and existing is not fn and not overwrite:
        raise ValueError(
          f"data_source {name!r} already has reward function {_qualname(existing)}; "
          f"pass overwrite=True to replace it with {_qualname(fn)}"
        )
    for name in data_sources:
      _REGISTRY[name] = fn
    return fn

  return decorator


def unregister_reward(*data_sources: str) -> None:
  """Removes registrations (missing names are ignored); mainly for tests and notebooks."""
  for name in data_sources:
    _REGISTRY.pop(name, None)


def registered_data_sources() -> list[str]:
  return sorted(_REGISTRY)


def registered_functions() -> dict[str, RewardFn]:
  """{data_source: its function}, a copy."""
  return dict(_REGISTRY)


def registered_name(data_source: str, names) -> Optional[str]:
  """The name among `names` that scores `data_source`: itself, else the longest prefix pattern (``aime*``)."""
  if not isinstance(data_source, str):
    return None
  if data_source in names:
    return data_source
  prefixes = [name for name in names if name.endswith("*") and data_source.startswith(name[:-1])]
  return max(prefixes, key=len, default=None)


def get_reward_fn(data_source: str) -> RewardFn:
  name = registered_name(data_source, _REGISTRY)
  fn = _REGISTRY[name] if name is not None else None
  if fn is None:
    what = "an empty data_source" if not data_source else f"data_source {data_source!r}"
    raise UnknownDataSourceError(
      f"no reward function is registered for {what}; registered data_sources: "
      f"{registered_data_sources()}. Register one with @jaxrlhf.rewards.register_reward(...) "
      "or set custom_reward_function.path"
    )
  return fn


def default_compute_score(
  data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None
) -> RewardResult:
  """Scores one response with the function registered for ``data_source``.

  Returns a float, or the function's dict (which must hold a ``"score"``) unchanged.
  """
  result = get_reward_fn(data_source)(data_source, solution_str, ground_truth, extra_info)
  return normalize_result(result, data_source)


def normalize_result(result: Any, data_source: str) -> RewardResult:
  """A reward function's return as a float or a dict with a ``"score"``; anything else raises."""
  if isinstance(result, dict):
    if "score" not in result:
      raise ValueError(
        f"reward function for data_source {data_source!r} returned a dict without a 'score' key "
        f"(keys: {sorted(result)})"
      )
    return result
  if isinstance(result, str):
    raise TypeError(f"reward function for data_source {data_source!r} returned a string {result!r}, not a number")
  try:
    return float(result)
  except (TypeError, ValueError):
    raise TypeError(
      f"reward function for data_source {data_source!r} returned {type(result).__name__} {result!r}, "
      "expected a number or a dict with a 'score' key"
    ) from None


def _qualname(fn: Any) -> str:
  return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


# Built-in rules. verl's data_source names, plus short aliases.


@register_reward("openai/gsm8k", "gsm8k")
def _gsm8k(data_source, solution_str, ground_truth, extra_info=None):
  return gsm8k.compute_score(solution_str, ground_truth)


@register_reward("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
def _math(data_source, solution_str, ground_truth, extra_info=None):
  return math_reward.compute_score(solution_str, ground_truth)


# verl scores "math" with DAPO's rule, not Hendrycks MATH's (verl's default_compute_score).
@register_reward("math_dapo", "math", "math_dapo_reasoning", "aime*")
def _math_dapo(data_source, solution_str, ground_truth, extra_info=None):
  return math_dapo.compute_score(solution_str, ground_truth)


NUMINA_SOURCES = tuple(
  f"numina_{name}" for name in ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc", "cn_k12", "olympiads")
)


@register_reward(*NUMINA_SOURCES)
def _prime_math(data_source, solution_str, ground_truth, extra_info=None):
  require_extra(data_source, prm800k.MODULES, prm800k.EXTRA)
  return prime_math.compute_score(solution_str, ground_truth)


@register_reward("hiyouga/geometry3k")
def _geometry3k(data_source, solution_str, ground_truth, extra_info=None):
  require_extra(data_source, prm800k.MODULES, prm800k.EXTRA)
  return geometry3k.compute_score(solution_str, ground_truth)


SEARCH_R1_SOURCES = tuple(
  f"searchR1_{name}" for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
)


CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")


@register_reward(*CODE_SOURCES)
def _code(data_source, solution_str, ground_truth, extra_info=None):
  return code.compute_score(solution_str, ground_truth)


@register_reward(*SEARCH_R1_SOURCES)
def _search_r1(data_source, solution_str, ground_truth, extra_info=None):
  return search_r1.compute_score(solution_str, ground_truth)


@register_reward("exact_match")
def _exact_match(data_source, solution_str, ground_truth, extra_info=None):
  return exact_match.compute_score(solution_str, ground_truth)


# The built-in `recall` task (jaxrlhf.data.builtin) asks for one number: the last number in the response.
RECALL_DATA_SOURCE = "jaxrlhf/recall"


@register_reward(RECALL_DATA_SOURCE)
def _recall(data_source, solution_str, ground_truth, extra_info=None):
  return gsm8k.compute_score(solution_str, ground_truth, method="flexible")
