"""The multi-turn tool loop (`rollout/agent_loop.py`) driving the compiled turns (`rollout/turns.py`) with real tools,
tokenizer and parser. The policy is a scripted decoder: its logits pick, for each row, the token written at each
response column, so every row plays one scenario (no call, a call, a malformed call, an unknown tool, a timeout, a
raising tool, the turn limit, a reply over the budget, parallel calls)."""

import functools
import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.data.builtin import LOOKUP_CALL, build_tokenizer
from jaxrlhf.data.dataset import encode_prompt
from jaxrlhf.models import DecoderConfig
from jaxrlhf.models.decoding import DecodeModel
from jaxrlhf.rollout import SamplingParams
from jaxrlhf.rollout.agent_loop import CallOutcome, ToolAgentLoop, ToolMessages, TurnLimits, tool_call_close_ids
from jaxrlhf.rollout.turns import run_turn, start_turns
from jaxrlhf.tools.hermes import parse_tool_calls
from jaxrlhf.tools.registry import load_tools
from jaxrlhf.tools.runner import ToolRunner
from jaxrlhf.trainer.multi_turn import create_kwargs

CALLS = {
  name: "<tool_call>" + json.dumps({"name": name, "arguments": {}}, separators=(",", ":")) + "</tool_call>"
  for name in ("nope", "slow", "boom")
}
BAD_CALL = '<tool_call>{"name":"lookup",</tool_call>'
TOKENIZER = build_tokenizer(extra_words=(*CALLS.values(), BAD_CALL), task="lookup")
VOCAB = len(TOKENIZER.get_vocab())
TOKEN = TOKENIZER.convert_tokens_to_ids
RESPONSE = 64
MODEL = DecoderConfig(
  vocab_size=VOCAB, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
  num_key_value_heads=1,
)  # fmt: skip
SAMPLING = SamplingParams(RESPONSE, eos_token_ids=(TOKEN("<eos>"),), pad_token_id=0, do_sample=False)

TOOL_FILE = """
import time

from jaxrlhf.tools import BaseTool, ToolResponse

class SlowTool(BaseTool):
  def execute(self, instance_id, parameters, **kwargs):
    time.sleep(3.0)
    return ToolResponse(text="late"), 0.0, {}

class BoomTool(BaseTool):
  async def execute(self, instance_id, parameters, **kwargs):
    raise ValueError("boom")
"""
TOOL_CONFIG = """
tools:
  - class_name: jaxrlhf.tools.lookup.LookupTool
    config: {type: native}
    tool_schema: {type: function, function: {name: lookup, description: d, parameters: {type: object, properties: {}}}}
  - class_name: tools.py:SlowTool
    config: {type: native}
    tool_schema: {type: function, function: {name: slow, description: d, parameters: {type: object, properties: {}}}}
  - class_name: tools.py:BoomTool
    config: {type: native}
    tool_schema: {type: function, function: {name: boom, description: d, parameters: {type: object, properties: {}}}}
"""


def scripted_apply(script_NxT) -> DecodeModel:
  """A decoder whose next token after the input at position p is `script[row, p]` (one-hot logits); it keeps nothing
  between tokens (an empty cache)."""

  def apply(params, ids, positions, kv_mask, cache=None, cache_index=None):
    del params, kv_mask, cache_index
    rows = jnp.arange(ids.shape[0])[:, None]
    tokens = script_NxT[rows, jnp.clip(positions, 0, script_NxT.shape[1] - 1)]
    return jax.nn.one_hot(tokens, VOCAB) * 5.0, cache

  return DecodeModel(apply=apply, init_cache=lambda batch, length: {}, cache_axes={})


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
  folder = tmp_path_factory.mktemp("tools")
  (folder / "tools.py").write_text(textwrap.dedent(TOOL_FILE))
  (folder / "tools.yaml").write_text(textwrap.dedent(TOOL_CONFIG))
  return load_tools(str(folder / "tools.yaml"))


def run(tools, scripts, tables, limits=TurnLimits(max_assistant_turns=3), timeout_s=0.5):
  """Rows of "secret ?" whose policy writes `scripts[row]` (response tokens by column; forced columns ignored)."""
  prompt = encode_prompt(TOKENIZER, [{"role": "user", "content": "secret ?"}])
  rows = len(scripts)
  prompts = jnp.asarray([prompt] * rows, jnp.int32)
  script = np.zeros((rows, len(prompt) + RESPONSE), np.int32)
  for row, words in enumerate(scripts):
    words = words[: RESPONSE + 1]
    script[row, len(prompt) - 1 : len(prompt) - 1 + len(words)] = [TOKEN(w) for w in words]
  apply = scripted_apply(jnp.asarray(script))
  state = jax.jit(functools.partial(start_turns, apply, sampling=SAMPLING))(
    {}, prompt_ids_NxP=prompts, prompt_mask_NxP=jnp.ones_like(prompts), rng=jax.random.key(0)
  )
  stop = tool_call_close_ids(TOKENIZER) if limits.max_parallel_calls == 1 else ()
  turn = jax.jit(functools.partial(run_turn, apply, {}, sampling=SAMPLING, stop_token_ids=stop))
  runner = ToolRunner(tools, limits.max_parallel_calls, timeout_s, max_response_length=256)

  def execute(calls):
    results = runner.run_round([(row, call, create_kwargs(call, kwargs)) for row, call, kwargs in calls])
    return [CallOutcome(r.text, r.step_reward, r.error is not None) for r in results]

  loop = ToolAgentLoop(
    TOKENIZER, limits, lambda text: parse_tool_calls(text)[1], execute, ToolMessages(TOKENIZER), SAMPLING.eos_token_ids
  )
  tools_kwargs = [{"lookup": {"create_kwargs": {"table": {"secret": value}}}} for value in tables]
  state, trajectories = loop.run(state, lambda s, *a: turn(s, *a), RESPONSE, tools_kwargs)
  run.metrics = runner.pop_metrics()
  return jax.device_get(state), trajectories


def words(state, row):
  return TOKENIZER.convert_ids_to_tokens(state.responses[row, : state.length[row]].tolist())


def test_scenarios_each_behave_as_stated(tools):
  forced_reply = ["<eos>", "<|tool|>", "7", "<|assistant|>"]
  filler = ["?"] * 60  # what the script says at forced columns: never written
  scripts = [
    ["####", "3", "<eos>"],  # 0: no call
    [LOOKUP_CALL, *filler[:4], "####", "7", "<eos>"],  # 1: a call, then the answer
    [BAD_CALL, *filler],  # 2: malformed (bad JSON)
    [CALLS["nope"], *filler],  # 3: unknown tool
    [CALLS["slow"], *filler],  # 4: times out
    [CALLS["boom"], *filler],  # 5: raises
    [LOOKUP_CALL, *filler[:4], LOOKUP_CALL, *filler[:4], LOOKUP_CALL, *filler],  # 6: calls every turn
    [LOOKUP_CALL, *filler],  # 7: the reply does not fit the budget
  ]
  tables = ["5", "7", "5", "5", "5", "5", "7", " ".join(["1"] * 70)]
  state, trajectories = run(tools, scripts, tables)
  assert {k: run.metrics[f"tools/{k}"] for k in ("timeouts", "raised", "unknown_tools", "malformed_calls")} == dict(
    timeouts=1, raised=1, unknown_tools=1, malformed_calls=1
  )
  loss = state.loss_mask
  # 0: one turn, as single-turn generation writes it.
  assert words(state, 0) == ["####", "3", "<eos>"] and loss[0, :3].tolist() == [1, 1, 1]
  assert (trajectories[0].num_turns, trajectories[0].tool_calls) == (2, 0)
  # 1: the turn ends at the call; the end of turn, the tool's reply and the generation prompt are forced, out of
  # the loss (log-prob 0); the answer is the policy's again.
  assert words(state, 1) == [LOOKUP_CALL, *forced_reply, "####", "7", "<eos>"]
  assert loss[1, :8].tolist() == [1, 0, 0, 0, 0, 1, 1, 1]
  assert (state.log_probs[1, 1:5] == 0).all() and (state.log_probs[1, [0, 5, 6, 7]] < 0.0).all()
  assert (trajectories[1].num_turns, trajectories[1].tool_calls, trajectories[1].tool_errors) == (4, 1, 0)
  # 2-5: an error text the policy reads in its tool turn, counted as a tool error; the trajectory goes on.
  for row in (2, 3, 4, 5):
    assert trajectories[row].tool_errors == 1 and trajectories[row].user_turns == 1, row
    assert words(state, row)[1:3] == ["<eos>", "<|tool|>"] and (loss[row, 1 : state.length[row]] == 0).sum() > 3
  # 6: max_assistant_turns=3: the third turn's call does not run.
  assert (trajectories[6].assistant_turns, trajectories[6].tool_calls, trajectories[6].num_turns) == (3, 2, 6)
  assert words(state, 6) == [LOOKUP_CALL, *forced_reply] * 2 + [LOOKUP_CALL]
  # 7: a reply that would reach the response budget ends the trajectory without it (verl's rule).
  assert words(state, 7) == [LOOKUP_CALL] and trajectories[7].tool_calls == 1 and trajectories[7].user_turns == 0
  # Nothing past each row's length.
  for row in range(len(scripts)):
    assert (state.responses[row, state.length[row] :] == 0).all() and (loss[row, state.length[row] :] == 0).all()


def test_max_user_turns_stops_after_the_answer_to_the_last_tool_turn(tools):
  scripts = [[LOOKUP_CALL, *["?"] * 4, LOOKUP_CALL, *["?"] * 20]]
  state, (trajectory,) = run(tools, scripts, ["7"], TurnLimits(max_user_turns=1))
  assert (trajectory.assistant_turns, trajectory.user_turns, trajectory.tool_calls) == (2, 1, 1)
  assert words(state, 0)[-1] == LOOKUP_CALL


def test_parallel_calls_run_together_and_the_extra_ones_are_dropped(tools):
  # Two calls allowed per turn: the turn goes on past a call to EOS; the third call of the turn is dropped.
  scripts = [[LOOKUP_CALL, LOOKUP_CALL, LOOKUP_CALL, "<eos>", *["?"] * 5, "####", "7", "<eos>"]]
  state, (trajectory,) = run(tools, scripts, ["7"], TurnLimits(max_parallel_calls=2))
  reply = ["<|tool|>", "7", "<|tool|>", "7", "<|assistant|>"]
  assert words(state, 0) == [LOOKUP_CALL] * 3 + ["<eos>", *reply, "####", "7", "<eos>"]
  assert (trajectory.tool_calls, trajectory.num_turns) == (2, 4)
  assert state.loss_mask[0, :12].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1]
