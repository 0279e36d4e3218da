import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxrlhf.data import BatchSchedule, DataError, build_dataset, load_rows
from jaxrlhf.data.builtin import RECALL_DATA_SOURCE, build_tokenizer, recall_rows
from jaxrlhf.trainer.reward import decode_responses, make_reward_fn


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  from transformers import AutoTokenizer

  path = tmp_path_factory.mktemp("tok")
  build_tokenizer(save_dir=str(path))
  return AutoTokenizer.from_pretrained(str(path))


def _row(content, truth="7", source=RECALL_DATA_SOURCE):
  return {
    "data_source": source,
    "prompt": [{"role": "user", "content": content}],
    "ability": "recall",
    "reward_model": {"style": "rule", "ground_truth": truth},
    "extra_info": {"index": 0},
  }


def test_tokenizer_round_trips_through_save_pretrained(tokenizer):
  text = tokenizer.apply_chat_template(
    [{"role": "user", "content": "last : 5 8 2 7"}], add_generation_prompt=True, tokenize=False
  )
  ids = tokenizer(text, add_special_tokens=False)["input_ids"]
  assert tokenizer.convert_ids_to_tokens(ids) == ["<|user|>", "last", ":", "5", "8", "2", "7", "<|assistant|>"]
  assert tokenizer.decode(tokenizer("#### 7")["input_ids"]) == "#### 7"


def test_parquet_and_jsonl_rows_are_left_padded(tmp_path, tokenizer):
  rows = [_row("last : 1 2 3 4"), _row("first : 9 9")]
  pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
  with open(tmp_path / "train.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  for name in ("train.parquet", "train.jsonl"):
    data = build_dataset(str(tmp_path / name), tokenizer, max_prompt_length=10)
    assert data.input_ids.shape == (2, 10)
    np.testing.assert_array_equal(data.attention_mask.sum(1), [8, 6])
    assert data.attention_mask[1, :4].sum() == 0 and data.input_ids[1, 0] == tokenizer.pad_token_id
    assert data.ground_truths == ["7", "7"] and data.data_sources == [RECALL_DATA_SOURCE] * 2


def test_overlong_prompts_truncate_filter_or_error(tmp_path, tokenizer):
  path = tmp_path / "rows.jsonl"
  path.write_text(json.dumps(_row("last : 1 2 3 4 5 6")) + "\n" + json.dumps(_row("first : 1")) + "\n")
  with pytest.raises(DataError, match="max_prompt_length=6"):
    build_dataset(str(path), tokenizer, max_prompt_length=6)
  filtered = build_dataset(str(path), tokenizer, max_prompt_length=6, filter_overlong_prompts=True)
  assert len(filtered) == 1 and filtered.num_filtered == 1
  left = build_dataset(str(path), tokenizer, max_prompt_length=6, truncation="left")
  assert tokenizer.convert_ids_to_tokens(left.input_ids[0].tolist())[-1] == "<|assistant|>"


def test_filtering_is_counted_and_a_too_small_dataset_counts_rows_before_and_after(tmp_path, tokenizer):
  path = tmp_path / "rows.jsonl"
  path.write_text("".join(json.dumps(_row(text)) + "\n" for text in ["last : 1 2 3 4 5 6"] * 3 + ["first : 1"]))
  filtered = build_dataset(str(path), tokenizer, max_prompt_length=6, filter_overlong_prompts=True)
  assert filtered.filtering_note("data.train_files") == (
    "data.train_files: data.filter_overlong_prompts dropped 3 of 4 rows (longer than data.max_prompt_length=6); 1 left"
  )
  assert build_dataset(str(path), tokenizer, max_prompt_length=20).filtering_note("data.train_files") is None
  with pytest.raises(
    DataError,
    match=r"^data.gen_batch_size=2 is larger than the dataset \(1 rows; 4 read, 3 "
    r"dropped by data.filter_overlong_prompts\)$",
  ):
    BatchSchedule(len(filtered), 2, seed=0, key="data.gen_batch_size", num_dropped=filtered.num_filtered)


def test_max_samples_keeps_a_seeded_subset_or_the_first_rows_before_tokenizing_and_filtering(tmp_path, tokenizer):
  """verl's data.train_max_samples / val_max_samples: with shuffle the rows numpy's generator of `seed` draws, in
  the order drawn; without, the first ones; <= 0 or more than the file holds: every row."""
  path = tmp_path / "rows.jsonl"
  lengths = [1, 6, 2, 6, 3, 6, 4, 1, 2, 3]  # digits per prompt: 6 digits is 10 tokens, over 8
  path.write_text(
    "".join(json.dumps(_row("last : " + " ".join("5" * n), truth=str(i))) + "\n" for i, n in enumerate(lengths))
  )
  drawn = np.random.default_rng(3).choice(10, 4, replace=False)
  subset = build_dataset(str(path), tokenizer, max_prompt_length=20, max_samples=4, seed=3)
  assert subset.ground_truths == [str(i) for i in drawn]
  np.testing.assert_array_equal(subset.attention_mask.sum(1), [lengths[i] + 4 for i in drawn])
  assert subset.sampling_note("data.train_files", "data.train_max_samples") == (
    "data.train_files: data.train_max_samples=4 uses 4 of its 10 rows"
  )
  first = build_dataset(
    str(path), tokenizer, max_prompt_length=8, max_samples=4, shuffle=False, filter_overlong_prompts=True
  )
  assert first.ground_truths == ["0", "2"] and first.num_filtered == 2  # chosen first, then filtered
  for every in (-1, 0, 10, 11):
    data = build_dataset(str(path), tokenizer, max_prompt_length=20, max_samples=every, seed=3)
    assert data.ground_truths == [str(i) for i in range(10)] and data.sampling_note("k", "m") is None


def test_row_errors_name_the_file_of_the_row_not_the_list_of_files(tmp_path, tokenizer):
  good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
  good.write_text(json.dumps(_row("first : 1")) + "\n")
  bad.write_text(json.dumps(_row("first : 1")) + "\n" + json.dumps({"prompt": "first : 2"}) + "\n")
  with pytest.raises(DataError, match=f"^{bad} row 1: missing column 'data_source'"):
    build_dataset((str(good), str(bad)), tokenizer, max_prompt_length=8)


def test_bytes_that_are_not_utf8_are_named_by_file_and_byte_offset(tmp_path, tokenizer):
  path = tmp_path / "latin1.jsonl"
  path.write_bytes(json.dumps(_row("first : 1")).encode() + b"\n" + b'{"prompt": "caf\xe9"}\n')
  offset = path.read_bytes().index(b"\xe9")
  with pytest.raises(DataError, match=f"^{path}: not UTF-8: byte 0xe9 at byte offset {offset} \\(line 2\\)$"):
    build_dataset(str(path), tokenizer, max_prompt_length=8)


def test_bad_inputs_name_file_and_column(tmp_path, tokenizer):
  with pytest.raises(DataError, match="missing.parquet"):
    load_rows(str(tmp_path / "missing.parquet"))
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"question": "x", "data_source": "gsm8k"}) + "\n")
  with pytest.raises(DataError, match="'prompt'"):
    build_dataset(str(bad), tokenizer, max_prompt_length=8)
  with pytest.raises(ValueError, match="unknown built-in task"):
    load_rows("builtin:nope:train")


def test_recall_split_is_disjoint_and_answers_are_right():
  train, test = recall_rows("train"), recall_rows("test")
  assert len(test) == 256 and len(train) == 2 * 10**4 - 256
  prompts = lambda rows: {r["prompt"][0]["content"] for r in rows}
  assert not prompts(train) & prompts(test)
  for row in test[:20]:
    which, _, *digits = row["prompt"][0]["content"].split()
    assert row["reward_model"]["ground_truth"] == (digits[0] if which == "first" else digits[-1])


def test_batch_schedule_is_deterministic_and_reshuffles_each_epoch():
  a, b = BatchSchedule(10, 4, seed=3), BatchSchedule(10, 4, seed=3)
  assert a.batches_per_epoch == 2  # drop_last
  np.testing.assert_array_equal(a.indices(5), b.indices(5))
  epoch0 = np.concatenate([a.indices(0), a.indices(1)])
  epoch1 = np.concatenate([a.indices(2), a.indices(3)])
  assert len(set(epoch0)) == 8 and len(set(epoch1)) == 8 and not np.array_equal(epoch0, epoch1)
  np.testing.assert_array_equal(BatchSchedule(10, 5, seed=0, shuffle=False).indices(1), np.arange(5, 10))


def test_reward_callback_decodes_and_scores_by_sample_index(tmp_path, tokenizer):
  import jax
  import jax.numpy as jnp

  rows = [_row("last : 1 2 3 7"), _row("first : 4 1 1 1", truth="4")]
  path = tmp_path / "rows.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  dataset = build_dataset(str(path), tokenizer, max_prompt_length=10)
  ids = lambda text: tokenizer(text)["input_ids"]
  responses = np.array([ids("#### 7 <eos>"), ids("#### 5 <eos>")], np.int32)
  mask = np.ones_like(responses)
  assert decode_responses(tokenizer, responses, mask) == ["#### 7", "#### 5"]
  reward_fn = jax.jit(make_reward_fn(tokenizer, dataset))
  scores, errors, null_ground_truths, components = reward_fn(
    jnp.asarray(responses), jnp.asarray(mask), jnp.asarray([0, 1], jnp.int32)
  )
  np.testing.assert_array_equal(np.asarray(null_ground_truths), [0.0, 0.0])
  assert components.shape == (0, 2)  # no GDPO reward components asked for
  np.testing.assert_array_equal(np.asarray(errors), [0.0, 0.0])
  np.testing.assert_array_equal(np.asarray(scores), [1.0, 0.0])


def test_a_restarted_schedule_continues_mid_epoch_with_the_same_rows():
  uninterrupted = BatchSchedule(100, 8, seed=5)
  rows = [uninterrupted.indices(k) for k in range(30)]  # crosses epochs (12 batches per epoch)
  restarted = BatchSchedule(100, 8, seed=5)  # a new process after resume knows only (seed, step)
  for k in range(17, 30):
    np.testing.assert_array_equal(restarted.indices(k), rows[k])
  assert not np.array_equal(BatchSchedule(100, 8, seed=6).indices(3), rows[3])


def test_process_rows_split_a_global_batch():
  from jaxrlhf.data import process_rows

  indices = np.arange(10, 18)
  np.testing.assert_array_equal(np.concatenate([process_rows(indices, p, 4) for p in range(4)]), indices)
  with pytest.raises(DataError, match="does not split over 3 processes"):
    process_rows(indices, 0, 3)
