"""``pyasc bench MODEL --targets all``: the migration report.

Every available backend x device x precision on this machine, side by side on the same inputs:
compile time, latency (median and p90), throughput, and the largest error against the reference
backend (hybrid's numpy backend; ONNX Runtime on the CPU where it is absent). Contenders are timed
interleaved, in blocks with a short pause between them, so that one runtime's spinning threads do
not tax the next (DESIGN section 4).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from hybrid.cli._console import console, report_errors
from hybrid.errors import HybridError

__all__ = ["BenchRow", "bench", "markdown", "reference_target", "register"]

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One contender of the migration report (``status`` 'ok', or 'n/a' with the reason in ``note``)."""

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


def reference_target() -> str:
    """The backend errors are measured against: hybrid's reference backend, else ONNX Runtime on the CPU."""
    from hybrid.hal import backend_status

    return "reference:cpu" if backend_status("reference").available else "onnxruntime:cpu"


def _load_model(path: Path) -> Any:
    from hybrid.ir import Model

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


def _interleave(runs: Mapping[str, Callable[[], Any]], blocks: int, per_block: int,
                pause: float) -> dict[str, list[float]]:
    """Seconds per call of every contender, timed in rotating blocks with pauses between contenders."""
    names = list(runs)
    per: dict[str, int] = {}
    for name in names:  # warm up, and size each block to about half a second for slow contenders
        t0 = time.perf_counter()
        runs[name]()
        runs[name]()
        per[name] = max(1, min(per_block, int(0.5 / max((time.perf_counter() - t0) / 2, 1e-6))))
        time.sleep(pause)
    times: dict[str, list[float]] = {n: [] for n in names}
    for b in range(blocks):
        for name in names[b % len(names):] + names[:b % len(names)]:
            for _ in range(per[name]):
                t0 = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - t0)
            time.sleep(pause)
    return times


def bench(model: Any, targets: str | list[str] = "all", precisions: tuple[str, ...] = PRECISIONS,
          blocks: int = 5, per_block: int = 10, batch: int = 1, inputs: Mapping[str, Any] | None = None,
          pause: float = 0.05) -> tuple[list[BenchRow], str]:
    """Compile ``model`` for every (backend, device, precision) requested and measure each.

    Returns:
        (rows in input order, the reference target the errors are measured against).
    """
    from hybrid.hal import resolve_target
    from hybrid.ir import Model
    from hybrid.runtime.compiler import compile_model
    from hybrid.runtime.profiler import sample_inputs

    model = Model.load(model)
    names = [str(c) for c in resolve_target("auto")] if targets == "all" else \
        list(dict.fromkeys(str(c) for t in targets for c in resolve_target(t)))
    feeds = {**sample_inputs(model.signature, batch), **(inputs or {})}
    ref_target = reference_target()
    expected = compile_model(model, target=ref_target).run(feeds)
    rows: dict[tuple[str, str], BenchRow] = {}
    compiled: dict[tuple[str, str], Any] = {}
    for target in names:
        for prec in precisions:
            t0 = time.perf_counter()
            try:
                cm = compile_model(model, target=target, precision=prec)
                out = cm.run(feeds)
            except HybridError as e:
                rows[(target, prec)] = BenchRow(target, prec, "n/a", note=f"[{e.code}] {e.message}")
                continue
            abs_err, rel_err = _errors(expected, out)
            compiled[(target, prec)] = cm
            rows[(target, prec)] = BenchRow(target, prec, "ok", time.perf_counter() - t0,
                                            max_abs_err=abs_err, max_rel_err=rel_err)
    times = _interleave({f"{t}|{p}": (lambda cm=cm: cm.run(feeds)) for (t, p), cm in compiled.items()},
                        blocks, per_block, pause) if compiled else {}
    medians = {k: statistics.median(v) for k, v in times.items()}
    fastest = min(medians.values(), default=0.0)
    for key, row in rows.items():
        samples = times.get(f"{key[0]}|{key[1]}")
        if samples:
            med = medians[f"{key[0]}|{key[1]}"]
            p90 = float(np.percentile(samples, 90))
            rows[key] = BenchRow(row.target, row.precision, "ok", row.compile_s, med * 1e3, p90 * 1e3, batch / med,
                                 row.max_abs_err, row.max_rel_err, med / fastest if fastest else None, row.note)
    return list(rows.values()), ref_target


def markdown(rows: list[BenchRow], reference: str, ok_only: bool = False) -> str:
    """The report as a Markdown table."""
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [f"| target | precision | compile s | p50 ms | p90 ms | items/s | x fastest | max abs err vs {reference} "
             "| max rel err |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.status != "ok":
            if not ok_only:
                lines.append(f"| {r.target} | {r.precision} | n/a | | | | | {r.note[:90]} | |")
            continue
        lines.append(f"| {r.target} | {r.precision} | {num(r.compile_s, '.2f')} | {num(r.p50_ms, '.3f')} | "
                     f"{num(r.p90_ms, '.3f')} | {num(r.items_per_s, '.1f')} | {num(r.vs_fastest, '.2f')} | "
                     f"{num(r.max_abs_err, '.3g')} | {num(r.max_rel_err, '.3g')} |")
    return "\n".join(lines)


def bench_command(
    model: Annotated[Path, typer.Argument(help="An .onnx model or a .hybrid bundle.")],
    targets: Annotated[str, typer.Option("--targets", help="'all', or targets separated by commas "
                                         "(onnxruntime,openvino:cpu).")] = "all",
    precisions: Annotated[str, typer.Option("--precisions", help="'all' or e.g. fp32,bf16.")] = "all",
    blocks: Annotated[int, typer.Option("--blocks", help="Interleaved timing blocks.")] = 5,
    per_block: Annotated[int, typer.Option("--per-block", help="Runs per contender per block.")] = 10,
    batch: Annotated[int, typer.Option("--batch", help="Size of symbolic dims in the inputs.")] = 1,
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE.npy (repeatable).")] = None,
    all_rows: Annotated[bool, typer.Option("--show-unavailable", help="Also list precisions a backend "
                                           "does not offer.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the rows as JSON.")] = None,
) -> None:
    """Compare every available backend x device x precision on MODEL: latency, throughput, max error."""
    from hybrid.cli._inputs import load_inputs
    from hybrid.ir import atomic_write_bytes

    with report_errors():
        model_obj = _load_model(model)
        precs = PRECISIONS if precisions == "all" else tuple(p.strip() for p in precisions.split(","))
        rows, reference = bench(model_obj, "all" if targets == "all" else [t.strip() for t in targets.split(",")],
                                precs, blocks, per_block, batch, load_inputs(inputs))
    console.print(f"migration report: {model.name}, batch {batch}, errors against {reference}", highlight=False)
    typer.echo(markdown(rows, reference, ok_only=not all_rows))  # plain text: a Markdown table must not wrap
    if json_out is not None:
        doc = {"model": str(model), "reference": reference, "batch": batch, "rows": [asdict(r) for r in rows]}
        atomic_write_bytes(json_out, json.dumps(doc, indent=1).encode())
        console.print(f"wrote {json_out}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``bench`` to the pyasc app."""
    app.command("bench")(bench_command)
