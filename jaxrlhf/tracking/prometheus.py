"""Prometheus endpoint (`trainer.prometheus_port`, off by default) with the run's headline gauges.

Each gauge holds the latest step's value; scrape http://<host>:<port>/metrics.
"""

from __future__ import annotations

from jaxrlhf.tracking.record import is_number, kl, tokens_per_second

# (gauge name, help, how to read it from a step's record)
_GAUGES = (
  (
    "jaxrlhf_tokens_per_second",
    "Prompt+response tokens per second over the whole step, all devices",
    tokens_per_second,
  ),
  (
    "jaxrlhf_tokens_per_second_per_device",
    "perf/throughput: tokens per second per device",
    lambda record: record.get("perf/throughput"),
  ),
  (
    "jaxrlhf_step_time_seconds",
    "perf/time_per_step: wall time of the last step",
    lambda record: record.get("perf/time_per_step"),
  ),
  (
    "jaxrlhf_reward_mean",
    "critic/score/mean: mean sequence score of the last rollout",
    lambda record: record.get("critic/score/mean"),
  ),
  ("jaxrlhf_kl", "actor/kl_loss, else actor/reward_kl_penalty", kl),
  (
    "jaxrlhf_global_step",
    "training/global_step of the last logged step",
    lambda record: record.get("training/global_step"),
  ),
)


class PrometheusExporter:
  def __init__(self, port: int, addr: str = "0.0.0.0"):
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    # A private registry: several runs (or tests) in one process must not collide on gauge names.
    self.registry = CollectorRegistry()
    self._gauges = [(Gauge(name, doc, registry=self.registry), read) for name, doc, read in _GAUGES]
    try:
      self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
    except OSError as error:
      raise ValueError(f"config key 'trainer.prometheus_port': cannot serve on {addr}:{port} ({error})") from error
    self.port = self._server.server_port

  def log(self, record: dict, step: int) -> None:
    for gauge, read in self._gauges:
      value = read(record)
      if is_number(value):
        gauge.set(value)

  def close(self, failed: bool = False) -> None:
    self._server.shutdown()
    self._server.server_close()
