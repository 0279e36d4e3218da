"""jaxrlhf entry point: `python train.py --config configs/X.py [--config.some.key=value ...] [key=value ...] [-v]`.

`key=value` arguments are verl's (Hydra-style) overrides, as in verl's run scripts: they apply after the
`--config.` flags. Without --config both apply to configs/verl_defaults.py (verl's defaults). A key
given twice takes its last value, in either spelling.
`jaxrlhf.verl_compat` says which verl keys are translated or ignored.

Bad input (a config key, a path, a data file, a checkpoint) prints one or two lines and exits 2;
`-v` / `--verbose` adds the traceback.
"""

import os
import sys

from absl import flags, logging
from ml_collections import config_flags

from jaxrlhf import verl_compat
from jaxrlhf.cli import absl_main
from jaxrlhf.errors import UserError

# The base of a command line without --config: verl's defaults, as verl's main_ppo starts from.
VERL_DEFAULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), verl_compat.DEFAULT_CONFIG)
_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file with get_config().", lock_config=True)
_DISTRIBUTED = flags.DEFINE_bool(
  "distributed",
  False,
  "one process per host joining one mesh: jax.distributed.initialize() finds the "
  "coordinator under SLURM, Open MPI, Kubernetes and Cloud TPU; elsewhere set JAX_COORDINATOR_ADDRESS=host:port "
  "and pass --num_processes and --process_id",
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "with --distributed: processes in all")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "with --distributed: this process's index")


def _config_with_overrides(verl_args: list[str]):
  """--config (or verl's defaults when only verl overrides are given) with the verl overrides applied."""
  config = _CONFIG.value
  if config is None:
    if not verl_args:
      raise UserError(
        "--config is required, e.g. --config configs/quickstart.py (or verl-style key=value "
        "overrides on configs/verl_defaults.py)"
      )
    from jaxrlhf.config import load_config_file

    config = load_config_file(VERL_DEFAULTS)
    config.lock()
  if verl_args:
    report = verl_compat.apply_overrides(config, verl_args)
    for key, raw, became in report.translated:
      print(f"verl key {key}={raw} -> {became}")
    if report.ignored:
      print(f"ignored {len(report.ignored)} verl key(s) that have no meaning in jaxrlhf:")
      print("\n".join(report.ignored_lines()))
  return config


def main(argv):
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # library INFO chatter (XLA, Orbax) off unless -v N is given
  import jax

  from jaxrlhf.tracking.tracking import check_installed
  from jaxrlhf.trainer import Trainer
  from jaxrlhf.trainer.guards import GuardError
  from jaxrlhf.trainer.preemption import EXIT_PREEMPTED, Preempted
  from jaxrlhf.trainer.validation import validation_summary

  verl_args, rest = verl_compat.split_overrides(argv[1:])
  if rest:
    raise UserError(f"unexpected argument(s) {rest}: flags are --name=value, verl overrides key=value")
  config = _config_with_overrides(verl_args)
  # A logger's missing package in one line now, not as a traceback once the model is built.
  check_installed(config.trainer.logger, config.trainer.prometheus_port)
  if _DISTRIBUTED.value:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU hosts; GPUs and TPUs use their own
    jax.distributed.initialize(num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
  trainer = Trainer(config)  # fit() writes <run dir>/config.json once a resume is accepted
  try:
    history = trainer.fit()
  except GuardError as e:
    sys.exit(f"jaxrlhf: {e}")  # a stop the guards decided, not bad input: exit 1
  except Preempted as e:
    print(f"train.py: {e}", file=sys.stderr, flush=True)
    sys.exit(EXIT_PREEMPTED)
  if not history:
    return  # already complete: fit() said so
  summary = validation_summary(history)
  written = (
    f" in {trainer.run_dir}/metrics.jsonl"
    if "jsonl" in trainer.config.trainer.logger
    else ", none written to a file (trainer.logger has no 'jsonl')"
  )
  print(f"done: {len(history)} records{written}" + (f"; {summary}" if summary else ""))


if __name__ == "__main__":
  absl_main("train.py", main, default_config=VERL_DEFAULTS)
