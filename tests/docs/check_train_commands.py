"""Checks `train.py` command lines without training: the flags parse, the overrides apply, the config validates.

    python tests/docs/check_train_commands.py '[["train.py", "--config", "configs/quickstart.py"], ...]'

Each command line runs in a fork of this process, as `train.py` would parse it (the same flags, `--config.` flags
before verl's `key=value` ones, verl's defaults without `--config`) up to `jaxrlhf.config.resolve_config`: every
key, type and choice is checked, nothing is loaded (a Hub id or a data path need not exist here) and no JAX backend
is started. One line per command on stdout, `ok` or `error: <what train.py would print>`; exit status 1 if any failed.
"""

import json
import os
import runpy
import sys

from absl import flags

from jaxrlhf import cli, verl_compat
from jaxrlhf.config import resolve_config
from jaxrlhf.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _check(argv: list[str]) -> None:
  train = runpy.run_path(os.path.join(ROOT, "train.py"), run_name="train_check")  # defines train.py's flags
  argv, _ = cli.absl_argv([os.path.join(ROOT, "train.py"), *argv[1:]], train["VERL_DEFAULTS"])
  sys.argv = argv  # ml_collections reads the --config.<key> overrides from sys.argv
  remaining = flags.FLAGS(argv)
  verl_args, rest = verl_compat.split_overrides(remaining[1:])
  if rest:
    raise UserError(f"unexpected argument(s) {rest}")
  resolve_config(train["_config_with_overrides"](verl_args))


def main(commands: list[list[str]]) -> int:
  import jaxrlhf.algos  # noqa: F401  (validation's registries, and JAX with them: once here, not in every fork)

  failed = 0
  for argv in commands:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
      os.close(read)
      sys.stdout = open(os.devnull, "w")  # the translation report of verl keys: not this checker's output
      try:
        _check(argv)
        message = "ok"
      except BaseException as error:  # noqa: BLE001  (a flag error is SystemExit; any other is the config's)
        message = f"error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
      os.write(write, message.encode())
      os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
      message = pipe.read()
    os.waitpid(pid, 0)
    failed += message != "ok"
    print(f"{message} <- {' '.join(argv)}", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(json.loads(sys.argv[1])))
