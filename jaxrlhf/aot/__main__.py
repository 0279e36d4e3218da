"""Will my run fit? Compile a config's step for a GPU or TPU target on this machine and report it.

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_qwen2_5_7b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen2.5-7b-instruct --target h100x8 [--phases]
        [--only gen] [--json report.json]

Prints the mesh and layout report, per-device memory of the compiled program(s) against the device's
memory, whether it fits (exit status 1 when it does not, with the largest buffers), the step's FLOPs
by phase and the compile time. Needs the `aot` extra: `pip install -e '.[aot]'`.
"""

import os
import sys

from absl import flags, logging
from ml_collections import config_flags

from jaxrlhf.cli import absl_main
from jaxrlhf.errors import UserError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file with get_config().", lock_config=True)
_TARGET = flags.DEFINE_string("target", None, "h100x8, h200x8, h100:NxG, h200:NxG, v4-N, v5p-N, v5e-N, v6e-N")
_PHASES = flags.DEFINE_bool("phases", False, "compile each phase as its own program (trainer.fuse_step=False)")
_ONLY = flags.DEFINE_list("only", [], "compile just these phases (implies --phases), e.g. --only gen")
_JSON = flags.DEFINE_string("json", None, "also write the report as JSON to this file")


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.ERROR)  # the GPU plugin and libtpu are chatty about missing hardware
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from jaxrlhf.aot.targets import parse_target, prepare_environment

  if _CONFIG.value is None or _TARGET.value is None:
    raise UserError("--config and --target are required, e.g. --config configs/quickstart.py --target h100x8")
  target = parse_target(_TARGET.value)
  prepare_environment(target)  # before JAX starts

  from jaxrlhf.aot.compile import compile_step, format_report, write_json

  report = compile_step(_CONFIG.value, target, phases=True if _PHASES.value else None, only=tuple(_ONLY.value))
  print(format_report(report), flush=True)
  if _JSON.value:
    write_json(report, _JSON.value)
  sys.exit(0 if report.fits else 1)


if __name__ == "__main__":
  absl_main("python -m jaxrlhf.aot", main)
