"""The GSM8K answer-checking tool, verl's `Gsm8kTool` (verl 0.7's verl/tools/gsm8k_tool.py, removed from verl in 0.8).

The policy submits its answer through the tool and reads back how it scored. Each instance holds the
trajectory's ground truth (`create_kwargs.ground_truth`), the last answer submitted and its reward. `execute`
scores the answer with the GSM8K rule (`jaxrlhf.rewards.gsm8k`, flexible extraction, 1.0 or 0.0) and returns a
step reward of 0.0 when the answer scores higher than the instance's previous one, else `NON_IMPROVING_PENALTY`.

The runner creates an instance per call (verl's agent loop does the same), so within a rollout the previous
reward is always 0.0: a right answer gets 0.0, a wrong one -0.05. An instance kept across calls (a tool driven
directly) also penalises resubmitting a right answer.
"""

from __future__ import annotations

import uuid
from typing import Any

from jaxrlhf.rewards import gsm8k as gsm8k_reward
from jaxrlhf.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolResponse, create_kwarg

NON_IMPROVING_PENALTY = -0.05  # verl's step reward for a submission that does not beat the previous one


class Gsm8kTool(BaseTool):
  """Scores a submitted GSM8K answer (parameter `answer`) against the trajectory's ground truth."""

  def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
    super().__init__(config, tool_schema)
    self._instances: dict[str, dict[str, Any]] = {}

  async def create(
    self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs
  ) -> tuple[str, ToolResponse]:
    if instance_id is None:
      instance_id = str(uuid.uuid4())
    if ground_truth is None:
      ground_truth = create_kwarg(kwargs, "ground_truth")
    self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
    return instance_id, ToolResponse()

  async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
    answer = parameters.get("answer", "")
    answer = answer if isinstance(answer, str) else str(answer)
    instance = self._instances[instance_id]
    # Scored as a strict-format response would be: the answer behind "#### ".
    instance["response"] = answer if answer.startswith("#### ") else "#### " + answer
    reward = await self.calc_reward(instance_id)
    step_reward = 0.0 if reward > instance["reward"] else NON_IMPROVING_PENALTY
    instance["reward"] = reward
    return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward!r}"), step_reward, {}

  async def calc_reward(self, instance_id: str, **kwargs) -> float:
    instance = self._instances[instance_id]
    if instance["ground_truth"] is None:  # no ground truth for this row: nothing can be right
      return 0.0
    return gsm8k_reward.compute_score(
      instance["response"], instance["ground_truth"], method="flexible", format_score=0.0, score=1.0
    )

  async def release(self, instance_id: str, **kwargs) -> None:
    self._instances.pop(instance_id, None)
