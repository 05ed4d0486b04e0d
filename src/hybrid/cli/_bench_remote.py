"""``pyasc bench --url http://HOST:PORT --model NAME``: a served model measured as perf_analyzer measures it.

Any KServe v2 / Triton server (``pyasc serve``, ``tritonserver``) through tritonclient: a concurrency or
request-rate sweep (``--concurrency-range``, ``--request-rate-range``), each level in windows repeated until
they agree (:mod:`hybrid.cli._sweep`), the server's side of each window from its statistics extension; or one
of LoadGen's scenarios (``--scenario``) with the server as the system under test. The CSV (``--csv``) has
perf_analyzer's columns; the JSON (``--output``, ``--json``) the same figures per level with every window.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from hybrid.cli._console import console, err_console, print_wide, progress
from hybrid.cli._remote import ConcurrencyLoad, RateLoad, RemoteModel, parse_url, remote_samples
from hybrid.cli._sweep import Level, StabilityPolicy, Window, csv_rows, measure, window_of
from hybrid.errors import ConfigError

__all__ = ["SweepSettings", "level_doc", "remote_command", "run_sweep", "server_line"]


@dataclass(frozen=True, slots=True)
class SweepSettings:
    """The sweep: its mode ('concurrency' or 'request_rate'), levels, the stability policy, the rate load's shape.

    ``latency_threshold_ms`` ends the sweep after the first level whose p99 exceeds it (perf_analyzer ``-l``).
    """

    mode: str
    levels: tuple[float, ...]
    policy: StabilityPolicy = field(default_factory=StabilityPolicy)
    distribution: str = "constant"
    threads: int = 16
    latency_threshold_ms: float | None = None


def run_sweep(model: Any, samples: Sequence[Mapping[str, Any]], s: SweepSettings, items: int,
              on_step: Callable[[str], None] | None = None, clock: Callable[[], float] = time.perf_counter,
              sleep: Callable[[float], None] = time.sleep) -> list[Level]:
    """Every level of the sweep, each measured until stable (or ``max_trials`` windows).

    Args:
        model: A :class:`hybrid.cli._remote.RemoteModel` (or anything with its ``call`` and ``counters``).
        samples: The requests' inputs, sent in turn.
        s: The sweep.
        items: Inferences per request (the batch), as Inferences/Second counts them.
        on_step: Progress.
        clock: The load's and the windows' clock.
        sleep: Waits out a window.
    """
    step = on_step or (lambda _text: None)
    levels: list[Level] = []
    for value in s.levels:
        if s.mode == "concurrency":
            load: Any = ConcurrencyLoad(model, samples, int(value), clock)
        else:
            load = RateLoad(model, samples, value, s.distribution, s.threads, clock)
        with load:
            window = functools.partial(_window, load, model, s.policy.window_s, items, clock, sleep)
            name = "concurrency" if s.mode == "concurrency" else "request rate"
            level = measure(s.mode, value, window, s.policy,
                            lambda n, w, v=value, name=name: step(f"{name} {v:g}: window {n}, "
                                                                 f"{w.infer_per_s:.1f} infer/s, "
                                                                 f"{w.avg_us / 1e3:.2f} ms"))
        if load.errors and not level.merged.requests:
            raise load.errors[0]
        levels.append(level)
        if s.latency_threshold_ms is not None and level.merged.percentiles_us[99] / 1e3 > s.latency_threshold_ms:
            break
    return levels


def _window(load: Any, model: Any, seconds: float, items: int, clock: Callable[[], float],
            sleep: Callable[[float], None]) -> Window:
    """One window: the server's counters read at both ends, the requests that completed between them."""
    load.take()  # what completed before the window (warm-up, the last window's tail)
    start, before = clock(), model.counters()
    sleep(seconds)
    after, end = model.counters(), clock()
    return window_of(load.take(), start, end, items, before, after)


def level_doc(lv: Level) -> dict[str, Any]:
    """One level as JSON: perf_analyzer's column names (microseconds), the verdict, every window."""
    header, rows = csv_rows([lv])
    doc: dict[str, Any] = {name: _number(cell) for name, cell in zip(header, rows[0])}
    w = lv.merged
    doc.update({"Avg latency": int(w.avg_us), "stable": lv.stable, "windows": len(lv.windows),
                "requests": w.requests, "errors": w.errors, "late sends": w.late,
                "server side": w.server_us is not None,
                "window figures": [{"Inferences/Second": x.infer_per_s, "Avg latency": x.avg_us,
                                    "p99 latency": x.percentiles_us[99], "requests": x.requests,
                                    "seconds": x.seconds} for x in lv.windows]})
    return doc


def _number(cell: str) -> float | int:
    number = float(cell)
    return int(number) if number.is_integer() else number


def _csv_text(levels: Sequence[Level]) -> str:
    header, rows = csv_rows(levels)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def server_line(model: RemoteModel) -> str:
    """What the server says it runs: its name and version, the model's platform, and pyasc's own record."""
    meta: dict[str, Any] = {}
    try:
        meta = model._json(model.client().get_server_metadata(**model._as_json()))
    except Exception:  # a KServe server without the endpoint: the line says less
        meta = {}
    parts = [f"{meta.get('name', 'server')} {meta.get('version', '')}".strip(),
             f"model {model.name} ({model.metadata.get('platform', '?')}, max_batch_size {model.max_batch_size})"]
    groups = model.config.get("instance_group") or []
    if groups:  # the server's layout: model instances (replicas) per kind
        parts.append("instances " + ", ".join(f"{g.get('count', 1)} x {g.get('kind', '?')}" for g in groups))
    stats = model.statistics() or {}
    for entry in stats.get("model_stats", []) or []:
        extra = entry.get("pyasc")
        if isinstance(extra, Mapping):  # pyasc serve's record of what the model runs on
            precision = extra.get("precision", "?")
            precision = ",".join(precision) if isinstance(precision, list) else precision
            parts.append(f"runtime {extra.get('backend', '?')}, device {extra.get('device', '?')}, "
                         f"precision {precision}")
            break
    return "server: " + "; ".join(parts)


def _header(model: RemoteModel, samples: Sequence[Mapping[str, Any]], what: str) -> list[str]:
    from importlib.metadata import version

    from hybrid._version import __version__
    from hybrid.cli._machine import machine_line

    shapes = ", ".join(f"{k}:{'x'.join(map(str, v.shape))} {v.dtype}" for k, v in samples[0].items())
    return [f"target: {model.endpoint} model {model.name}{' version ' + model.version if model.version else ''}",
            server_line(model),
            f"client machine: {machine_line()}, Python {platform.python_version()}",
            f"versions: pyasc {__version__}; tritonclient {version('tritonclient')}",
            f"inputs: {shapes}; {len(samples)} sample(s), sent in turn",
            what]


def _table(levels: Sequence[Level]) -> Table:
    table = Table(title="perf_analyzer-style sweep (times per request; server side from its statistics)")
    first = "concurrency" if levels and levels[0].mode == "concurrency" else "request rate"
    for name in (first, "infer/s", "p50 ms", "p90 ms", "p99 ms", "avg ms", "client send+recv ms",
                 "network ms", "server queue ms", "server compute ms (in/infer/out)", "stable", "windows"):
        table.add_column(name, overflow="fold")
    for lv in levels:
        w = lv.merged
        srv = w.server_us
        compute = "-" if srv is None else "/".join(f"{srv[k] / 1e3:.3f}" for k in ("compute_input", "compute_infer",
                                                                                  "compute_output"))
        table.add_row(f"{lv.value:g}", f"{w.infer_per_s:.1f}", *(f"{w.percentiles_us[p] / 1e3:.3f}" for p in
                                                                 (50, 90, 99)),
                      f"{w.avg_us / 1e3:.3f}", f"{(w.send_us + w.recv_us) / 1e3:.3f}", f"{w.network_us / 1e3:.3f}",
                      "-" if srv is None else f"{srv['queue'] / 1e3:.3f}", compute,
                      "yes" if lv.stable else "NO", str(len(lv.windows)))
    return table


def _markdown(levels: Sequence[Level]) -> str:
    header, rows = csv_rows(levels)
    lines = ["| " + " | ".join(header) + " | stable |", "|" + "---|" * (len(header) + 1)]
    by_value = {f"{lv.value:g}": lv for lv in levels}
    for row in rows:
        lv = by_value[f"{float(row[0]):g}"]
        lines.append("| " + " | ".join(row) + f" | {'yes' if lv.stable else 'NO'} |")
    return "\n".join(lines)


def remote_command(url: str, model_name: str | None, version: str, shapes: Mapping[str, Sequence[int]] | None,
                   batch: int | None, given: Mapping[str, Any] | None, sweep: SweepSettings | None,
                   loadgen: Mapping[str, Any] | None, *, as_json: bool, as_markdown: bool, output: Path | None,
                   csv_path: Path | None, report: Path | None) -> None:
    """Measure the served model: the sweep, or (``loadgen`` given) one LoadGen scenario; print and write.

    Raises:
        ConfigError: HYB-102 for a bad URL or option; RunError HYB-417 for an input no option sizes.
        ServingError: HYB-716 for a server that cannot be reached, HYB-701 for a model it does not serve.
    """
    from hybrid.ir import atomic_write_bytes

    endpoint = parse_url(url)
    if not model_name:
        raise ConfigError("HYB-102", "--url needs --model NAME: the served model to measure",
                          f"e.g. pyasc bench --url {endpoint} --model resnet50")
    model = RemoteModel(endpoint, model_name, version)
    try:
        samples = remote_samples(model, shapes, batch, given)
        first = next(iter(samples[0].values()))
        items = int(first.shape[0]) if model.max_batch_size > 0 and first.ndim else 1
        model.run(samples[0])  # a warm request: the server's first call (compile, allocation) is not timed
        if loadgen is not None:
            doc, lines, table = _loadgen(model, samples, loadgen, endpoint, as_markdown)
        else:
            assert sweep is not None
            p = sweep.policy
            what = (f"sweep: {sweep.mode.replace('_', ' ')} {', '.join(f'{v:g}' for v in sweep.levels)}; windows of "
                    f"{p.window_s:g} s until {p.windows} agree within {p.stability_pct:g} % "
                    f"({'mean' if p.percentile is None else f'p{p.percentile}'} latency and throughput), at most "
                    f"{p.max_trials}" + (f"; {sweep.distribution} intervals, {sweep.threads} sender threads"
                                         if sweep.mode == "request_rate" else ""))
            with progress(f"measuring {model_name} at {endpoint}") as update:
                levels = run_sweep(model, samples, sweep, items, update)
            lines = _header(model, samples, what)
            doc = {"target": str(endpoint), "model": model_name, "header": lines, "mode": sweep.mode,
                   "policy": asdict(p), "levels": [level_doc(lv) for lv in levels]}
            table = _markdown(levels) if as_markdown else _table(levels)
            if csv_path is not None:
                atomic_write_bytes(csv_path, _csv_text(levels).encode())
            if report is not None:
                from hybrid.cli._report_curves import sweep_html

                atomic_write_bytes(report, sweep_html(f"{model_name} at {endpoint}", lines, levels).encode())
    finally:
        model.close()
    if output is not None:
        atomic_write_bytes(output, json.dumps(doc, indent=1).encode())
    if as_json:
        typer.echo(json.dumps(doc, indent=1))
    else:
        for line in lines:
            console.print(line, soft_wrap=True)
        if isinstance(table, str):
            typer.echo(table)
        else:
            print_wide(table)
        unstable = [lv for lv in doc.get("levels", []) if not lv.get("stable", True)]
        if unstable:
            console.print(f"note: {len(unstable)} level(s) did not stabilise within --max-trials windows: their "
                          "figures are the last windows', marked NO", soft_wrap=True)
    for path in (output, csv_path, report):
        if path is not None:
            err_console.print(f"wrote {path}", soft_wrap=True)


def _loadgen(model: RemoteModel, samples: Sequence[Mapping[str, Any]], settings: Mapping[str, Any],
             endpoint: Any, as_markdown: bool) -> tuple[dict[str, Any], list[str], Any]:
    """One LoadGen scenario with the server as the system under test (one row: the served model)."""
    from hybrid.cli._bench_view import loadgen_markdown, loadgen_table
    from hybrid.cli._loadgen import LoadgenResult, LoadgenSettings, run_scenario

    s = LoadgenSettings(**settings)
    base = LoadgenResult(str(endpoint), "served", s.scenario)
    with progress(f"LoadGen {s.scenario} on {model.name} at {endpoint}") as update:
        result = run_scenario(model, samples, s, base, update)
    lines = _header(model, samples, f"LoadGen {s.scenario}: min duration {s.min_duration_s:g} s, min queries "
                    f"{s.min_queries}, {s.workers} request(s) at once")
    if s.min_duration_s < 600:
        lines.append(f"note: {s.min_duration_s:g} s runs are below MLPerf's 600 s minimum: not submission results")
    result = replace(result, target=str(endpoint))
    doc = {"target": str(endpoint), "model": model.name, "header": lines, "results": [asdict(result)]}
    return doc, lines, loadgen_markdown([result]) if as_markdown else loadgen_table([result])

