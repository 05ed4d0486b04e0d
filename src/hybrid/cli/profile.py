"""``pyasc profile MODEL --duration 60 --output profile.json``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from hybrid.cli import _options as opt
from hybrid.cli._console import console, progress, report_errors
from hybrid.cli._inputs import load_inputs

__all__ = ["register"]


def _task_shapes(cm: Any, given: dict[str, Any] | None, batch: int | None) -> dict[str, tuple[int, ...]] | None:
    """A task bundle's image input at its declared size (``bundle create --input-size``), unless given as a file."""
    from hybrid.runtime.profiler import task_input_shapes

    found = {k: v for k, v in (task_input_shapes(cm, batch or 1) or {}).items() if k not in (given or {})}
    return found or None


def profile(
    model: Annotated[Path, typer.Argument(help="A .hybrid bundle or an .onnx model (or a folder holding one).")],
    duration: Annotated[float, typer.Option("--duration", "-d", help="Seconds of timed plain runs (> 0).")] = 10.0,
    output: Annotated[Path, typer.Option("--output", "-o", help="Chrome trace to write (opens in Perfetto); "
                                         "its folder must exist.")] = Path("profile.json"),
    target: opt.Target = "auto",
    precision: Annotated[str | None, typer.Option("--precision", "-p", help="fp32, fp16, bf16 or auto (default "
                                                  "fp32; a bundle's own precision for a .hybrid).")] = None,
    inputs: opt.Inputs = None,
    shapes: opt.Shapes = None,
    min_shapes: opt.MinShapes = None,
    opt_shapes: opt.OptShapes = None,
    max_shapes: opt.MaxShapes = None,
    batch: opt.Batch = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs first.")] = 3,
    node_runs: Annotated[int, typer.Option("--node-runs", help="Runs with the backend's profiler on, for node "
                                           "spans (before the timed runs; 0: none).")] = 100,
    top: Annotated[int, typer.Option("--top", help="Operator types to list.")] = 10,
    device_fallback: opt.DeviceFallback = "error",
    as_json: opt.Json = False,
) -> None:
    """Profile MODEL: p50/p90/p99 latency, throughput, top operators, and a Chrome trace.

    Node spans come from --node-runs runs with the backend's profiler on; then --duration seconds of plain
    runs give the latency and throughput. The trace is bounded in size. A dynamic input needs --shapes or
    --input (HYB-417), unless a bundle declares its shapes or a task bundle its input size: no size is made
    up; the shapes run are printed. Under --target auto, the profiled shape is decided first and every
    figure is of the candidate serving it.
    """
    from hybrid.cli._inputs import bundle_shapes, declared_shapes, load_compiled, load_model, model_path, resolve_inputs
    from hybrid.runtime.profiler import check_arguments
    from hybrid.runtime.profiler import profile as run_profile

    with report_errors(as_json):
        opt.apply_device_fallback(device_fallback)
        check_arguments(duration, batch or 1, warmup, node_runs, output)
        declared = declared_shapes(shapes, min_shapes, opt_shapes, max_shapes)
        model = model_path(model)
        source = load_model(model)
        given = load_inputs(inputs)
        cm = None
        if model.suffix == ".hybrid":  # a bundle loads as it is, whatever the shapes run (and says its own)
            with progress(f"loading {model.name} for {target}"):
                cm = load_compiled(model, target, precision, None, source)
            declared = declared or bundle_shapes(model, given) or _task_shapes(cm, given, batch)
        feeds = resolve_inputs(source, given, declared, batch=batch, command=f"profile {model}", has_batch=True)
        if cm is None:
            with progress(f"compiling {model.name} for {target}"):
                cm = load_compiled(model, target, precision, feeds.compile_shapes, source)
        first = next(iter(feeds.feeds.values()), None)
        items = int(first.shape[0]) if first is not None and first.ndim else 1
        with progress(f"profiling {model.name} for {duration:g} s"):
            report = run_profile(cm, duration=duration, output=output, target=target, inputs=feeds.feeds,
                                 batch=items, warmup=warmup, node_runs=node_runs, quiet=True)
    if as_json:
        typer.echo(json.dumps({**asdict(report), "inputs": feeds.shapes, "input_sources": feeds.sources},
                              indent=2))
        return
    console.print(f"inputs: {feeds.describe()}", soft_wrap=True)
    console.print(report.summary(top), soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``profile`` to the pyasc app."""
    app.command("profile")(profile)
