"""``pyasc profile MODEL --duration 60 --output profile.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hybrid.cli._console import console, report_errors
from hybrid.cli._inputs import load_inputs

__all__ = ["register"]


def profile(
    model: Annotated[Path, typer.Argument(help="A .hybrid bundle or an .onnx model.")],
    duration: Annotated[float, typer.Option("--duration", "-d", help="Seconds of timed runs.")] = 10.0,
    output: Annotated[Path, typer.Option("--output", "-o", help="Chrome trace to write (opens in "
                                         "Perfetto).")] = Path("profile.json"),
    target: Annotated[str, typer.Option("--target", "-t", help="auto, cpu, onnxruntime, openvino:cpu...")] = "auto",
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE.npy (repeatable); "
                                                     "others are generated.")] = None,
    batch: Annotated[int, typer.Option("--batch", help="Size of symbolic dims in generated inputs.")] = 1,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs first.")] = 3,
    node_runs: Annotated[int, typer.Option("--node-runs", help="Timed runs that get node spans.")] = 100,
    top: Annotated[int, typer.Option("--top", help="Operator types to list.")] = 10,
) -> None:
    """Run MODEL for --duration seconds: write a trace with run, subgraph and node spans, print
    p50/p90/p99 latency, throughput and the top operators by time."""
    from hybrid.runtime.profiler import profile as run_profile
    from hybrid.runtime.profiler import sample_inputs

    with report_errors():
        feeds = load_inputs(inputs)
        if feeds is not None:
            import hybrid

            cm = hybrid.load(str(model), target=target) if model.suffix == ".hybrid" else \
                hybrid.compile(str(model), target=target)
            feeds = {**sample_inputs(cm.signature, batch), **feeds}
            source = cm
        else:
            source = model
        report = run_profile(source, duration=duration, output=output, target=target, inputs=feeds, batch=batch,
                             warmup=warmup, node_runs=node_runs, quiet=True)
    console.print(report.summary(top), highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``profile`` to the pyasc app."""
    app.command("profile")(profile)
