"""jaxrlhf entry point: `python train.py --config configs/X.py [--config.some.key=value ...] [-v]`.

Bad input (a config key, a path, a data file, a checkpoint) prints one or two lines and exits 2;
`-v` / `--verbose` adds the traceback.
"""

import sys

from absl import flags, logging
from ml_collections import config_flags

from jaxrlhf.cli import absl_main
from jaxrlhf.errors import UserError

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
    logging.set_verbosity(logging.WARNING)  # library INFO chatter (XLA, Orbax) off unless -v N is given
  from jaxrlhf.trainer import Trainer
  from jaxrlhf.trainer.guards import GuardError

  if _CONFIG.value is None:
    raise UserError("--config is required, e.g. --config configs/quickstart.py")
  if _DISTRIBUTED.value:
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU hosts; GPUs and TPUs use their own
    jax.distributed.initialize(num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
  trainer = Trainer(_CONFIG.value)
  try:
    history = trainer.fit()
  except GuardError as e:
    sys.exit(f"jaxrlhf: {e}")  # a stop the guards decided, not bad input: exit 1
  if not history:
    return  # already complete: fit() said so
  val_keys = [k for k in history[-1] if k.startswith("val-core/")]
  summary = ", ".join(f"{k}: {history[0].get(k, float('nan')):.3f} -> {history[-1][k]:.3f}" for k in val_keys)
  print(f"done: {len(history)} records in {trainer.run_dir}/metrics.jsonl; {summary}")


if __name__ == "__main__":
  absl_main("train.py", main)
