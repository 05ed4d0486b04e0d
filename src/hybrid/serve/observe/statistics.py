"""Triton's per-model inference statistics, kept by the server and reported three ways.

``ModelStats`` accumulates what Triton's ``InferStatistics`` holds (success, fail, queue, compute input /
infer / output, cache hit / miss: a count and nanoseconds each), the failures by reason, the inference and
execution counts, and one entry per executed batch size. ``GET /v2/models/{m}/stats`` and gRPC
``ModelStatistics`` return it as Triton's ``ModelStatistics`` message (JSON on HTTP); ``/metrics`` exposes the
same numbers under Triton's metric names (``nv_inference_*``, ``nv_cache_*_per_model``, microseconds), so the
three never disagree. As in Triton, a request refused before it reaches the model's queue (a bad request, a
full queue) is in none of them: only requests the model took count, as a success or as a failure with
Triton's reason (:data:`FAILURE_REASONS`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from tritonclient.grpc import service_pb2 as pb

from hybrid.serve.observe.latency_summary import MetricsConfig, Window

if TYPE_CHECKING:
    from hybrid.serve.triton.response_cache import CacheCounts

__all__ = ["FAILURE_REASONS", "ModelStats", "TritonCollector"]

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
"""The ``reason`` label of ``nv_inference_request_failure``, as Triton 2.51 names them: a request the queue gave
up (its timeout), one its client cancelled, one the model's run failed, anything else."""
_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
_SUMMARIZED = ("request", "queue", "compute_input", "compute_infer", "compute_output")
_NS = 1_000_000_000


class ModelStats:
    """The statistics of one model version (thread-safe: the batcher's threads and the event loop feed it).

    Args:
        name: Model name.
        version: Model version.
        summaries: Keep each latency's recent observations for Triton's summaries (``summary_latencies``), each
            looking back ``max_age_s`` seconds.
        max_age_s: See ``summaries``.
    """

    def __init__(self, name: str, version: str, summaries: bool = False, max_age_s: float = 60.0) -> None:
        self.name = name
        self.version = version
        self._lock = threading.Lock()
        # phase -> its recent observations in microseconds (request: the successes' durations); None: not kept
        self._windows = {p: Window(max_age_s) for p in _SUMMARIZED} if summaries else None
        self._phase = {p: [0, 0] for p in _PHASES}  # phase -> [count, ns]
        self._batches: dict[int, list[int]] = {}  # batch size -> [count, infer ns]
        self._failures = dict.fromkeys(FAILURE_REASONS, 0)
        self.caches_responses = False  # set by the server: its cache keeps this model's answers
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0

    def _add(self, phase: str, count: int, seconds: float) -> None:
        entry = self._phase[phase]
        entry[0] += count
        entry[1] += round(seconds * _NS)

    def _observe(self, windows: dict[str, Window], **seconds: float) -> None:
        """Add one observation to each named window (called only where the windows are kept)."""
        for phase, value in seconds.items():
            windows[phase].add(value * 1e6)

    def request(self, ok: bool, seconds: float, rows: int = 1, input_s: float = 0.0, output_s: float = 0.0,
                cached: bool = False, reason: str = "OTHER") -> None:
        """One request the model took, answered (``ok``) or failed after ``seconds`` in the server.

        ``cached``: answered from the response cache: a success and a (zero) queue entry, as Triton counts it,
        with no compute and no inference. ``reason``: a failure's, one of :data:`FAILURE_REASONS`.
        """
        with self._lock:
            if ok and cached:
                self._add("success", 1, seconds)
                self._add("queue", 1, 0.0)
                if self._windows is not None:
                    self._observe(self._windows, request=seconds, queue=0.0)
                self.last_inference_ms = int(time.time() * 1000)
            elif ok:
                self._add("success", 1, seconds)
                self._add("compute_input", 1, input_s)
                self._add("compute_output", 1, output_s)
                if self._windows is not None:
                    self._observe(self._windows, request=seconds, compute_input=input_s, compute_output=output_s)
                self.inference_count += rows
                self.last_inference_ms = int(time.time() * 1000)
            else:
                self._add("fail", 1, seconds)
                self._failures[reason if reason in self._failures else "OTHER"] += 1

    def cache(self, hit: bool, seconds: float) -> None:
        """One response cache lookup: a hit, or a miss (its time includes the insertion of the answer)."""
        with self._lock:
            self._add("cache_hit" if hit else "cache_miss", 1, seconds)

    def batch(self, size: int, waits: Iterable[float], run_s: float) -> None:
        """One executed batch of ``size`` requests that waited ``waits`` and ran ``run_s`` seconds."""
        waits = list(waits)
        with self._lock:
            self.execution_count += 1
            self._add("queue", len(waits), sum(waits))
            self._add("compute_infer", size, run_s * size)
            if self._windows is not None:  # each request of the batch: its wait, and the batch's run
                for w in waits:
                    self._observe(self._windows, queue=w)
                for _ in range(size):
                    self._observe(self._windows, compute_infer=run_s)
            entry = self._batches.setdefault(size, [0, 0])
            entry[0] += 1
            entry[1] += round(run_s * _NS)

    def snapshot(self, quantiles: tuple[float, ...] = ()) -> dict[str, Any]:
        """A consistent copy of every number, taken under the lock.

        ``phase``: (count, ns) per phase; ``batches``: (count, infer ns) per executed batch size, smallest
        first; ``failures``: count per reason; ``inference_count``, ``execution_count`` and ``last_inference``
        (ms since the epoch); ``summaries``: where they are kept and ``quantiles`` are asked for, the value in
        microseconds at each of ``quantiles`` per summarized phase (``request``, ``queue``, ``compute_*``).
        """
        with self._lock:
            windows = self._windows if quantiles else None
            summaries = {p: w.quantiles(quantiles) for p, w in windows.items()} if windows is not None else {}
            return {"phase": {p: (c, ns) for p, (c, ns) in self._phase.items()}, "summaries": summaries,
                    "failures": dict(self._failures),
                    "batches": {k: (c, ns) for k, (c, ns) in sorted(self._batches.items())},
                    "inference_count": self.inference_count, "execution_count": self.execution_count,
                    "last_inference": self.last_inference_ms}

    def to_proto(self) -> pb.ModelStatistics:
        """Triton's ``ModelStatistics`` message."""
        snap = self.snapshot()
        msg = pb.ModelStatistics(name=self.name, version=self.version, last_inference=snap["last_inference"],
                                 inference_count=snap["inference_count"], execution_count=snap["execution_count"])
        for phase, (count, ns) in snap["phase"].items():
            getattr(msg.inference_stats, phase).count = count
            getattr(msg.inference_stats, phase).ns = ns
        for phase in _PHASES:  # every phase Triton reports, zero when unused (no cache)
            getattr(msg.inference_stats, phase).SetInParent()
        for size, (count, ns) in snap["batches"].items():
            entry = msg.batch_stats.add(batch_size=size)
            entry.compute_infer.count = count
            entry.compute_infer.ns = ns
            entry.compute_input.SetInParent()
            entry.compute_output.SetInParent()
        return msg


# (name, HELP as Triton 2.51 writes it, phase, 0: its count / 1: its time in us); the order is Triton's
_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", "success", 0),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "fail", 0),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)", "", 0),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)", "", 0),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached "
     "requests)", "success", 1),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached "
     "requests)", "queue", 1),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include "
     "cached requests)", "compute_input", 1),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not "
     "include cached requests)", "compute_infer", 1),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does "
     "not include cached requests)", "compute_output", 1),
)
# --metrics-config summary_latencies=true: (name, HELP as Triton 2.51 writes it, window, phase of its count and sum)
_SUMMARIES = (
    ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds (includes cached "
     "requests)", "request", "success"),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds (includes cached "
     "requests)", "queue", "queue"),
    ("nv_inference_compute_input_summary_us", "Cumulative compute input duration in microseconds (does not include "
     "cached requests)", "compute_input", "compute_input"),
    ("nv_inference_compute_infer_summary_us", "Cumulative compute inference duration in microseconds (does not "
     "include cached requests)", "compute_infer", "compute_infer"),
    ("nv_inference_compute_output_summary_us", "Cumulative inference compute output duration in microseconds (does "
     "not include cached requests)", "compute_output", "compute_output"),
)
# a model whose answers the server caches: Triton's per-model cache counters
_CACHE_COUNTERS = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", 0),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds", "cache_hit", 1),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", 0),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     "cache_miss", 1),
)
# the server's cache as a whole: Triton's gauges (name, HELP, CacheCounts field)
_CACHE_GAUGES = (
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]", "utilization"),
    ("nv_cache_num_entries", "Number of responses stored in response cache", "entries"),
    ("nv_cache_num_hits", "Number of cache hits in response cache", "hits"),
    ("nv_cache_num_misses", "Number of cache misses in response cache", "misses"),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", "lookups"),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache", "evictions"),
    ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds", "lookup_us"),
    ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds", "insertion_us"),
)


def _counter(name: str, doc: str) -> Metric:
    # Triton's names carry no '_total': the samples are added as named (prometheus_client would append it)
    return Metric(name, doc, "counter")


def _value(snap: dict[str, Any], name: str, phase: str, which: int) -> int:
    if name == "nv_inference_count":
        return snap["inference_count"]
    if name == "nv_inference_exec_count":
        return snap["execution_count"]
    value = snap["phase"][phase][which]
    return value // 1000 if which else value  # ns -> us


class TritonCollector(Collector):
    """Triton's metrics, read from the statistics at scrape: per model (``model``, ``version``) and the cache's.

    Args:
        stats: Called at scrape time for the statistics of every model served now or before.
        pending: Called at scrape time for (model, version, queued requests) of the models served now.
        cache: Called at scrape time for the response cache's counts; None (or a call returning None) where
            the server has no cache.
        config: Which latency metrics to expose (``--metrics-config``): the counters, the summaries.
    """

    def __init__(self, stats: Callable[[], Iterable[ModelStats]],
                 pending: Callable[[], Iterable[tuple[str, str, int]]],
                 cache: Callable[[], CacheCounts | None] | None = None,
                 config: MetricsConfig | None = None) -> None:
        self._stats = stats
        self._pending = pending
        self._cache = cache
        self._config = config or MetricsConfig()

    def collect(self) -> Iterator[Metric]:
        """The metrics at scrape time, named, described and ordered as Triton 2.51 exposes them.

        ``nv_inference_*`` counters (durations in microseconds unless ``counter_latencies`` is off; failures by
        ``reason``, every reason listed), ``nv_cache_*_per_model`` for the models whose answers are cached, the
        pending-request gauge, the cache's own gauges where there is a cache, and last the latency summaries
        where ``summary_latencies`` is on; all from one snapshot of each model's statistics.
        """
        config = self._config
        quantiles = tuple(q for q, _ in config.summary_quantiles) if config.summary_latencies else ()
        snaps = [(s.name, s.version, s.caches_responses, s.snapshot(quantiles)) for s in self._stats()]
        for name, doc, phase, which in _COUNTERS:
            if which and not config.counter_latencies:
                continue
            metric = _counter(name, doc)
            for model, version, _, snap in snaps:
                if name == "nv_inference_request_failure":
                    for reason, count in snap["failures"].items():
                        metric.add_sample(name, {"model": model, "reason": reason, "version": version}, count)
                else:
                    metric.add_sample(name, {"model": model, "version": version}, _value(snap, name, phase, which))
            yield metric
        for name, doc, phase, which in _CACHE_COUNTERS:
            cached = [(model, version, snap) for model, version, caches, snap in snaps if caches]
            if cached:
                metric = _counter(name, doc)
                for model, version, snap in cached:
                    metric.add_sample(name, {"model": model, "version": version}, _value(snap, name, phase, which))
                yield metric
        pending = GaugeMetricFamily("nv_inference_pending_request_count", "Instantaneous number of pending "
                                    "requests awaiting execution per-model.", labels=["model", "version"])
        for model, version, queued in self._pending():
            pending.add_metric([model, version], queued)
        yield pending
        counts = self._cache() if self._cache is not None else None
        if counts is not None:
            for name, doc, field in _CACHE_GAUGES:
                yield GaugeMetricFamily(name, doc, value=getattr(counts, field))
        if quantiles:
            yield from self._summaries(snaps, quantiles)

    @staticmethod
    def _summaries(snaps: list[tuple[str, str, bool, dict[str, Any]]],
                   quantiles: tuple[float, ...]) -> Iterator[Metric]:
        """Triton's latency summaries: count and sum since start, and the recent quantiles (``quantile`` label)."""
        for name, doc, window, phase in _SUMMARIES:
            metric = Metric(name, doc, "summary")
            for model, version, _, snap in snaps:
                labels = {"model": model, "version": version}
                count, ns = snap["phase"][phase]
                metric.add_sample(f"{name}_count", labels, count)
                metric.add_sample(f"{name}_sum", labels, ns // 1000)
                for q, value in zip(quantiles, snap["summaries"].get(window, [math.nan] * len(quantiles)),
                                    strict=True):
                    metric.add_sample(name, {**labels, "quantile": f"{q:g}"}, value)
            yield metric
