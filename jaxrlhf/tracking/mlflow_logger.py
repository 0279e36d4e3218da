"""MLflow: one run per `Tracking` in experiment <project>, run name <experiment>, config as params.

Uses `MLFLOW_TRACKING_URI` when set, else a local file store at file:<run_dir>/mlruns
(`mlflow ui --backend-store-uri <run_dir>/mlruns` to browse it). MLflow 3 refuses the file store
unless `MLFLOW_ALLOW_FILE_STORE=true`, which we set for that case only.
"""

from __future__ import annotations

import os
import time

from jaxrlhf.tracking.record import restricted_name, scalars

_MAX_PARAMS_PER_BATCH = 100
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAM_LENGTH = 500


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _chunks(items: list, size: int):
  return (items[i : i + size] for i in range(0, len(items), size))


class MlflowLogger:
  def __init__(self, run_dir: str, *, project: str, experiment: str, config: dict | None):
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not tracking_uri:
      tracking_uri = "file:" + os.path.join(os.path.abspath(run_dir), "mlruns")
      os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    self._metric = Metric
    self.client = MlflowClient(tracking_uri=tracking_uri)
    found = self.client.get_experiment_by_name(project)
    experiment_id = found.experiment_id if found is not None else self.client.create_experiment(project)
    self.run_id = self.client.create_run(experiment_id, run_name=experiment).info.run_id
    if config is not None:
      params = [Param(restricted_name(key), str(value)[:_MAX_PARAM_LENGTH]) for key, value in _flatten(config).items()]
      for chunk in _chunks(params, _MAX_PARAMS_PER_BATCH):
        self.client.log_batch(self.run_id, params=chunk)

  def log(self, record: dict, step: int) -> None:
    timestamp = int(time.time() * 1000)
    metrics = [self._metric(restricted_name(key), value, timestamp, step) for key, value in scalars(record).items()]
    for chunk in _chunks(metrics, _MAX_METRICS_PER_BATCH):
      self.client.log_batch(self.run_id, metrics=chunk)

  def close(self, failed: bool = False) -> None:
    self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
