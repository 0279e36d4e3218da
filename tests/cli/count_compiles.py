"""Runs a command-line tool and reports, as it exits, how many XLA programs it compiled.

    python tests/cli/count_compiles.py train.py --config ...        # a script
    python tests/cli/count_compiles.py -m jaxrlhf.generate --model ...  # a module
    python tests/cli/count_compiles.py --serve                       # many commands, one per line of stdin

The last stderr line is `[compiled] N` (N: programs compiled or loaded from the persistent compilation cache,
as `jax.monitoring` sees them), so a test can prove that bad input was refused before anything was built.

`--serve` is for a test file that runs dozens of commands: it imports JAX and jaxrlhf once (nearly all of the
~2 s a refused command costs), then forks one process per command. Each fork runs the script or module as `__main__`
with its own argv, stdout and stderr (files named in the request), as the one-shot form does, and its exit status is
the command's. A request is a JSON line `{"argv": [...], "stdout": path, "stderr": path}`; the server answers
`pid N` when the command starts and `exit N` when it ends. Nothing is compiled in the server itself (it checks).
"""

import atexit
import json
import os
import runpy
import sys

import jax.monitoring

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_compiled = 0


def _count(event, *args, **kwargs):
  global _compiled
  if event in (_BACKEND_COMPILE_EVENT, _CACHE_HIT_EVENT):
    _compiled += 1


def _report_at_exit():
  atexit.register(lambda: print(f"[compiled] {_compiled}", file=sys.stderr, flush=True))


def _run(argv):
  """`argv` as `python argv...` would run it: `-m module args` or `script args`."""
  if argv[0] == "-m":
    sys.argv = argv[1:]
    sys.modules.pop(sys.argv[0], None)  # imported by the server's warm-up; a fresh process has not run it yet
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
  else:
    sys.argv = list(argv)
    runpy.run_path(sys.argv[0], run_name="__main__")


def _exit_as_a_command(argv):
  """Runs `argv` and exits as the interpreter does after it (the exit status of `sys.exit` or 1 after a printed
  traceback; atexit handlers, the `[compiled]` line among them), less the teardown of every imported module, which
  costs ~0.7 s with JAX loaded and has nothing to show."""
  try:
    _run(argv)
    code = 0
  except SystemExit as stop:
    code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
    if not isinstance(stop.code, int | None):
      print(stop.code, file=sys.stderr)
  except BaseException:
    sys.excepthook(*sys.exc_info())
    code = 1
  atexit._run_exitfuncs()
  sys.stdout.flush(), sys.stderr.flush()
  os._exit(code)


def _serve():
  """Forks one process per request line (see the module docstring)."""
  # What every command imports; the commands' own modules (train.py's flags) are defined afresh in each fork.
  import absl.flags  # noqa: F401
  import ml_collections.config_flags  # noqa: F401
  import transformers  # noqa: F401
  from jax._src import xla_bridge

  import jaxrlhf.cli  # noqa: F401
  import jaxrlhf.trainer  # noqa: F401
  import jaxrlhf.verl_compat  # noqa: F401

  assert not xla_bridge._backends, "the server must not start a JAX backend: its forks would inherit it"
  replies = os.fdopen(os.dup(1), "w", buffering=1)
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
      os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
      _report_at_exit()
      _exit_as_a_command(request["argv"])
    replies.write(f"pid {pid}\n")
    _, status = os.waitpid(pid, 0)
    replies.write(f"exit {os.waitstatus_to_exitcode(status)}\n")


jax.monitoring.register_event_duration_secs_listener(_count)
jax.monitoring.register_event_listener(_count)

if sys.argv[1:] == ["--serve"]:
  _serve()
else:
  _report_at_exit()
  _run(sys.argv[1:])
