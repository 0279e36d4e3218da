"""Runs a command-line tool and reports, as it exits, how many XLA programs it compiled.

    python tests/cli/count_compiles.py train.py --config ...        # a script
    python tests/cli/count_compiles.py -m jaxrlhf.generate --model ...  # a module

The last stderr line is `[compiled] N` (N: programs compiled or loaded from the persistent compilation cache,
as `jax.monitoring` sees them), so a test can prove that bad input was refused before anything was built.
"""

import atexit
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


jax.monitoring.register_event_duration_secs_listener(_count)
jax.monitoring.register_event_listener(_count)
atexit.register(lambda: print(f"[compiled] {_compiled}", file=sys.stderr, flush=True))

if sys.argv[1] == "-m":
  sys.argv = [sys.argv[2], *sys.argv[3:]]
  runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
  sys.argv = sys.argv[1:]
  runpy.run_path(sys.argv[0], run_name="__main__")
