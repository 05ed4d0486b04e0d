"""``pyasc bench MODEL --scenario ...``: MLPerf LoadGen's scenarios against each contender.

LoadGen (``pip install mlcommons-loadgen``, imported as ``mlperf_loadgen``) issues the queries and judges
the run; this module is its system under test (SUT) and sample library (QSL), built on
:meth:`hybrid.CompiledModel.submit`: each issued sample is submitted and completed from its future's
done callback, so no thread of ours waits on a call. Scenarios and their metric:

- SingleStream: one sample at a time, the next when the last completed; metric the p90 latency.
- MultiStream: queries of 8 samples, the next when the last completed; metric the p99 query latency.
- Server: samples arrive as a Poisson process at ``target_qps``; metric the highest QPS whose p99 stays
  under ``latency_bound`` (searched: a few LoadGen runs, bisecting; see :func:`search_server`).
- Offline: every sample in one query; the SUT batches them (``offline_batch`` samples per call, the
  same for every contender, when every input's dim 0 is dynamic); metric samples per second.

Each run's verdict is LoadGen's own (``mlperf_log_summary.txt``): VALID, or INVALID with the constraints
that failed and LoadGen's recommendation. Runs shorter than MLPerf's 600 s minimum are allowed and say so.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.errors import ConfigError

__all__ = ["SCENARIOS", "LoadgenResult", "LoadgenSettings", "run_scenario", "search_server", "summary_fields"]

_lock = threading.Lock()  # LoadGen keeps one test's state per process: one run at a time
SCENARIOS = ("singlestream", "multistream", "server", "offline")
_NAMES = {"singlestream": "SingleStream", "multistream": "MultiStream", "server": "Server", "offline": "Offline"}
SUBMISSION_MIN_S = 600.0  # MLPerf Inference's minimum run for a result (LoadGen's default min_duration)
MULTISTREAM_SAMPLES = 8
AUTO_TUNED = "auto+tune"  # target='auto' measured after cm.tune(): the decision made before the first query


@dataclass(frozen=True, slots=True)
class LoadgenSettings:
    """LoadGen's settings as ``pyasc bench`` takes them (None: derived from a warm call, and said so).

    Attributes:
        scenario: One of :data:`SCENARIOS`.
        target_qps: Server's Poisson rate, the search's first QPS (Offline: the expected samples/s).
        latency_bound_ms: Server's p99 bound.
        min_duration_s: LoadGen's min_duration.
        min_queries: LoadGen's min_query_count.
        mlperf_conf: A LoadGen config file (``*.Server.target_qps = ...``), applied before the above.
        offline_batch: Samples per call in Offline.
        search_runs: LoadGen runs of the Server search at most.
        workers: Calls at once into each contender (``CompiledModel.submit_workers``).
        tune: Also measure ``auto`` after ``cm.tune()`` on the library's samples (the contender
            :data:`AUTO_TUNED`): decided, its check process idle, before LoadGen's first query.
    """

    scenario: str
    target_qps: float | None = None
    latency_bound_ms: float | None = None
    min_duration_s: float = 10.0
    min_queries: int = 1
    mlperf_conf: Path | None = None
    offline_batch: int = 8
    search_runs: int = 6
    workers: int = 1
    tune: bool = False

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ConfigError("HYB-102", f"--scenario: expected one of {', '.join(SCENARIOS)}, got "
                              f"{self.scenario!r}", "e.g. --scenario server --latency-bound 15")
        for name, value in (("--target-qps", self.target_qps), ("--latency-bound", self.latency_bound_ms),
                            ("--min-duration", self.min_duration_s)):
            if value is not None and not value > 0:
                raise ConfigError("HYB-102", f"{name}: expected a number > 0, got {value!r}")
        for name, count in (("--min-queries", self.min_queries), ("--offline-batch", self.offline_batch),
                            ("--search-runs", self.search_runs), ("--workers", self.workers)):
            if count < 1:
                raise ConfigError("HYB-102", f"{name}: expected a whole number >= 1, got {count!r}")
        if self.mlperf_conf is not None and not Path(self.mlperf_conf).is_file():
            raise ConfigError("HYB-102", f"--mlperf-conf: {self.mlperf_conf} is not a file",
                              "give a LoadGen config (user.conf syntax: *.Server.target_qps = 100)")


@dataclass(frozen=True, slots=True)
class LoadgenResult:
    """One contender's LoadGen result (``status`` 'ok', or 'n/a' with the reason in ``note``).

    ``metric`` is the scenario's figure (ms for SingleStream/MultiStream, QPS for Server, samples/s for
    Offline), ``metric_name`` says which; ``valid`` and ``reason`` are LoadGen's verdict (for Server,
    of the run that holds the reported QPS); ``runs`` the Server search's runs as (qps, valid, p99 ms);
    ``tune_s`` the seconds ``cm.tune()`` took before the run (:data:`AUTO_TUNED` only).
    """

    target: str
    precision: str
    scenario: str
    status: str = "ok"
    valid: bool | None = None
    reason: str = ""
    metric_name: str = ""
    metric: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    samples_per_s: float | None = None
    duration_s: float | None = None
    queries: int | None = None
    compile_s: float | None = None
    first_call_ms: float | None = None
    short_run: bool = False
    note: str = ""
    latency_bound_ms: float | None = None
    runs: tuple[tuple[float, bool, float | None], ...] = field(default=())
    tune_s: float | None = None


def _lg() -> Any:
    try:
        import mlperf_loadgen
    except ImportError as e:
        raise ConfigError("HYB-102", "--scenario needs MLPerf LoadGen, which is not installed",
                          "pip install 'pyasc[bench]' (or pip install mlcommons-loadgen)") from e
    return mlperf_loadgen


def summary_fields(text: str) -> dict[str, str]:
    """``key : value`` lines of ``mlperf_log_summary.txt`` (later sections do not overwrite earlier keys)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and not key.startswith(" *"):
            out.setdefault(key.strip(), value.strip())
    return out


def _reason(text: str, fields: Mapping[str, str]) -> str:
    """Why LoadGen judged INVALID: the constraints marked NO, and its recommendation's first line."""
    failed = [k.replace(" satisfied", "") for k, v in fields.items() if k.endswith("satisfied") and v.upper() == "NO"]
    advice = ""
    match = re.search(r"Recommendations:\n(.*?)(?:\n\n|\n=)", text, re.S)
    if match:
        lines = [ln.strip(" *") for ln in match.group(1).splitlines() if ln.strip(" *")]
        lines = [ln for ln in lines if ln != "Early Stopping Result:"]
        advice = " ".join(lines[:3])
    return "; ".join(filter(None, [", ".join(failed) and f"not met: {', '.join(failed)}", advice]))


def _ms(fields: Mapping[str, str], key: str) -> float | None:
    value = fields.get(key)
    return None if value is None else float(value) / 1e6


def _batchable(signature: Any) -> bool:
    """Whether samples can be stacked along dim 0 (every input's dim 0 dynamic)."""
    inputs = signature.inputs
    return bool(inputs) and all(i.shape and not isinstance(i.shape[0], int) for i in inputs)


class _Sut:
    """LoadGen's SUT and QSL around one compiled model, completing from ``submit`` futures."""

    def __init__(self, lg: Any, cm: Any, samples: Sequence[Mapping[str, np.ndarray]], batch: int) -> None:
        self.lg, self.cm, self.samples, self.batch = lg, cm, samples, batch
        self.errors: list[BaseException] = []
        self.sut = lg.ConstructSUT(self.issue, lambda: None)
        self.qsl = lg.ConstructQSL(len(samples), len(samples), lambda _ids: None, lambda _ids: None)

    def _done(self, ids: list[int]) -> Callable[[Any], None]:
        def complete(future: Any) -> None:
            error = future.exception()
            if error is not None:
                self.errors.append(error)
            # outputs are not handed to LoadGen: a performance run, accuracy is bench's own check
            self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(i, 0, 0) for i in ids])
        return complete

    def issue(self, queries: list[Any]) -> None:
        if len(queries) == 1 or self.batch == 1:
            for q in queries:
                self._submit([q], self.samples[q.index])
            return
        # Offline: batches are stacked as they are run, a few in flight (all stacked at once: gigabytes)
        chunks = iter([queries[k:k + self.batch] for k in range(0, len(queries), self.batch)])
        lock = threading.Lock()
        for _ in range(self.cm.submit_workers + 1):
            self._next(chunks, lock)

    def _next(self, chunks: Any, lock: threading.Lock) -> None:
        with lock:
            chunk = next(chunks, None)
        if chunk is not None:
            feeds = {name: np.concatenate([self.samples[q.index][name] for q in chunk]) for name in self.samples[0]}
            self._submit(chunk, feeds, lambda: self._next(chunks, lock))

    def _submit(self, chunk: list[Any], feeds: Mapping[str, np.ndarray], then: Callable[[], None] | None = None
                ) -> None:
        ids = [q.id for q in chunk]
        try:
            future = self.cm.submit(feeds)
        except BaseException as e:  # a failed sample still completes, or LoadGen waits forever
            self.errors.append(e)
            self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(i, 0, 0) for i in ids])
            if then is not None:
                then()
            return
        complete = self._done(ids)
        future.add_done_callback(complete if then is None else lambda f: (complete(f), then()))

    def close(self) -> None:
        self.lg.DestroyQSL(self.qsl)
        self.lg.DestroySUT(self.sut)


def _settings(lg: Any, s: LoadgenSettings, call_s: float, qps: float | None) -> Any:
    ts = lg.TestSettings()
    name = _NAMES[s.scenario]
    if s.mlperf_conf is not None:
        ts.FromConfig(str(s.mlperf_conf), "*", name)
    ts.scenario = getattr(lg.TestScenario, name)
    ts.mode = lg.TestMode.PerformanceOnly
    ts.min_duration_ms = int(s.min_duration_s * 1000)
    ts.min_query_count = s.min_queries
    # half a warm call: LoadGen pre-generates min_duration / expected queries, too few ends the run short
    expected_ns = max(int(call_s * 0.5e9), 1000)
    ts.single_stream_expected_latency_ns = expected_ns
    ts.multi_stream_expected_latency_ns = expected_ns * MULTISTREAM_SAMPLES
    ts.multi_stream_samples_per_query = MULTISTREAM_SAMPLES
    if qps is not None:
        ts.server_target_qps = qps
        ts.offline_expected_qps = qps
    if s.latency_bound_ms is not None:
        ts.server_target_latency_ns = int(s.latency_bound_ms * 1e6)
    return ts


def _one_run(cm: Any, samples: Sequence[Mapping[str, np.ndarray]], s: LoadgenSettings, call_s: float,
             qps: float | None, batch: int) -> tuple[dict[str, str], str]:
    """One LoadGen test; (summary fields, summary text). Raises what the model raised during the run."""
    lg = _lg()
    with _lock:
        return _locked_run(lg, cm, samples, s, call_s, qps, batch)


def _locked_run(lg: Any, cm: Any, samples: Sequence[Mapping[str, np.ndarray]], s: LoadgenSettings, call_s: float,
                qps: float | None, batch: int) -> tuple[dict[str, str], str]:
    sut = _Sut(lg, cm, samples, batch)
    logs = Path(tempfile.mkdtemp(prefix="pyasc-loadgen-"))
    try:
        out = lg.LogOutputSettings()
        out.outdir = str(logs)
        out.copy_summary_to_stdout = False
        log = lg.LogSettings()
        log.log_output = out
        log.enable_trace = False
        lg.StartTestWithLogSettings(sut.sut, sut.qsl, _settings(lg, s, call_s, qps), log, "")
        text = (logs / "mlperf_log_summary.txt").read_text()
    finally:
        sut.close()
        shutil.rmtree(logs, ignore_errors=True)
    if sut.errors:
        raise sut.errors[0]
    return summary_fields(text), text


def _result(base: LoadgenResult, s: LoadgenSettings, fields: Mapping[str, str], text: str) -> LoadgenResult:
    valid = fields.get("Result is", "").upper() == "VALID"
    scenario = s.scenario
    p99 = _ms(fields, "99.00 percentile latency (ns)")
    if scenario == "multistream":  # the p99 of whole 8-sample queries
        p99 = _ms(fields, "99.0th percentile latency (ns)") or p99
    rate = fields.get("Samples per second") or fields.get("Completed samples per second") \
        or fields.get("QPS w/ loadgen overhead")
    metric: float | None
    if scenario == "singlestream":
        name, metric = "p90 ms", _ms(fields, "90.0th percentile latency (ns)") or _ms(fields, "90.00 percentile "
                                                                                      "latency (ns)")
    elif scenario == "multistream":
        name, metric = "p99 ms (8-sample query)", p99
    elif scenario == "server":
        name, metric = f"QPS (p99 <= {s.latency_bound_ms:g} ms)", float(fields.get("Scheduled samples per second",
                                                                                    "0"))
    else:
        name, metric = "samples/s", float(rate) if rate else None
    counted = re.search(r"[Pp]rocessed (?:at least \d+ queries \((\d+)\)|(\d+) queries)", text)
    queries = counted and (counted.group(1) or counted.group(2))
    return replace(base, valid=valid, reason="" if valid else _reason(text, fields), metric_name=name,
                   metric=metric, p50_ms=_ms(fields, "50.00 percentile latency (ns)"),
                   p90_ms=_ms(fields, "90.00 percentile latency (ns)"), p99_ms=p99,
                   samples_per_s=float(rate) if rate else None, queries=int(queries) if queries else None,
                   duration_s=s.min_duration_s, short_run=s.min_duration_s < SUBMISSION_MIN_S)


def search_server(probe: Callable[[float], tuple[bool, float | None, bool]], start_qps: float, runs: int
                  ) -> tuple[float, float, list[tuple[float, bool, float | None]]]:
    """The highest QPS whose p99 stays under the bound: grow from ``start_qps`` until a run breaks it, then bisect.

    ``probe(qps)`` runs LoadGen at ``qps`` and returns (VALID, p99 ms, bound broken). The direction follows
    the bound (broken: lower; held: higher); the answer is the highest QPS LoadGen called VALID, so an
    INVALID run that held the bound (too few queries for early stopping) steers the search without
    being reported. Stops after ``runs`` runs or when bracketed within 5 %.

    Returns:
        (highest VALID QPS, 0.0 if none; highest QPS that held the bound, VALID or not; every run as
        (qps, valid, p99 ms)).
    """
    history: list[tuple[float, bool, float | None]] = []
    held, hi, qps = 0.0, math.inf, start_qps
    while len(history) < runs:
        valid, p99, broken = probe(qps)
        history.append((qps, valid, p99))
        if broken:
            hi = qps
        else:
            held = qps
        if hi != math.inf and held and (hi - held) / hi < 0.05:
            break
        qps = qps * 2 if hi == math.inf else (held + hi) / 2 if held else hi / 2
    best = max((q for q, valid, _ in history if valid and q <= held), default=0.0)
    return best, held, history


def _more_queries(text: str) -> int | None:
    """The query count LoadGen's early stopping asks for (``Would need to run at least N more queries``)."""
    processed = re.search(r"Processed (\d+) queries", text)
    more = re.search(r"at least (\d+) more queries", text) or re.search(r"at least (\d+) queries", text)
    if not more:
        return None
    return int(more.group(1)) + (int(processed.group(1)) if processed and "more" in more.group(0) else 0)


def run_scenario(cm: Any, samples: Sequence[Mapping[str, np.ndarray]], s: LoadgenSettings, base: LoadgenResult,
                 on_step: Callable[[str], None] | None = None) -> LoadgenResult:
    """Run ``s.scenario`` against ``cm`` (compiled, warmed) and return its result.

    Raises:
        HybridError: what the model raised on a sample (HYB-408 and kin).
    """
    step = on_step or (lambda _text: None)
    cm.submit_workers = s.workers
    times = []
    for i in range(5):
        t0 = time.perf_counter()
        cm.submit(samples[i % len(samples)]).result()
        times.append(time.perf_counter() - t0)
    call_s = float(np.median(times))  # a warm call: LoadGen's expected latency, and the first QPS guess
    batch = s.offline_batch if s.scenario == "offline" and _batchable(cm.signature) else 1
    if batch > 1:  # Offline's one query must outlast min_duration: sized from a warm batched call
        stacked = {k: np.concatenate([samples[i % len(samples)][k] for i in range(batch)]) for k in samples[0]}
        cm.submit(stacked).result()
        t0 = time.perf_counter()
        cm.submit(stacked).result()
        call_s = (time.perf_counter() - t0) / batch
    if s.scenario != "server":
        # 2x the warm rate: a query too small ends before min_duration (INVALID), a larger one only runs longer
        qps = s.target_qps or 2 * s.workers / call_s
        step(f"LoadGen {_NAMES[s.scenario]} on {base.target} {base.precision}")
        fields, text = _one_run(cm, samples, s, call_s, qps, batch)
        result = _result(base, s, fields, text)
        if s.scenario == "offline" and not s.target_qps and fields.get("Min duration satisfied", "").upper() == "NO" \
                and result.samples_per_s:
            # the query ran out before min_duration: once more, sized from the rate it just ran at
            step(f"LoadGen Offline again on {base.target} {base.precision}, at {2 * result.samples_per_s:.0f}/s")
            fields, text = _one_run(cm, samples, s, call_s, 2 * result.samples_per_s, batch)
            result = _result(base, s, fields, text)
        return replace(result, note="; ".join(filter(None, [base.note, f"batch {batch} per call" if batch > 1
                                                           else ""])))
    bound = s.latency_bound_ms
    derived = bound is None
    if derived:
        bound = round(max(10 * call_s * 1e3, 1.0), 1)
    s = replace(s, latency_bound_ms=bound)
    kept: dict[float, LoadgenResult] = {}

    def probe(qps: float) -> tuple[bool, float | None, bool]:
        step(f"LoadGen Server at {qps:.1f} QPS on {base.target} {base.precision}")
        run = s
        for _ in range(2):  # an INVALID run for too few queries is run again with the count LoadGen asks for
            fields, text = _one_run(cm, samples, run, call_s, qps, 1)
            got = _result(base, run, fields, text)
            broken = fields.get("Performance constraints satisfied", "").upper() == "NO" or \
                (got.p99_ms is not None and got.p99_ms > bound)
            need = _more_queries(text)
            # up to 4x the asked duration or 20 s: a low rate is not run for minutes
            if got.valid or broken or need is None or need > qps * max(4 * s.min_duration_s, 20.0) \
                    or need <= run.min_queries:
                break
            run = replace(s, min_queries=need)
            step(f"LoadGen Server at {qps:.1f} QPS again, {need} queries (early stopping)")
        kept[qps] = got
        return bool(got.valid), got.p99_ms, broken

    start = s.target_qps or max(0.5 * s.workers / call_s, 1.0)
    best, held, history = search_server(probe, start, s.search_runs)
    shown = kept[best] if best else kept[held] if held else kept[history[-1][0]]
    tried = ", ".join(f"{q:.1f}{'' if v else '*'}" for q, v, _ in history)
    notes = [base.note, f"p99 bound {bound:g} ms (10x this contender's warm call, then the same for the others; "
             "--latency-bound to set)" if derived else "",
             f"search QPS: {tried} (* INVALID)",
             f"{held:.1f} QPS held the bound in an INVALID run" if held > best else ""]
    # with no VALID run, the QPS that held the bound is shown, marked INVALID with LoadGen's reason
    return replace(shown, metric=best or held, runs=tuple(history), latency_bound_ms=bound,
                   note="; ".join(filter(None, notes)), valid=best > 0,
                   reason="" if best else (shown.reason or "no run held the bound"))


def samples_from(feeds: Mapping[str, np.ndarray], npz: Path | None, regenerate: Callable[[int], Mapping[str, Any]]
                 | None, count: int = 8) -> list[dict[str, np.ndarray]]:
    """The sample library: a ``.npz`` (one array per input, axis 0 indexes samples), or the feeds bench runs.

    Generated feeds (``regenerate(seed)``) give ``count`` samples at the same shapes with other seeds;
    ``--input`` files give the one sample they hold.

    Raises:
        ConfigError: HYB-102 for a ``.npz`` that lacks an input or holds different sample counts.
    """
    if npz is not None:
        with np.load(npz, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        missing = [k for k in feeds if k not in arrays]
        counts = {len(a) for a in arrays.values() if a.ndim}
        if missing or len(counts) != 1:
            raise ConfigError("HYB-102", f"--samples {npz}: expected one array per input ({', '.join(feeds)}) "
                              f"with the same number of samples on axis 0, got "
                              f"{ {k: list(a.shape) for k, a in arrays.items()} }",
                              "numpy.savez(path, x=np.stack(samples))")
        return [{k: arrays[k][i] for k in feeds} for i in range(counts.pop())]
    out = [dict(feeds)]
    if regenerate is not None:
        out += [dict(regenerate(seed)) for seed in range(1, count)]
    return out



def _offline_shapes(compile_shapes: Mapping[str, Any] | None, sample: Mapping[str, np.ndarray], batch: int
                    ) -> dict[str, Any] | None:
    """Compile shapes that admit ``batch`` samples stacked on dim 0 (a range from one sample to the batch)."""
    if batch <= 1 or not compile_shapes:
        return dict(compile_shapes) if compile_shapes else compile_shapes
    out: dict[str, Any] = {}
    for name, spec in compile_shapes.items():
        one = tuple(int(d) for d in np.shape(sample[name]))
        full = (one[0] * batch, *one[1:])
        if isinstance(spec, Mapping):
            out[name] = {"min": tuple(spec.get("min", one)), "opt": full,
                         "max": tuple(max(a, b) for a, b in zip(spec.get("max", full), full))}
        else:
            out[name] = {"min": one, "opt": full, "max": full}
    return out


def _contenders(targets: str | list[str], precisions: Sequence[str], tune: bool = False) -> list[tuple[str, str]]:
    """(target, precision) pairs: 'auto' is one contender compiled as a user gets it; others per candidate.

    With ``tune``, :data:`AUTO_TUNED` follows 'auto': the same compile, measured after ``cm.tune()``.

    Raises:
        ConfigError: HYB-102 for ``tune`` without 'auto' among the targets.
    """
    from hybrid.hal import resolve_target

    asked = [*(str(c) for c in resolve_target("auto")), "auto"] if targets == "all" else list(targets)
    if tune and "auto" not in asked:
        raise ConfigError("HYB-102", f"--tune measures target='auto' after cm.tune(), but -t {','.join(asked)} "
                          "has no auto", "add auto to -t (e.g. -t onnxruntime,openvino,auto --tune)")
    pairs: list[tuple[str, str]] = []
    for t in asked:
        if t == "auto":
            pairs += [("auto", "auto"), *([(AUTO_TUNED, "auto")] if tune else [])]
        else:
            pairs += [(str(c), p) for c in resolve_target(t) for p in precisions]
    return list(dict.fromkeys(pairs))


def _tune(cm: Any, samples: Sequence[Mapping[str, np.ndarray]], batch: int) -> tuple[float, str]:
    """``cm.tune()`` on what the run will call (one sample; Offline's stacked batch too): (seconds, what it decided).

    ``tune`` returns once each bucket is decided with no candidate left to time, so the check process is idle
    when LoadGen's first query comes: the run measures the decision, not the tuning.
    """
    feeds = [samples[0]]
    if batch > 1:
        feeds.append({k: np.concatenate([samples[i % len(samples)][k] for i in range(batch)]) for k in samples[0]})
    t0 = time.perf_counter()
    records = cm.tune(feeds)
    took = time.perf_counter() - t0
    decided = "; ".join(f"{r.bucket}: {r.serving}" + (f" (decided after {r.decided_after_calls} calls)"
                                                      if r.decided_after_calls is not None else "")
                        for r in records) or f"{cm.backend}:{cm.device}, nothing to decide"
    return took, f"cm.tune() took {took:.1f} s before the run: {decided}"


def children_cpu_s() -> float | None:
    """CPU seconds this process's child processes have used so far (Linux ``/proc``); None where it cannot tell."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").is_file():
        return None
    me, tick, total = os.getpid(), os.sysconf("SC_CLK_TCK"), 0.0
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # after the name: state, ppid, ... utime, stime
        except OSError:  # ended while read
            continue
        if len(fields) > 12 and int(fields[1]) == me:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def settle(read_cpu: Callable[[], float | None] = children_cpu_s, clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep, window_s: float = 1.0, busy_share: float = 0.05,
           max_wait_s: float = 30.0) -> tuple[float, bool] | None:
    """Wait until this process's children (auto's check process) use under ``busy_share`` of a core for a window.

    On a machine of few cores a child's CPU (the check process importing its backends, checking, racing) is
    taken from the calls being timed; this waits it out, ``max_wait_s`` at most.

    Returns:
        (seconds waited, whether they went quiet), or None where children's CPU cannot be read.
    """
    last = read_cpu()
    if last is None:
        return None
    start = clock()
    while True:
        sleep(window_s)
        used, now = read_cpu(), clock()
        if used is None or used - last < busy_share * window_s:
            return now - start, True
        if now - start >= max_wait_s:
            return now - start, False
        last = used


def _decision(cm: Any, compile_s: float) -> str:
    """What ``target='auto'`` decided under LoadGen's traffic, and how long it took (from ``cm.tuning``)."""
    records = cm.tuning
    if not records:
        return f"auto serves {cm.backend}:{cm.device}, decided at compile ({compile_s:.2f} s)"
    parts = []
    for r in records:
        if r.decided_after_s is not None:
            parts.append(f"{r.bucket}: {r.serving}, decided after {r.decided_after_s:.1f} s "
                         f"({r.decided_after_calls} calls)")
        else:
            # the run's figures include the tuning: its check process shares the cores with the calls
            parts.append(f"{r.bucket}: {r.serving}, still {r.state} ({r.phase}) after {r.calls} calls: the "
                         "figures are of the tuning period (--tune measures after the decision)")
    return "auto " + "; ".join(parts)


def bench_loadgen(model: Any, targets: str | list[str], precisions: Sequence[str], s: LoadgenSettings,
                  feeds: Any, samples: Sequence[Mapping[str, np.ndarray]], config: Mapping[str, Any] | None = None,
                  on_step: Callable[[str], None] | None = None) -> list[LoadgenResult]:
    """Compile every contender and run ``s.scenario`` on each, one after another (LoadGen runs one test at once).

    Args:
        model: A hybrid.Model.
        targets: 'all' (every candidate here, and auto) or targets; 'auto' is compiled with nothing given
            and tuned online by LoadGen's own traffic, its decision and the time to it in the row's note
            (with ``s.tune``, :data:`AUTO_TUNED` follows it: measured after ``cm.tune()``, its time in
            ``tune_s``).
        precisions: Precisions of the pinned targets.
        s: LoadGen's settings.
        feeds: The resolved inputs (:class:`hybrid.cli._inputs.Inputs`; its compile shapes are used).
        samples: The sample library (:func:`samples_from`).
        config: Backend options per backend name.
        on_step: Progress.

    Returns:
        One result per contender, 'n/a' with the reason for one that cannot compile or run.
    """
    from hybrid.errors import HybridError
    from hybrid.runtime.compiler import compile_model

    step = on_step or (lambda _text: None)
    _lg()
    batch = s.offline_batch if s.scenario == "offline" and _batchable(model.signature) else 1
    shapes = _offline_shapes(feeds.compile_shapes, samples[0], batch)
    results: list[LoadgenResult] = []
    for target, prec in _contenders(targets, precisions, s.tune):
        base = LoadgenResult(target, prec, s.scenario)
        step(f"compiling for {target} {prec}")
        t0 = time.perf_counter()
        cm = None
        try:
            if target in ("auto", AUTO_TUNED):
                cm = compile_model(model, target="auto", shapes=shapes)
            else:
                backend = target.partition(":")[0]
                options = {backend: dict(config[backend])} if config and backend in config else None
                cm = compile_model(model, target=target, precision=prec, config=options, shapes=shapes)
            compile_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            cm.run(samples[0])
            first_ms = (time.perf_counter() - t1) * 1e3
            base = replace(base, compile_s=compile_s, first_call_ms=first_ms)
            if target == AUTO_TUNED:
                step(f"cm.tune() for {target}")
                tune_s, tuned = _tune(cm, samples, batch)
                step(f"waiting for {target}'s check process to idle")
                quiet = settle()
                if quiet is not None:  # its start-up imports run at full speed when tune() asked no check
                    tuned += (f"; then {quiet[0]:.1f} s until its check process idled" if quiet[1] else
                              f"; its check process was still busy after {quiet[0]:.0f} s")
                base = replace(base, tune_s=tune_s, note=tuned)
            got = run_scenario(cm, samples, s, base, step)
            if target == "auto":
                got = replace(got, note="; ".join(filter(None, [got.note, _decision(cm, compile_s)])))
            results.append(got)
            if s.latency_bound_ms is None and got.latency_bound_ms is not None:
                # derived from the first contender's warm call, then the same bound for every contender
                s = replace(s, latency_bound_ms=got.latency_bound_ms)
        except HybridError as e:
            if e.code == "HYB-306":
                raise  # a backend option the user gave is wrong: not a row
            results.append(replace(base, status="n/a", note=f"[{e.code}] {e.message}"))
        finally:
            if cm is not None:
                cm.close()
    return results
