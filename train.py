"""jaxrlhf entry point: `python train.py --config configs/X.py [--config.some.key=value ...]`."""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file with get_config().",
                                          lock_config=True)
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "one process per host joining one mesh: jax.distributed.initialize() finds the "
    "coordinator under SLURM, Open MPI, Kubernetes and Cloud TPU; elsewhere set JAX_COORDINATOR_ADDRESS=host:port "
    "and pass --num_processes and --process_id")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "with --distributed: processes in all")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "with --distributed: this process's index")


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # library INFO chatter (XLA, Orbax) off unless -v is given
  from jaxrlhf.config import ConfigError
  from jaxrlhf.trainer import Trainer
  from jaxrlhf.trainer.guards import GuardError

  if _CONFIG.value is None:
    raise app.UsageError("--config is required, e.g. --config configs/quickstart.py")
  if _DISTRIBUTED.value:
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU hosts; GPUs and TPUs use their own
    jax.distributed.initialize(num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
  try:
    trainer = Trainer(_CONFIG.value)
  except ConfigError as e:
    raise app.UsageError(str(e)) from e
  except (ValueError, FileNotFoundError, ImportError) as e:
    # Bad data, model, mesh or checkpoint paths: one clear line (JAXRLHF_DEBUG=1 keeps the traceback).
    if os.environ.get("JAXRLHF_DEBUG"):
      raise
    sys.exit(f"jaxrlhf: error: {e}")
  try:
    history = trainer.fit()
  except GuardError as e:
    sys.exit(f"jaxrlhf: {e}")
  val_keys = [k for k in history[-1] if k.startswith("val-core/")]
  summary = ", ".join(f"{k}: {history[0].get(k, float('nan')):.3f} -> {history[-1][k]:.3f}" for k in val_keys)
  print(f"done: {len(history)} records in {trainer.run_dir}/metrics.jsonl; {summary}")


if __name__ == "__main__":
  app.run(main)
