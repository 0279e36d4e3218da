"""One error style for every command-line tool (`train.py`, `jaxrlhf.generate`, `jaxrlhf.export`, `jaxrlhf.aot`).

A user error (`jaxrlhf.errors.UserError`: a bad flag, config key, path, data file, checkpoint, reward
function) prints one or two lines to stderr and exits 2:

    train.py: error: config key 'algorithm.adv_estimator' must be one of ['gae', ...], got 'gea'
    train.py: hint: <what to try, when there is something to say>

The traceback is printed too with `-v` / `--verbose`; any other exception is a bug and keeps its
traceback. Ctrl-C prints one line and exits 130 (finished checkpoints are kept; `resume_mode=auto`
continues from the newest).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import traceback
from collections.abc import Callable

from absl import app, flags

from jaxrlhf.errors import UserError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


def fail(prog: str, message: str, hint: str | None = None) -> None:
  """Prints `prog: error: message` (and `prog: hint: hint`) and exits 2."""
  print(f"{prog}: error: {message}", file=sys.stderr)
  if hint:
    print(f"{prog}: hint: {hint}", file=sys.stderr)
  sys.stderr.flush()
  sys.exit(EXIT_USER_ERROR)


def run(prog: str, fn: Callable, *args, verbose: bool = False):
  """Returns `fn(*args)`; a UserError or Ctrl-C ends the program in the one style above."""
  verbose = verbose or bool(os.environ.get("JAXRLHF_DEBUG"))
  try:
    return fn(*args)
  except UserError as error:
    if verbose:
      traceback.print_exc()
    fail(prog, str(error), error.hint)
  except KeyboardInterrupt:
    if verbose:
      traceback.print_exc()
    print(f"{prog}: interrupted", file=sys.stderr)
    sys.exit(EXIT_INTERRUPTED)


def add_verbose_flag(parser) -> None:
  """`-v` / `--verbose` on an argparse parser."""
  parser.add_argument("-v", "--verbose", action="store_true", help="print the traceback of an error too")


# ----- absl programs (train.py, jaxrlhf.aot): --config and --config.<key>=<value> flags ---------------


def _take_verbose(argv: list[str]) -> bool:
  """Removes `--verbose` and a bare `-v` (absl's `-v N` sets the log verbosity and stays)."""
  found = False
  for i in reversed(range(1, len(argv))):
    following = argv[i + 1] if i + 1 < len(argv) else ""
    if argv[i] == "--verbose" or (argv[i] == "-v" and not following.lstrip("-").isdigit()):
      del argv[i]
      found = True
  return found


def _flag_value(argv: list[str], name: str) -> str | None:
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _unknown_override(argv: list[str]) -> str | None:
  """The message for the first `--config.<key>=` whose key is not in the config tree, if any."""
  from jaxrlhf.config import all_keys  # here, not at the top: jaxrlhf.aot sets up its devices before JAX loads

  keys = all_keys()
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    key = arg[len("--config.") :].split("=", 1)[0]
    if key in keys or any(k.startswith(key + ".") for k in keys):
      continue
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    suggestion = f"; did you mean '{close[0]}'?" if close else "; docs/config.md lists every key"
    return f"unknown config key '{key}' (from {arg}){suggestion}"
  return None


def _override_type_error(error: flags.Error) -> str | None:
  """`config key 'K' expects int, got 'abc' (from --config.K=abc)` for an override whose value absl could not
  parse as the key's type; None for any other flag error."""
  match = re.match(r"flag (--config\.([\w.]+)=(.*?)): ", str(error).splitlines()[0])
  if match is None:
    return None
  from jaxrlhf.config import get_base_config  # here, not at the top: see _unknown_override

  flag, key, value = match.groups()
  *parents, leaf = key.split(".")
  node = get_base_config()
  try:
    for part in parents:
      node = node[part]
    expected = node.get_type(leaf)
  except (KeyError, AttributeError):
    return None
  # A sequence key takes a Python literal; say how to write one.
  example = " such as ('a', 'b')" if expected in (tuple, list) else ""
  return f"config key {key!r} expects {expected.__name__}{example}, got {value!r} (from {flag})"


def _config_file(config_path: str) -> str:
  """The file of `--config`: ml_collections passes what follows its first ':' to get_config ("x.py:arg")."""
  return config_path.split(":", 1)[0]


def _config_file_error(error: BaseException, config_path: str) -> str | None:
  """`file:line: message` for an exception raised while a config file ran (e.g. a misspelt key in it)."""
  config_path = _config_file(config_path)
  path = os.path.abspath(config_path)
  frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) == path]
  if not frames:
    return None
  text = error
  while isinstance(text, BaseException) and text.args:  # ml_collections wraps a KeyError in an AttributeError
    text = text.args[0]
  text = str(text)
  # ml_collections' two wordings: assigning a key the locked tree lacks, and reading one it lacks.
  missing = re.search(r'Key "([^"]+)" does not exist', text) or re.match(r"""['"\\]*(\w+)['"\\]*\n""", text)
  close = re.search(r'Did you mean "([^"]+)"', text)
  if missing:
    message = f"unknown config key '{missing.group(1)}'"
    message += f" (did you mean '{close.group(1)}'?)" if close else ""
  else:
    message = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
  frame = frames[-1]
  return f"{config_path}:{frame.lineno}: {message}" + (f": {frame.line.strip()}" if frame.line else "")


def _config_override_key(arg: str) -> str | None:
  """The key of a `--config.<key>=<value>` flag; None for any other argument."""
  if not arg.startswith("--config.") or "=" not in arg:
    return None
  return arg[len("--config.") :].split("=", 1)[0]


def last_override_wins(argv: list[str]) -> list[str]:
  """`argv` with every `--config.<key>=` but the last of its key removed.

  absl appends the values of a repeated flag, and ml_collections then sets a tuple-valued key to all of
  them (a repeated `--config.data.train_files` trained on both files); verl's `key=value` lines and
  every other flag keep the last value, so these do too.
  """
  last = {key: i for i, key in enumerate(map(_config_override_key, argv)) if key is not None}
  return [
    arg for i, arg in enumerate(argv) if _config_override_key(arg) is None or last[_config_override_key(arg)] == i
  ]


def absl_argv(argv: list[str], default_config: str | None = None) -> tuple[list[str], bool]:
  """`argv` as `absl_main` hands it to absl, and whether `-v` / `--verbose` was in it: the last of a repeated
  `--config.<key>=` kept, the verbose flag taken out, and `--config=default_config` put first when only
  `--config.<key>=` flags are given."""
  argv = last_override_wins(argv)
  verbose = _take_verbose(argv)
  if default_config and _flag_value(argv, "config") is None and any(map(_config_override_key, argv)):
    argv.insert(1, f"--config={default_config}")
  return argv, verbose


def absl_main(
  prog: str, main: Callable[[list[str]], object], argv: list[str] | None = None, default_config: str | None = None
) -> None:
  """`absl.app.run(main)` with the one error style, for flag and config-file errors as well.

  `default_config`: the config file `--config.<key>=` flags apply to when `--config` is not given.
  """
  argv, verbose = absl_argv(list(sys.argv if argv is None else argv), default_config)

  def parse_flags(args):
    config_path = _flag_value(args, "config")
    if config_path is not None and not os.path.isfile(_config_file(config_path)):
      fail(
        prog,
        f"--config {config_path!r}: no such file",
        "configs/ holds the shipped configs, e.g. --config configs/quickstart.py",
      )
    try:
      return flags.FLAGS(args)
    except flags.Error as error:
      if verbose:
        traceback.print_exc()
      type_error = _override_type_error(error)
      if type_error:
        fail(prog, type_error, "docs/config.md lists every key with its type and default")
      command = f"python {prog}" if prog.endswith(".py") else prog
      fail(prog, str(error).splitlines()[0], f"{command} --helpshort lists the flags")
    except Exception as error:  # noqa: BLE001  (a config file or an override that does not fit the tree)
      message = _unknown_override(args) or (config_path and _config_file_error(error, config_path))
      if not message:
        raise
      if verbose:
        traceback.print_exc()
      fail(prog, message)

  def run_main(args):
    return run(prog, main, args, verbose=verbose or flags.FLAGS["verbosity"].present)

  app.run(run_main, argv=argv, flags_parser=parse_flags)
