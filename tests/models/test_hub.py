"""Hugging Face Hub model ids as model paths (`jaxrlhf.models.hub`), offline, on a hub cache built here.

The cache has huggingface_hub's layout (`models--org--name/snapshots/<commit>/` holding the files,
`refs/main` naming the commit) with a tiny real checkpoint in it; `HF_HUB_OFFLINE=1` keeps every lookup
in the cache, as it would on a machine without the Hub.
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import pytest

from jaxrlhf.config import resolve_config
from jaxrlhf.data.builtin import build_tokenizer
from jaxrlhf.errors import UserError
from jaxrlhf.models import Decoder, DecoderConfig, init_params, save_hf_checkpoint
from jaxrlhf.models.hub import download_patterns, hub_id_of, parse_hub_id, resolve_model_path, resolve_model_paths
from jaxrlhf.trainer.trainer import tokenizer_from_config
from jaxrlhf.validate import validate_run
from tests.helpers import small_config, subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COUNTER = os.path.join(ROOT, "tests", "cli", "count_compiles.py")
ACTOR, CRITIC = "TinyOrg/tiny-chat", "TinyOrg/tiny-critic"
COMMIT, OLD_COMMIT = "a" * 40, "b" * 40
# The quickstart's model and built-in tokenizer, as an HF checkpoint directory.
MODEL = DecoderConfig(
  vocab_size=64,
  hidden_size=64,
  intermediate_size=128,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  tie_word_embeddings=True,
  max_position_embeddings=64,
)


def put_in_cache(cache, repo_id: str, source_dir, commit: str = COMMIT, ref: str | None = "main", files=None) -> str:
  """`source_dir`'s files (or only `files`) as the snapshot `commit` of `repo_id` in the hub cache `cache`."""
  repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
  snapshot = os.path.join(repo, "snapshots", commit)
  os.makedirs(snapshot)
  for file in files or os.listdir(source_dir):
    shutil.copy(os.path.join(source_dir, file), snapshot)
  if ref:
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", ref), "w") as f:
      f.write(commit)
  return snapshot


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """A tiny real HF checkpoint: config.json, model.safetensors, the built-in tokenizer's files."""
  path = str(tmp_path_factory.mktemp("hf") / "tiny")
  save_hf_checkpoint(init_params(Decoder(MODEL), jax.random.key(0))[0], MODEL, path)
  build_tokenizer(save_dir=path)
  return path


@pytest.fixture
def cache(checkpoint, tmp_path, monkeypatch):
  """A hub cache holding ACTOR (commits COMMIT = main and OLD_COMMIT) and CRITIC; offline; cwd a fresh folder."""
  cache = str(tmp_path / "hub")
  put_in_cache(cache, ACTOR, checkpoint)
  put_in_cache(cache, ACTOR, checkpoint, commit=OLD_COMMIT, ref=None)
  put_in_cache(cache, CRITIC, checkpoint)
  monkeypatch.setenv("HF_HUB_CACHE", cache)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.chdir(tmp_path)
  return cache


def snapshot_of(cache, repo_id, commit=COMMIT):
  return os.path.join(cache, "models--" + repo_id.replace("/", "--"), "snapshots", commit)


@pytest.mark.parametrize(
  "path, expected",
  [
    ("Qwen/Qwen2.5-7B-Instruct", ("Qwen/Qwen2.5-7B-Instruct", None)),
    ("meta-llama/Llama-3.1-8B@v1.0", ("meta-llama/Llama-3.1-8B", "v1.0")),
    ("Qwen/Qwen2.5-7B-Instruct@", None),  # an empty revision
    ("models/a/b", None),
    ("./models/qwen", None),
    ("../models/qwen", None),
    ("/models/qwen", None),
    ("~/models/qwen", None),
    ("qwen", None),
    ("builtin:recall", None),
    ("org--x/name", None),
    ("", None),
  ],
)
def test_what_reads_as_a_hub_id(path, expected):
  assert parse_hub_id(path) == expected


def test_a_download_takes_config_tokenizer_and_safetensors_only():
  from huggingface_hub.utils import filter_repo_objects

  repo = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "qwen.tiktoken",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    # never: pickles, code, other formats in subfolders, Mistral's duplicate of the weights, docs
    "pytorch_model.bin",
    "training_args.bin",
    "optimizer.pt",
    "modeling_qwen.py",
    "original/consolidated.00.pth",
    "onnx/model.safetensors",
    "consolidated.safetensors",
    "params.json",
    "README.md",
    ".gitattributes",
  ]
  for weights, expected in ((True, repo[:11]), (False, repo[:8])):
    allow_patterns, ignore_patterns = download_patterns(weights)
    assert list(filter_repo_objects(repo, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns)) == expected


def test_an_id_resolves_to_its_cached_snapshot_with_or_without_weights(cache):
  assert resolve_model_path(ACTOR, "actor_rollout_ref.model.path") == snapshot_of(cache, ACTOR)
  assert resolve_model_path(ACTOR, "data.tokenizer", weights=False) == snapshot_of(cache, ACTOR)
  assert resolve_model_path(f"{ACTOR}@{OLD_COMMIT}", "critic.model.path") == snapshot_of(cache, ACTOR, OLD_COMMIT)


def test_the_cache_is_found_through_hf_home_too(cache, tmp_path, monkeypatch):
  monkeypatch.delenv("HF_HUB_CACHE")
  monkeypatch.setenv("HF_HOME", str(tmp_path))  # its hub/ folder is the cache
  assert resolve_model_path(ACTOR, "actor_rollout_ref.model.path") == snapshot_of(cache, ACTOR)


def test_a_path_that_exists_wins_over_an_id(cache, checkpoint):
  os.makedirs(ACTOR)  # ./TinyOrg/tiny-chat, a local directory named like the id
  assert resolve_model_path(ACTOR, "actor_rollout_ref.model.path") == ACTOR
  assert resolve_model_path(checkpoint, "actor_rollout_ref.model.path") == checkpoint
  assert resolve_model_path("", "critic.model.path") == ""  # unset: the caller's default


def test_a_missing_id_is_one_line_naming_the_key_and_the_id(cache):
  with pytest.raises(UserError) as error:
    resolve_model_path("Qwen/Qwen2.5-7B-Instruct", "actor_rollout_ref.model.path")
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(
    "actor_rollout_ref.model.path='Qwen/Qwen2.5-7B-Instruct' is neither a local directory "
    "nor a Hugging Face Hub model 'Qwen/Qwen2.5-7B-Instruct' in the cache"
  )
  assert cache in message and "HF_HUB_OFFLINE=1" in message
  assert "check its spelling" in error.value.hint and "hf download Qwen/Qwen2.5-7B-Instruct" in error.value.hint
  with pytest.raises(UserError, match=r"critic.model.path='TinyOrg/tiny-chat@v2' .* at revision 'v2'"):
    resolve_model_path(f"{ACTOR}@v2", "critic.model.path")  # no refs/v2 in the cache


def test_org_slash_name_under_an_existing_local_folder_is_a_mistyped_path(cache):
  os.makedirs("models")
  with pytest.raises(
    UserError,
    match=r"^actor_rollout_ref.model.path='models/qwen' does not exist \(read as a local "
    r"path since ./models is a directory",
  ):
    resolve_model_path("models/qwen", "actor_rollout_ref.model.path")


def test_a_path_that_is_not_an_id_comes_back_for_its_own_check(cache):
  for path in ("./models/qwen", "/nowhere/qwen", "builtin:recall", "qwen"):
    assert resolve_model_path(path, "actor_rollout_ref.model.path") == path


def test_a_snapshot_path_of_another_machine_resolves_by_id_and_commit(cache):
  elsewhere = f"/home/someone/.cache/huggingface/hub/models--TinyOrg--tiny-chat/snapshots/{OLD_COMMIT}"
  assert hub_id_of(elsewhere) == ACTOR and hub_id_of("/data/models/qwen") is None
  assert resolve_model_path(elsewhere, "actor_rollout_ref.model.path") == snapshot_of(cache, ACTOR, OLD_COMMIT)


def test_a_cached_snapshot_without_safetensors_serves_a_tokenizer_not_weights(cache, checkpoint):
  put_in_cache(
    cache, "TinyOrg/config-only", checkpoint, files=["config.json", "tokenizer.json", "tokenizer_config.json"]
  )
  assert resolve_model_path("TinyOrg/config-only", "data.tokenizer", weights=False).endswith(COMMIT)
  with pytest.raises(UserError, match=r"reward_model.model.path='TinyOrg/config-only': .* has no \*.safetensors"):
    resolve_model_path("TinyOrg/config-only", "reward_model.model.path")


def _hf_config(tmp_path, **overrides):
  """The small test config on an HF checkpoint: override_config cleared, so config.json defines the model."""
  config = small_config(tmp_path, **overrides)
  for key in config.actor_rollout_ref.model.override_config.keys():
    config.actor_rollout_ref.model.override_config[key] = None
  return config


def test_validation_resolves_actor_critic_and_tokenizer_ids_in_the_config(cache, tmp_path):
  config = resolve_config(
    _hf_config(
      tmp_path,
      **{
        "actor_rollout_ref.model.path": ACTOR,
        "critic.enable": True,
        "critic.model.path": CRITIC,
        "data.tokenizer": f"{ACTOR}@{OLD_COMMIT}",
      },
    )
  )
  validate_run(config)  # the models' shapes are checked on the snapshots
  assert config.actor_rollout_ref.model.path == snapshot_of(cache, ACTOR)
  assert config.critic.model.path == snapshot_of(cache, CRITIC)
  assert config.data.tokenizer == snapshot_of(cache, ACTOR, OLD_COMMIT)
  assert tokenizer_from_config(config, str(tmp_path / "unused")).get_vocab() == build_tokenizer().get_vocab()
  # The reward model's path too (its head is not checked here: the tiny checkpoint is a causal LM).
  config = resolve_config(_hf_config(tmp_path, **{"reward_model.enable": True, "reward_model.model.path": CRITIC}))
  resolve_model_paths(config)
  assert config.reward_model.model.path == snapshot_of(cache, CRITIC)


def test_a_missing_critic_id_fails_validation_naming_its_key(cache, tmp_path):
  config = resolve_config(
    _hf_config(
      tmp_path,
      **{"actor_rollout_ref.model.path": ACTOR, "critic.enable": True, "critic.model.path": "TinyOrg/no-such-critic"},
    )
  )
  with pytest.raises(UserError, match=r"^critic.model.path='TinyOrg/no-such-critic' is neither"):
    validate_run(config)


def _run(cache, *args):
  env = subprocess_env(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1")
  return subprocess.run(
    [sys.executable, COUNTER, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
  )


def test_generate_and_train_take_an_id_end_to_end(cache, tmp_path):
  """`jaxrlhf.generate --model org/name` generates from the cached snapshot; train.py passes the id's model
  and tokenizer checks (it stops at the data file, before compiling) and names a missing id in one line."""
  (tmp_path / "prompts.txt").write_text("first : 1 2 3\n")
  result = _run(
    cache,
    "-m",
    "jaxrlhf.generate",
    "--model",
    ACTOR,
    "--prompts",
    tmp_path / "prompts.txt",
    "--output",
    tmp_path / "out.jsonl",
    "--temperature",
    "0",
    "--max_new_tokens",
    "2",
  )
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "out.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) == 1 and 1 <= len(rows[0]["response_ids"]) <= 2

  (tmp_path / "quickstart_hf.py").write_text(
    "from jaxrlhf.config import load_config_file\n\n\ndef get_config():\n"
    f"  config = load_config_file({os.path.join(ROOT, 'configs', 'quickstart.py')!r})\n"
    "  for key in config.actor_rollout_ref.model.override_config.keys():\n"
    "    config.actor_rollout_ref.model.override_config[key] = None\n  return config\n"
  )
  train = lambda path: _run(
    cache,
    "train.py",
    "--config",
    tmp_path / "quickstart_hf.py",
    f"--config.trainer.default_local_dir={tmp_path / 'runs'}",
    f"--config.actor_rollout_ref.model.path={path}",
    f"--config.data.train_files=('{tmp_path}/missing.parquet',)",
  )
  for path, error in (
    (ACTOR, f"data.train_files: data file '{tmp_path}/missing.parquet' does not exist"),
    ("TinyOrg/no-such-model", "actor_rollout_ref.model.path='TinyOrg/no-such-model' is neither"),
  ):
    result = train(path)
    lines = [line for line in result.stderr.splitlines() if line.startswith("train.py:")]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].startswith(f"train.py: error: {error}"), lines
    assert result.stderr.splitlines()[-1] == "[compiled] 0"
