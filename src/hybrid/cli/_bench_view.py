"""What ``pyasc bench`` measures about accuracy, and how it shows its rows.

Accuracy: each contender's outputs against the reference backend's on the same inputs (the ``--input``
files where given): the largest absolute error, that error over the largest reference magnitude, the
lowest cosine over the outputs, and the share of elements outside ``|got - ref| <= atol + rtol * |ref|``.
A row passes when every output is within rtol/atol everywhere and its cosine reaches ``min_cosine``.
Defaults (stated in ``--help`` and the report's header): fp32 rtol 1e-3, atol 1e-4; fp16 and bf16 rtol
1e-2, atol 1e-2; cosine >= 0.999 for every precision. Given values apply to every precision.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from rich.table import Table

from hybrid.errors import ConfigError

__all__ = ["COLUMNS", "LOADGEN_COLUMNS", "Accuracy", "Tolerance", "header_lines", "loadgen_cells", "loadgen_markdown",
           "loadgen_table", "markdown", "measure_accuracy", "report_doc", "rich_table", "row_cells"]

DEFAULT_TOLERANCE = {"fp32": (1e-3, 1e-4), "fp16": (1e-2, 1e-2), "bf16": (1e-2, 1e-2)}
DEFAULT_MIN_COSINE = 0.999


@dataclass(frozen=True, slots=True)
class Tolerance:
    """``--rtol/--atol/--min-cosine``; None takes the per-precision default."""

    rtol: float | None = None
    atol: float | None = None
    min_cosine: float | None = None

    def __post_init__(self) -> None:
        for flag, value in (("--rtol", self.rtol), ("--atol", self.atol)):
            if value is not None and not value >= 0:
                raise ConfigError("HYB-102", f"{flag}: expected a number >= 0, got {value:g}", f"e.g. {flag} 1e-3")
        if self.min_cosine is not None and not 0 < self.min_cosine <= 1:
            raise ConfigError("HYB-102", f"--min-cosine: expected a cosine in (0, 1], got {self.min_cosine:g}",
                              "e.g. --min-cosine 0.999")

    def of(self, precision: str) -> tuple[float, float, float]:
        """(rtol, atol, min_cosine) for a precision."""
        rtol, atol = DEFAULT_TOLERANCE.get(precision, DEFAULT_TOLERANCE["fp16"])
        return (rtol if self.rtol is None else self.rtol, atol if self.atol is None else self.atol,
                DEFAULT_MIN_COSINE if self.min_cosine is None else self.min_cosine)

    def describe(self, precisions: tuple[str, ...]) -> str:
        """The tolerance in words, per precision benchmarked."""
        parts = []
        for prec in dict.fromkeys(precisions):
            rtol, atol, cos = self.of(prec)
            parts.append(f"{prec} rtol {rtol:g} atol {atol:g} cosine >= {cos:g}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Accuracy:
    """One contender against the reference: ``passed`` and, when not, ``reason``."""

    max_abs_err: float
    max_scaled_err: float
    cosine: float
    outside: float
    passed: bool
    reason: str = ""


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def measure_accuracy(expected: Mapping[str, Any], got: Mapping[str, Any], rtol: float, atol: float,
                     min_cosine: float) -> Accuracy:
    """Compare every output (numeric ones; others must be equal) and give the verdict."""
    abs_err, scale, cos, outside, reasons = 0.0, 0.0, 1.0, 0.0, []
    for name, ref in expected.items():
        ref_arr, got_arr = np.asarray(ref), np.asarray(got[name])
        if ref_arr.shape != got_arr.shape:
            return Accuracy(float("inf"), float("inf"), 0.0, 1.0, False,
                            f"{name} is {got_arr.shape} instead of {ref_arr.shape}")
        if ref_arr.dtype.kind not in "fiub":
            if not np.array_equal(ref_arr, got_arr):
                reasons.append(f"{name} differs")
            continue
        a, b = ref_arr.astype(np.float64).ravel(), got_arr.astype(np.float64).ravel()
        if not a.size:
            continue
        bad_values = np.isnan(a) != np.isnan(b)
        diff = np.abs(np.nan_to_num(a) - np.nan_to_num(b))
        abs_err = max(abs_err, float(diff.max()))
        scale = max(scale, float(np.abs(np.nan_to_num(a)).max()))
        out_cos = _cosine(np.nan_to_num(a), np.nan_to_num(b))
        cos = min(cos, out_cos)
        frac = float(np.mean((diff > atol + rtol * np.abs(np.nan_to_num(a))) | bad_values))
        outside = max(outside, frac)
        if frac:
            reasons.append(f"{frac:.2%} of {name} outside rtol {rtol:g} / atol {atol:g}")
        if out_cos < min_cosine:
            reasons.append(f"{name} cosine {out_cos:.5f} < {min_cosine:g}")
    return Accuracy(abs_err, abs_err / scale if scale else abs_err, cos, outside, not reasons, "; ".join(reasons))


def header_lines(model: str, reference: str, inputs_text: str, tolerance: str, backends: list[str],
                 timing: str) -> list[str]:
    """The report's header: the machine, the versions, the shapes run, the tolerance, the timing."""
    from hybrid._version import __version__
    from hybrid.cli._machine import machine_line
    from hybrid.hal import statuses

    versions = {s.name: s.version for s in statuses()}
    used = ", ".join(f"{b} {versions.get(b, '?')}" for b in dict.fromkeys(backends))
    return [f"model: {model}",
            f"machine: {machine_line()}, Python {platform.python_version()}",
            f"versions: pyasc {__version__}; {used}",
            f"inputs: {inputs_text}",
            f"accuracy against {reference}; pass: {tolerance}",
            f"timing: {timing}"]


_THREADS = ("intra_op_num_threads", "num_threads", "inference_num_threads")
_STREAMS = ("num_streams",)


def layout_line(config: Mapping[str, Mapping[str, Any]] | None, backends: list[str]) -> str:
    """The layout each backend ran with: threads and streams as the options set them, else the backend's default.

    No compiled model exposes the layout its runtime chose yet, so an option not given reads 'default'
    (the runtime's own choice); each contender is one compiled model (one replica).
    """
    parts = []
    for b in dict.fromkeys(backends):
        opts = {k.lower(): v for k, v in (config or {}).get(b, {}).items()}
        threads = next((opts[k] for k in _THREADS if k in opts), "default")
        streams = next((opts[k] for k in _STREAMS if k in opts), "default")
        hint = opts.get("performance_hint")
        parts.append(f"{b}: threads {threads}, streams {streams}" + (f", hint {hint}" if hint else ""))
    return "layout: " + "; ".join(parts) + "; 1 replica per contender (one compiled model)"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _prec(r: Any) -> str:
    return r.precision if r.precision_run in (None, r.precision) else f"{r.precision_run} (asked {r.precision})"


def _shown(rows: list[Any], ok_only: bool) -> list[Any]:
    ran = {r.target for r in rows if r.status == "ok"}
    return [r for r in rows if r.status == "ok" or not ok_only or r.target not in ran]


COLUMNS = ("target", "precision", "compile s", "count", "min ms", "mean ms", "p50 ms", "p95 ms", "p99 ms", "max ms",
           "items/s", "x fastest", "max abs err", "err / max|ref|", "cosine", "accuracy")


def row_cells(r: Any) -> tuple[str, ...]:
    verdict = "-" if r.accuracy_ok is None else "pass" if r.accuracy_ok else "FAIL"
    return (r.target, _prec(r), _num(r.compile_s, ".2f"), str(r.runs), _num(r.min_ms, ".3f"), _num(r.mean_ms, ".3f"),
            _num(r.p50_ms, ".3f"), _num(r.p95_ms, ".3f"), _num(r.p99_ms, ".3f"), _num(r.max_ms, ".3f"),
            _num(r.items_per_s, ".1f"), _num(r.vs_fastest, ".2f"), _num(r.max_abs_err, ".3g"),
            _num(r.max_scaled_err, ".3g"), _num(r.cosine, ".6f"), verdict)


def rich_table(rows: list[Any], reference: str, ok_only: bool = False) -> Table:
    """The rows as a Rich table (n/a rows say why; ``ok_only`` as in :func:`markdown`)."""
    table = Table(title=f"pyasc bench (errors against {reference})")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("target", "precision", "accuracy") else "right",
                         no_wrap=col != "accuracy")
    for r in _shown(rows, ok_only):
        if r.status != "ok":
            table.add_row(r.target, r.precision, "n/a", *[""] * (len(COLUMNS) - 4), r.note[:120])
            continue
        cells = list(row_cells(r))
        if r.accuracy_ok is False:
            from hybrid.cli._console import styled

            table.add_row(*cells[:-1], styled(f"FAIL: {r.accuracy_note}", "bold red"))
        else:
            table.add_row(*cells)
    return table


def markdown(rows: list[Any], reference: str, ok_only: bool = False) -> str:
    """The report as a Markdown table (``--markdown``).

    Precision: asked for, and what ran where the backend differs.

    ``ok_only`` leaves out the n/a rows, except for a target none of whose precisions ran (so a target that
    was asked for never vanishes from the table).
    """
    head = [c if c != "max abs err" else f"max abs err vs {reference}" for c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in _shown(rows, ok_only):
        if r.status != "ok":
            lines.append(f"| {r.target} | {r.precision} | n/a |" + " |" * (len(COLUMNS) - 4) + f" {r.note[:90]} |")
            continue
        cells = list(row_cells(r))
        if r.accuracy_ok is False:
            cells[-1] = f"FAIL: {r.accuracy_note}"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_doc(model: str, reference: str, batch: int, timing: Any, rows: list[Any],
               latencies: bool = False, *, header: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of ``--json`` / ``--output``.

    ``latencies``: every timed call, in ms; ``header``: machine, versions, inputs, tolerance.
    """
    def row(r: Any) -> dict[str, Any]:
        d = asdict(r)
        if not latencies:
            d.pop("latencies_ms")
        else:
            d["latencies_ms"] = list(r.latencies_ms)
        return d

    return {"model": model, "reference": reference, "batch": batch, "timing": asdict(timing), **(header or {}),
            "rows": [row(r) for r in rows]}


LOADGEN_COLUMNS = ("target", "precision", "scenario", "result", "metric", "value", "p50 ms", "p90 ms", "p99 ms",
                   "samples/s", "compile s", "first call ms", "why INVALID / notes")


def loadgen_cells(r: Any) -> list[str]:
    """One LoadGen result (``hybrid.cli._loadgen.LoadgenResult``) as table cells."""
    if r.status != "ok":
        return [r.target, r.precision, r.scenario, "n/a", "", "-", "-", "-", "-", "-", "-", "-", r.note]
    verdict = "VALID" if r.valid else "INVALID"
    if r.scenario == "server" and r.metric:
        verdict = f"{verdict} at {r.metric:.1f} QPS"
    notes = "; ".join(filter(None, [r.reason, r.note,
                                    f"short run ({r.duration_s:g} s < MLPerf's 600 s)" if r.short_run else ""]))
    return [r.target, r.precision, r.scenario, verdict, r.metric_name, _num(r.metric, ".2f"), _num(r.p50_ms, ".3f"),
            _num(r.p90_ms, ".3f"), _num(r.p99_ms, ".3f"), _num(r.samples_per_s, ".1f"), _num(r.compile_s, ".2f"),
            _num(r.first_call_ms, ".1f"), notes]


def loadgen_table(results: list[Any]) -> Table:
    """LoadGen's results per contender, as a Rich table."""
    table = Table(title="MLPerf LoadGen (performance mode)")
    for name in LOADGEN_COLUMNS:
        table.add_column(name, overflow="fold")
    for r in results:
        table.add_row(*loadgen_cells(r))
    return table


def loadgen_markdown(results: list[Any]) -> str:
    """LoadGen's results per contender, as a Markdown table."""
    lines = ["| " + " | ".join(LOADGEN_COLUMNS) + " |", "|" + "---|" * len(LOADGEN_COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in loadgen_cells(r)) + " |" for r in results]
    return "\n".join(lines)
