"""Orbax checkpoints of the train state under `<default_local_dir>/<project>/<experiment>/global_step_N`.

What a checkpoint holds: the TrainState (actor and critic params and optimizer states, KL-controller
coefficient, lr scale, step) and a JSON record (step, data-iterator position, seed, the config).
The frozen models (reference policy, reward model) are not saved: they are rebuilt from their source
(the seed or the model path), as verl does. Batches and per-step RNG are pure functions of (seed, step), so the step is the whole
iterator state.

Saves are asynchronous and atomic: Orbax writes into a temporary directory and renames it when the
write has finished, so an interrupted save is never picked up by `latest_step()`. Restoring takes
the target shardings, so a checkpoint saved on one mesh restores onto another. A finished checkpoint
that cannot be read (a file truncated or damaged afterwards) raises CheckpointError naming its step
folder; `set_aside` moves it out of the run's steps without deleting anything.
"""

from __future__ import annotations

import contextlib
import json
import os

import jax
import ml_collections
import orbax.checkpoint as ocp

from jaxrlhf.errors import UserError

STEP_PREFIX = "global_step"


class CheckpointError(UserError, ValueError):
  """A checkpoint (a jaxrlhf `global_step_N` or a Hugging Face directory) that cannot be read as asked;
  the message names the path, file or tensor."""


def _without_reference(state):
  """Frozen models (reference policy, reward model) are rebuilt from their source, not saved."""
  return state.replace(ref_params=None, reward_params=None)


class Checkpointer:
  def __init__(self, directory: str, *, max_to_keep: int | None = None, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, step_prefix=STEP_PREFIX,
                                             enable_async_checkpointing=async_save, create=True),
        item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state, meta: dict) -> None:
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(_without_reference(state)), meta=ocp.args.JsonSave(meta)))

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, f"{STEP_PREFIX}_{step}")

  def restore(self, step: int, target_state):
    """Restores onto the shardings of `target_state` (arrays or ShapeDtypeStructs); keeps its ref params."""
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), _without_reference(target_state))
    with _unreadable_as_checkpoint_error(self.step_dir(step)):
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    state = restored.state.replace(ref_params=target_state.ref_params, reward_params=target_state.reward_params)
    return state, restored.meta

  def set_aside(self, step: int) -> str:
    """Renames an unreadable step folder to `unreadable_global_step_N[.K]` (kept, no longer a step); returns it."""
    source = self.step_dir(step)
    target = os.path.join(self.directory, "unreadable_" + os.path.basename(source))
    suffix = 0
    while os.path.exists(target + (f".{suffix}" if suffix else "")):
      suffix += 1
    target += f".{suffix}" if suffix else ""
    if jax.process_index() == 0:  # one process renames; every process has stopped counting it as a step
      os.rename(source, target)
    self._manager.reload()
    return target

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


@contextlib.contextmanager
def _unreadable_as_checkpoint_error(step_dir: str):
  """Orbax and TensorStore errors from a damaged checkpoint (JSONDecodeError naming no file, DATA_LOSS, ...)."""
  try:
    yield
  except CheckpointError:
    raise
  except Exception as e:  # noqa: BLE001  (any failure to read it means the same thing to the user)
    detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise CheckpointError(f"checkpoint {step_dir} cannot be read (a truncated or damaged file?): "
                          f"{type(e).__name__}: {detail}") from e


def _named(key: str, path: str) -> str:
  """How a message names where a path came from: `--flag '/p'` or `config.key='/p'`."""
  return f"{key} {path!r}" if key.startswith("--") else f"{key}={path!r}"


def split_step_dir(path: str, key: str = "trainer.resume_from_path") -> tuple[str, int]:
  """'/runs/p/e/global_step_40' -> ('/runs/p/e', 40); errors name the path and the `key` (flag) it came from."""
  path = os.path.abspath(path.rstrip("/"))
  name = os.path.basename(path)
  if not name.startswith(STEP_PREFIX + "_") or not name[len(STEP_PREFIX) + 1:].isdigit():
    raise CheckpointError(f"{_named(key, path)} must be a '{STEP_PREFIX}_<N>' checkpoint directory")
  if not os.path.isdir(path):
    raise CheckpointError(f"{_named(key, path)} does not exist")
  return os.path.dirname(path), int(name[len(STEP_PREFIX) + 1:])


def read_checkpoint(step_dir: str, key: str = "trainer.resume_from_path"):
  """(raw state dict of numpy/jax arrays, meta dict, config) of a `global_step_N` directory."""
  run_dir, step = split_step_dir(step_dir, key)
  with ocp.CheckpointManager(run_dir, options=ocp.CheckpointManagerOptions(step_prefix=STEP_PREFIX),
                             item_names=("state", "meta")) as manager:
    if step not in manager.all_steps():
      raise CheckpointError(f"{_named(key, step_dir)} is not a finished jaxrlhf checkpoint")
    with _unreadable_as_checkpoint_error(os.path.abspath(step_dir)):
      restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                               meta=ocp.args.JsonRestore()))
  config = ml_collections.ConfigDict(json.loads(restored.meta["config"]))
  return restored.state, restored.meta, config
