"""``pyasc bench --scenario``: the command's side of a LoadGen run (settings, header, table, JSON).

The runs themselves are :mod:`hybrid.cli._loadgen`'s; this module turns the options into its settings and
its results into what the command prints and writes.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from hybrid.cli._bench_view import layout_line, loadgen_markdown, loadgen_table
from hybrid.cli._console import console, err_console, print_wide, progress
from hybrid.errors import BackendError

__all__ = ["loadgen_command", "loadgen_doc"]


def _header(model: str, s: Any, feeds: Any, samples: int, backends: Sequence[str]) -> list[str]:
    from importlib.metadata import version

    from hybrid._version import __version__
    from hybrid.cli._machine import machine_line
    from hybrid.hal import statuses

    versions = {st.name: st.version for st in statuses()}
    used = ", ".join(f"{b} {versions.get(b, '?')}" for b in dict.fromkeys(backends) if not b.startswith("auto"))
    settings = [f"min duration {s.min_duration_s:g} s", f"min queries {s.min_queries}", f"workers {s.workers}"]
    if s.scenario == "server":
        settings += [f"p99 bound {s.latency_bound_ms:g} ms" if s.latency_bound_ms else "p99 bound: 10x a warm call",
                     f"search runs <= {s.search_runs}"]
    if s.target_qps:
        settings.append(f"target QPS {s.target_qps:g}")
    if s.scenario == "offline":
        settings.append(f"batch {s.offline_batch} per call where dim 0 is dynamic")
    if s.mlperf_conf:
        settings.append(f"config {s.mlperf_conf}")
    if s.tune:
        settings.append("auto+tune: auto measured after cm.tune() on the samples (decided, its checks idle)")
    lines = [f"model: {model}",
             f"machine: {machine_line()}, Python {platform.python_version()}",
             f"versions: pyasc {__version__}; mlcommons-loadgen {version('mlcommons-loadgen')}; {used}",
             f"inputs: {feeds.describe()}; {samples} sample(s) in the library",
             f"LoadGen {s.scenario}: " + ", ".join(settings)]
    if s.min_duration_s < 600:
        lines.append(f"note: {s.min_duration_s:g} s runs are below MLPerf's 600 s minimum: not submission results")
    return lines


def loadgen_doc(model: str, header: list[str], results: Sequence[Any]) -> dict[str, Any]:
    """The JSON document of a LoadGen bench (``--json`` and ``--output``)."""
    return {"model": model, "header": header, "results": [asdict(r) for r in results]}


def loadgen_command(model: Path, model_obj: Any, targets: str | list[str], precisions: Sequence[str], feeds: Any,
                    config: Mapping[str, Any] | None, as_json: bool, as_markdown: bool, output: Path | None, *,
                    samples_file: Path | None, regenerate: Callable[[int], Mapping[str, Any]] | None,
                    report: Path | None = None, **settings: Any) -> None:
    """Run the scenario on every contender and print (or write) the results.

    Raises:
        ConfigError: HYB-102 for a bad setting or sample file, or LoadGen missing.
        BackendError: HYB-304 when no contender can run.
    """
    from hybrid.cli._loadgen import LoadgenSettings, bench_loadgen, samples_from
    from hybrid.ir import atomic_write_bytes

    s = LoadgenSettings(**settings)
    samples = samples_from(feeds.feeds, samples_file, regenerate)
    with progress(f"LoadGen {s.scenario} on {model.name}") as update:
        results = bench_loadgen(model_obj, targets, precisions, s, feeds, samples, config, update)
    if not any(r.status == "ok" for r in results):
        reasons = "; ".join(f"{r.target} {r.precision}: {r.note}" for r in results)
        raise BackendError("HYB-304", f"nothing asked for can run on this machine: {reasons}",
                           "`pyasc devices` lists the backends and devices here")
    header = _header(str(model), s, feeds, len(samples), [r.target.partition(":")[0] for r in results])
    header.append(layout_line(config, [r.target.partition(":")[0] for r in results if r.status == "ok"]))
    doc = loadgen_doc(str(model), header, results)
    if output is not None:
        atomic_write_bytes(output, json.dumps(doc, indent=1).encode())
    if report is not None:
        from hybrid.cli._report_curves import loadgen_html

        atomic_write_bytes(report, loadgen_html(f"LoadGen {s.scenario} on {model}", header, results).encode())
    if as_json:
        typer.echo(json.dumps(doc, indent=1))
    else:
        for line in header:
            console.print(line, soft_wrap=True)
        if as_markdown:
            typer.echo(loadgen_markdown(list(results)))
        else:
            print_wide(loadgen_table(list(results)))
    for path in (output, report):
        if path is not None:
            err_console.print(f"wrote {path}", soft_wrap=True)
