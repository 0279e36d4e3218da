"""Where every process the reward code starts comes from (the reward workers, prm800k's sympy helper).

multiprocessing's forkserver where the platform has it (a child is forked from a clean server, cheaply), else
spawn. The forkserver is one per process and keeps the preload of whoever starts it first, so every caller takes
its context from `process_context`: a context without the preload would leave a server that a process group's
SIGTERM ends, and every worker it forked would then read as "exited with status 255"
(tests/reliability/test_process_group_sigterm.py).
"""

from __future__ import annotations

import multiprocessing


def process_context():
  """The forkserver context, its server preloading `jaxrlhf.rewards.worker_server` (which makes it ignore SIGTERM and
  imports the worker code once, so a new worker starts without importing it, or NumPy, again; not the trainer's
  __main__, whose import could run a script's top-level code in a long-lived server); spawn without a forkserver."""
  if "forkserver" in multiprocessing.get_all_start_methods():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["jaxrlhf.rewards.worker_server"])
    return context
  return multiprocessing.get_context("spawn")
