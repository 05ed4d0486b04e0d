"""``pyasc bench --report report.html``: one self-contained HTML file, plots drawn by matplotlib as inline SVG.

Nothing is loaded from the network (no script, stylesheet, font or image URL), so the file opens
offline and can be attached to a ticket. One plot per metric: latency distribution, throughput, error
against the reference backend, each over backend x precision.
"""

from __future__ import annotations

import datetime
import html
import io
import re
from dataclasses import asdict
from typing import Any

from hybrid.errors import ModelError

__all__ = ["METRICS", "bench_html"]

METRICS = ("latency", "throughput", "error")

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f4f4f4}td:first-child,
td:nth-child(2){text-align:left}figure{margin:1.5em 0}figcaption{font-weight:600;margin-bottom:.4em}
.na{color:#888}"""


def _figure(width: float = 8.0, height: float = 4.0) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ModelError("HYB-207", "pyasc bench --report needs matplotlib, which is not installed",
                         "pip install 'pyasc[report]'") from e
    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Any) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "pyasc"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # no XML prolog / DOCTYPE (it names an external DTD)
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def _label(r: Any) -> str:
    prec = r.precision if r.precision_run in (None, r.precision) else f"{r.precision}→{r.precision_run}"
    return f"{r.target}\n{prec}"


def _plots(rows: list[Any], reference: str, concurrency: int) -> dict[str, str]:
    ok = [r for r in rows if r.status == "ok"]
    labels = [_label(r) for r in ok]
    height = max(2.5, 0.55 * len(ok) + 1.2)
    plots: dict[str, str] = {}

    fig = _figure(9, height)
    ax = fig.add_subplot()
    ax.boxplot([list(r.latencies_ms) or [r.p50_ms or 0.0] for r in ok], orientation="horizontal",
               tick_labels=labels, showfliers=True, whis=(1, 99))
    ax.set_xlabel("latency per call, ms (box: p25-p75, line: p50, whiskers: p1-p99)")
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    plots["latency"] = _svg(fig)

    fig = _figure(9, height)
    ax = fig.add_subplot()
    ax.barh(labels, [r.items_per_s or 0.0 for r in ok], color="#4c72b0")
    ax.set_xlabel(f"items per second ({concurrency} caller{'s' if concurrency > 1 else ''})")
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    plots["throughput"] = _svg(fig)

    fig = _figure(9, height)
    ax = fig.add_subplot()
    errs = [max(r.max_scaled_err or 0.0, 1e-12) for r in ok]
    ax.barh(labels, errs, color=["#dd8452" if r.accuracy_ok is not False else "#c44e52" for r in ok])
    ax.set_xscale("log")
    ax.set_xlabel(f"max abs error / max |ref| vs {reference} (log scale; 1e-12 shown for exact; red: failed)")
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    plots["error"] = _svg(fig)
    return plots


def _table(rows: list[Any], reference: str) -> str:
    from hybrid.cli._bench_view import COLUMNS, row_cells

    head = [c if c != "max abs err" else f"max abs err vs {reference}" for c in COLUMNS]
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        if r.status != "ok":
            out.append(f"<tr class='na'><td>{html.escape(r.target)}</td><td>{html.escape(r.precision)}</td>"
                       f"<td colspan='{len(head) - 2}'>n/a: {html.escape(r.note)}</td></tr>")
            continue
        cells = list(row_cells(r))
        if r.accuracy_ok is False:
            cells[-1] = f"FAIL: {r.accuracy_note}"
        out.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return "\n".join([*out, "</table>"])


def bench_html(model: str, reference: str, batch: int, timing: Any, rows: list[Any],
               header: list[str] | None = None) -> str:
    """The report as one HTML document (no external resources).

    ``header``: the lines bench prints first (machine, versions, inputs, tolerance).

    Raises:
        ModelError: HYB-207 when matplotlib is not installed (``pip install 'pyasc[report]'``).
    """
    from hybrid._version import __version__

    plots = _plots(rows, reference, timing.concurrency)
    captions = {"latency": "Latency distribution", "throughput": "Throughput",
                "error": "Error against the reference backend"}
    settings = ", ".join(f"{k}={v}" for k, v in asdict(timing).items() if v is not None)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    figures = "\n".join(f"<figure class='plot' data-metric='{m}'><figcaption>{captions[m]}</figcaption>{plots[m]}"
                        "</figure>" for m in METRICS)
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>pyasc bench: "
            f"{html.escape(model)}</title><style>{_CSS}</style></head><body>\n"
            f"<h1>pyasc bench: {html.escape(model)}</h1>\n<p>batch {batch}; timing: {html.escape(settings)}; "
            f"errors against {html.escape(reference)}; pyasc {__version__}, {when}</p>\n"
            + "".join(f"<p class='header'>{html.escape(line)}</p>\n" for line in header or ()) +
            f"{_table(rows, reference)}\n{figures}\n</body></html>\n")
