"""`MicroBatcher` as a table: verl's batch keys, the device count and sequence parallelism -> the micro-batches
of an update and of a forward-only phase (no compile)."""

import pytest

from jaxrlhf.config import get_base_config
from jaxrlhf.trainer.packing import MicroBatching
from jaxrlhf.trainer.update_loop import MicroBatcher

ACTOR = "actor_rollout_ref.actor"


def batcher(shards=8, sp=None, **keys):
  """Base config: 1024 prompts x `rollout.n`=4 here, mini-batches of 256 prompts (1024 sequences)."""
  config = get_base_config()
  config.actor_rollout_ref.rollout.n = 4
  for key, value in keys.items():
    node = config
    *parents, leaf = key.split("__")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config, MicroBatcher(config, num_batch_shards=shards, sequence_parallel=sp)


# (keys, batch shards, sequence parallel, seq_len, packed) -> (rows, num_micro, shards)
UPDATE_TABLE = [
  ({}, 8, None, 512, False, (1024, 1, 8)),  # no micro-batch size: the mini-batch at once
  ({"actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": 4}, 8, None, 512, False, (32, 32, 8)),
  ({"actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": 4}, 1, None, 512, True, (4, 256, 1)),
  # a sequence-parallel group of 4 devices shares its rows: 2 batch shards
  ({"actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": 4}, 8, {ACTOR: 4}, 512, False, (8, 128, 2)),
  # token budget (use_dynamic_bsz): 4096 tokens per device / 512 = 8 rows a shard
  (
    {
      "actor_rollout_ref__actor__use_dynamic_bsz": True,
      "actor_rollout_ref__actor__ppo_max_token_len_per_gpu": 4096,
      "actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": 1,
    },
    8,
    None,
    512,
    False,
    (64, 16, 8),
  ),
  # ... and a sequence-parallel group holds S / sp of a row per device: 4x the rows of the group
  (
    {"actor_rollout_ref__actor__use_dynamic_bsz": True, "actor_rollout_ref__actor__ppo_max_token_len_per_gpu": 4096},
    8,
    {ACTOR: 4},
    512,
    False,
    (64, 16, 2),
  ),
  # a budget above the mini-batch caps at the mini-batch
  (
    {"actor_rollout_ref__actor__use_dynamic_bsz": True, "actor_rollout_ref__actor__ppo_max_token_len_per_gpu": 10**7},
    8,
    None,
    512,
    False,
    (1024, 1, 8),
  ),
]


@pytest.mark.parametrize("keys, shards, sp, seq_len, packed, expected", UPDATE_TABLE)
def test_update_plan(keys, shards, sp, seq_len, packed, expected):
  config, micro = batcher(shards, sp, **keys)
  plan = micro.update_plan(config.actor_rollout_ref.actor, ACTOR, seq_len, packed)
  assert (plan.rows, plan.num_micro, plan.shards, plan.packed) == (*expected, packed)
  assert plan.rows * plan.num_micro >= config.actor_rollout_ref.actor.ppo_mini_batch_size * 4


def test_a_micro_batch_that_does_not_divide_the_mini_batch_names_the_key():
  config, micro = batcher(8, None, actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=3)
  with pytest.raises(
    ValueError,
    match=r"actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu=3 x 8 batch shards "
    r"= 24 rows does not divide the mini-batch of 1024 sequences",
  ):
    micro.update_plan(config.actor_rollout_ref.actor, ACTOR, 512, False)


def test_forward_phases_fall_back_to_the_rollout_log_prob_key():
  config, micro = batcher(
    8,
    None,
    actor_rollout_ref__rollout__log_prob_micro_batch_size_per_gpu=16,
    critic__forward_micro_batch_size_per_gpu=2,
  )
  assert micro.forward_micro_per_device == {"old_log_prob": 16, "ref": 16, "values": 2}


# forward-only phase over the whole batch of 4096 sequences: (micro_per_device, packed) -> plan
@pytest.mark.parametrize(
  "micro_per_device, packed, expected",
  [
    (None, False, None),  # padded rows at once
    (16, False, MicroBatching(rows=128, num_micro=32, shards=8, packed=False)),
    (12, True, MicroBatching(rows=96, num_micro=43, shards=8, packed=True)),  # the last one partly empty
    (None, True, MicroBatching(rows=1024, num_micro=4, shards=8, packed=True, padded_at_once=True)),
  ],
)
def test_phase_plan(micro_per_device, packed, expected):
  config, micro = batcher(8)
  assert micro.phase_plan(config.actor_rollout_ref.actor, ACTOR, 4096, 512, packed, micro_per_device) == expected
