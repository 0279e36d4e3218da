"""Hugging Face Hub model ids as model paths: `Qwen/Qwen2.5-7B-Instruct` -> a local snapshot directory.

verl's run scripts name their models by Hub id (`actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct`).
A run resolves its model and tokenizer paths once, before validation (`resolve_model_paths`), and from then
on every reader sees a local directory. The resolved config (the run's config.json, its checkpoints) holds
the snapshot directory, `<cache>/models--Qwen--Qwen2.5-7B-Instruct/snapshots/<commit>`, which names the id
and the exact commit; on a machine whose cache lacks that directory it is looked up again by id and commit.

Which string is an id: a path that exists is a path. Otherwise `org/name` or `org/name@revision` (one slash,
the Hub's own id rules; a revision is a branch, tag or commit) is an id, unless `./org` is a directory: then it
is a local path with a typo (`models/qwen` when models/ exists). Absolute paths, `./x`, `~/x` and deeper paths
are always paths.

Downloads go through huggingface_hub and its cache (`HF_HUB_CACHE`, else `$HF_HOME/hub`; `HF_HUB_OFFLINE=1`
reads the cache only; `HF_TOKEN` for gated models) and fetch only config.json, the tokenizer and generation
config files and the top-level safetensors weights with their index: never pickled weights (.bin, .pt) nor
repository code.
"""

from __future__ import annotations

import glob
import os
import re

from jaxrlhf.errors import UserError
from jaxrlhf.models.hf_io import MODEL_DIR_FILES, TOKENIZER_SUFFIXES

_CONFIG_FILES = ("config.json", *MODEL_DIR_FILES, *(f"*{suffix}" for suffix in TOKENIZER_SUFFIXES))
_WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json")
# Subfolders hold other formats (original/, onnx/); Mistral's consolidated*.safetensors duplicate the HF-named
# weights (hf_io skips them too).
_IGNORED_FILES = ("*/*", "consolidated*")
_SNAPSHOT_DIR = re.compile(r"models--(?P<org>[^/]+)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})/?$")
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's spelling of a true environment variable


def hub_id_of(path: str) -> str | None:
  """The Hub id whose cached snapshot `path` is (`.../models--org--name/snapshots/<commit>`), else None."""
  match = _SNAPSHOT_DIR.search(path.replace(os.sep, "/"))
  return f"{match['org']}/{match['name']}" if match else None


def parse_hub_id(path: str) -> tuple[str, str | None] | None:
  """(repo id, revision or None) when `path` has the form of a Hub model id `org/name[@revision]`, else None."""
  from huggingface_hub.errors import HFValidationError
  from huggingface_hub.utils import validate_repo_id

  repo_id, at, revision = path.partition("@")
  if repo_id.count("/") != 1 or (at and not revision):
    return None
  try:
    validate_repo_id(repo_id)
  except HFValidationError:
    return None
  return repo_id, revision or None


def download_patterns(weights: bool) -> tuple[list[str], list[str]]:
  """(allow_patterns, ignore_patterns) of a download: config, tokenizer and generation config files, and with
  `weights` the top-level safetensors and their index; nothing else (no .bin/.pt pickles, no code)."""
  return [*_CONFIG_FILES, *(_WEIGHT_FILES if weights else ())], list(_IGNORED_FILES)


def _hub_settings() -> tuple[str, bool]:
  """(cache directory, offline), read at each call: huggingface_hub reads them once, when first imported, so a
  process (a notebook, a test) that sets them later would otherwise be ignored."""
  from huggingface_hub import constants

  cache_dir = os.environ.get("HF_HUB_CACHE") or (
    os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else constants.HF_HUB_CACHE
  )
  offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE or bool(constants.HF_HUB_OFFLINE)
  return os.path.expanduser(cache_dir), offline


def resolve_model_path(path: str, key: str, *, weights: bool = True) -> str:
  """The local directory `key`=`path` names: `path` itself unless it is a Hub id, else the id's snapshot.

  `weights`: also fetch the safetensors weights (False: config, tokenizer and generation config only, for
  a tokenizer or a compile without weights). A path that is not an id comes back unchanged, for the
  caller's own check to say what is missing.
  """
  if not path or os.path.exists(path):
    return path
  if repo_id := hub_id_of(path):  # another machine's cache (a run's config or checkpoint): the same commit here
    return _download(repo_id, _SNAPSHOT_DIR.search(path.replace(os.sep, "/"))["commit"], key, path, weights)
  parsed = parse_hub_id(path)
  if parsed is None:
    return path
  org = parsed[0].split("/")[0]
  if os.path.isdir(org):
    raise UserError(
      f"{key}={path!r} does not exist (read as a local path since ./{org} is a directory; a "
      "Hugging Face Hub id org/name is looked up only when ./org is not a local directory)"
    )
  return _download(*parsed, key, path, weights)


def _download(repo_id: str, revision: str | None, key: str, path: str, weights: bool) -> str:
  """`repo_id`'s snapshot directory, from the cache or downloaded; a UserError naming `key` and the id if neither."""
  from huggingface_hub import errors as hub_errors
  from huggingface_hub import snapshot_download

  incomplete = getattr(hub_errors, "IncompleteSnapshotError", ())  # huggingface_hub >= 1.x: a partial cached snapshot
  cache_dir, offline = _hub_settings()
  named = f"{key}={path!r}"
  hub_model = f"Hugging Face Hub model {repo_id!r}" + (f" at revision {revision!r}" if revision else "")
  why = "HF_HUB_OFFLINE=1" if offline else "the Hub cannot be reached"
  download_hint = (
    "a local path: check its spelling; a Hub id: "
    + ("unset HF_HUB_OFFLINE, or " if offline else "")
    + f"download it where the Hub is reachable (`hf download {repo_id}"
    + (f" --revision {revision}" if revision else "")
    + f"`) into {cache_dir}"
  )
  allow_patterns, ignore_patterns = download_patterns(weights)
  try:
    directory = snapshot_download(
      repo_id,
      revision=revision,
      cache_dir=cache_dir,
      local_files_only=offline,
      allow_patterns=allow_patterns,
      ignore_patterns=ignore_patterns,
    )
  except hub_errors.GatedRepoError:
    raise UserError(
      f"{named}: the {hub_model} is gated",
      hint="accept its terms on huggingface.co, then log in (`hf auth login`) or set HF_TOKEN",
    ) from None
  except hub_errors.RepositoryNotFoundError:
    raise UserError(
      f"{named} is neither a local directory nor a model on the Hugging Face Hub",
      hint="a local path: check its spelling; a private Hub model: log in (`hf auth login`) or set HF_TOKEN",
    ) from None
  except hub_errors.RevisionNotFoundError:
    raise UserError(f"{named}: the Hugging Face Hub model {repo_id!r} has no revision {revision!r}") from None
  except hub_errors.LocalEntryNotFoundError as e:
    if isinstance(e, incomplete):
      raise UserError(
        f"{named}: the cached snapshot of the {hub_model} in {cache_dir} lacks some of the files a run reads ({why})",
        hint=download_hint,
      ) from None
    raise UserError(
      f"{named} is neither a local directory nor a {hub_model} in the cache {cache_dir} ({why})", hint=download_hint
    ) from None
  except (hub_errors.HfHubHTTPError, OSError) as e:
    raise UserError(
      f"{named}: downloading the {hub_model} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
      hint=download_hint,
    ) from None
  if weights and not glob.glob(os.path.join(directory, "*.safetensors")):
    raise UserError(
      f"{named}: the {hub_model} has no *.safetensors weights in {directory} (jaxrlhf never loads "
      "pickled .bin/.pt weights)" + ("; offline, only the files already in the cache are seen" if offline else ""),
      hint=download_hint if offline else None,
    )
  return directory


def resolve_model_paths(config, *, weights: bool = True) -> None:
  """Replaces, in place, each model and tokenizer path of a resolved config that is a Hub id by its local
  snapshot: the actor's, the critic's, the reward model's and the distillation teacher's (of the models the run
  uses) and `data.tokenizer`. `weights=False` (a compile without weights): config and tokenizer files only."""
  sections = [("actor_rollout_ref.model", config.actor_rollout_ref.model, "path", weights)]
  if config.critic.enable:
    sections.append(("critic.model", config.critic.model, "path", weights))
  if config.reward_model.enable:
    sections.append(("reward_model.model", config.reward_model.model, "path", weights))
  if config.distillation.enabled:
    sections.append(("distillation.teacher_model", config.distillation.teacher_model, "model_path", weights))
  sections.append(("data", config.data, "tokenizer", False))
  for prefix, section, name, with_weights in sections:
    section[name] = resolve_model_path(section[name], f"{prefix}.{name}", weights=with_weights)
