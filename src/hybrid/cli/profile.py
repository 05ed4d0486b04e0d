"""``pyasc profile MODEL --duration 60 --output profile.json``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from hybrid.cli import _options as opt
from hybrid.cli._console import console, progress, report_errors
from hybrid.cli._inputs import generated_inputs, load_inputs

__all__ = ["register"]


def profile(
    model: Annotated[Path, typer.Argument(help="A .hybrid bundle or an .onnx model.")],
    duration: Annotated[float, typer.Option("--duration", "-d", help="Seconds of timed plain runs (> 0).")] = 10.0,
    output: Annotated[Path, typer.Option("--output", "-o", help="Chrome trace to write (opens in Perfetto); "
                                         "its folder must exist.")] = Path("profile.json"),
    target: opt.Target = "auto",
    inputs: opt.Inputs = None,
    shapes: opt.Shapes = None,
    batch: Annotated[int, typer.Option("--batch", help="Size of symbolic dims in generated inputs.")] = 1,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs first.")] = 3,
    node_runs: Annotated[int, typer.Option("--node-runs", help="Runs with the backend's profiler on, for node "
                                           "spans (before the timed runs; 0: none).")] = 100,
    top: Annotated[int, typer.Option("--top", help="Operator types to list.")] = 10,
    device_fallback: opt.DeviceFallback = "error",
    as_json: opt.Json = False,
) -> None:
    """Profile MODEL: p50/p90/p99 latency, throughput, top operators, and a Chrome trace.

    Node spans come from --node-runs runs with the backend's profiler on; then --duration seconds of plain
    runs give the latency and throughput. The trace is bounded in size."""
    from hybrid.api import profile as run_profile  # loads a .hybrid bundle, then the runtime profiles it

    with report_errors(as_json):
        opt.apply_device_fallback(device_fallback)
        feeds = load_inputs(inputs)
        source = model
        if feeds is not None or shapes:
            import hybrid

            with progress(f"compiling {model.name} for {target}"):
                cm = hybrid.load(str(model), target=target) if model.suffix == ".hybrid" else \
                    hybrid.compile(str(model), target=target)
            feeds = {**generated_inputs(cm.model, shapes, batch), **(feeds or {})}
            source = cm
        with progress(f"profiling {model.name} for {duration:g} s"):
            report = run_profile(source, duration=duration, output=output, target=target, inputs=feeds,
                                 batch=batch, warmup=warmup, node_runs=node_runs, quiet=True)
    if as_json:
        typer.echo(json.dumps(asdict(report), indent=2))
        return
    console.print(report.summary(top), soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``profile`` to the pyasc app."""
    app.command("profile")(profile)
