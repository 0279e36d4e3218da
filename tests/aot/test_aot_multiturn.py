"""`jaxrlhf.aot` for a multi-turn rollout: the programs the run compiles (the generation weights, the prefill, one
turn, the reward, the training phases) for an H100 node, with the train state resident beside generation."""

import pytest

from tests.aot.test_aot import config_text, run_aot

MULTI_TURN = (
  config_text((512, 64, 128, 2, 8, 8), (8, 8, 16), "grpo", (1, 8, 1)).replace("  return c\n", "")
  + """
  c.actor_rollout_ref.rollout.n = 2
  c.actor_rollout_ref.rollout.multi_turn.enable = True
  c.actor_rollout_ref.rollout.multi_turn.tool_config_path = "builtin:lookup"
  return c
"""
)


@pytest.mark.slow
def test_a_multi_turn_recipe_compiles_its_turn_programs(tmp_path):
  result, report = run_aot(tmp_path, MULTI_TURN, "--target", "h100x8")
  assert result.returncode == 0, result.stderr[-3000:]
  assert report["mode"] == "multi-turn, fused" and report["fits"]
  programs = {p["name"]: p for p in report["programs"]}
  assert list(programs) == ["gen_weights", "gen_prefill", "gen_turn", "reward", "train"]
  # A turn updates the donated trajectory state (its KV cache) in place, and the train state stays resident.
  turn = programs["gen_turn"]
  assert turn["alias_bytes"] > 0 and turn["resident_bytes"] == report["state_bytes_per_device"]
  assert programs["gen_prefill"]["resident_bytes"] == report["state_bytes_per_device"]
  assert "gen_turn" in result.stdout and "multi-turn, fused step" in result.stdout
