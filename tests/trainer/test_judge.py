"""A generative reward model (LLM-as-judge, `trainer/judge.py`): the judge's replies inside the step equal
`jaxrlhf.generate`'s for the same judge prompts (greedy), the parsed scores reach metrics.jsonl under verl's reward
metric names, and a reply the parser rejects gives `reward_model.on_error`'s behaviour."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf import generate as generate_cli
from jaxrlhf import rewards
from jaxrlhf.config import ConfigError, get_base_config, resolve_config
from jaxrlhf.data.builtin import build_tokenizer
from jaxrlhf.models import load_hf_config
from jaxrlhf.models.tokenizer import encode_prompt
from jaxrlhf.parallel import StepLayouts
from jaxrlhf.rewards import judge as judge_parser
from jaxrlhf.rollout import SamplingParams
from jaxrlhf.trainer import Trainer
from jaxrlhf.trainer.judge import Judge, JudgeFns
from tests.helpers import small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TEMPLATE = ": {response}"  # the judge reads ":" then the response's words
REPLY_TOKENS = 3


def _save_judge(path, echo: bool, seed: int):
  """A tiny Qwen2 causal LM with the built-in word tokenizer. `echo`: every layer's output projections zeroed, so
  the last hidden state is the current token's embedding and the tied LM head's largest logit is that token: the
  greedy reply repeats the prompt's last word (a digit scores it, any other word is rejected by the parser)."""
  import torch
  import transformers

  config = transformers.Qwen2Config(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    max_position_embeddings=64,
    pad_token_id=0,
    eos_token_id=1,
  )
  torch.manual_seed(seed)
  model = transformers.Qwen2ForCausalLM(config)
  if echo:
    with torch.no_grad():
      for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
  model.save_pretrained(path)
  build_tokenizer(save_dir=str(path))
  return str(path)


@pytest.fixture(scope="module")
def echo_judge(tmp_path_factory):
  return _save_judge(tmp_path_factory.mktemp("echo_judge"), echo=True, seed=3)


def _oracle_replies(judge_path, texts, max_new_tokens=REPLY_TOKENS):
  """What `python -m jaxrlhf.generate --model judge_path --temperature 0` replies to each judge prompt text:
  (prompt ids, reply ids, reply texts)."""
  params, model_config, tokenizer, eos_ids, pad_id = generate_cli.load_model(judge_path)
  sampling = SamplingParams(max_new_tokens=max_new_tokens, eos_token_ids=eos_ids, pad_token_id=pad_id, do_sample=False)
  encoded = [encode_prompt(tokenizer, text, chat=False) for text in texts]
  rows, _ = generate_cli.sample_responses(jax.device_put(params), model_config, encoded, sampling, batch_size=64)
  replies = [row["response_ids"] for row in rows]
  return encoded, replies, [tokenizer.decode(ids, skip_special_tokens=True) for ids in replies]


def _judge_config(tmp_path, judge_path, **overrides):
  return small_config(
    tmp_path,
    **{
      "mesh.fsdp": 2,
      "data.val_max_samples": 8,
      "data.val_batch_size": 4,
      "trainer.validation_data_dir": str(tmp_path / "validation"),
      "trainer.total_training_steps": 1,
      "trainer.rollout_data_dir": str(tmp_path / "rollouts"),
      "reward_model.enable": True,
      "reward_model.generative": True,
      "reward_model.model.path": judge_path,
      "reward_model.on_error": "zero",
      "reward_model.judge.prompt_template": TEMPLATE,
      "reward_model.judge.apply_chat_template": False,
      "reward_model.rollout.prompt_length": 8,
      "reward_model.rollout.response_length": REPLY_TOKENS,
      **overrides,
    },
  )


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory, echo_judge):
  """One fused training step scored by the echo judge alone (on_error=zero), through `fit` (metrics.jsonl)."""
  tmp_path = tmp_path_factory.mktemp("judged_run")
  trainer = Trainer(_judge_config(tmp_path, echo_judge), devices=jax.devices()[:2])
  trainer.fit()
  with open(os.path.join(trainer.run_dir, "metrics.jsonl")) as f:
    metrics = [json.loads(line) for line in f]
  with open(tmp_path / "rollouts" / "1.jsonl") as f:
    dumped = [json.loads(line) for line in f]
  return trainer, metrics, dumped


def test_echo_judge_repeats_the_last_token(echo_judge):
  """The fixture's premise: the echo judge's greedy reply is its prompt's last token (as the judge's tokenizer
  splits the text), for every word it may see."""
  words = ["####", ":", "first", "last"] + [str(d) for d in range(20)]
  encoded, replies, _ = _oracle_replies(echo_judge, [f": 3 {word}" for word in words])
  assert replies == [[ids[-1]] * REPLY_TOKENS for ids in encoded]


def test_judge_replies_equal_jaxrlhf_generate_and_scores_reach_metrics(judged_run, echo_judge):
  trainer, metrics, dumped = judged_run
  assert len(dumped) == 16  # train_batch_size 8 x rollout.n 2
  replies = [row["judge_response"] for row in dumped]
  _, _, oracle = _oracle_replies(echo_judge, [TEMPLATE.format(response=row["output"]) for row in dumped])
  assert replies == oracle
  expected, failed = _expected(oracle)
  assert 0 < sum(failed) < len(failed), "the random policy's responses should end in digits and in other words"
  np.testing.assert_allclose([row["score"] for row in dumped], expected)
  np.testing.assert_allclose([row["reward_error"] for row in dumped], failed)
  (step,) = [record for record in metrics if "critic/score/mean" in record]
  # verl's reward metric names: the sequence score (critic/score/*) and, with one reward, the token rewards' sums.
  assert step["critic/score/mean"] == pytest.approx(np.mean(expected), abs=1e-5)
  assert step["critic/score/max"] == pytest.approx(np.max(expected), abs=1e-5)
  assert step["critic/rewards/mean"] == pytest.approx(np.mean(expected), abs=1e-3)  # less the KL (kl_coef 0.001)
  assert step["reward/num_errors"] == sum(failed)


def _expected(replies):
  """(scores, failed) of the built-in parser on the replies, on_error=zero."""
  scores, failed = [], []
  for reply in replies:
    try:
      scores.append(judge_parser.compute_score("", "", "", {}, judge_response=reply))
      failed.append(0.0)
    except ValueError:
      scores.append(0.0)
      failed.append(1.0)
  return scores, failed


def test_validation_is_judged_too(judged_run, echo_judge):
  """Validation's judge (on the host, `HostJudging`): the scores of the oracle's replies to the validation
  responses, in verl's val-core reward and validation_data_dir's rows, before and after the step."""
  trainer, metrics, _ = judged_run
  validations = [record for record in metrics if "val-core/jaxrlhf/recall/reward/mean@1" in record]
  assert len(validations) == 2
  for step, record in zip((0, 1), validations):
    with open(os.path.join(trainer.config.trainer.validation_data_dir, f"{step}.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    assert len(rows) == 8
    _, _, oracle = _oracle_replies(echo_judge, [TEMPLATE.format(response=row["output"]) for row in rows])
    expected, _ = _expected(oracle)
    np.testing.assert_allclose([row["score"] for row in rows], expected)
    assert record["val-core/jaxrlhf/recall/reward/mean@1"] == pytest.approx(np.mean(expected), abs=1e-5)


def test_rejected_reply_with_on_error_raise_is_one_clear_error(judged_run):
  """on_error=raise: a reply the parser rejects fails with the parser's own error, naming it and the sample (inside
  the step `reward.host_callback_errors` raises it in place of XLA's wrapping, as for the rule reward). Called on
  the run's judge host directly: a callback that raises inside a program on several devices leaves the others in
  their collectives."""
  trainer, _, _ = judged_run
  host = trainer.judge_host
  verdicts_NxV = np.array([[15, 1, 0], [6, 6, 6]], np.int32)  # "3" <eos> (a number), ":::" (none)
  verdict_mask_NxV = np.array([[1, 1, 0], [1, 1, 1]], np.int32)
  responses_NxR = np.array([[15, 1, 0], [6, 1, 0]], np.int32)
  args = (responses_NxR, np.ones_like(responses_NxR), np.array([0, 1]), verdicts_NxV, verdict_mask_NxV)
  scores_N, errors_N = host.scores(*args, np.zeros(2, np.float32))
  np.testing.assert_allclose(scores_N, [3.0, 0.0])  # on_error=zero: scored 0 and counted
  np.testing.assert_allclose(errors_N, [0.0, 1.0])
  trainer.config.reward_model.on_error = "raise"  # the judge's host reads it at each call
  try:
    with pytest.raises(rewards.RewardFunctionError, match=r"'compute_score' failed on sample 1 .*holds no number"):
      host.scores(*args, np.zeros(2, np.float32))
  finally:
    trainer.config.reward_model.on_error = "zero"


def test_judge_prompt_over_prompt_length_is_the_rows_error(judged_run):
  """A judge prompt longer than reward_model.rollout.prompt_length: that row fails (on_error), never truncated."""
  trainer, _, _ = judged_run
  host = trainer.judge_host
  responses_NxR = np.array([[15, 15, 15, 15, 15, 15, 15, 15], [15, 1, 0, 0, 0, 0, 0, 0]], np.int32)
  mask_NxR = (np.arange(8) < np.array([[8], [2]])).astype(np.int32)
  prompts_NxP = np.full((2, 2), 6, np.int32)
  ids_NxQ, mask_NxQ, too_long_N = host.prompts(prompts_NxP, np.zeros_like(prompts_NxP), responses_NxR, mask_NxR, [0, 1])
  np.testing.assert_allclose(too_long_N, [1.0, 0.0])
  assert mask_NxQ[1].tolist() == [0] * 6 + [1, 1] and ids_NxQ[1, -2:].tolist() == [6, 15]
  trainer.config.reward_model.on_error = "raise"
  try:
    with pytest.raises(
      rewards.RewardFunctionError, match=r"sample 0 is 9 tokens, over reward_model.rollout.prompt_length=8"
    ):
      host.prompts(prompts_NxP, np.zeros_like(prompts_NxP), responses_NxR, mask_NxR, [0, 1])
  finally:
    trainer.config.reward_model.on_error = "zero"


@pytest.mark.parametrize("max_num_seqs", [None, 3])
def test_judge_verdicts_equal_generate_for_a_random_judge(tmp_path, max_num_seqs):
  """`Judge.verdicts` (the whole batch, or 3 slots refilled in-graph) on random weights: the tokens
  `jaxrlhf.generate` samples greedily for the same judge prompts."""
  path = _save_judge(tmp_path / "judge", echo=False, seed=7)
  config = get_base_config()
  config.reward_model.update(enable=True, generative=True)
  config.reward_model.model.path = path
  config.reward_model.rollout.update(prompt_length=6, response_length=5, max_num_seqs=max_num_seqs)
  judge_config = load_hf_config(path)
  fns = JudgeFns(prompts=None, scores=None, eos_token_ids=(1,), pad_token_id=0)
  judge = Judge(resolve_config(config), judge_config, StepLayouts(), fns)
  params, _, _, _, _ = generate_cli.load_model(path)
  rng = np.random.default_rng(0)
  lengths = [1, 6, 3, 4, 2, 5, 6]
  prompts = [rng.integers(5, 32, length).tolist() for length in lengths]
  ids_NxQ = np.zeros((len(prompts), 6), np.int32)
  mask_NxQ = np.zeros((len(prompts), 6), np.int32)
  for row, ids in enumerate(prompts):
    ids_NxQ[row, 6 - len(ids) :], mask_NxQ[row, 6 - len(ids) :] = ids, 1
  out = jax.jit(judge.verdicts)(params, jnp.asarray(ids_NxQ), jnp.asarray(mask_NxQ), jnp.arange(len(prompts)))
  sampling = SamplingParams(max_new_tokens=5, eos_token_ids=(1,), pad_token_id=0, do_sample=False)
  rows, _ = generate_cli.sample_responses(jax.device_put(params), judge_config, prompts, sampling)
  for row, expected in enumerate(rows):
    length = int(out["response_mask"][row].sum())
    assert out["responses"][row, :length].tolist() == expected["response_ids"]


@pytest.mark.parametrize(
  ("template", "message"),
  [("{prompt} {answer}", r"has field \{answer\}"), ("{response", "not a str.format template")],
)
def test_judge_template_refused_in_one_line(template, message):
  config = get_base_config()
  config.reward_model.update(enable=True, generative=True)
  config.reward_model.model.path = "/some/judge"
  config.reward_model.judge.prompt_template = template
  with pytest.raises(ConfigError, match=r"reward_model\.judge\.prompt_template.*" + message):
    resolve_config(config)


def test_builtin_parser_takes_the_last_number():
  assert judge_parser.compute_score("s", "r", "1", {}, judge_response="7 out of 10, so 8.5") == 8.5
  with pytest.raises(ValueError, match="holds no number"):
    judge_parser.compute_score("s", "r", "1", {}, judge_response="great answer")


def test_a_parser_file_runs_in_worker_processes_with_the_reply(tmp_path):
  """A `score_function.path` parser gets the reply as `judge_response` in reward worker processes (the rule reward's
  scorer: num_workers, timeout_s); a reply that makes it hang times out into on_error."""
  from jaxrlhf.trainer.judge import judge_score_function, judge_scorer

  parser = tmp_path / "parse.py"
  parser.write_text(
    "import time\n"
    "def parse(data_source, solution_str, ground_truth, extra_info=None, judge_response=''):\n"
    "    if judge_response == 'hang':\n"
    "        time.sleep(60)\n"
    "    return {'score': float(judge_response == ground_truth), 'judge_length': float(len(judge_response))}\n"
  )
  section = get_base_config().reward_model
  section.update(num_workers=1, timeout_s=2.0)
  section.judge.score_function.update(path=str(parser), name="parse")
  scorer = judge_scorer(section, judge_score_function(section))
  try:
    scores, extras = rewards.score_batch(
      scorer,
      ["s"] * 3,
      ["a", "b", "c"],
      ["7", "7", "7"],
      [{}] * 3,
      extra_keys=(),
      on_error="zero",
      keywords=[{"judge_response": "7"}, {"judge_response": "3"}, {"judge_response": "hang"}],
    )
  finally:
    scorer.close()
  assert scorer.num_workers == 1
  np.testing.assert_allclose(scores, [1.0, 0.0, 0.0])
  np.testing.assert_allclose(extras[rewards.ERROR_KEY], [0.0, 0.0, 1.0])
  section.judge.score_function.path = str(tmp_path / "missing.py")
  with pytest.raises(ConfigError, match=r"reward_model\.judge\.score_function\.path: reward file .* does not exist"):
    judge_score_function(section)
