"""The Prometheus endpoint serves the latest step's throughput, step time, reward and KL."""

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jaxrlhf.tracking import Tracking


def _scrape(port):
  with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
    text = response.read().decode()
  return {sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples}


def test_scrape_returns_the_gauges(tmp_path):
  with Tracking([], str(tmp_path), total_steps=3, prometheus_port=0) as run:
    assert run.prometheus_port > 0
    run.log(
      {
        "training/global_step": 1,
        "critic/score/mean": 0.25,
        "actor/reward_kl_penalty": 0.03,
        "perf/total_num_tokens": 4096.0,
        "perf/time_per_step": 2.0,
        "perf/throughput": 256.0,
      },
      step=1,
    )
    run.log(
      {
        "training/global_step": 2,
        "critic/score/mean": 0.5,
        "actor/kl_loss": 0.02,
        "perf/total_num_tokens": 4096.0,
        "perf/time_per_step": 4.0,
        "perf/throughput": 128.0,
      },
      step=2,
    )
    gauges = _scrape(run.prometheus_port)
  assert gauges["jaxrlhf_tokens_per_second"] == 1024.0
  assert gauges["jaxrlhf_tokens_per_second_per_device"] == 128.0
  assert gauges["jaxrlhf_step_time_seconds"] == 4.0
  assert gauges["jaxrlhf_reward_mean"] == 0.5
  assert gauges["jaxrlhf_kl"] == 0.02  # the actor's KL loss wins over the in-reward penalty
  assert gauges["jaxrlhf_global_step"] == 2.0
  with pytest.raises(OSError):  # closed with the run
    _scrape(run.prometheus_port)


def test_busy_port_names_the_config_key(tmp_path):
  with Tracking([], str(tmp_path), total_steps=1, prometheus_port=0) as run:
    with pytest.raises(ValueError, match="trainer.prometheus_port"):
      Tracking([], str(tmp_path), total_steps=1, prometheus_port=run.prometheus_port)
