"""``pyasc bench MODEL --targets all``: the migration report, and a benchmarking tool.

Every available backend x device x precision on this machine, side by side on the same inputs:
compile time, latency (p50, p90, p99), throughput, and the largest error against the reference
backend (hybrid's numpy backend; ONNX Runtime on the CPU where it is absent). Contenders are timed
interleaved, in blocks with a short pause between them, so that one runtime's spinning threads do
not tax the next (DESIGN section 4). ``--concurrency N`` times N callers at once per contender
(throughput mode); ``--duration``/``--iterations``/``--warmup`` and ``--shapes`` use trtexec's spelling.
Inputs are generated the way ``target='auto'`` generates its samples, so both agree on a backend's error.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from hybrid.cli import _options as opt
from hybrid.cli._console import console, err_console, progress, report_errors
from hybrid.errors import BackendError, ConfigError, HybridError

__all__ = ["BenchRow", "bench", "markdown", "reference_target", "register"]

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One contender of the migration report (``status`` 'ok', or 'n/a' with the reason in ``note``).

    ``precision`` is what was asked for, ``precision_run`` what the backend reports it runs (OpenVINO
    runs an 'fp16' request in bf16 on a CPU with BF16 units). ``items_per_s`` is items (batch x calls)
    per second of wall time with ``concurrency`` callers; ``latencies_ms`` every timed call.
    """

    target: str
    precision: str
    status: str
    compile_s: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    items_per_s: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    vs_fastest: float | None = None
    note: str = ""
    p99_ms: float | None = None
    mean_ms: float | None = None
    precision_run: str | None = None
    runs: int = 0
    concurrency: int = 1
    latencies_ms: tuple[float, ...] = field(default=(), repr=False)


@dataclass(frozen=True, slots=True)
class Timing:
    """How contenders are timed: per contender ``warmup`` untimed calls, then ``blocks`` rotating blocks of
    ``per_block`` calls (or ``duration`` seconds in all, or ``iterations`` calls in all), ``concurrency``
    callers at once."""

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


def _load_model(path: Path) -> Any:
    from hybrid.ir import Model

    if not path.is_file():
        return Model.load(path)  # HYB-201
    with open(path, "rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"
    if not is_zip:
        return Model.load(path)
    from hybrid.bundle.format import BundleReader
    from hybrid.bundle.load import read_model

    with BundleReader(path) as reader:
        return read_model(reader)


def _errors(expected: Mapping[str, Any], got: Mapping[str, Any]) -> tuple[float, float]:
    abs_err, scale = 0.0, 0.0
    for name, ref in expected.items():
        a = np.asarray(ref, dtype=np.float64)
        b = np.asarray(got[name], dtype=np.float64)
        if a.shape != b.shape:
            return float("inf"), float("inf")
        if a.size:
            abs_err = max(abs_err, float(np.nanmax(np.abs(a - b))))
            scale = max(scale, float(np.nanmax(np.abs(a))))
    return abs_err, abs_err / scale if scale else abs_err


def _block(fn: Callable[[], Any], calls: int, seconds: float | None, concurrency: int) -> tuple[list[float], float]:
    """One block of one contender: ``calls`` calls per caller (or calls until ``seconds`` have passed),
    ``concurrency`` callers at once. Returns (seconds per call, wall seconds of the block)."""
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
          blocks: int = 5, per_block: int = 10, batch: int = 1, inputs: Mapping[str, Any] | None = None,
          pause: float = 0.05, *, timing: Timing | None = None, shapes: Mapping[str, tuple[int, ...]] | None = None,
          on_step: Callable[[str], None] | None = None) -> tuple[list[BenchRow], str]:
    """Compile ``model`` for every (backend, device, precision) requested and measure each.

    Args:
        model: A model (path, proto, hybrid.Model).
        targets: 'all' (every backend x device here) or a list of targets.
        precisions: Some of fp32, fp16, bf16.
        blocks, per_block, pause: Interleaved timing (used when ``timing`` is not given).
        batch: Size of symbolic dims in generated inputs, and the items per call.
        inputs: Feeds to use instead of generated ones (per input).
        timing: Warmup, duration/iterations and concurrency (overrides blocks/per_block/pause).
        shapes: Concrete shapes of generated inputs (``--shapes``).
        on_step: Called with a description of each step (progress).

    Returns:
        (rows in input order, the reference target the errors are measured against).

    Raises:
        ConfigError: HYB-102 for an unknown precision.
        BackendError: HYB-301..307 for a target that cannot be resolved (an absent device under
            device_fallback='error').
    """
    from hybrid.cli._inputs import generated_inputs
    from hybrid.hal import resolve_target
    from hybrid.ir import Model
    from hybrid.runtime.compiler import compile_model

    timing = timing or Timing(blocks=blocks, per_block=per_block, pause=pause)
    step = on_step or (lambda _text: None)
    precisions = _precisions(tuple(precisions))
    model = Model.load(model)
    names = [str(c) for c in resolve_target("auto")] if targets == "all" else \
        list(dict.fromkeys(str(c) for t in targets for c in resolve_target(t)))
    feeds = {**generated_inputs(model, shapes, batch), **(inputs or {})}
    ref_target = reference_target()
    step(f"reference run on {ref_target}")
    expected = compile_model(model, target=ref_target).run(feeds)
    rows: dict[tuple[str, str], BenchRow] = {}
    compiled: dict[tuple[str, str], Any] = {}
    for target in names:
        for prec in precisions:
            step(f"compiling for {target} {prec}")
            t0 = time.perf_counter()
            try:
                cm = compile_model(model, target=target, precision=prec)
                out = cm.run(feeds)
            except HybridError as e:
                rows[(target, prec)] = BenchRow(target, prec, "n/a", note=f"[{e.code}] {e.message}")
                continue
            abs_err, rel_err = _errors(expected, out)
            ran = getattr(cm.executable, "precision", None) or prec
            compiled[(target, prec)] = cm
            rows[(target, prec)] = BenchRow(target, prec, "ok", time.perf_counter() - t0, max_abs_err=abs_err,
                                            max_rel_err=rel_err, precision_run=ran,
                                            note="" if ran == prec else f"{target} runs {prec} as {ran}")
    measured = _interleave({f"{t}|{p}": (lambda cm=cm: cm.run(feeds)) for (t, p), cm in compiled.items()},
                           timing, step) if compiled else {}
    medians = {k: statistics.median(v[0]) for k, v in measured.items()}
    fastest = min(medians.values(), default=0.0)
    for key, row in rows.items():
        got = measured.get(f"{key[0]}|{key[1]}")
        if got:
            samples, wall = got
            ms = np.asarray(samples) * 1e3
            med = medians[f"{key[0]}|{key[1]}"]
            rows[key] = BenchRow(row.target, row.precision, "ok", row.compile_s, med * 1e3,
                                 float(np.percentile(ms, 90)), batch * len(samples) / wall, row.max_abs_err,
                                 row.max_rel_err, med / fastest if fastest else None, row.note,
                                 float(np.percentile(ms, 99)), float(ms.mean()), row.precision_run, len(samples),
                                 timing.concurrency, tuple(float(x) for x in ms))
    return list(rows.values()), ref_target


def markdown(rows: list[BenchRow], reference: str, ok_only: bool = False) -> str:
    """The report as a Markdown table (precision: asked for, and what ran where the backend differs).

    ``ok_only`` leaves out the n/a rows, except for a target none of whose precisions ran (so a target that
    was asked for never vanishes from the table)."""
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    ran = {r.target for r in rows if r.status == "ok"}

    lines = [f"| target | precision | compile s | p50 ms | p90 ms | p99 ms | items/s | x fastest | max abs err vs "
             f"{reference} | max rel err |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.status != "ok":
            if not ok_only or r.target not in ran:
                lines.append(f"| {r.target} | {r.precision} | n/a | | | | | | {r.note[:90]} | |")
            continue
        prec = r.precision if r.precision_run in (None, r.precision) else f"{r.precision_run} (asked {r.precision})"
        lines.append(f"| {r.target} | {prec} | {num(r.compile_s, '.2f')} | {num(r.p50_ms, '.3f')} | "
                     f"{num(r.p90_ms, '.3f')} | {num(r.p99_ms, '.3f')} | {num(r.items_per_s, '.1f')} | "
                     f"{num(r.vs_fastest, '.2f')} | {num(r.max_abs_err, '.3g')} | {num(r.max_rel_err, '.3g')} |")
    return "\n".join(lines)


def report_doc(model: str, reference: str, batch: int, timing: Timing, rows: list[BenchRow],
               latencies: bool = False) -> dict[str, Any]:
    """The JSON document of ``--json`` / ``--output`` (``latencies``: every timed call, in ms)."""
    def row(r: BenchRow) -> dict[str, Any]:
        d = asdict(r)
        if not latencies:
            d.pop("latencies_ms")
        else:
            d["latencies_ms"] = list(r.latencies_ms)
        return d

    return {"model": model, "reference": reference, "batch": batch, "timing": asdict(timing),
            "rows": [row(r) for r in rows]}


def _positive(name: str, value: float | None, integer: bool = False) -> None:
    if value is not None and (value <= 0 or (integer and int(value) != value)):
        raise ConfigError("HYB-102", f"{name}: expected a {'whole ' if integer else ''}number > 0, got {value!r}")


def bench_command(
    model: Annotated[Path, typer.Argument(help="An .onnx model or a .hybrid bundle.")],
    targets: Annotated[str, typer.Option("--targets", "-t", help="'all', or targets separated by commas "
                                         "(onnxruntime,openvino:cpu).")] = "all",
    precisions: Annotated[str, typer.Option("--precisions", "-p", help="'all' or some of fp32,fp16,bf16.")] = "all",
    shapes: opt.Shapes = None,
    batch: Annotated[int, typer.Option("--batch", help="Size of symbolic dims --shapes does not set.", min=1)] = 1,
    inputs: opt.Inputs = None,
    duration: Annotated[float | None, typer.Option("--duration", "-d", help="Seconds of timed calls per "
                                                   "contender, over all blocks (trtexec --duration).")] = None,
    iterations: Annotated[int | None, typer.Option("--iterations", help="Timed calls per contender, over all "
                                                   "blocks (trtexec --iterations).")] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed calls per contender first.", min=0)] = 2,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Callers at once per contender "
                                             "(throughput mode; benchmark_app -nireq).", min=1)] = 1,
    blocks: Annotated[int, typer.Option("--blocks", help="Interleaved timing blocks.", min=1)] = 5,
    per_block: Annotated[int, typer.Option("--per-block", help="Calls per contender per block (when neither "
                                           "--duration nor --iterations is given).", min=1)] = 10,
    all_rows: Annotated[bool, typer.Option("--show-unavailable", help="Also list precisions a backend "
                                           "does not offer.")] = False,
    device_fallback: opt.DeviceFallback = "error",
    as_json: opt.Json = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the rows as JSON to this "
                                                "file (every timed call included).")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="Write a self-contained HTML report (plots "
                                                "of latency and error; opens offline).")] = None,
) -> None:
    """Benchmark every backend x device x precision here: latency, throughput, error vs the reference.

    Latency p50/p90/p99 and throughput (--concurrency callers) per contender, timed interleaved; the
    largest error against the reference backend on the same inputs. Exits 1 when nothing asked for can run."""
    from hybrid.cli._inputs import load_inputs, parse_shapes
    from hybrid.ir import atomic_write_bytes

    with report_errors(as_json):
        opt.apply_device_fallback(device_fallback)
        _positive("--duration", duration)
        _positive("--iterations", iterations, integer=True)
        if duration is not None and iterations is not None:
            raise ConfigError("HYB-102", "--duration and --iterations both bound the timed calls; give one")
        timing = Timing(blocks, per_block, warmup, duration, iterations, concurrency)
        precs = PRECISIONS if precisions == "all" else tuple(p.strip().lower() for p in precisions.split(",") if p)
        target_list = "all" if targets == "all" else [t.strip() for t in targets.split(",") if t.strip()]
        given_shapes = parse_shapes(shapes)
        model_obj = _load_model(model)
        with progress(f"benchmarking {model.name}") as update:
            rows, reference = bench(model_obj, target_list, precs, batch=batch, inputs=load_inputs(inputs),
                                    timing=timing, shapes=given_shapes, on_step=update)
        if not any(r.status == "ok" for r in rows):
            reasons = "; ".join(f"{r.target} {r.precision}: {r.note}" for r in rows)
            raise BackendError("HYB-304", f"nothing asked for can run on this machine: {reasons}",
                               "`pyasc devices` lists the backends and devices here; --targets all --precisions "
                               "all benchmarks what they offer")
        if output is not None:
            doc = report_doc(str(model), reference, batch, timing, rows, latencies=True)
            atomic_write_bytes(output, json.dumps(doc, indent=1).encode())
        if report is not None:
            from hybrid.cli._report import bench_html

            atomic_write_bytes(report, bench_html(str(model), reference, batch, timing, rows).encode("utf-8"))
    if as_json:
        typer.echo(json.dumps(report_doc(str(model), reference, batch, timing, rows), indent=1))
    else:
        mode = f", {concurrency} callers" if concurrency > 1 else ""
        console.print(f"migration report: {model.name}, batch {batch}{mode}, errors against {reference}",
                      soft_wrap=True)
        # precisions asked for by name are shown when they cannot run; 'all' shows what runs
        typer.echo(markdown(rows, reference, ok_only=not (all_rows or precisions != "all")))  # must not wrap
        for r in rows:
            if r.status == "ok" and r.note:
                console.print(f"note: {r.note}", soft_wrap=True)
    for path in (output, report):
        if path is not None:
            err_console.print(f"wrote {path}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``bench`` to the pyasc app."""
    app.command("bench")(bench_command)
