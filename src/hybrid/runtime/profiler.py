"""``hybrid.profile``: run a model for a while and write a Chrome trace (opens in Perfetto).

The trace has four tracks of spans. Profiled runs (the first ``node_runs``, compiled with the backend's
``Backend.profiling_options``) and their nodes, from the backend's own profiler through
``Executable.node_spans`` (ONNX Runtime's events re-timed onto hybrid's clock run by run; OpenVINO's
per-layer counters laid end to end in each call; any backend's that implements the hook). Then plain
runs (``cm.run``, validation included) and their subgraphs (the backend executable's call), timed for
``duration`` seconds: the latency percentiles and throughput come from these alone, as a profiler slows
the runs it watches. The trace is bounded (a minute of a small model
is millions of node events): node spans from the profiled runs only, run spans for the first
``MAX_RUN_SPANS`` plain runs. Memory-pool counters become counter tracks when pools are configured
(``hybrid.init``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.errors import ConfigError, ModelError, RunError
from hybrid.hal.backend import MACHINE_OPTIONS, Executable, NodeSpan
from hybrid.runtime.compiled import CompiledModel, LiveView

__all__ = ["OpStat", "ProfileReport", "check_arguments", "profile", "sample_inputs", "task_input_shapes"]

logger = logging.getLogger("hybrid")

_RUN, _SUBGRAPH, _NODE, _PROFILED = 1, 2, 3, 4  # trace thread ids (tracks)
MAX_RUN_SPANS = 20_000  # plain runs drawn in the trace (about 2.5 MB); later runs count in the statistics only
MAX_NODE_EVENTS = 200_000  # node spans in the trace (about 30 MB)


@dataclass(frozen=True, slots=True)
class OpStat:
    """Time spent in one operator type (or one node), over the runs that have node spans."""

    name: str
    count: int
    total_ms: float
    per_run_ms: float
    share: float


@dataclass(frozen=True, slots=True)
class ProfileReport:
    """What ``hybrid.profile`` measured.

    Attributes:
        model, backend, device: What ran.
        runs: Timed plain runs (after ``warmup``); node_runs: profiled runs (node spans) before them.
        wall_s: Wall time of the timed loop.
        latency_ms: 'p50', 'p90', 'p99', 'mean', 'min', 'max' of ``cm.run`` over the plain runs.
        throughput: Inferences per second: runs / time spent in runs (one stream, batch as given).
        items_per_s: ``throughput`` times the batch size.
        top_ops: Operator types by total time; top_nodes: single nodes by total time.
        output: Path of the trace written (None if none); events: how many events it holds.
        notes: What could not be measured and why (and, under ``target='auto'``, which candidate was profiled).
        inputs: The shape of each input run.
    """

    model: str
    backend: str
    device: str
    runs: int
    node_runs: int
    wall_s: float
    latency_ms: dict[str, float]
    throughput: float
    items_per_s: float
    top_ops: tuple[OpStat, ...]
    top_nodes: tuple[OpStat, ...]
    output: str | None
    events: int
    notes: tuple[str, ...] = ()
    inputs: dict[str, list[int]] = field(default_factory=dict)

    def summary(self, top: int = 10) -> str:
        """A text summary: latency, throughput and the ``top`` operators and nodes."""
        lat = self.latency_ms
        lines = [f"profile of {self.model!r} on {self.backend}:{self.device}: {self.runs} runs in {self.wall_s:.2f} s"
                 + (f" (and {self.node_runs} profiled runs before them for node spans)" if self.node_runs else ""),
                 f"latency ms: p50 {lat['p50']:.3f}  p90 {lat['p90']:.3f}  p99 {lat['p99']:.3f}  "
                 f"mean {lat['mean']:.3f}  min {lat['min']:.3f}  max {lat['max']:.3f}",
                 f"throughput: {self.throughput:.1f} inferences/s ({self.items_per_s:.1f} items/s)"]
        if self.top_ops:
            lines.append(f"top ops by time, over the {self.node_runs} runs with node spans (the backend's "
                         "profiler slows them):")
            lines.append(f"  {'op type':<34} {'share':>6}  {'ms/run':>7}  {'nodes':>6}")
            lines += [f"  {s.name[:34]:<34} {s.share * 100:5.1f}%  {s.per_run_ms:7.3f}  {s.count:6d}"
                      for s in self.top_ops[:top]]
        lines += [f"note: {n}" for n in self.notes]
        if self.output:
            lines.append(f"trace: {self.output} ({self.events} events; open it in https://ui.perfetto.dev)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


class _TimedExecutable(Executable):
    """Records (start, end) of every executable call: the subgraph spans."""

    def __init__(self, inner: Executable) -> None:
        self.inner = inner
        self.input_names = inner.input_names
        self.output_names = inner.output_names
        self.spans: list[tuple[int, int]] = []

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        t0 = time.perf_counter_ns()
        out = self.inner.run(feeds)
        self.spans.append((t0, time.perf_counter_ns()))
        return out

    def close(self) -> None:
        self.inner.close()


def _legacy_samples(signature: Any, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in signature.inputs:
        shape = tuple(d if isinstance(d, int) else batch for d in (spec.shape or ()))
        dtype = spec.dtype if spec.dtype is not None else np.dtype(np.float32)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[spec.name] = rng.integers(1, 3, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.random(shape) > 0.5
        else:
            raise RunError("HYB-406", f"input {spec.name!r}: cannot generate {dtype} data",
                           "pass the inputs (inputs=... or --input NAME=FILE.npy)")
    return feeds


def sample_inputs(model: Any, batch: int = 1, seed: int = 0,
                  shapes: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
    """Inputs generated the way ``target='auto'`` makes its samples (``make_samples``).

    So profile, bench and auto-selection run a model on the same kind of data: floats standard normal, integers
    that index a constant table inside it, other integers 1 or 2.

    Args:
        model: A hybrid.Model or CompiledModel (a bare Signature is accepted too, without the index
            bounds only the graph can tell).
        batch: Size of symbolic dims not given by ``shapes``.
        seed: Random seed.
        shapes: Concrete shapes of some inputs (``--shapes``); inputs sharing a symbolic dim's name follow.

    Raises:
        RunError: HYB-406 for an input that cannot be generated (sequences, maps, unknown dtype or rank).
    """
    source = getattr(model, "model", model)
    if not hasattr(source, "graph"):  # a Signature
        return _legacy_samples(source, batch, seed)
    from hybrid.runtime.auto import make_samples, normalize_shapes
    from hybrid.runtime.auto.shapes import concrete_shapes

    concrete = concrete_shapes(source.signature, normalize_shapes(source.signature, shapes), "opt", default=batch) \
        if shapes else None
    feeds = make_samples(source, seed=seed, symbolic_size=batch, shapes=concrete)
    if feeds is None:
        raise RunError("HYB-406", f"model {source.name!r}: cannot generate inputs for its signature "
                       f"{source.signature}", "pass the inputs (inputs=... or --input NAME=FILE.npy)")
    return {k: np.asarray(v) for k, v in feeds.items()}


def task_input_shapes(model: Any, batch: int = 1) -> dict[str, tuple[int, ...]] | None:
    """The input shape a task model declares (``bundle create --input-size``), for a batch of ``batch`` images.

    A task-aware wrapper (``hybrid.vision.TaskModel``, a layer above this one) says it through its
    ``image_input_shapes(batch)``; a model whose height and width are dynamic is profiled, benched and run at that
    size, as it is served. None for any other model.

    Args:
        model: What was given to profile: a task model, or anything else (None then).
        batch: Images per run, where the input's batch dim is dynamic.
    """
    shapes_of = getattr(model, "image_input_shapes", None)
    return shapes_of(batch) if callable(shapes_of) else None


def _one_candidate(cm: CompiledModel, feeds: Mapping[str, Any]) -> tuple[CompiledModel, list[str]]:
    """The single candidate every figure of a profile comes from.

    A model compiled with ``target='auto'`` that tunes online routes each call by its shape bucket, and races
    candidates in turns while it decides (and on later re-checks): timed through it, the latencies would mix
    backends, and its ``backend`` names the most-called bucket's, not necessarily the profiled one's. So the
    profiled shape's bucket is decided first (``cm.tune``), then the candidate serving it is profiled on its own:
    node table, header and latencies all of it. Any other model is profiled as it is.

    Raises:
        RunError: HYB-411 when the bucket is not decided within the tuning policy's bound.
    """
    if not cm.tunes_online:
        return cm, []
    live = cm.executable
    if not isinstance(live, LiveView):  # (a task model's wrapper reports the model it wraps)
        return cm, []
    serving = live.serving_for(feeds)
    assert serving.executable is not None, "a live view names the executable it serves with"
    pinned = CompiledModel(cm.model, serving.executable, serving.plan, serving.backend, serving.device,
                           dict(serving.options), cm.target)
    return pinned, [serving.plan.notes[-1]]


def _resolve(model_or_path: Any, target: str) -> CompiledModel:
    # a task-aware wrapper (hybrid.vision's TaskModel) profiles the compiled model it wraps
    inner = getattr(model_or_path, "compiled", None)
    if isinstance(inner, CompiledModel):
        return inner
    if isinstance(model_or_path, CompiledModel):
        return model_or_path
    if isinstance(model_or_path, (str, os.PathLike)) and Path(model_or_path).is_file():
        with open(model_or_path, "rb") as f:
            is_zip = f.read(4) == b"PK\x03\x04"
        if is_zip:  # a .hybrid bundle: the bundle layer, above this one, loads it
            raise ModelError("HYB-203", f"{str(model_or_path)!r} is a .hybrid bundle, not a model",
                             "profile it with hybrid.profile (or `pyasc profile`), which loads bundles")
    from hybrid.runtime.compiler import compile_model

    return compile_model(model_or_path, target=target)


def _profiling_model(cm: CompiledModel, tmp: str) -> tuple[CompiledModel, list[str]]:
    """Recompile ``cm`` with its backend's profiler on (same backend, device, precision, options)."""
    from hybrid.hal import backend_class
    from hybrid.runtime.compiler import compile_model

    if len(cm.plan.segments) != 1:
        return cm, [f"the plan has {len(cm.plan.segments)} segments; node spans need a single-backend plan"]
    profiling = backend_class(cm.backend).profiling_options(tmp)
    if not profiling:
        return cm, [f"backend {cm.backend!r} has no profiler; the trace has run and subgraph spans only"]
    options = {k: v for k, v in cm.options.items() if k not in MACHINE_OPTIONS}
    options.update(profiling)
    precision = getattr(cm.plan.segments[0], "precision", "fp32")
    return compile_model(cm.model, target=f"{cm.backend}:{cm.device}", precision=precision,
                         config={cm.backend: options}), []


def _node_event(span: NodeSpan, calls: list[tuple[int, int]], t_base: int) -> dict[str, Any]:
    """A trace event (hybrid's clock, microseconds since ``t_base``) from a backend's node span."""
    start = (calls[span.call][0] - t_base) / 1e3 + span.offset_us
    return {"name": span.name, "cat": "node", "ph": "X", "pid": 1, "tid": _NODE, "ts": round(start, 3),
            "dur": round(span.dur_us, 3), "args": {"op_type": span.op_type, **span.args}}


def _pool_counters(ts_us: float) -> list[dict[str, Any]]:
    try:
        from hybrid.hal import memory

        stats = memory.snapshot()
    except (ImportError, AttributeError):
        return []
    return [{"name": f"memory pool {kind}", "ph": "C", "pid": 1, "ts": round(ts_us, 3),
             "args": {"allocated": s.allocated, "reserved": s.reserved, "peak": s.peak, "free": s.free}}
            for kind, s in stats.items()]


def _stats(events: list[dict[str, Any]], key: str, node_runs: int) -> tuple[OpStat, ...]:
    total: dict[str, float] = defaultdict(float)
    names: dict[str, set[str]] = defaultdict(set)
    for e in events:
        k = e["args"].get("op_type", "?") if key == "op" else e["name"]
        total[k] += e["args"].get("real_us", e["dur"])  # the backend's own number, not the drawn span
        names[k].add(e["name"])
    grand = sum(total.values()) or 1.0
    runs = max(node_runs, 1)
    return tuple(OpStat(k, len(names[k]), v / 1e3, v / 1e3 / runs, v / grand)
                 for k, v in sorted(total.items(), key=lambda kv: -kv[1]))


def _check_output(output: str | os.PathLike | None) -> None:
    if output is None:
        return
    folder = Path(output).parent
    if not folder.is_dir():
        raise ConfigError("HYB-102", f"profile output: the folder {str(folder)!r} of {str(output)!r} does not exist",
                          f"create it first (mkdir -p {folder}) or write the trace elsewhere")
    if Path(output).is_dir():
        raise ConfigError("HYB-102", f"profile output: {str(output)!r} is a folder, expected a file name",
                          "e.g. --output profile.json")


def _warm(run: Any, feeds: Mapping[str, Any], warmup: int, seconds: float) -> int:
    """Untimed runs: at least ``warmup``, and (when warmup > 0) until ``seconds`` have passed."""
    until, done = time.perf_counter() + seconds, 0
    while done < warmup or (warmup and time.perf_counter() < until):
        run(feeds)
        done += 1
    return done


def check_arguments(duration: float, batch: int, warmup: int, node_runs: int,
                    output: str | os.PathLike | None) -> None:
    """Check :func:`profile`'s numbers and output before anything is loaded or compiled.

    Raises:
        ConfigError: HYB-102 for a bad duration, batch, warmup or node_runs, or an output folder that
            does not exist.
    """
    for key, value, low in (("duration", duration, 0), ("batch", batch, 1), ("warmup", warmup, 0),
                            ("node_runs", node_runs, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or \
                (key == "duration" and value <= 0):
            rel = "> 0" if key == "duration" else f">= {low}"
            raise ConfigError("HYB-102", f"profile {key}: expected a number {rel}, got {value!r}")
    _check_output(output)


def profile(model_or_path: Any, duration: float = 10.0, output: str | os.PathLike | None = "profile.json", *,
            target: str = "auto", inputs: Mapping[str, Any] | None = None, batch: int = 1, warmup: int = 3,
            node_runs: int = 100, quiet: bool = False) -> ProfileReport:
    """Run a model repeatedly for ``duration`` seconds; write a Chrome trace and return the statistics.

    Two phases: first ``node_runs`` runs with the backend's profiler on (node spans, drawn on their own
    "profiled runs" track), then ``duration`` seconds of plain runs, which give the latency percentiles
    and throughput (a profiler slows the runs it watches). The trace stays bounded: node spans come
    from the profiled runs only (at most :data:`MAX_NODE_EVENTS`), run and subgraph spans from the first
    :data:`MAX_RUN_SPANS` plain runs; every plain run counts in the statistics. Under ``target='auto'``
    with online tuning, the profiled shape's bucket is decided first and the candidate serving it is
    profiled alone, so the node table, the header and the latencies are all of one backend (a note names it).

    Args:
        model_or_path: A CompiledModel or a model (path, bytes, proto, hybrid.Model); a .hybrid bundle
            goes through ``hybrid.profile`` (:func:`hybrid.api.profile`), which loads it.
        duration: Seconds of timed plain runs (> 0; at least one run happens).
        output: Trace file (Chrome trace JSON, written atomically; its folder must exist); None writes none.
        target: Target for models ('auto' by default).
        inputs: Feeds; generated from the signature (symbolic dims = ``batch``) as target='auto' does
            (:func:`sample_inputs`) when not given, a task model's image input at its declared size
            (:func:`task_input_shapes`).
        batch: Size of symbolic dimensions in generated inputs, and the items per inference.
        warmup: Untimed runs first (continued until 5% of ``duration`` has passed, at most 3 s; 0: none).
        node_runs: How many runs get node spans (0: none, and the backend's profiler is not turned on).
        quiet: Do not print the summary.

    Raises:
        ConfigError: HYB-102 for a bad duration, batch, warmup or node_runs, or an output folder that
            does not exist.
        RunError: HYB-411 when auto's online tuning does not decide the profiled shape within its bound.
        HybridError: whatever loading, compiling or running the model raises.
    """
    check_arguments(duration, batch, warmup, node_runs, output)
    base = _resolve(model_or_path, target)
    feeds = dict(inputs) if inputs is not None else \
        sample_inputs(base.model, batch, shapes=task_input_shapes(model_or_path, batch))
    base, notes = _one_candidate(base, feeds)
    nodes: list[dict[str, Any]] = []
    profiled: list[tuple[int, int]] = []
    why: list[str] = []  # why the backend's profiler could not be turned on
    t_base = time.perf_counter_ns()
    if node_runs:
        with tempfile.TemporaryDirectory(prefix="hybrid-profile-") as tmp:
            cm, why = _profiling_model(base, tmp)
            notes += why
            if cm is not base:
                t_base, profiled, nodes = _node_phase(cm, feeds, warmup, node_runs)
                cm.executable.close()
    timed = _TimedExecutable(base.executable)
    run_cm = CompiledModel(base.model, timed, base.plan, base.backend, base.device, base.options, base.target)
    # a freshly compiled model runs slow at first (lazy allocations, cold weights); warm it for at
    # least ``warmup`` runs and 5% of the duration (at most 3 s) so the numbers describe steady state
    _warm(run_cm.run, feeds, warmup, min(0.05 * duration, 3.0))
    timed.spans.clear()
    if not profiled:
        t_base = time.perf_counter_ns()
    lat_ns: list[int] = []
    runs: list[tuple[int, int]] = []
    counters: list[dict[str, Any]] = []
    t_start = time.perf_counter_ns()
    deadline, next_sample = t_start + int(duration * 1e9), t_start
    while True:
        t0 = time.perf_counter_ns()
        run_cm.run(feeds)
        t1 = time.perf_counter_ns()
        lat_ns.append(t1 - t0)
        if len(runs) < MAX_RUN_SPANS:
            runs.append((t0, t1))
        else:
            timed.spans.pop()
        if t1 >= next_sample:
            counters += _pool_counters((t1 - t_base) / 1e3)
            next_sample = t1 + 10_000_000
        if t1 >= deadline:
            break
    wall = (time.perf_counter_ns() - t_start) / 1e9
    if len(lat_ns) > len(runs):
        notes.append(f"the trace draws the first {len(runs)} of {len(lat_ns)} runs; the statistics use all")
    return _finish(base, lat_ns, runs, timed.spans, profiled, nodes, counters, t_base, wall,
                   len(profiled) if nodes else 0, batch, output, notes, quiet, feeds, bool(why))


def _node_phase(cm: CompiledModel, feeds: Mapping[str, Any], warmup: int,
                node_runs: int) -> tuple[int, list[tuple[int, int]], list[dict[str, Any]]]:
    """Runs of the profiling build of the model, with node spans: (time base, run spans, node events)."""
    timed = _TimedExecutable(cm.executable)
    run_cm = CompiledModel(cm.model, timed, cm.plan, cm.backend, cm.device, cm.options, cm.target)
    _warm(run_cm.run, feeds, min(warmup, 3), 0.0)
    timed.spans.clear()
    per_run = max(len(cm.model.graph), 1)  # node spans a run gives, about: the trace stays bounded
    runs: list[tuple[int, int]] = []
    t_base = time.perf_counter_ns()
    while len(runs) < node_runs and len(runs) * per_run < MAX_NODE_EVENTS:
        t0 = time.perf_counter_ns()
        run_cm.run(feeds)
        runs.append((t0, time.perf_counter_ns()))
    calls = list(timed.spans)
    spans = cm.executable.node_spans(calls)
    # the run count above is held to the graph's node count; a backend may report more spans (layers) than
    # that: the trace keeps at most MAX_NODE_EVENTS of them
    nodes = [_node_event(span, calls, t_base) for span in spans if 0 <= span.call < len(calls)][:MAX_NODE_EVENTS]
    return t_base, runs, nodes


def _finish(cm: CompiledModel, lat_ns: list[int], runs: list[tuple[int, int]], subgraphs: list[tuple[int, int]],
            profiled: list[tuple[int, int]], nodes: list[dict[str, Any]], counters: list[dict[str, Any]],
            t_base: int, wall: float, node_runs: int, batch: int, output: str | os.PathLike | None,
            notes: list[str], quiet: bool, feeds: Mapping[str, Any], unprofiled: bool) -> ProfileReport:
    lat = np.asarray(lat_ns, dtype=np.float64) / 1e6
    latency = {"p50": float(np.percentile(lat, 50)), "p90": float(np.percentile(lat, 90)),
               "p99": float(np.percentile(lat, 99)), "mean": float(lat.mean()), "min": float(lat.min()),
               "max": float(lat.max())}
    throughput = len(lat) / (lat.sum() / 1e3)
    label = f"{cm.backend}:{cm.device}" if len(cm.plan.segments) == 1 else "partitioned graph"
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"hybrid: {cm.model.name}"}},
        *({"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": n}}
          for t, n in ((_PROFILED, "profiled runs (backend profiler on)"), (_NODE, f"nodes ({cm.backend})"),
                       (_RUN, "runs"), (_SUBGRAPH, "subgraphs")))]
    events += [{"name": f"profiled run {i}", "cat": "profiled run", "ph": "X", "pid": 1, "tid": _PROFILED,
                "ts": round((s - t_base) / 1e3, 3), "dur": round((e - s) / 1e3, 3)}
               for i, (s, e) in enumerate(profiled)]
    events += [{"name": f"run {i}", "cat": "run", "ph": "X", "pid": 1, "tid": _RUN,
                "ts": round((s - t_base) / 1e3, 3), "dur": round((e - s) / 1e3, 3)} for i, (s, e) in enumerate(runs)]
    events += [{"name": label, "cat": "subgraph", "ph": "X", "pid": 1, "tid": _SUBGRAPH,
                "ts": round((s - t_base) / 1e3, 3), "dur": round((e - s) / 1e3, 3)} for s, e in subgraphs]
    events += nodes + counters
    shapes = {k: [int(n) for n in np.shape(v)] for k, v in feeds.items()}
    if not nodes and not unprofiled and node_runs:
        notes.append(f"{cm.backend} reported no node timings")
    report = ProfileReport(cm.model.name, cm.backend, cm.device, len(lat), node_runs, wall, latency, throughput,
                           throughput * batch, _stats(nodes, "op", node_runs), _stats(nodes, "node", node_runs)[:50],
                           None if output is None else str(output), len(events), tuple(notes), shapes)
    if output is not None:
        from hybrid.ir import atomic_write_bytes

        doc = {"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"model": cm.model.name, "backend": cm.backend, "device": cm.device, "runs": len(lat),
                             "node_runs": node_runs, "latency_ms": latency, "throughput": throughput,
                             "batch": batch, "inputs": shapes, "notes": list(notes)}}
        atomic_write_bytes(Path(output), json.dumps(doc).encode("utf-8"))
    if not quiet:
        print(report.summary())
    return report
