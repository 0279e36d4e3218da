"""Validation: the compiled sample program, the rule reward on the host, and verl's validation metrics
(docs/algorithms.md §7 `val-core`, `val-aux`).

`Validation` (what `Trainer.validate` runs) samples fixed-shape batches of the validation set through the
generation mode's `validation_samples` (`make_validation_fn`'s program, or the multi-turn host loop), scores the
responses with the rule reward on the host (where every entry the reward function returns is known: `acc`, `pred`,
...), turns the variables into metrics with `validation_metrics` and logs the first generations.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf import rewards
from jaxrlhf.rollout import SamplingParams
from jaxrlhf.rollout.agent_loop import trajectory_metrics
from jaxrlhf.trainer import reward
from jaxrlhf.trainer.dumps import prompt_texts, write_generations
from jaxrlhf.trainer.ppo_step import PPOStep

VALIDATION_STREAM = 1 << 30  # fold_in tag of validation keys (training folds in step numbers < 2**30)


class Validation:
  """`validate(state, step) -> metrics`: greedy (val_kwargs) generation on the validation set,
  val-core/<data_source>/reward/mean@n. With trainer.log_val_generations = K, the first K samples go to
  `run_dir`/val_generations.jsonl.

  `generation`: the step's generation mode (`step_modes`); `rng`: the run's key (validation folds in its own stream).
  """

  def __init__(self, config, generation, data, tokenizer, reward_scorer, run_dir: str, rng, judging=None):
    """`judging`: a generative reward model's `judge.HostJudging` on the validation rows, or None."""
    self.config = config
    self.judging = judging
    self.generation = generation
    self.data = data
    self.tokenizer = tokenizer
    self.reward_scorer = reward_scorer
    self.run_dir = run_dir
    self.rng = rng

  def __call__(self, state, step: int = 0) -> dict[str, float]:
    data, config = self.data, self.config
    n = config.actor_rollout_ref.rollout.val_kwargs.n
    batch_size = config.data.val_batch_size or len(data)
    num_batches = -(-len(data) // batch_size)
    # Pad the last batch with repeats of row 0 so every batch has one shape (one compile); drop them after.
    order = np.concatenate([np.arange(len(data)), np.zeros(num_batches * batch_size - len(data), np.int64)])
    # A fresh key per validation (and per batch), from a stream the training steps' keys never use.
    val_rng = jax.random.fold_in(jax.random.fold_in(self.rng, VALIDATION_STREAM), step)
    samples = [
      self.generation.validation_samples(
        state, data, order[b * batch_size : (b + 1) * batch_size], jax.random.fold_in(val_rng, b)
      )
      for b in range(num_batches)
    ]
    if self.judging is not None:  # the judge's scores of each batch (its rows' prompts from the data set)
      samples = [
        dataclasses.replace(sample, model_scores=sample.model_scores + self._judged(state, data, rows, n, sample))
        for sample, rows in zip(samples, (order[b * batch_size : (b + 1) * batch_size] for b in range(num_batches)))
      ]
    valid = len(data) * n
    scores, responses, masks = (
      np.concatenate([getattr(s, name) for s in samples])[:valid]
      for name in ("model_scores", "responses", "response_mask")
    )
    multi_turn = samples[0].trajectories is not None
    trajectories = [t for s in samples for t in s.trajectories][:valid] if multi_turn else None
    trajectory_infos = [i for s in samples for i in s.trajectory_infos][:valid] if multi_turn else None
    variables = {}
    if reward.uses_rule_reward(config.reward_model):
      # On the host, with every entry the reward function returns (verl's validation variables); the rule reward
      # sees every trajectory's tool rewards.
      rule_scores, variables = reward.score_on_host(
        self.tokenizer,
        data,
        self.reward_scorer,
        config.reward_model.on_error,
        responses,
        masks,
        np.repeat(np.arange(len(data)), n),
        trajectory_infos=trajectory_infos,
      )
      variables.pop(rewards.ERROR_KEY, None)
      scores = scores + rule_scores
    variables = {"reward": scores, **{name: v for name, v in variables.items() if name != "reward"}}
    metrics = validation_metrics(
      data.data_sources, {name: v.reshape(len(data), n) for name, v in variables.items()}, masks
    )
    if multi_turn:  # turns and tool calls of the validation trajectories (verl's val-aux/num_turns)
      metrics.update({f"val-aux/{k}": v for k, v in trajectory_metrics(trajectories).items()})
    self._log_generations(step, n, scores.reshape(len(data), n), responses, masks)
    folder = config.trainer.validation_data_dir
    if folder and jax.process_index() == 0:  # verl's <validation_data_dir>/<step>.jsonl
      rows = np.repeat(np.arange(len(data)), n)
      extras = {name: values.tolist() for name, values in variables.items()}
      outputs = reward.decode_responses(self.tokenizer, responses, masks)
      truths = [data.ground_truths[row] for row in rows]
      inputs = prompt_texts(self.tokenizer, data, rows)
      write_generations(folder, step, inputs, outputs, truths, scores.tolist(), extras)
    return metrics

  def _judged(self, state, data, rows, n: int, sample) -> np.ndarray:
    rows_N = np.repeat(rows, n)
    scores_N, _ = self.judging(
      state.reward_params,
      data.input_ids[rows_N],
      data.attention_mask[rows_N],
      sample.responses,
      sample.response_mask,
      rows_N,
    )
    return scores_N

  def _log_generations(self, step: int, n: int, scores, responses, masks) -> None:
    """The first `trainer.log_val_generations` samples to val_generations.jsonl (process 0)."""
    data = self.data
    num_logged = min(self.config.trainer.log_val_generations, len(data) * n)
    if not num_logged or jax.process_index() != 0:
      return
    texts = reward.decode_responses(self.tokenizer, responses[:num_logged], masks[:num_logged])
    prompts = self.tokenizer.batch_decode(
      [row[m > 0].tolist() for row, m in zip(data.input_ids, data.attention_mask)][: -(-num_logged // n)]
    )
    with open(os.path.join(self.run_dir, "val_generations.jsonl"), "a") as f:
      for i, text in enumerate(texts):
        f.write(
          json.dumps(
            {
              "step": step,
              "prompt": prompts[i // n],
              "response": text,
              "ground_truth": str(data.ground_truths[i // n]),
              "score": float(scores.reshape(-1)[i]),
            }
          )
          + "\n"
        )


def make_validation_fn(ppo: PPOStep, sampling: SamplingParams):
  """`validate(actor, reward_params, batch, rng) -> (model_scores_N, responses_NxR, response_mask_NxR)`;
  `actor`: the actor's weights (`RoleState.weights`).

  Each prompt is sampled `val_kwargs.n` times with `sampling`; `model_scores_N` is the reward model's
  score (zeros without one): the rule reward runs on the host afterwards (`Trainer.validate`).
  """

  def validate(actor, reward_params, batch, rng):
    n = ppo.config.actor_rollout_ref.rollout.val_kwargs.n
    prompts_NxP = jnp.repeat(batch["input_ids"], n, axis=0)
    prompt_mask_NxP = jnp.repeat(batch["attention_mask"], n, axis=0)
    generation = ppo.generation
    out = generation.sample(generation.generation_params(actor), prompts_NxP, prompt_mask_NxP, rng, sampling)
    scores_N = reward.model_scores(
      ppo.config.reward_model,
      ppo.reward_model,
      reward_params,
      prompts_NxP,
      prompt_mask_NxP,
      out["responses"],
      out["response_mask"],
    )
    return scores_N, out["responses"], out["response_mask"]

  return validate


def _subset_sizes(n: int) -> list[int]:
  """The sample counts k of best@k / worst@k / maj@k: 2, 4, 8, ... below n, then n (verl's)."""
  sizes, k = [], 2
  while k < n:
    sizes.append(k)
    k *= 2
  return sizes + [n] if n > 1 else []


def _bootstrap_draws(n: int, subset_size: int, num_draws: int = 1000, seed: int = 42) -> np.ndarray:
  """[num_draws, subset_size] indices drawn with replacement; verl reseeds before every bootstrap, so every
  prompt and every statistic draws the same subsets."""
  np.random.seed(seed)
  return np.random.choice(n, size=(num_draws, subset_size), replace=True)


def _majority_value(values_S, preds_S):
  """verl's `calc_maj_val`: the value of the first sample that voted for the most common `pred` (ties:
  the pred seen first)."""
  counts, first_value = {}, {}
  for value, pred in zip(values_S, preds_S):
    counts[pred] = counts.get(pred, 0) + 1
    first_value.setdefault(pred, value)
  return first_value[max(counts, key=counts.get)]


def _prompt_metrics(values_K: np.ndarray, preds_K=None) -> dict[str, float]:
  """One prompt's n samples of one variable: mean@n, std@n, and bootstrap best/worst@k (maj@k with preds)."""
  n = len(values_K)
  metrics = {f"mean@{n}": float(np.mean(values_K))}
  if n > 1:
    metrics[f"std@{n}"] = float(np.std(values_K))
    for k in _subset_sizes(n):
      draws_DxS = _bootstrap_draws(n, k)
      best_D, worst_D = values_K[draws_DxS].max(axis=1), values_K[draws_DxS].min(axis=1)
      metrics.update(
        {
          f"best@{k}/mean": float(best_D.mean()),
          f"best@{k}/std": float(best_D.std()),
          f"worst@{k}/mean": float(worst_D.mean()),
          f"worst@{k}/std": float(worst_D.std()),
        }
      )
      if preds_K is not None:
        majority_D = np.array([_majority_value(values_K[d], [preds_K[i] for i in d]) for d in draws_DxS])
        metrics.update({f"maj@{k}/mean": float(majority_D.mean()), f"maj@{k}/std": float(majority_D.std())})
  return metrics


def validation_metrics(
  data_sources: Sequence[str],
  variables: dict[str, np.ndarray],
  response_mask_NxR: np.ndarray,
) -> dict[str, float]:
  """verl's validation metrics, per data source, averaged over its prompts, for each variable: `reward`
  (the score) and every number the reward function returned beside it (e.g. `acc`). The core variable is
  `acc` when there is one, else `reward`: its mean/maj/best at the largest n are `val-core/<source>/<var>/...`,
  everything else `val-aux/...` (std@n, best/worst@k: a bootstrap over subsets of k of a prompt's n
  samples; maj@k when the reward returns a text `pred`: the majority answer's value). Also
  `val/response_length/mean`.

  variables: name -> [prompts, n] values of each prompt's n samples (numbers; `pred` text, None where
  missing); data_sources: one per prompt.
  """
  preds = variables.get("pred")
  numeric = {
    name: np.asarray(values, np.float64) for name, values in variables.items() if np.asarray(values).dtype != object
  }
  core = "acc" if "acc" in numeric else "reward"
  by_source = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
  for p, source in enumerate(data_sources):
    prompt_preds = None
    if preds is not None and all(pred is not None for pred in preds[p]):
      prompt_preds = list(preds[p])
    for name, values in numeric.items():
      for metric, value in _prompt_metrics(values[p], prompt_preds).items():
        by_source[source][name][metric].append(value)
  n = next(iter(numeric.values())).shape[1]
  metrics = {}
  for source, name_metrics in by_source.items():
    for name, metric_values in name_metrics.items():
      for metric, values in metric_values.items():
        is_core = name == core and metric.startswith(("mean", "maj", "best")) and f"@{n}" in metric
        metrics[f"{'val-core' if is_core else 'val-aux'}/{source}/{name}/{metric}"] = float(np.mean(values))
  metrics["val/response_length/mean"] = float(response_mask_NxR.sum(axis=1).mean())
  return metrics


def validation_summary(history: Sequence[dict]) -> str:
  """The closing line's account of validation: 'val-core/...: 0.125 -> 0.875' from the first validation to the last
  (one value when the run validated once), for every val-core metric the run logged; '' when it never validated."""
  values = defaultdict(list)
  for record in history:
    for key, value in record.items():
      if key.startswith("val-core/"):
        values[key].append(value)
  return ", ".join(
    f"{key}: {seen[0]:.3f} -> {seen[-1]:.3f}" if len(seen) > 1 else f"{key}: {seen[0]:.3f}"
    for key, seen in values.items()
  )
