"""Metric sinks chosen by `trainer.logger`, the Prometheus endpoint, plots and the step profiler.

`Tracking` is the one object the trainer talks to: it turns a step's metrics (docs/algorithms.md §7 names,
JAX or NumPy scalars) into plain Python numbers once and hands them to each backend, one module
per backend. Only process 0 writes; on other processes every call is a no-op.
"""

from jaxrlhf.tracking.jsonl import read_metrics, truncate_jsonl
from jaxrlhf.tracking.plots import plot_metrics
from jaxrlhf.tracking.profiling import maybe_profile
from jaxrlhf.tracking.tracking import LOGGERS, Tracking, check_installed

__all__ = ["LOGGERS", "Tracking", "check_installed", "maybe_profile", "plot_metrics", "read_metrics", "truncate_jsonl"]
