"""Imported by multiprocessing's forkserver alone (`processes.process_context` preloads it), never by the trainer.

The forkserver forks the reward workers and reports their exit statuses to the trainer. A scheduler's
preemption SIGTERM goes to the whole process group (SLURM, `timeout`); a server it ended would make every
worker read as "exited with status 255" although they are alive and still scoring. So the server ignores
SIGTERM, as the workers do; it still ends with the trainer (multiprocessing closes its pipe then).
"""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)

from jaxrlhf.rewards import workers  # noqa: E402, F401  (imported once in the server: each worker starts without it)
