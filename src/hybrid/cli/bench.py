"""``pyasc bench MODEL --targets all``: the migration report, and a benchmarking tool.

Every available backend x device x precision on this machine, side by side on the same inputs:
compile time, latency (min, mean, p50, p95, p99, max, count), throughput, and the accuracy against the
reference backend (hybrid's numpy backend; ONNX Runtime on the CPU where it is absent) with a pass/fail
verdict (``--rtol/--atol/--min-cosine``, see :mod:`hybrid.cli._bench_view`). Contenders are timed
interleaved, in blocks with a short pause between them, so that one runtime's spinning threads do
not tax the next (DESIGN section 4). ``--concurrency N`` times N callers at once per contender
(throughput mode); ``--duration``/``--iterations``/``--warmup`` and ``--shapes`` use trtexec's spelling;
``--hint``/``--nstreams``/``--nthreads`` and ``--backend-option`` are benchmark_app's knobs. A dynamic
input needs ``--shapes`` (or ``--input``): no size is made up. The header names the machine, the
versions and the shapes run.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from hybrid.cli import _options as opt
from hybrid.cli import _remote_options as ro
from hybrid.cli._bench_view import (
    Tolerance,
    header_lines,
    layout_line,
    markdown,
    measure_accuracy,
    report_doc,
    rich_table,
)
from hybrid.cli._console import console, err_console, print_wide, progress, report_errors, styled
from hybrid.cli._inputs import Inputs
from hybrid.errors import BackendError, ConfigError, HybridError

__all__ = ["BenchRow", "Tolerance", "bench", "markdown", "reference_target", "register"]

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One contender of the migration report (``status`` 'ok', or 'n/a' with the reason in ``note``).

    ``precision`` is what was asked for, ``precision_run`` what the backend reports it runs (OpenVINO
    runs an 'fp16' request in bf16 on a CPU with BF16 units). ``items_per_s`` is items (batch x calls)
    per second of wall time with ``concurrency`` callers; ``latencies_ms`` every timed call.
    ``max_scaled_err`` is the largest absolute error over the largest reference magnitude (not an
    element-wise relative error); ``accuracy_ok`` the verdict against the tolerance, ``accuracy_note``
    why it failed.
    """

    target: str
    precision: str
    status: str
    compile_s: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    items_per_s: float | None = None
    max_abs_err: float | None = None
    max_scaled_err: float | None = None
    vs_fastest: float | None = None
    note: str = ""
    p99_ms: float | None = None
    mean_ms: float | None = None
    precision_run: str | None = None
    runs: int = 0
    concurrency: int = 1
    latencies_ms: tuple[float, ...] = field(default=(), repr=False)
    min_ms: float | None = None
    max_ms: float | None = None
    p95_ms: float | None = None
    cosine: float | None = None
    outside: float | None = None
    accuracy_ok: bool | None = None
    accuracy_note: str = ""


@dataclass(frozen=True, slots=True)
class Timing:
    """How contenders are timed.

    Per contender ``warmup`` untimed calls, then ``blocks`` rotating blocks of ``per_block`` calls (or
    ``duration`` seconds in all, or ``iterations`` calls in all), ``concurrency`` callers at once.
    """

    blocks: int = 5
    per_block: int = 10
    warmup: int = 2
    duration: float | None = None
    iterations: int | None = None
    concurrency: int = 1
    pause: float = 0.05


def reference_target() -> str:
    """The backend errors are measured against: hybrid's reference backend, else ONNX Runtime on the CPU."""
    from hybrid.hal import backend_status

    return "reference:cpu" if backend_status("reference").available else "onnxruntime:cpu"


def _block(fn: Callable[[], Any], calls: int, seconds: float | None, concurrency: int) -> tuple[list[float], float]:
    """One block of one contender; returns (seconds per call, wall seconds of the block).

    ``calls`` calls per caller (or calls until ``seconds`` have passed), ``concurrency`` callers at once.
    """
    def caller(out: list[float], start: threading.Barrier | None) -> None:
        if start is not None:
            start.wait()
        end = None if seconds is None else time.perf_counter() + seconds
        n = 0
        while (end is None and n < calls) or (end is not None and (n == 0 or time.perf_counter() < end)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
            n += 1

    if concurrency == 1:
        times: list[float] = []
        t0 = time.perf_counter()
        caller(times, None)
        return times, time.perf_counter() - t0
    per_thread: list[list[float]] = [[] for _ in range(concurrency)]
    barrier = threading.Barrier(concurrency + 1)
    threads = [threading.Thread(target=caller, args=(per_thread[i], barrier), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return [x for times in per_thread for x in times], wall


def _interleave(runs: Mapping[str, Callable[[], Any]], timing: Timing,
                on_block: Callable[[str], None] | None = None) -> dict[str, tuple[list[float], float]]:
    """(seconds per call, wall seconds) of every contender, timed in rotating blocks with pauses between them."""
    names = list(runs)
    per: dict[str, int] = {}
    seconds = None if timing.duration is None else timing.duration / timing.blocks
    for name in names:  # warm up, and size each block to about half a second for slow contenders
        # warmed the way it is timed: with N callers, each caller's first calls (per-thread requests,
        # arenas grown for concurrent runs) happen before the clock starts
        warm, wall = _block(runs[name], max(timing.warmup, 1), None, timing.concurrency)
        each = wall / max(len(warm) / timing.concurrency, 1)
        if timing.iterations is not None:
            per[name] = max(1, math.ceil(timing.iterations / timing.blocks / timing.concurrency))
        else:
            per[name] = max(1, min(timing.per_block, int(0.5 / max(each, 1e-6))))
        time.sleep(timing.pause)
    out: dict[str, tuple[list[float], float]] = {n: ([], 0.0) for n in names}
    for b in range(timing.blocks):
        for name in names[b % len(names):] + names[:b % len(names)]:
            if on_block is not None:
                on_block(f"timing {name} (block {b + 1}/{timing.blocks})")
            times, wall = _block(runs[name], per[name], seconds, timing.concurrency)
            out[name] = (out[name][0] + times, out[name][1] + wall)
            time.sleep(timing.pause)
    return out


def _precisions(precisions: tuple[str, ...]) -> tuple[str, ...]:
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions:
        hint = "quantize first (pyasc quantize MODEL -o model.int8.onnx), then bench the quantized model" \
            if any(p.startswith("int") for p in bad) else "e.g. --precisions fp32,bf16"
        raise ConfigError("HYB-102", f"--precisions: expected some of {', '.join(PRECISIONS)} or 'all', got "
                          f"{', '.join(bad) or 'none'}", hint)
    return precisions


def bench(model: Any, targets: str | list[str] = "all", precisions: tuple[str, ...] = PRECISIONS,
          blocks: int = 5, per_block: int = 10, batch: int | None = None, inputs: Mapping[str, Any] | None = None,
          pause: float = 0.05, *, timing: Timing | None = None, shapes: Mapping[str, Any] | None = None,
          on_step: Callable[[str], None] | None = None, tolerance: Tolerance | None = None,
          config: Mapping[str, Any] | None = None, feeds: Inputs | None = None) -> tuple[list[BenchRow], str]:
    """Compile ``model`` for every (backend, device, precision) requested and measure each.

    Args:
        model: A model (path, proto, hybrid.Model).
        targets: 'all' (every backend x device here) or a list of targets.
        precisions: Some of fp32, fp16, bf16.
        blocks: Interleaved timing blocks (used when ``timing`` is not given).
        per_block: Calls per contender per block (idem).
        pause: Seconds between contenders (idem).
        batch: Size of dim 0 where it is dynamic and ``shapes`` does not set it.
        inputs: Feeds to use instead of generated ones (per input); errors are measured on them.
        timing: Warmup, duration/iterations and concurrency (overrides blocks/per_block/pause).
        shapes: The shapes to run (``--shapes``, or a min/opt/max range: inputs are made at opt); handed to
            every compile.
        on_step: Called with a description of each step (progress).
        tolerance: The accuracy verdict's rtol/atol/min_cosine (defaults per precision).
        config: Backend options, per backend name (``{'openvino': {'performance_hint': 'THROUGHPUT'}}``).
        feeds: Inputs already resolved (:func:`hybrid.cli._inputs.resolve_inputs`; ``inputs``, ``shapes``
            and ``batch`` are then unused).

    Returns:
        (rows in input order, the reference target the errors are measured against).

    Raises:
        ConfigError: HYB-102 for an unknown precision or shapes that do not fit.
        RunError: HYB-417 for a dynamic dim nothing gives a size to.
        BackendError: HYB-301..307 for a target that cannot be resolved (an absent device under
            device_fallback='error').
    """
    from hybrid.cli._inputs import resolve_inputs
    from hybrid.hal import resolve_target
    from hybrid.ir import Model
    from hybrid.runtime.compiler import compile_model

    timing = timing or Timing(blocks=blocks, per_block=per_block, pause=pause)
    tolerance = tolerance or Tolerance()
    step = on_step or (lambda _text: None)
    precisions = _precisions(tuple(precisions))
    model = Model.load(model)
    names = [str(c) for c in resolve_target("auto")] if targets == "all" else \
        list(dict.fromkeys(str(c) for t in targets for c in resolve_target(t)))
    if feeds is None:
        feeds = resolve_inputs(model, inputs, shapes, batch=batch, command="bench MODEL")
    run_feeds = feeds.feeds
    items = _items(run_feeds)
    ref_target = reference_target()
    step(f"reference run on {ref_target}")
    expected = compile_model(model, target=ref_target, shapes=feeds.compile_shapes).run(run_feeds)
    rows: dict[tuple[str, str], BenchRow] = {}
    compiled: dict[tuple[str, str], Any] = {}
    for target in names:
        for prec in precisions:
            step(f"compiling for {target} {prec}")
            t0 = time.perf_counter()
            try:
                cm = compile_model(model, target=target, precision=prec, config=_config_for(config, target),
                                   shapes=feeds.compile_shapes)
                out = cm.run(run_feeds)
            except HybridError as e:
                if e.code == "HYB-306":
                    raise  # a backend option the user gave is wrong: not a row
                rows[(target, prec)] = BenchRow(target, prec, "n/a", note=f"[{e.code}] {e.message}")
                continue
            ran = getattr(cm.executable, "precision", None) or prec
            acc = measure_accuracy(expected, out, *tolerance.of(ran))
            compiled[(target, prec)] = cm
            rows[(target, prec)] = BenchRow(target, prec, "ok", time.perf_counter() - t0, max_abs_err=acc.max_abs_err,
                                            max_scaled_err=acc.max_scaled_err, precision_run=ran,
                                            note="" if ran == prec else f"{target} runs {prec} as {ran}",
                                            cosine=acc.cosine, outside=acc.outside, accuracy_ok=acc.passed,
                                            accuracy_note=acc.reason)
    measured = _interleave({f"{t}|{p}": (lambda cm=cm: cm.run(run_feeds)) for (t, p), cm in compiled.items()},
                           timing, step) if compiled else {}
    medians = {k: statistics.median(v[0]) for k, v in measured.items()}
    fastest = min(medians.values(), default=0.0)
    for key, row in rows.items():
        got = measured.get(f"{key[0]}|{key[1]}")
        if got:
            samples, wall = got
            ms = np.asarray(samples) * 1e3
            med = medians[f"{key[0]}|{key[1]}"]
            rows[key] = replace(row, p50_ms=med * 1e3, p90_ms=float(np.percentile(ms, 90)),
                                items_per_s=items * len(samples) / wall, vs_fastest=med / fastest if fastest else None,
                                p99_ms=float(np.percentile(ms, 99)), mean_ms=float(ms.mean()), runs=len(samples),
                                concurrency=timing.concurrency, latencies_ms=tuple(float(x) for x in ms),
                                min_ms=float(ms.min()), max_ms=float(ms.max()), p95_ms=float(np.percentile(ms, 95)))
    return list(rows.values()), ref_target


def _items(feeds: Mapping[str, Any]) -> int:
    """Items per call: dim 0 of the first input (1 for a scalar)."""
    first = next(iter(feeds.values()), None)
    shape = np.shape(first) if first is not None else ()
    return int(shape[0]) if shape else 1


def _config_for(config: Mapping[str, Any] | None, target: str) -> dict[str, Any] | None:
    """The backend options of the target's backend only (options of others would not apply)."""
    if not config:
        return None
    backend = target.partition(":")[0]
    return {backend: dict(config[backend])} if backend in config else None


def _positive(name: str, value: float | None, integer: bool = False) -> None:
    if value is not None and (value <= 0 or (integer and int(value) != value)):
        raise ConfigError("HYB-102", f"{name}: expected a {'whole ' if integer else ''}number > 0, got {value!r}")


def bench_command(
    model: Annotated[Path | None, typer.Argument(help="An .onnx model or a .hybrid bundle (or a folder holding "
                                                 "one); leave out with --url.")] = None,
    targets: Annotated[str, typer.Option("--targets", "-t", help="'all', or targets separated by commas "
                                         "(onnxruntime,openvino:cpu).")] = "all",
    precisions: Annotated[str, typer.Option("--precisions", "-p", help="'all' or some of fp32,fp16,bf16.")] = "all",
    shapes: opt.Shapes = None,
    min_shapes: opt.MinShapes = None,
    opt_shapes: opt.OptShapes = None,
    max_shapes: opt.MaxShapes = None,
    batch: opt.Batch = None,
    inputs: opt.Inputs = None,
    duration: Annotated[float | None, typer.Option("--duration", "-d", help="Seconds of timed calls per "
                                                   "contender, over all blocks (trtexec --duration).")] = None,
    iterations: Annotated[int | None, typer.Option("--iterations", help="Timed calls per contender, over all "
                                                   "blocks (trtexec --iterations).")] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed calls per contender first.", min=0)] = 2,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Callers at once per contender "
                                             "(throughput mode; benchmark_app -nireq, with --hint "
                                             "throughput).", min=1)] = 1,
    hint: Annotated[str | None, typer.Option("--hint", help="OpenVINO's performance hint: latency (its "
                                             "default), throughput or cumulative_throughput (benchmark_app "
                                             "-hint).")] = None,
    nstreams: Annotated[int | None, typer.Option("--nstreams", help="OpenVINO's NUM_STREAMS (benchmark_app "
                                                 "-nstreams).", min=1)] = None,
    nthreads: Annotated[int | None, typer.Option("--nthreads", help="Threads: OpenVINO's INFERENCE_NUM_THREADS, "
                                                 "ONNX Runtime's intra_op_num_threads (benchmark_app "
                                                 "-nthreads).", min=1)] = None,
    backend_option: Annotated[list[str] | None, typer.Option("--backend-option", help="BACKEND.KEY=VALUE, any "
                                                             "backend option (repeatable), e.g. "
                                                             "onnxruntime.inter_op_num_threads=2.")] = None,
    rtol: Annotated[float | None, typer.Option("--rtol", help="Relative tolerance of the accuracy verdict "
                                               "(default: fp32 1e-3, fp16/bf16 1e-2).")] = None,
    atol: Annotated[float | None, typer.Option("--atol", help="Absolute tolerance (default: fp32 1e-4, "
                                               "fp16/bf16 1e-2).")] = None,
    min_cosine: Annotated[float | None, typer.Option("--min-cosine", help="Lowest cosine against the reference "
                                                     "per output, in (0, 1] (default 0.999).")] = None,
    blocks: Annotated[int, typer.Option("--blocks", help="Interleaved timing blocks.", min=1)] = 5,
    per_block: Annotated[int, typer.Option("--per-block", help="Calls per contender per block (when neither "
                                           "--duration nor --iterations is given).", min=1)] = 10,
    all_rows: Annotated[bool, typer.Option("--show-unavailable", help="Also list precisions a backend "
                                           "does not offer.")] = False,
    device_fallback: opt.DeviceFallback = "error",
    as_json: opt.Json = False,
    as_markdown: Annotated[bool, typer.Option("--markdown", help="Print the table as Markdown (for a README or "
                                              "a ticket).")] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the rows as JSON to this "
                                                "file (every timed call included).")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="Write a self-contained HTML report (plots "
                                                "of latency and error; opens offline).")] = None,
    scenario: Annotated[str | None, typer.Option("--scenario", help="Run MLPerf LoadGen's scenario instead of "
                                                 "closed-loop blocks: singlestream (p90), multistream (p99 of "
                                                 "8-sample queries), server (highest QPS with p99 under "
                                                 "--latency-bound), offline (samples/s). Needs "
                                                 "pyasc[bench].")] = None,
    target_qps: Annotated[float | None, typer.Option("--target-qps", help="Server: the search's first QPS "
                                                     "(default: from a warm call); Offline: expected "
                                                     "samples/s.")] = None,
    latency_bound: Annotated[float | None, typer.Option("--latency-bound", help="Server: the p99 bound in ms "
                                                        "(default: 10x a warm call, stated).")] = None,
    min_duration: Annotated[float, typer.Option("--min-duration", help="LoadGen's min_duration per run, in "
                                                "seconds (MLPerf results need 600).")] = 10.0,
    min_queries: Annotated[int, typer.Option("--min-queries", help="LoadGen's min_query_count.", min=1)] = 1,
    mlperf_conf: Annotated[Path | None, typer.Option("--mlperf-conf", help="A LoadGen config file "
                                                     "(user.conf syntax), read before the options "
                                                     "above.")] = None,
    offline_batch: Annotated[int, typer.Option("--offline-batch", help="Offline: samples per call, stacked on "
                                               "dim 0 (the same for every contender; 1 where dim 0 is "
                                               "fixed).", min=1)] = 8,
    search_runs: Annotated[int, typer.Option("--search-runs", help="Server: LoadGen runs of the QPS search at "
                                             "most.", min=1)] = 6,
    workers: Annotated[int, typer.Option("--workers", help="LoadGen scenarios: calls at once into each "
                                         "contender (CompiledModel.submit_workers).", min=1)] = 1,
    tune: Annotated[bool, typer.Option("--tune", help="LoadGen scenarios: also measure auto after cm.tune() "
                                       "on the samples (the row auto+tune, with the time tune() took); auto "
                                       "is measured as compiled either way.")] = False,
    samples_file: Annotated[Path | None, typer.Option("--samples", help="LoadGen scenarios: a .npz with one "
                                                      "array per input, axis 0 indexing samples (default: the "
                                                      "--input files, or 8 generated at --shapes).")] = None,
    url: ro.Url = None,
    served_model: ro.ServedModel = None,
    model_version: ro.ModelVersion = "",
    concurrency_range: ro.ConcurrencyRange = None,
    request_rate_range: ro.RequestRateRange = None,
    request_distribution: ro.RequestDistribution = "constant",
    measurement_interval: ro.MeasurementInterval = 5000.0,
    stability_percentage: ro.StabilityPercentage = 10.0,
    max_trials: ro.MaxTrials = 10,
    percentile: ro.Percentile = None,
    latency_threshold: ro.LatencyThreshold = None,
    max_threads: ro.MaxThreads = 16,
    csv_path: ro.CsvPath = None,
) -> None:
    """Benchmark every backend x device x precision here: latency, throughput, accuracy vs the reference.

    Latency min/mean/p50/p95/p99/max and throughput (--concurrency callers) per contender, timed interleaved;
    the error against the reference backend on the same inputs (the --input files where given) with a
    pass/fail verdict (a failed row is reported, the exit code stays 0). A dynamic input needs --shapes or
    --input (HYB-417). Exits 1 when nothing asked for can run. With --url and --model instead of MODEL: a
    served model on any KServe v2 / Triton server, perf_analyzer's sweep (--concurrency-range,
    --request-rate-range; --csv for its CSV) or a --scenario.
    """
    from hybrid.cli._inputs import bundle_shapes, declared_shapes, load_inputs, load_model, model_path, resolve_inputs
    from hybrid.ir import atomic_write_bytes

    with report_errors(as_json):
        if url is not None:
            ro.run_remote(url, served_model, model_version, shapes, batch, inputs, scenario, concurrency,
                          concurrency_range, request_rate_range, request_distribution, measurement_interval,
                          stability_percentage, max_trials, percentile, latency_threshold, max_threads,
                          as_json=as_json, as_markdown=as_markdown, output=output, csv_path=csv_path,
                          report=report, loadgen={"target_qps": target_qps, "latency_bound_ms": latency_bound,
                                                  "min_duration_s": min_duration, "min_queries": min_queries,
                                                  "mlperf_conf": mlperf_conf, "search_runs": search_runs,
                                                  "workers": workers, "offline_batch": offline_batch})
            return
        if model is None:
            raise ConfigError("HYB-102", "pyasc bench needs a MODEL file, or --url and --model for a served one",
                              "pyasc bench model.onnx, or pyasc bench --url http://127.0.0.1:8000 --model NAME")
        opt.apply_device_fallback(device_fallback)
        _positive("--duration", duration)
        _positive("--iterations", iterations, integer=True)
        if duration is not None and iterations is not None:
            raise ConfigError("HYB-102", "--duration and --iterations both bound the timed calls; give one")
        if as_json and as_markdown:
            raise ConfigError("HYB-102", "--json and --markdown both choose what stdout gets; give one")
        tolerance = Tolerance(rtol, atol, min_cosine)
        config = opt.backend_config(backend_option, hint, nstreams, nthreads)
        timing = Timing(blocks, per_block, warmup, duration, iterations, concurrency)
        precs = PRECISIONS if precisions == "all" else tuple(p.strip().lower() for p in precisions.split(",") if p)
        target_list = "all" if targets == "all" else [t.strip() for t in targets.split(",") if t.strip()]
        declared = declared_shapes(shapes, min_shapes, opt_shapes, max_shapes)
        model = model_path(model)
        model_obj = load_model(model)
        given = load_inputs(inputs)
        feeds = resolve_inputs(model_obj, given, declared or bundle_shapes(model, given), batch=batch,
                               command=f"bench {model}", has_batch=True)
        if scenario is not None:
            if duration is not None or iterations is not None or concurrency > 1:
                raise ConfigError("HYB-102", "--duration, --iterations and --concurrency time closed-loop blocks; "
                                  "a --scenario run is sized by LoadGen", "use --min-duration, --min-queries "
                                  "and --workers with --scenario")
            from hybrid.cli._bench_loadgen import loadgen_command

            loadgen_command(model, model_obj, target_list, precs, feeds, config, as_json, as_markdown, output,
                            scenario=scenario.lower(), target_qps=target_qps, latency_bound_ms=latency_bound,
                            min_duration_s=min_duration, min_queries=min_queries, mlperf_conf=mlperf_conf,
                            offline_batch=offline_batch, search_runs=search_runs, workers=workers, tune=tune,
                            samples_file=samples_file, report=report, regenerate=None if given else
                            (lambda seed: resolve_inputs(model_obj, None, declared or bundle_shapes(model, None),
                                                         batch=batch, seed=seed, command=f"bench {model}").feeds))
            return
        with progress(f"benchmarking {model.name}") as update:
            rows, reference = bench(model_obj, target_list, precs, timing=timing, on_step=update,
                                    tolerance=tolerance, config=config, feeds=feeds)
        if not any(r.status == "ok" for r in rows):
            reasons = "; ".join(f"{r.target} {r.precision}: {r.note}" for r in rows)
            raise BackendError("HYB-304", f"nothing asked for can run on this machine: {reasons}",
                               "`pyasc devices` lists the backends and devices here; --targets all --precisions "
                               "all benchmarks what they offer")
        items = _items(feeds.feeds)
        ran_precs = tuple(r.precision_run or r.precision for r in rows if r.status == "ok")
        timing_text = ", ".join(f"{k} {v}" for k, v in asdict(timing).items() if v is not None)
        lines = header_lines(str(model), reference, feeds.describe(), tolerance.describe(ran_precs),
                             [r.target.partition(":")[0] for r in rows] + [reference.partition(":")[0]], timing_text)
        lines.append(layout_line(config, [r.target.partition(":")[0] for r in rows if r.status == "ok"]))
        lines.append(f"compile s is apart from the timed calls; the first {timing.warmup} call(s) per contender "
                     "(--warmup) are untimed")
        header = {"header": lines, "inputs": feeds.shapes, "input_sources": feeds.sources,
                  "tolerance": {p: dict(zip(("rtol", "atol", "min_cosine"), tolerance.of(p))) for p in ran_precs},
                  "backend_options": config}
        if output is not None:
            doc = report_doc(str(model), reference, items, timing, rows, latencies=True, header=header)
            atomic_write_bytes(output, json.dumps(doc, indent=1).encode())
        if report is not None:
            from hybrid.cli._report import bench_html

            atomic_write_bytes(report, bench_html(str(model), reference, items, timing, rows,
                                                  header=lines).encode("utf-8"))
    failed = [r for r in rows if r.accuracy_ok is False]
    if as_json:
        typer.echo(json.dumps(report_doc(str(model), reference, items, timing, rows, header=header), indent=1))
    else:
        for line in lines:
            console.print(line, soft_wrap=True)
        ok_only = not (all_rows or precisions != "all")  # precisions asked for by name are shown when n/a
        if as_markdown:
            typer.echo(markdown(rows, reference, ok_only=ok_only))  # must not wrap
        else:
            print_wide(rich_table(rows, reference, ok_only=ok_only))
        for r in rows:
            if r.status == "ok" and r.note:
                console.print(f"note: {r.note}", soft_wrap=True)
        if concurrency > 1 and hint is None and any(r.target.startswith("openvino") for r in rows):
            console.print("note: OpenVINO ran on its LATENCY hint; --hint throughput is benchmark_app's -hint "
                          "throughput", soft_wrap=True)
    for path in (output, report):
        if path is not None:
            err_console.print(f"wrote {path}", soft_wrap=True)
    if failed:
        err_console.print(styled(f"accuracy check failed for {len(failed)} of {len(rows)} rows", "bold red"),
                          ": " + "; ".join(f"{r.target} {r.precision_run or r.precision}: {r.accuracy_note}"
                                          for r in failed), sep="", soft_wrap=True)
        err_console.print(f"  tolerance: {tolerance.describe(ran_precs)} (--rtol, --atol, --min-cosine)",
                          soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``bench`` to the pyasc app."""
    app.command("bench")(bench_command)
