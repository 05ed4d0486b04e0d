"""Triton's latency summaries (``--metrics-config``): the window's quantiles on a scripted clock, the settings
read as tritonserver reads them, and what ``/metrics`` then exposes."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hybrid.errors import ConfigError
from hybrid.serve.observe.latency_summary import DEFAULT_QUANTILES, MetricsConfig, Window
from hybrid.serve.observe.statistics import ModelStats, TritonCollector


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_window_answers_nearest_rank_quantiles_of_its_recent_values():
    clock = _Clock()
    window = Window(max_age_s=60.0, size=1000, clock=clock)
    assert all(math.isnan(v) for v in window.quantiles((0.5, 0.99)))  # nothing yet: NaN, as Prometheus reports
    for v in range(1, 101):  # 1..100 us
        window.add(v)
    assert window.quantiles((0.5, 0.9, 0.99, 0.999, 0.0, 1.0)) == [50.0, 90.0, 99.0, 100.0, 1.0, 100.0]
    clock.now += 61.0  # a minute later: all of them too old
    window.add(7.4)
    assert window.quantiles((0.5, 0.99)) == [7.0, 7.0]  # rounded to the microsecond


def test_a_window_keeps_its_newest_values_alone():
    window = Window(max_age_s=60.0, size=10, clock=_Clock())
    for v in range(100):
        window.add(v)
    assert window.quantiles((0.0, 1.0)) == [90.0, 99.0]


def test_metrics_config_reads_tritonserver_s_settings():
    assert MetricsConfig.from_options([]) == MetricsConfig()
    assert MetricsConfig().summary_quantiles == DEFAULT_QUANTILES and not MetricsConfig().summary_latencies
    config = MetricsConfig.from_options(["summary_latencies=true", "counter_latencies=false",
                                         "summary_quantiles=0.5:0.05,0.99:0.001"])
    assert config == MetricsConfig(counter_latencies=False, summary_latencies=True,
                                   summary_quantiles=((0.5, 0.05), (0.99, 0.001)))
    for bad, says in (("summary_latencies", "KEY=VALUE"), ("summary_latencies=maybe", "true or false"),
                      ("summary_quantiles=0.5:2", "QUANTILE:ERROR"), ("summary_quantiles=x", "QUANTILE:ERROR"),
                      ("histogram_latencies=true", "unknown setting")):
        with pytest.raises(ConfigError) as info:
            MetricsConfig.from_options([bad])
        assert info.value.code == "HYB-102" and says in info.value.message, bad


def _exposed(config: MetricsConfig) -> dict[str, tuple[str, dict[tuple[str, tuple], float]]]:
    from prometheus_client import CollectorRegistry, generate_latest

    stats = ModelStats("m", "1", summaries=config.summary_latencies)
    for i in range(10):
        stats.batch(1, [0.001 * (i + 1)], 0.002)
        stats.request(True, 0.004 + 0.001 * i, input_s=0.0001, output_s=0.0002)
    stats.request(False, 0.5, reason="BACKEND")  # a failure: in no latency
    registry = CollectorRegistry()
    registry.register(TritonCollector(lambda: [stats], lambda: [("m", "1", 0)], None, config))
    text = generate_latest(registry).decode()
    return {f.name: (f.type, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples})
            for f in text_string_to_metric_families(text)}


def test_summaries_and_counters_as_the_settings_ask():
    plain = _exposed(MetricsConfig())
    assert "nv_inference_request_duration_us" in plain and not any("summary" in n for n in plain)
    both = _exposed(MetricsConfig(summary_latencies=True, summary_quantiles=((0.5, 0.05), (0.99, 0.001))))
    kind, samples = both["nv_inference_request_summary_us"]
    labels = (("model", "m"), ("version", "1"))
    assert kind == "summary"
    assert samples[("nv_inference_request_summary_us_count", labels)] == 10  # the successes
    assert samples[("nv_inference_request_summary_us_sum", labels)] == 85_000  # 4..13 ms, in us
    assert samples[("nv_inference_request_summary_us", (*labels[:1], ("quantile", "0.5"), labels[1]))] == 8000
    assert samples[("nv_inference_request_summary_us", (*labels[:1], ("quantile", "0.99"), labels[1]))] == 13000
    queue = both["nv_inference_queue_summary_us"][1]
    assert queue[("nv_inference_queue_summary_us", (*labels[:1], ("quantile", "0.5"), labels[1]))] == 5000
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert both[f"nv_inference_{phase}_summary_us"][0] == "summary"
    summaries_only = _exposed(MetricsConfig(counter_latencies=False, summary_latencies=True))
    assert not any(n.endswith("_duration_us") for n in summaries_only)
    assert "nv_inference_request_success" in summaries_only  # the counts stay
    quantiles = {dict(k[1]).get("quantile") for k in summaries_only["nv_inference_request_summary_us"][1]}
    assert quantiles == {None, "0.5", "0.9", "0.95", "0.99", "0.999"}  # Triton's default five (and count, sum)
