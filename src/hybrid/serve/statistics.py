"""Triton's per-model inference statistics, kept by the server and reported three ways.

``ModelStats`` accumulates what Triton's ``InferStatistics`` holds (success, fail, queue, compute input /
infer / output: a count and nanoseconds each), the inference and execution counts, and one entry per
executed batch size. ``GET /v2/models/{m}/stats`` and gRPC ``ModelStatistics`` return it as Triton's
``ModelStatistics`` message (JSON on HTTP); ``/metrics`` exposes the same numbers under Triton's metric
names (``nv_inference_*``, microseconds), so the three never disagree.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from tritonclient.grpc import service_pb2 as pb

__all__ = ["ModelStats", "TritonCollector"]

_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
_NS = 1_000_000_000


class ModelStats:
    """The statistics of one model version (thread-safe: the batcher's threads and the event loop feed it).

    Args:
        name: Model name.
        version: Model version.
    """

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self._lock = threading.Lock()
        self._phase = {p: [0, 0] for p in _PHASES}  # phase -> [count, ns]
        self._batches: dict[int, list[int]] = {}  # batch size -> [count, infer ns]
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0

    def _add(self, phase: str, count: int, seconds: float) -> None:
        entry = self._phase[phase]
        entry[0] += count
        entry[1] += round(seconds * _NS)

    def request(self, ok: bool, seconds: float, rows: int = 1, input_s: float = 0.0, output_s: float = 0.0,
                cached: bool = False) -> None:
        """One request answered (``ok``) or failed after ``seconds`` in the server.

        ``cached``: answered from the response cache: a success and a (zero) queue entry, as Triton counts it,
        with no compute and no inference.
        """
        with self._lock:
            if ok and cached:
                self._add("success", 1, seconds)
                self._add("queue", 1, 0.0)
                self.last_inference_ms = int(time.time() * 1000)
            elif ok:
                self._add("success", 1, seconds)
                self._add("compute_input", 1, input_s)
                self._add("compute_output", 1, output_s)
                self.inference_count += rows
                self.last_inference_ms = int(time.time() * 1000)
            else:
                self._add("fail", 1, seconds)

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
            entry = self._batches.setdefault(size, [0, 0])
            entry[0] += 1
            entry[1] += round(run_s * _NS)

    def snapshot(self) -> dict[str, int | dict[str, tuple[int, int]] | dict[int, tuple[int, int]]]:
        """A consistent copy of every number, taken under the lock.

        ``phase``: (count, ns) per phase; ``batches``: (count, infer ns) per executed batch size, smallest
        first; ``inference_count``, ``execution_count`` and ``last_inference`` (ms since the epoch).
        """
        with self._lock:
            return {"phase": {p: (c, ns) for p, (c, ns) in self._phase.items()},
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


_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", "success", 0),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "fail", 0),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds", "success", 1),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", "queue", 1),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     "compute_input", 1),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     "compute_infer", 1),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     "compute_output", 1),
)


def _counter(name: str, doc: str) -> Metric:
    # Triton's names carry no '_total': the samples are added as named (prometheus_client would append it)
    return Metric(name, doc, "counter")


class TritonCollector(Collector):
    """Triton's per-model metrics (labels ``model`` and ``version``), read from the statistics at scrape.

    Args:
        stats: Called at scrape time for the statistics of every model served now or before.
        pending: Called at scrape time for (model, version, queued requests) of the models served now.
    """

    def __init__(self, stats: Callable[[], Iterable[ModelStats]],
                 pending: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        self._stats = stats
        self._pending = pending

    def collect(self) -> Iterator[Metric]:
        """The metrics at scrape time: Triton's ``nv_inference_*`` counters and the pending-request gauge.

        Durations are in microseconds, per ``model`` and ``version``, from one snapshot of each model's
        statistics.
        """
        snaps = [(s.name, s.version, s.snapshot()) for s in self._stats()]
        for name, doc, phase, which in _COUNTERS:
            metric = _counter(name, doc)
            for model, version, snap in snaps:
                value = snap["phase"][phase][which]
                metric.add_sample(name, {"model": model, "version": version}, value // 1000 if which else value)
            yield metric
        for name, doc, key in (("nv_inference_count", "Number of inferences performed (rows of batched "
                                "requests)", "inference_count"),
                               ("nv_inference_exec_count", "Number of model executions performed (batches)",
                                "execution_count")):
            metric = _counter(name, doc)
            for model, version, snap in snaps:
                metric.add_sample(name, {"model": model, "version": version}, snap[key])
            yield metric
        pending = GaugeMetricFamily("nv_inference_pending_request_count", "Instantaneous number of pending "
                                    "requests awaiting execution per-model", labels=["model", "version"])
        for model, version, queued in self._pending():
            pending.add_metric([model, version], queued)
        yield pending
