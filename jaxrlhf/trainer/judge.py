"""A generative reward model (LLM-as-judge) in the step's reward phase (docs/algorithms.md "A generative reward model").

A judge is a causal LM with its own tokenizer. Scoring a batch is host - device - host, inside the step's one
compiled program (the host parts are `jax.pure_callback`s, as the rule reward is):
1. `JudgeHost.prompts`: each row's prompt and response decoded with the policy's tokenizer, the template
   (`reward_model.judge.prompt_template`) filled with them and the row's ground truth, data_source and extra_info,
   tokenized by the judge's tokenizer (through its chat template: `jaxrlhf.models.tokenizer.encode_prompt`, what
   `jaxrlhf.generate --chat` does) and left-padded to `reward_model.rollout.prompt_length`;
2. `Judge.verdicts`: the judge's frozen weights (kept like the reference, in the train layout) moved to the
   generation layout and sampled with the rollout's sampler (`rollout.generate`, or `generate_in_slots` with
   `reward_model.rollout.max_num_seqs`), greedy by default;
3. `JudgeHost.scores`: each reply decoded with the judge's tokenizer and parsed into the score by the score
   function (verl's reward function signature plus `judge_response`), run by a `RewardScorer` (worker processes,
   `reward_model.timeout_s`) under `reward_model.on_error`.

A judge prompt longer than `prompt_length` is that row's failure (on_error), not a truncation: a judge that reads
half a response would score it anyway.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf import rewards
from jaxrlhf.config import ConfigError
from jaxrlhf.data import PromptDataset
from jaxrlhf.models.decoder import Decoder, DecoderConfig, cast_floating, kv_heads_repeated
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.models.tokenizer import encode_prompt
from jaxrlhf.parallel.step_layouts import StepLayouts
from jaxrlhf.rewards import judge as judge_parser
from jaxrlhf.rollout import SamplingParams, generate, generate_in_slots, request_key
from jaxrlhf.trainer.dumps import RolloutDump, prompt_texts
from jaxrlhf.trainer.reward import reported


def judge_score_function(section) -> Callable:
  """The judge's parser (`reward_model.judge.score_function`): a function from a file, or the built-in one (the last
  number of the reply, `rewards.judge`)."""
  function = section.judge.score_function
  if not function.path:
    return judge_parser.compute_score
  try:
    return rewards.load_custom_reward_function(function.path, function.name)
  except (OSError, ImportError, AttributeError, TypeError) as error:
    message = str(error).replace("custom_reward_function.", "reward_model.judge.score_function.")
    raise ConfigError(message) from None


def judge_scorer(section, fn: Callable) -> rewards.RewardScorer:
  """Where the parser runs: a file's function as the rule reward runs (`reward_model.num_workers`, `timeout_s`);
  the built-in parser (a regular expression) in this process."""
  workers = section.num_workers if fn is not judge_parser.compute_score else 0
  return rewards.RewardScorer(fn, num_workers=workers, timeout_s=section.timeout_s)


class JudgeHost:
  """The host side of judging: judge prompts from rows, scores from replies. `tokenizer`: the policy's;
  `judge_tokenizer`: the judge's; `dataset`: where each row's ground truth, data_source and extra_info are looked up
  by its sample index; `dump` (trainer.rollout_data_dir): each reply joins the row's record."""

  def __init__(
    self,
    section,
    tokenizer,
    judge_tokenizer,
    dataset: PromptDataset,
    scorer: rewards.RewardScorer,
    dump: RolloutDump | None = None,
  ):
    self.section = section
    self.tokenizer = tokenizer
    self.judge_tokenizer = judge_tokenizer
    self.dataset = dataset
    self.scorer = scorer
    self.dump = dump
    self.chat = bool(section.judge.apply_chat_template and getattr(judge_tokenizer, "chat_template", None))

  def with_dataset(self, dataset: PromptDataset) -> JudgeHost:
    """The same judge for the rows of another dataset (validation's)."""
    return JudgeHost(self.section, self.tokenizer, self.judge_tokenizer, dataset, self.scorer)

  def _decode(self, tokenizer, ids_NxL, mask_NxL) -> list[str]:
    rows = [ids[mask > 0].tolist() for ids, mask in zip(np.asarray(ids_NxL), np.asarray(mask_NxL))]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)

  def texts(self, prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N) -> list[str]:
    """Each row's judge prompt as text (the template filled)."""
    prompts = self._decode(self.tokenizer, prompts_NxP, prompt_mask_NxP)
    responses = self._decode(self.tokenizer, responses_NxR, response_mask_NxR)
    data = self.dataset
    return [
      self.section.judge.prompt_template.format(
        prompt=prompt,
        response=response,
        ground_truth=data.ground_truths[row],
        data_source=data.data_sources[row],
        extra_info=data.extra_infos[row] or {},
      )
      for prompt, response, row in zip(prompts, responses, np.asarray(sample_index_N).tolist())
    ]

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    """Judge prompts' token ids, as `jaxrlhf.generate` encodes them (`--chat` with `judge.apply_chat_template`)."""
    return [encode_prompt(self.judge_tokenizer, text, self.chat) for text in texts]

  def prompts(self, prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N):
    """(judge prompt ids [N, Q] int32, left-padded; their mask [N, Q] int32; too_long [N] float32): Q =
    `rollout.prompt_length`. A longer prompt keeps its last Q tokens, so the row still decodes, and is marked: its
    reply is not parsed (on_error="raise" fails here, naming the row)."""
    length, pad = self.section.rollout.prompt_length, self.judge_tokenizer.pad_token_id
    encoded = self.encode(self.texts(prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N))
    ids_NxQ = np.full((len(encoded), length), 0 if pad is None else pad, np.int32)
    mask_NxQ = np.zeros((len(encoded), length), np.int32)
    too_long_N = np.zeros(len(encoded), np.float32)
    for row, ids in enumerate(encoded):
      if len(ids) > length:
        if self.section.on_error == "raise":
          raise rewards.RewardFunctionError(
            f"the judge prompt of sample {row} is {len(ids)} tokens, over reward_model.rollout.prompt_length={length}",
            hint="raise reward_model.rollout.prompt_length, shorten reward_model.judge.prompt_template, or "
            "reward_model.on_error=zero to score such a sample 0 and count it (reward/num_errors)",
          )
        too_long_N[row] = 1.0
        ids = ids[-length:]
      if ids:
        ids_NxQ[row, length - len(ids) :] = ids
        mask_NxQ[row, length - len(ids) :] = 1
    return ids_NxQ, mask_NxQ, too_long_N

  def replies(self, verdicts_NxV, verdict_mask_NxV) -> list[str]:
    return self._decode(self.judge_tokenizer, verdicts_NxV, verdict_mask_NxV)

  def scores(self, responses_NxR, response_mask_NxR, sample_index_N, verdicts_NxV, verdict_mask_NxV, too_long_N):
    """(scores [N] float32, errors [N] float32): each reply parsed by the score function, called as verl calls a
    reward function with the reply as `judge_response`; a too-long judge prompt, or a reply the parser rejects
    (it raises, times out, returns no number), is an error under `reward_model.on_error`."""
    responses = self._decode(self.tokenizer, responses_NxR, response_mask_NxR)
    replies = self.replies(verdicts_NxV, verdict_mask_NxV)
    data, rows = self.dataset, np.asarray(sample_index_N).tolist()
    judged = [i for i in range(len(rows)) if not too_long_N[i]]
    scores_N = np.zeros(len(rows), np.float32)
    errors_N = np.asarray(too_long_N, np.float32).copy()
    if judged:
      parsed, extras = rewards.score_batch(
        self.scorer,
        [data.data_sources[rows[i]] for i in judged],
        [responses[i] for i in judged],
        [data.ground_truths[rows[i]] for i in judged],
        [data.extra_infos[rows[i]] for i in judged],
        extra_keys=(),
        on_error=self.section.on_error,
        keywords=[{"judge_response": replies[i]} for i in judged],
      )
      scores_N[judged] = parsed
      errors_N[judged] = extras.get(rewards.ERROR_KEY, np.zeros_like(parsed))
    if self.dump is not None:  # the judge's rows (with the rule reward too, the rule's rows are its own)
      truths = [data.ground_truths[row] for row in rows]
      extras = {"judge_response": replies, "reward_error": errors_N.tolist()}
      self.dump.add(prompt_texts(self.tokenizer, data, rows), responses, truths, scores_N.tolist(), extras)
    return scores_N, errors_N


@dataclasses.dataclass(frozen=True)
class JudgeFns:
  """The judge's host side as jittable functions (`make_judge_fns`; `jaxrlhf.aot` has stand-ins) and the judge's
  generation ids."""

  prompts: Callable  # (prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N) -> 3 arrays
  scores: Callable  # (responses_NxR, response_mask_NxR, sample_index_N, verdicts_NxV, mask_NxV, too_long_N) -> 2
  eos_token_ids: tuple[int, ...]
  pad_token_id: int


def make_judge_fns(host: JudgeHost, eos_token_ids: Sequence[int], pad_token_id: int) -> JudgeFns:
  """`host`'s two steps as host callbacks of fixed shapes; their exceptions reach `reward.host_callback_errors`."""
  length = host.section.rollout.prompt_length

  def prompts(prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N):
    rows = responses_NxR.shape[0]
    shapes = (
      jax.ShapeDtypeStruct((rows, length), jnp.int32),
      jax.ShapeDtypeStruct((rows, length), jnp.int32),
      jax.ShapeDtypeStruct((rows,), jnp.float32),
    )
    args = (prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N)
    return jax.pure_callback(reported(host.prompts), shapes, *args, vmap_method="sequential")

  def scores(responses_NxR, response_mask_NxR, sample_index_N, verdicts_NxV, verdict_mask_NxV, too_long_N):
    row = jax.ShapeDtypeStruct(responses_NxR.shape[:1], jnp.float32)
    args = (responses_NxR, response_mask_NxR, sample_index_N, verdicts_NxV, verdict_mask_NxV, too_long_N)
    return jax.pure_callback(reported(host.scores), (row, row), *args, vmap_method="sequential")

  return JudgeFns(prompts, scores, tuple(int(e) for e in eos_token_ids), int(pad_token_id))


class Judge:
  """The judge on the device: its decode model (the rollout dtype `reward_model.rollout.dtype`, key/value heads
  repeated as the generation layout needs) and sampling; `fns` its host side."""

  def __init__(self, config, judge_config: DecoderConfig, layouts: StepLayouts, fns: JudgeFns):
    self.section = config.reward_model
    rollout = self.section.rollout
    self.config = judge_config
    self.model = Decoder(
      dataclasses.replace(kv_heads_repeated(judge_config, layouts.judge_kv_repeat), dtype=rollout.dtype), head="lm"
    )
    self.decode_model = decode_model(self.model)
    self.sampling = SamplingParams.from_rollout_config(
      rollout, rollout.response_length, fns.eos_token_ids, fns.pad_token_id
    )
    self.layouts = layouts
    self.fns = fns

  def generation_params(self, params):
    """The judge's weights (train layout) in the rollout dtype and the generation layout: cast before the move, so
    the gathered copy holds the rollout dtype, as the actor's (`Generation.generation_params`)."""
    return self.layouts.judge_to_generation(cast_floating(params, self.section.rollout.dtype), self.config)

  def verdicts(self, params, prompts_NxQ, prompt_mask_NxQ, sample_index_N) -> dict:
    """The judge's replies to its prompts (`rollout.generate`'s outputs). Batch row r, judging a response to data
    row i, draws with `request_key(seed, i, r)` (unused when greedy): keys that differ between the rows of a batch
    and do not depend on `max_num_seqs` (the convention of `jaxrlhf.generate`'s keys)."""
    keys_N = jax.vmap(request_key, in_axes=(None, 0, 0))(
      self.section.rollout.seed, sample_index_N, jnp.arange(sample_index_N.shape[0])
    )
    inputs = (self.generation_params(params), *self.layouts.to_generation_batch((prompts_NxQ, prompt_mask_NxQ)))
    slots = self.section.rollout.max_num_seqs
    if slots is None:
      constrain = lambda cache: self.layouts.constrain_cache(cache, self.decode_model.cache_axes)
      out = generate(self.decode_model, *inputs, keys_N, self.sampling, constrain_cache=constrain)
    else:
      shards = self.layouts.generation_shards(prompts_NxQ.shape[0])
      out = generate_in_slots(self.decode_model, *inputs, keys_N, self.sampling, slots=slots, shards=shards)
    return self.layouts.to_train({"responses": out["responses"], "response_mask": out["response_mask"]})

  def scores(self, params, prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N):
    """(scores [N], errors [N]) of the responses by the judge: prompts on the host, replies on the device, parsed on
    the host."""
    prompts_NxQ, prompt_mask_NxQ, too_long_N = self.fns.prompts(
      prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N
    )
    out = self.verdicts(params, prompts_NxQ, prompt_mask_NxQ, sample_index_N)
    return self.fns.scores(
      responses_NxR, response_mask_NxR, sample_index_N, out["responses"], out["response_mask"], too_long_N
    )


class HostJudging:
  """Judging driven from the host, for validation (whose rule reward runs on the host after sampling): the same
  three parts as inside the step (`Judge.scores`), the replies from one compiled program (`Judge.verdicts`)."""

  def __init__(self, judge: Judge, host: JudgeHost, params_sharding=None):
    self.judge = judge
    self.host = host
    self.verdicts = jax.jit(judge.verdicts, in_shardings=(params_sharding, None, None, None))

  def __call__(self, params, prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N):
    """(scores [N], errors [N]) as numpy: the rows of `host.dataset` at `sample_index_N`."""
    prompts_NxQ, prompt_mask_NxQ, too_long_N = self.host.prompts(
      prompts_NxP, prompt_mask_NxP, responses_NxR, response_mask_NxR, sample_index_N
    )
    out = jax.device_get(self.verdicts(params, prompts_NxQ, prompt_mask_NxQ, np.asarray(sample_index_N, np.int32)))
    return self.host.scores(
      responses_NxR, response_mask_NxR, sample_index_N, out["responses"], out["response_mask"], too_long_N
    )
