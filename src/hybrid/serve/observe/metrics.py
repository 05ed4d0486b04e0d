"""Prometheus metrics of the inference server (``GET /metrics``).

Each server has its own registry, so several servers (tests, one per Ray replica) never share counters.
Queue depth, the runners (``pyasc_model_runners``, labelled with the layout serving the model) and memory-pool
occupancy are read at scrape time from the models and from ``hybrid.hal.memory``, so they cost nothing between
scrapes. Beside hybrid's own ``pyasc_*`` metrics the
server exposes Triton's (``nv_inference_request_success``, ``nv_inference_request_failure``,
``nv_inference_count``, ``nv_inference_exec_count``, ``nv_inference_*_duration_us``, labels ``model`` and
``version``; failures also by ``reason``), read from the same :class:`~hybrid.serve.observe.statistics.ModelStats` that
the statistics endpoints report, with Triton's response cache metrics (``nv_cache_*``) and CPU metrics
(``nv_cpu_*``, Linux); ``pyasc_batch_size`` is the histogram of the batches actually executed. Triton counts
only the requests a model took; ``pyasc_inference_requests`` and ``pyasc_inference_failures`` count every
request, refused ones too, by error code.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hybrid.serve.observe.host_metrics import HostCollector
from hybrid.serve.observe.latency_summary import MetricsConfig
from hybrid.serve.observe.statistics import ModelStats, TritonCollector

if TYPE_CHECKING:
    from hybrid.serve.core.model import ServedModel
    from hybrid.serve.triton.response_cache import ResponseCache

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_POOL_FIELDS = ("reserved", "allocated", "peak", "free", "largest_free")
_TRITON_TOTAL = re.compile(rb"^# (HELP|TYPE) (nv_[a-z_]+)_total ", re.M)


class _LiveCollector(Collector):
    """Gauges read when scraped: queued requests and runners per model, memory-pool bytes per device."""

    def __init__(self, models: Iterable[ServedModel]) -> None:
        self._models = models

    def collect(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily("pyasc_queue_depth", "Requests waiting in the model's queue now",
                                   labels=["model", "version"])
        for m in self._models:
            queued.add_metric([m.name, m.version], m.queued)
        yield queued
        runners = GaugeMetricFamily("pyasc_model_runners", "Batches the model runs at once now, with the layout "
                                    "serving it (its backend's default: 'default')",
                                    labels=["model", "version", "layout"])
        for m in self._models:
            layout = m.serving_layout()
            runners.add_metric([m.name, m.version, layout["layout"]], layout["runners"])
        yield runners
        from hybrid.hal import memory

        pool = GaugeMetricFamily("pyasc_pool_bytes", "Memory-pool bytes by device and kind (hybrid.hal.memory)",
                                 labels=["device", "kind"])
        for device, stats in memory.snapshot().items():
            for kind in _POOL_FIELDS:
                pool.add_metric([device, kind], getattr(stats, kind))
        yield pool


class ServerMetrics:
    """The server's counters and histograms.

    Args:
        models: The served models (read at scrape time for queue depths).
        response_cache: The server's response cache, if it has one.
        config: Which of Triton's latency metrics to expose (``--metrics-config``): counters, summaries.
    """

    def __init__(self, models: Iterable[ServedModel], response_cache: ResponseCache | None = None,
                 config: MetricsConfig | None = None) -> None:
        self._cache = response_cache
        self.config = config or MetricsConfig()
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model", "version"]
        self.requests = Counter("pyasc_inference_requests", "Inference requests received",
                                labels, registry=self.registry)
        self.failures = Counter("pyasc_inference_failures", "Inference requests that failed, by error code",
                                [*labels, "code"], registry=self.registry)
        self.http_errors = Counter("pyasc_http_errors", "Error responses of any endpoint, by error code",
                                   ["code"], registry=self.registry)
        self.dropped = Counter("pyasc_connections_dropped", "Requests and connections that ended without an "
                               "answer, by reason (client_disconnect, body_timeout, header_timeout, "
                               "connection_limit)",
                               ["reason"], registry=self.registry)
        self.latency = Histogram("pyasc_request_duration_seconds", "Inference request time in the server",
                                 labels, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_time = Histogram("pyasc_queue_duration_seconds", "Time a request waited for its batch to run",
                                    labels, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.compute_time = Histogram("pyasc_compute_duration_seconds", "Time the model took per batch",
                                      labels, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("pyasc_batch_size", "Requests per batch executed", labels,
                                    buckets=_BATCH_BUCKETS, registry=self.registry)
        self.grpc_errors = Counter("pyasc_grpc_errors", "Error statuses of any gRPC method, by error code",
                                   ["code"], registry=self.registry)
        self._models = models
        self._stats: dict[tuple[str, str], ModelStats] = {}
        self._stats_lock = threading.Lock()
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self.registry.register(_LiveCollector(models))
        self.registry.register(TritonCollector(self._all_stats,
                                               lambda: [(m.name, m.version, m.queued) for m in models],
                                               response_cache.counts if response_cache is not None else None,
                                               self.config))
        self.registry.register(HostCollector())

    def children(self, key: tuple[str, str]) -> tuple[Any, Any]:
        """The requests counter and the latency histogram of the model ``key`` (name, version), looked up once."""
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = (self.requests.labels(*key), self.latency.labels(*key))
        return found

    def _all_stats(self) -> list[ModelStats]:
        """The statistics of the models served now: an unloaded model's metrics are gone, as in Triton."""
        served = {(m.name, m.version) for m in self._models}
        with self._stats_lock:  # a batcher thread may add a model's entry meanwhile
            return [s for key, s in self._stats.items() if key in served]

    def stats(self, model: ServedModel) -> ModelStats:
        """The Triton statistics of ``model``, made at its first use."""
        key = (model.name, model.version)
        found = self._stats.get(key)
        if found is None:
            with self._stats_lock:
                found = self._stats.setdefault(key, self._new_stats(model))
        return found

    def loaded(self, model: ServedModel) -> ModelStats:
        """A model version (re)loaded: its Triton statistics start again from 0, as Triton's do after a load."""
        fresh = self._new_stats(model)
        with self._stats_lock:
            self._stats[(model.name, model.version)] = fresh
        return fresh

    def _new_stats(self, model: ServedModel) -> ModelStats:
        stats = ModelStats(model.name, model.version, summaries=self.config.summary_latencies,
                           max_age_s=self.config.max_age_s)
        stats.caches_responses = self._cache is not None and model.caches_responses
        return stats

    def request_done(self, model: ServedModel, ok: bool, seconds: float, rows: int = 1, input_s: float = 0.0,
                     output_s: float = 0.0, cached: bool = False, reason: str = "OTHER") -> None:
        """One inference request that ``model`` took ended: answered (``ok``) or failed, after ``seconds``.

        ``cached``: answered from the response cache; ``reason``: a failure's (Triton's, e.g. ``BACKEND``).
        """
        self.stats(model).request(ok, seconds, rows, input_s, output_s, cached, reason)

    def cache_lookup(self, model: ServedModel, hit: bool, seconds: float) -> None:
        """One response cache lookup for ``model``: a hit or a miss, and its time."""
        stats = self.stats(model)
        stats.caches_responses = True  # (also a version loaded again, now with the cache on)
        stats.cache(hit, seconds)

    def observe_batch(self, model: ServedModel, size: int, waits: list[float], run_s: float) -> None:
        """The ServedModel observer: one batch of ``size`` requests ran in ``run_s`` after ``waits``."""
        key = (model.name, model.version)
        self.stats(model).batch(size, waits, run_s)
        self.batch_size.labels(*key).observe(size)
        self.compute_time.labels(*key).observe(run_s)
        queue = self.queue_time.labels(*key)
        for w in waits:
            queue.observe(w)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        # prometheus_client names a counter's HELP/TYPE lines '<name>_total'; Triton's counters have no
        # '_total' (the samples are already exposed under Triton's names)
        return _TRITON_TOTAL.sub(rb"# \1 \2 ", generate_latest(self.registry))
