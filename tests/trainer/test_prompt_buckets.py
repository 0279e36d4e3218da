"""Prompts padded per batch to a length bucket (`data.bucket_prompt_lengths`): same numbers as padding every
prompt to `max_prompt_length`, one compiled step per bucket used."""

import json

import jax
import numpy as np
import pytest

from jaxrlhf.data import batch_arrays, build_dataset
from jaxrlhf.data.builtin import RECALL_DATA_SOURCE, build_tokenizer
from jaxrlhf.rollout import prompt_length_buckets
from jaxrlhf.trainer import Trainer
from jaxrlhf.trainer.phased import select_groups
from tests.helpers import TIMING_DEPENDENT, programs_built, rollout_of, scored_of, small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
MAX_PROMPT_LENGTH = 40  # buckets 16, 32, 40


def _list_lengths(num_batches: int) -> list[int]:
  """Digits per prompt (a prompt is 4 + digits tokens): even batches of 8 fit bucket 16, odd ones need 32."""
  lengths = []
  for batch in range(num_batches):
    lengths += [2, 5, 8, 12, 3, 7, 9, 1] if batch % 2 == 0 else [20, 4, 6, 10, 2, 11, 8, 3]
  return lengths


def _write_rows(path, lengths) -> str:
  rng = np.random.default_rng(0)
  with open(path, "w") as f:
    for i, length in enumerate(lengths):
      digits = rng.integers(0, 10, length)
      f.write(
        json.dumps(
          {
            "data_source": RECALL_DATA_SOURCE,
            "prompt": [{"role": "user", "content": "last : " + " ".join(map(str, digits))}],
            "reward_model": {"style": "rule", "ground_truth": str(digits[-1])},
            "extra_info": {"index": i},
          }
        )
        + "\n"
      )
  return str(path)


def _config(tmp_path, bucketed: bool, **overrides):
  train = _write_rows(tmp_path / "train.jsonl", _list_lengths(4))
  val = _write_rows(tmp_path / "val.jsonl", _list_lengths(2)[3:])  # 13 rows: batches of 8 and 5 (+3 repeats)
  return small_config(
    tmp_path / str(bucketed),
    **{
      "mesh.fsdp": 1,
      "data.train_files": (train,),
      "data.val_files": (val,),
      "data.val_batch_size": 8,
      "data.shuffle": False,
      "data.max_prompt_length": MAX_PROMPT_LENGTH,
      "data.bucket_prompt_lengths": bucketed,
      **overrides,
    },
  )


def _assert_same_metrics(a: dict, b: dict, where: str):
  assert set(a) == set(b), where
  for key, value in a.items():
    if not key.startswith(TIMING_DEPENDENT):
      np.testing.assert_allclose(b[key], value, rtol=1e-5, atol=1e-5, err_msg=f"{where} {key}")


def test_buckets_stop_at_the_maximum_and_batches_keep_the_last_columns(tmp_path):
  assert prompt_length_buckets(40) == (16, 32, 40)
  assert prompt_length_buckets(12) == (12,)
  assert prompt_length_buckets(64) == (16, 32, 64)
  data = build_dataset(
    _write_rows(tmp_path / "rows.jsonl", [2, 9]), build_tokenizer(), max_prompt_length=MAX_PROMPT_LENGTH
  )
  full, narrow = batch_arrays(data, np.array([0, 1])), batch_arrays(data, np.array([0, 1]), 16)
  assert narrow["input_ids"].shape == (2, 16)
  np.testing.assert_array_equal(narrow["input_ids"], full["input_ids"][:, -16:])
  np.testing.assert_array_equal(narrow["attention_mask"].sum(1), full["attention_mask"].sum(1))
  with pytest.raises(ValueError, match="longest prompt"):
    batch_arrays(data, np.array([0, 1]), 8)


def test_dapo_rounds_of_different_widths_join_left_padded():
  groups = np.array([0, 0, 1, 1])
  scores = np.array([0, 1, 1, 0], np.float32)
  responses = np.ones((4, 3), np.int32)
  round_of = lambda width: (
    rollout_of(np.full((4, width), 7), np.ones((4, width), np.int32), responses, responses, group_index=groups),
    scored_of(scores),
  )
  picked, _ = select_groups([round_of(16), round_of(32)], 4, "score", pad_token_id=0)
  assert picked.prompts.shape == (8, 32)
  np.testing.assert_array_equal(picked.prompt_mask.sum(1), [16] * 4 + [32] * 4)
  assert (picked.prompts[:4, :16] == 0).all() and (picked.prompts[:4, 16:] == 7).all()


def test_bucketed_prompts_give_the_metrics_of_full_padding_with_one_step_program_per_bucket(tmp_path):
  full = Trainer(_config(tmp_path, False), devices=jax.devices()[:1])
  bucketed = Trainer(_config(tmp_path, True), devices=jax.devices()[:1])
  widths = [
    bucketed._load_batch(bucketed.train_data, bucketed.schedule.indices(s))["input_ids"].shape[1] for s in range(4)
  ]
  assert widths == [16, 32, 16, 32]
  for step in range(2):  # bucket 16, then 32
    _assert_same_metrics(full.train_step(step), bucketed.train_step(step), f"step {step}")
  _assert_same_metrics(full.validate(), bucketed.validate(), "validation")
  with programs_built() as events:
    bucketed.train_step(2)
    bucketed.train_step(3)
  assert events == [], f"steps on buckets already used compiled {len(events)} program(s)"
  assert bucketed.jitted_step._cache_size() == 2


def test_phased_dapo_rounds_with_bucketed_prompts_give_the_metrics_of_full_padding(tmp_path):
  dapo = {
    "trainer.fuse_step": False,
    "algorithm.adv_estimator": "grpo",
    "algorithm.filter_groups.enable": True,
    "data.gen_batch_size": 8,
    "data.train_batch_size": 4,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
    "reward_model.overlong_buffer.enable": True,
    "reward_model.overlong_buffer.len": 1,
    "algorithm.filter_groups.max_num_gen_batches": 50,
    "trainer.val_before_train": False,
  }
  full = Trainer(_config(tmp_path, False, **dapo), devices=jax.devices()[:1])
  bucketed = Trainer(_config(tmp_path, True, **dapo), devices=jax.devices()[:1])
  for step in range(2):
    _assert_same_metrics(full.train_step(step), bucketed.train_step(step), f"step {step}")
  assert full.gen_cursor == bucketed.gen_cursor
