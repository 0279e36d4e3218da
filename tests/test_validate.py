"""The validation pass's own checks, in this process (docs/guarantees.md; tests/cli/test_bad_input.py runs them
through the command lines): output paths that cannot be written, lengths beyond the model, memory before padding."""

import dataclasses
import json
import os
import tempfile

import pytest

from jaxrlhf.config import ConfigError, load_config_file, resolve_config
from jaxrlhf.errors import UserError
from jaxrlhf.export import export_checkpoint
from jaxrlhf.generate import parse_args
from jaxrlhf.generate import run as generate_run
from jaxrlhf.models import DecoderConfig, hf_config_dict
from jaxrlhf.validate import check_lengths, check_writable

QUICKSTART = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "quickstart.py")


def _quickstart(**overrides):
  config = load_config_file(QUICKSTART)
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return resolve_config(config)


def _refuses_root() -> bool:
  """Whether /sys refuses a new folder even to root (sysfs does, where it is mounted)."""
  try:
    os.rmdir(tempfile.mkdtemp(dir="/sys"))
  except OSError:
    return True
  return False


def test_a_path_under_a_file_is_named(tmp_path):
  (tmp_path / "notes.txt").write_text("")
  with pytest.raises(UserError, match=f"trainer.default_local_dir='x': {tmp_path}/notes.txt is a file, not a dir"):
    check_writable("trainer.default_local_dir='x'", str(tmp_path / "notes.txt" / "runs" / "exp"))
  check_writable("ok", str(tmp_path / "new" / "deeper"))  # missing folders are fine: they are made later
  assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # and the check leaves nothing behind


@pytest.mark.skipif(not _refuses_root(), reason="no folder here that refuses new entries to this user")
def test_a_location_that_refuses_writes_is_named_even_to_root():
  with pytest.raises(UserError, match="trainer.default_local_dir='/sys/runs': /sys is not writable"):
    check_writable("trainer.default_local_dir='/sys/runs'", "/sys/runs/quickstart/recall_ppo")


def test_a_folder_without_write_permission_is_named(tmp_path, monkeypatch):
  """What a non-root user meets on a read-only folder (root passes permission bits, so the refusal is simulated)."""

  def refuse(**kwargs):
    raise PermissionError(13, "Permission denied")

  monkeypatch.setattr(tempfile, "mkdtemp", refuse)
  with pytest.raises(UserError, match=f"--out '{tmp_path}/o': {tmp_path} is not writable \\(Permission denied\\)"):
    check_writable(f"--out '{tmp_path}/o'", str(tmp_path / "o"))


def test_export_and_generate_check_their_outputs_first(tmp_path):
  (tmp_path / "file").write_text("")
  with pytest.raises(UserError, match=f"--out '{tmp_path}/file/actor': {tmp_path}/file is a file, not a directory"):
    export_checkpoint(str(tmp_path / "run" / "global_step_1"), str(tmp_path / "file" / "actor"))
  (tmp_path / "prompts.txt").write_text("first : 1 2\n")
  for output, problem in (("file/out.jsonl", "file is a file, not a directory"), ("", "is a directory, not a file")):
    args = parse_args(
      [
        "--model",
        str(tmp_path / "no_model"),
        "--prompts",
        str(tmp_path / "prompts.txt"),
        "--output",
        str(tmp_path / output),
      ]
    )
    with pytest.raises(UserError, match=problem):  # before the model (which does not exist) is looked at
      generate_run(args)


def test_prompt_and_response_beyond_the_models_positions_unless_rope_scaled(tmp_path):
  config = _quickstart(**{"data.max_response_length": 60})
  with pytest.raises(
    ConfigError, match="12 \\+ 60 = 72 tokens is more than actor_rollout_ref.model's max_position_embeddings=64"
  ):
    check_lengths(config, num_rows=100)
  model = DecoderConfig(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
  )
  for rope_type, refused in (("default", True), ("linear", False)):
    path = tmp_path / rope_type
    os.makedirs(path)
    scaled = dataclasses.replace(model, rope_type=rope_type, rope_factor=4.0 if rope_type == "linear" else 1.0)
    (path / "config.json").write_text(json.dumps(hf_config_dict(scaled)))
    config = _quickstart(**{"data.max_response_length": 60, "actor_rollout_ref.model.path": str(path)})
    for key in config.actor_rollout_ref.model.override_config.keys():
      config.actor_rollout_ref.model.override_config[key] = None
    if refused:
      with pytest.raises(ConfigError, match="max_position_embeddings=64"):
        check_lengths(config, num_rows=100)
    else:
      check_lengths(config, num_rows=100)


def test_prompts_padded_beyond_the_machines_memory_are_refused_before_padding():
  config = _quickstart(
    **{"data.max_prompt_length": 10**9, "actor_rollout_ref.model.override_config.max_position_embeddings": 10**12}
  )
  with pytest.raises(ConfigError) as error:
    check_lengths(config, num_rows=20_000)
  message = str(error.value)
  assert message.startswith("the run needs at least ")
  assert "the prompts padded to data.max_prompt_length=1000000000 (20,000 rows): 145.5 TiB" in message
  assert "more than this machine's" in message


def test_a_from_scratch_model_without_its_sizes_is_a_config_error():
  config = resolve_config(load_config_file(QUICKSTART))
  config.actor_rollout_ref.model.override_config.hidden_size = None
  with pytest.raises(ConfigError, match=r"actor_rollout_ref.model: model config is missing \['hidden_size'\]"):
    check_lengths(config, num_rows=100)
