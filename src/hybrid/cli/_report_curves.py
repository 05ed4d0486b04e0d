"""Latency-vs-throughput curves for ``pyasc bench --report``: the ``--url`` sweep and LoadGen's Server search.

Drawn by matplotlib as inline SVG (:mod:`hybrid.cli._report`'s figure helpers), so the page opens offline.
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Sequence
from typing import Any

from hybrid.cli._report import _CSS, _figure, _svg

__all__ = ["loadgen_html", "search_svg", "sweep_svgs"]


def sweep_svgs(levels: Sequence[Any]) -> dict[str, str]:
    """The sweep's curves: p50/p90/p99 latency against Inferences/Second, and the latency split per level."""
    ordered = sorted(levels, key=lambda lv: lv.value)
    rate = [lv.merged.infer_per_s for lv in ordered]
    fig = _figure(8, 4.5)
    ax = fig.add_subplot()
    for p, style in ((50, "o-"), (90, "s--"), (99, "^:")):
        ax.plot(rate, [lv.merged.percentiles_us[p] / 1e3 for lv in ordered], style, label=f"p{p}")
    for lv, x in zip(ordered, rate):
        ax.annotate(f"{lv.value:g}{'' if lv.stable else '*'}", (x, lv.merged.percentiles_us[99] / 1e3),
                    textcoords="offset points", xytext=(4, 4), fontsize=8)
    first = "concurrency" if ordered and ordered[0].mode == "concurrency" else "request rate"
    ax.set_xlabel(f"inferences / second (points labelled by {first}; * not stable)")
    ax.set_ylabel("latency, ms")
    ax.grid(alpha=0.3)
    ax.legend()
    curve = _svg(fig)

    fig = _figure(8, max(2.5, 0.45 * len(ordered) + 1.2))
    ax = fig.add_subplot()
    parts = [("client send/recv", lambda w: w.send_us + w.recv_us), ("network + server send/recv",
                                                                      lambda w: w.network_us)]
    parts += [(f"server {k.replace('_', ' ')}", lambda w, k=k: (w.server_us or {}).get(k, 0.0))
              for k in ("queue", "compute_input", "compute_infer", "compute_output")]
    labels = [f"{first} {lv.value:g}" for lv in ordered]
    left = [0.0] * len(ordered)
    for name, get in parts:
        widths = [get(lv.merged) / 1e3 for lv in ordered]
        ax.barh(labels, widths, left=left, label=name)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("mean latency per request, ms (server parts from its statistics extension)")
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="lower right")
    return {"curve": curve, "split": _svg(fig)}


def search_svg(results: Sequence[Any]) -> str | None:
    """LoadGen Server search: each run's p99 against its QPS per contender, VALID filled, the bound dashed."""
    searched = [r for r in results if r.status == "ok" and r.runs]
    if not searched:
        return None
    fig = _figure(8, 4.5)
    ax = fig.add_subplot()
    for r in searched:
        runs = sorted((q, v, p) for q, v, p in r.runs if p is not None)
        line = ax.plot([q for q, _, _ in runs], [p for _, _, p in runs], "-", alpha=0.5,
                       label=f"{r.target} {r.precision}")[0]
        ax.scatter([q for q, v, _ in runs if v], [p for _, v, p in runs if v], color=line.get_color())
        ax.scatter([q for q, v, _ in runs if not v], [p for _, v, p in runs if not v], facecolors="none",
                   edgecolors=line.get_color())
    bound = next((r.latency_bound_ms for r in searched if r.latency_bound_ms), None)
    if bound:
        ax.axhline(bound, color="#c44e52", linestyle="--", label=f"p99 bound {bound:g} ms")
    ax.set_xlabel("scheduled QPS (filled: VALID, hollow: INVALID)")
    ax.set_ylabel("p99 latency, ms")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig)


def _page(title: str, header: Sequence[str], body: str) -> str:
    from hybrid._version import __version__

    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>pyasc bench: {html.escape(title)}"
            f"</title><style>{_CSS}</style></head><body>\n<h1>pyasc bench: {html.escape(title)}</h1>\n"
            + "".join(f"<p class='header'>{html.escape(line)}</p>\n" for line in header)
            + f"{body}\n<p>pyasc {__version__}, {when}</p>\n</body></html>\n")


def _rows(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows]
    return "\n".join([*out, "</table>"])


def sweep_html(title: str, header: Sequence[str], levels: Sequence[Any]) -> str:
    """The ``--url`` sweep as one HTML page: perf_analyzer's table, the curve and the latency split."""
    from hybrid.cli._sweep import csv_rows

    plots = sweep_svgs(levels)
    head, rows = csv_rows(levels)
    body = (_rows([*head, "stable"], [[*row, "yes" if lv.stable else "NO"] for row, lv in
                                      zip(rows, sorted(levels, key=lambda lv: lv.merged.infer_per_s))])
            + "<p>times in microseconds per request, as perf_analyzer's CSV</p>"
            + f"<figure class='plot' data-metric='curve'><figcaption>Latency vs throughput</figcaption>"
              f"{plots['curve']}</figure>"
            + f"<figure class='plot' data-metric='split'><figcaption>Where the time goes</figcaption>"
              f"{plots['split']}</figure>")
    return _page(title, header, body)


def loadgen_html(title: str, header: Sequence[str], results: Sequence[Any]) -> str:
    """A LoadGen bench as one HTML page: the results table and, for Server, the search's curve."""
    from hybrid.cli._bench_view import LOADGEN_COLUMNS, loadgen_cells

    body = _rows(LOADGEN_COLUMNS, [loadgen_cells(r) for r in results])
    svg = search_svg(results)
    if svg is not None:
        body += (f"\n<figure class='plot' data-metric='server-search'><figcaption>Server search: p99 vs QPS"
                 f"</figcaption>{svg}</figure>")
    return _page(title, header, body)
