"""The step's reward phase, and the bridge from token ids inside it to Python rule rewards on the host.

`score_rollout` is the phase: rule reward and/or reward model, DAPO overlong shaping, the score on
the last valid token. The rule reward is one `jax.pure_callback` per batch: decode every response
(batched), look each row's data_source, ground truth and extra_info up by its `sample_index` in the
host-side dataset, and score the whole batch with `jaxrlhf.rewards.score_batch`, in the trainer's
process or in reward worker processes (`reward_scorer`: `reward_model.num_workers`, `timeout_s`).

An exception in the callback reaches the host as a `JaxRuntimeError` whose text buries the reward
function's message in XLA's traceback; `host_callback_errors` (around the code that runs a step)
raises the callback's own exception instead.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import weakref
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf import algos, rewards
from jaxrlhf.data import PromptDataset
from jaxrlhf.errors import UserError
from jaxrlhf.models.decoder import Decoder, reward_model_scores
from jaxrlhf.rewards.batch import function_name
from jaxrlhf.trainer.dumps import RolloutDump, prompt_texts
from jaxrlhf.trainer.model_outputs import sequence_inputs
from jaxrlhf.trainer.records import Rollout, Scored

# Exceptions raised by reward callbacks (Ctrl-C too), newest last; callbacks run on XLA's threads, hence the lock.
_callback_errors: list[BaseException] = []
_callback_errors_lock = threading.Lock()


class _UserErrorsReachTheUser(logging.Filter):
  """JAX logs every callback exception with its traceback; a UserError is reported once, by the caller, and
  Ctrl-C during scoring is just Ctrl-C."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], (UserError, KeyboardInterrupt)))


logging.getLogger("jax._src.callback").addFilter(_UserErrorsReachTheUser())


@contextlib.contextmanager
def host_callback_errors():
  """Re-raises a reward callback's own exception in place of the `JaxRuntimeError` that carries it."""
  with _callback_errors_lock:
    _callback_errors.clear()
  try:
    yield
  except jax.errors.JaxRuntimeError as error:
    with _callback_errors_lock:
      original = _callback_errors[-1] if _callback_errors else None
      _callback_errors.clear()
    if original is None or str(original) not in str(error):
      raise  # not (only) the callback's failure: keep XLA's error whole
    raise original from error


def reported(fn: Callable) -> Callable:
  """`fn` for a host callback: an exception it raises (Ctrl-C too) is kept for `host_callback_errors`."""

  @functools.wraps(fn)
  def host_fn(*args):
    try:
      return fn(*args)
    except BaseException as error:
      with _callback_errors_lock:
        _callback_errors.append(error)
      raise

  return host_fn


def reward_scorer(reward_model_config, compute_score_fn: Callable | None) -> rewards.RewardScorer:
  """Where the rule reward runs (`reward_model.num_workers`, `reward_model.timeout_s`); its worker processes
  start at the first batch, and `close()` stops them."""
  return rewards.RewardScorer(
    compute_score_fn,
    num_workers=reward_model_config.num_workers,
    timeout_s=reward_model_config.timeout_s,
    batch=reward_model_config.reward_manager == "batch",
  )


PREFLIGHT_ROWS = 4  # of the first rows of the training files (one per data_source first), tried before compiling


def preflight(scorer: rewards.RewardScorer, rows: list[tuple[str, dict]], key: str, reward_fn_key: str) -> None:
  """Tries the reward function on a few data rows before anything compiles (nor the tokenizer loads), where the
  run will score (`scorer`'s worker processes, which stay up for the run): each row's ground truth as the response,
  and an empty response. A function that raises, exits, crashes, times out or returns something that is not a finite
  number (or a dict with one under "score") is refused in one line naming the row and what came back, in seconds
  rather than after the step has compiled. What it scores is not judged, only that it scores.

  `rows`: (where, row) of the data files of `key` (`validate.first_rows`), the data_source under `reward_fn_key`."""
  samples, tried = [], []
  for where, row in _preflight_rows(rows, reward_fn_key):
    truth = (row.get("reward_model") or {}).get("ground_truth")
    data_source, extra_info = row.get(reward_fn_key), row.get("extra_info") or {}
    for response, what in ((_as_text(truth), "its ground truth as the response"), ("", "an empty response")):
      samples.append((data_source, response, truth, extra_info))
      tried.append((where, data_source, what))
  results = scorer.score(samples, stop_at_error=True)
  for result, (where, data_source, what) in zip(results, tried):
    if result is not None and result.unknown_data_source:
      raise rewards.UnknownDataSourceError(f"{key}: {where}: {result.unknown_data_source}")
    if result is not None and result.error is not None:
      hint = "a reward function returns a finite number, or a dict with a finite number under 'score'"
      if result.timed_out:
        hint = "raise reward_model.timeout_s if the function is slow but right; " + hint
      raise rewards.RewardFunctionError(
        f"reward function {function_name(scorer.fn)!r} refused before compiling: on {key} {where} "
        f"(data_source={data_source!r}) with {what}: {result.error}",
        hint=hint,
      )


def _preflight_rows(rows: list[tuple[str, dict]], reward_fn_key: str) -> list[tuple[str, dict]]:
  """The first row of each data_source, then the next rows, up to PREFLIGHT_ROWS; rows with a ground truth first."""
  truth = lambda row: (row.get("reward_model") or {}).get("ground_truth")
  order = [item for item in rows if not _is_null(truth(item[1]))] or rows
  chosen, seen = [], set()
  for item in order:
    if item[1].get(reward_fn_key) not in seen:
      seen.add(item[1].get(reward_fn_key))
      chosen.append(item)
  chosen += [item for item in order if item not in chosen]
  return chosen[:PREFLIGHT_ROWS]


def _as_text(ground_truth) -> str:
  if isinstance(ground_truth, str):
    return ground_truth
  if isinstance(ground_truth, (list, tuple)) and ground_truth and isinstance(ground_truth[0], str):
    return ground_truth[0]  # one of the accepted answers (search_r1's targets)
  return "" if _is_null(ground_truth) else str(ground_truth)


def _is_null(ground_truth) -> bool:
  return ground_truth is None or (isinstance(ground_truth, float) and math.isnan(ground_truth))


_ROWS_NAMED = 10  # a warning names this many rows with a null ground truth, then counts the rest
_warned_datasets: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> dataset warned about


def warn_null_ground_truths(dataset: PromptDataset) -> None:
  """Once per dataset: which rows have a null `reward_model.ground_truth` (the built-in rules score them 0)."""
  if _warned_datasets.get(id(dataset)) is dataset:
    return
  _warned_datasets[id(dataset)] = dataset
  rows = [i for i, truth in enumerate(dataset.ground_truths) if _is_null(truth)]
  if not rows:
    return
  named = ", ".join(f"{dataset.place(i)} (data_source {dataset.data_sources[i]!r})" for i in rows[:_ROWS_NAMED])
  more = f" and {len(rows) - _ROWS_NAMED} more" if len(rows) > _ROWS_NAMED else ""
  logging.warning(
    "reward: %d of %d data rows have a null reward_model.ground_truth: %s%s. The reward function gets "
    "None for them (the built-in rules score 0); each step's reward/num_null_ground_truth counts their "
    "samples (actor_rollout_ref.rollout.n per row), not rows",
    len(rows),
    len(dataset),
    named,
    more,
  )


def decode_responses(tokenizer, responses_NxR: np.ndarray, response_mask_NxR: np.ndarray) -> list[str]:
  rows = [ids[mask > 0].tolist() for ids, mask in zip(np.asarray(responses_NxR), np.asarray(response_mask_NxR))]
  return tokenizer.batch_decode(rows, skip_special_tokens=True)


def score_on_host(
  tokenizer,
  dataset: PromptDataset,
  compute_score_fn: Callable | rewards.RewardScorer | None,
  on_error: str,
  responses_NxR,
  response_mask_NxR,
  sample_index_N,
  extra_keys=None,
  require_extra_keys=False,
  trajectory_infos=None,
):
  """(scores_N, extras) of decoded responses by the rule reward (`rewards.score_batch`; a `RewardScorer`
  says where it runs), each row looked up by its `sample_index` in `dataset`. Validation calls it directly
  (every extra the reward returns); the step through `make_reward_fn`'s callback. `trajectory_infos`: per row,
  what a multi-turn rollout adds to the row's `extra_info` (`trajectory_infos`), as verl's reward managers do."""
  warn_null_ground_truths(dataset)
  texts = decode_responses(tokenizer, responses_NxR, response_mask_NxR)
  rows = np.asarray(sample_index_N).tolist()
  extra_infos = [dataset.extra_infos[i] for i in rows]
  if trajectory_infos is not None:
    extra_infos = [{**info, **more} for info, more in zip(extra_infos, trajectory_infos)]
  return rewards.score_batch(
    compute_score_fn,
    [dataset.data_sources[i] for i in rows],
    texts,
    [dataset.ground_truths[i] for i in rows],
    extra_infos,
    extra_keys=extra_keys,
    require_extra_keys=require_extra_keys,
    on_error=on_error,
  )


def trajectory_infos(num_turns_N, tool_rewards_NxC) -> list[dict]:
  """Per row, what verl's reward managers add to a multi-turn row's `extra_info`: `num_turns`, each tool call's
  step reward (`tool_rewards`) and `turn_scores` (verl's tool agent loop leaves it empty). The reward function
  combines them with its score as it likes; by default they are not added (verl's)."""
  return [
    {"num_turns": int(turns), "tool_rewards": [float(r) for r in rewards if np.isfinite(r)], "turn_scores": []}
    for turns, rewards in zip(np.asarray(num_turns_N), np.asarray(tool_rewards_NxC))
  ]


def make_reward_fn(
  tokenizer,
  dataset: PromptDataset,
  compute_score_fn: Callable | rewards.RewardScorer | None = None,
  on_error: str = "raise",
  component_keys: tuple[str, ...] = (),
  dump: RolloutDump | None = None,
):
  """Returns `reward_fn(responses_NxR, response_mask_NxR, sample_index_N) -> (scores_N, errors_N,
  null_ground_truths_N, components_KxN)` (jittable).

  on_error="raise": a reward function that raises, exits, crashes, times out or returns a non-number fails
  the step, naming the sample and its data_source; "zero": that sample scores 0 and errors_N marks it.
  null_ground_truths_N marks the rows whose ground truth is null (warned about once, here). `component_keys`
  (GDPO's `algorithm.gdpo_reward_keys`): entries of the dict the reward function returns, one row of
  components_KxN each; every sample must return them all. `dump` (trainer.rollout_data_dir): every scored row is
  added to it (prompt, response, ground truth, score), for the trainer to write after the step.
  """
  warn_null_ground_truths(dataset)

  def host_score(responses_NxR, response_mask_NxR, sample_index_N, num_turns_N=None, tool_rewards_NxC=None):
    try:
      scores_N, extras = score_on_host(
        tokenizer,
        dataset,
        compute_score_fn,
        on_error,
        responses_NxR,
        response_mask_NxR,
        sample_index_N,
        extra_keys=component_keys,
        require_extra_keys=True,
        trajectory_infos=None if num_turns_N is None else trajectory_infos(num_turns_N, tool_rewards_NxC),
      )
    except BaseException as error:  # KeyboardInterrupt too: Ctrl-C during scoring stops the run as Ctrl-C
      with _callback_errors_lock:
        _callback_errors.append(error)
      raise
    errors_N = extras.get(rewards.ERROR_KEY, np.zeros_like(scores_N))
    if dump is not None:
      rows = np.asarray(sample_index_N).tolist()
      dump.add(
        prompt_texts(tokenizer, dataset, rows),
        decode_responses(tokenizer, responses_NxR, response_mask_NxR),
        [dataset.ground_truths[i] for i in rows],
        scores_N.tolist(),
        {key: values.tolist() for key, values in extras.items()},
      )
    null_ground_truths_N = np.array(
      [_is_null(dataset.ground_truths[i]) for i in np.asarray(sample_index_N)], np.float32
    )
    components_KxN = (
      np.stack([extras[key] for key in component_keys])
      if component_keys
      else (np.zeros((0, len(scores_N)), np.float32))
    )
    return (
      scores_N.astype(np.float32),
      errors_N.astype(np.float32),
      null_ground_truths_N,
      components_KxN.astype(np.float32),
    )

  def reward_fn(responses_NxR, response_mask_NxR, sample_index_N, *trajectories):
    """`trajectories`: a multi-turn rollout's (num_turns_N, tool_rewards_NxC), or nothing."""
    num_rows = responses_NxR.shape[0]
    row = jax.ShapeDtypeStruct((num_rows,), jnp.float32)
    result = (row, row, row, jax.ShapeDtypeStruct((len(component_keys), num_rows), jnp.float32))
    return jax.pure_callback(
      host_score, result, responses_NxR, response_mask_NxR, sample_index_N, *trajectories, vmap_method="sequential"
    )

  return reward_fn


def uses_judge(reward_model_config) -> bool:
  """Whether a generative reward model (a judge, `trainer/judge.py`) scores."""
  return bool(reward_model_config.enable and reward_model_config.generative)


def uses_rule_reward(reward_model_config) -> bool:
  """Whether the rule reward scores (no reward model, or one combined with the rule)."""
  return not reward_model_config.enable or reward_model_config.combine_with_rule


def model_scores(
  reward_model_config,
  reward_model: Decoder | None,
  reward_params,
  prompts_NxP,
  prompt_mask_NxP,
  responses_NxR,
  response_mask_NxR,
):
  """The scalar reward model's score of each sequence [N] (zeros without one; a judge scores in `sequence_scores`)."""
  if not reward_model_config.enable or uses_judge(reward_model_config):
    return jnp.zeros(responses_NxR.shape[:1], jnp.float32)
  ids_NxS, _, _ = sequence_inputs(prompts_NxP, prompt_mask_NxP, responses_NxR)
  mask_NxS = jnp.concatenate([prompt_mask_NxP, response_mask_NxR], axis=1).astype(jnp.int32)
  return reward_model_scores(reward_model, reward_params, ids_NxS, mask_NxS)


def sequence_scores(
  reward_model_config,
  reward_fn: Callable,
  reward_model: Decoder | None,
  reward_params,
  prompts_NxP,
  prompt_mask_NxP,
  responses_NxR,
  response_mask_NxR,
  sample_index_N,
  trajectories=None,
  judge=None,
):
  """(scores_N, errors_N, null_ground_truths_N, components_KxN): the rule reward, the reward model's score,
  or (combine_with_rule) their sum; the failed samples (the rule reward's, the judge's), rows with a null ground
  truth and components (GDPO), K = 0 without.

  `reward_model_config`: the config's `reward_model` section; `reward_fn` as made by `make_reward_fn`; `judge`: a
  generative reward model (`judge.Judge`, its weights `reward_params`), or None.
  """
  zeros_N = jnp.zeros(responses_NxR.shape[:1], jnp.float32)
  scores_N, errors_N, null_ground_truths_N = zeros_N, zeros_N, zeros_N
  components_KxN = jnp.zeros((0,) + zeros_N.shape, jnp.float32)
  if uses_rule_reward(reward_model_config):
    scores_N, errors_N, null_ground_truths_N, components_KxN = reward_fn(
      responses_NxR, response_mask_NxR, sample_index_N, *(trajectories or ())
    )
  scores_N = scores_N + model_scores(
    reward_model_config, reward_model, reward_params, prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR
  )
  if judge is not None:
    judged_N, judge_errors_N = judge.scores(
      reward_params, prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N
    )
    scores_N, errors_N = scores_N + judged_N, jnp.maximum(errors_N, judge_errors_N)
  return scores_N, errors_N, null_ground_truths_N, components_KxN


def score_rollout(
  reward_model_config, reward_fn: Callable, reward_model: Decoder | None, reward_params, rollout: Rollout, judge=None
) -> Scored:
  """The step's reward phase: sequence scores (+ DAPO overlong penalty) placed on the last valid token. `judge`: a
  generative reward model (`judge.Judge`) or None.

  For GDPO the record holds the rule reward's `reward_components` [K, N], for ReMax the greedy baseline's
  `reward_baselines` [N].
  """
  # The whole response is scored (verl decodes a multi-turn response with its tool text); the score sits on the
  # last policy token, verl's "last valid token" (a multi-turn response never ends with tool tokens).
  responses_NxR, response_mask_NxR = rollout.responses, rollout.sequence_mask()
  trajectories = None if rollout.num_turns is None else (rollout.num_turns, rollout.tool_rewards)
  score = functools.partial(
    sequence_scores,
    reward_model_config,
    reward_fn,
    reward_model,
    reward_params,
    rollout.prompts,
    rollout.prompt_mask,
    judge=judge,
  )
  scores_N, errors_N, null_ground_truths_N, components_KxN = score(
    responses_NxR, response_mask_NxR, rollout.sample_index, trajectories
  )
  overlong = reward_model_config.overlong_buffer
  if overlong.enable:
    scores_N = scores_N + algos.overlong_penalty(
      response_mask_NxR.sum(axis=1), responses_NxR.shape[1], overlong.len, overlong.penalty_factor
    )
  baselines_N = None
  if rollout.baseline_responses is not None:
    baselines_N = score(rollout.baseline_responses, rollout.baseline_response_mask, rollout.sample_index)[0]
  return Scored(
    scores=scores_N,
    reward_errors=errors_N,
    null_ground_truths=null_ground_truths_N,
    token_level_scores=algos.place_scores_on_last_token(scores_N, rollout.response_mask),
    reward_components=components_KxN if components_KxN.shape[0] else None,
    reward_baselines=baselines_N,
  )
