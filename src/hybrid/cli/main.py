"""The ``pyasc`` command: devices, run, demo, explain (and the command groups registered below)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

from hybrid._version import __version__
from hybrid.cli._console import console, progress_iter, report_errors
from hybrid.cli._inputs import load_inputs
from hybrid.errors import CATALOG
from hybrid.errors import explain as explain_code

app = typer.Typer(name="pyasc", help="PyASC: deploy a model once, run it on any accelerator.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"pyasc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """PyASC: deploy a model once, run it on any accelerator the machine has."""


@app.command()
def devices(as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
            ) -> None:
    """List devices, the backends that use them, their versions, and why any backend is unavailable."""
    from hybrid.hal import devices as list_devices
    from hybrid.hal import statuses

    sts = statuses()
    devs = list_devices()
    if as_json:
        doc = {
            "devices": [{"name": d.name, "kind": d.kind, "index": d.index, "backends": list(d.backends),
                         "properties": {k: str(v) for k, v in d.properties.items()}} for d in devs],
            "backends": [{"name": s.name, "available": s.available, "version": s.version,
                          "devices": [d.name for d in s.devices], "reason": s.reason} for s in sts],
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    table = Table(title="devices")
    for col in ("device", "kind", "backends", "details"):
        table.add_column(col)
    for d in devs:
        details = ", ".join(f"{k}={v}" for k, v in d.properties.items() if k.endswith(("full_name", "providers")))
        table.add_row(d.name, d.kind, ", ".join(d.backends), details)
    console.print(table)
    btable = Table(title="backends")
    for col in ("backend", "available", "version", "devices / reason"):
        btable.add_column(col)
    for s in sts:
        btable.add_row(s.name, "yes" if s.available else "no", s.version,
                       ", ".join(d.name for d in s.devices) if s.available else s.reason)
    console.print(btable)


def _load_compiled(model: Path, target: str):
    import hybrid

    if model.suffix == ".hybrid":
        return hybrid.load(str(model), target=target)
    return hybrid.compile(str(model), target=target)


@app.command()
def run(
    model: Annotated[Path, typer.Argument(help="An .onnx model or a .hybrid bundle.")],
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE.npy (repeatable).")] = None,
    target: Annotated[str, typer.Option("--target", "-t", help="auto, cpu, onnxruntime, openvino:cpu...")] = "auto",
    random: Annotated[bool, typer.Option("--random", help="Generate inputs missing from --input.")] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write outputs to this .npz.")] = None,
) -> None:
    """Compile MODEL for TARGET, run it once, print the outputs' names, shapes, dtypes and stats."""
    with report_errors():
        cm = _load_compiled(model, target)
        feeds = load_inputs(inputs) or {}
        if random:
            from hybrid.runtime.profiler import sample_inputs

            feeds = {**sample_inputs(cm.signature), **feeds}
        t0 = time.perf_counter()
        outs = cm.run(feeds)
        ms = (time.perf_counter() - t0) * 1e3
    table = Table(title=f"{model.name} on {cm.backend}:{cm.device} ({ms:.2f} ms)")
    for col in ("output", "shape", "dtype", "min", "max", "mean"):
        table.add_column(col)
    for name, value in outs.items():
        arr = np.asarray(value)
        if arr.dtype.kind in "fiub" and arr.size:
            stats = [f"{arr.min():.6g}", f"{arr.max():.6g}", f"{arr.astype(np.float64).mean():.6g}"]
        else:
            stats = ["-", "-", "-"]
        table.add_row(name, str(arr.shape), str(arr.dtype), *stats)
    console.print(table)
    if output is not None:
        import io

        from hybrid.ir import atomic_write_bytes

        buf = io.BytesIO()
        np.savez(buf, **{k: np.asarray(v) for k, v in outs.items()})
        atomic_write_bytes(output, buf.getvalue())
        console.print(f"wrote {output}")


@app.command()
def demo(
    model: Annotated[str, typer.Option("--model", "-m", help="Light model from the onnx package.")] = "resnet50",
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per target.")] = 10,
) -> None:
    """Compile a sample model shipped with the onnx package on every available backend and compare.

    Prints latency (median of --runs) and the max error against the output shipped with the model.
    """
    import hybrid
    from hybrid.hal import resolve_target
    from hybrid.samples import LIGHT_RTOL, light_expected, light_input, light_model_path

    with report_errors():
        path = light_model_path(model)
        expected = light_expected(model)
        x = light_input()
        rtol = LIGHT_RTOL.get(model, 1e-3)
        targets = ["auto", *[str(c) for c in resolve_target("auto")]]
        table = Table(title=f"light {model} (batch 1, from the onnx package)")
        for col in ("target", "ran on", "compile s", "median ms", "max error", "ok"):
            table.add_column(col, no_wrap=True)
        notes = []
        for target in progress_iter(targets, "compiling and timing", total=len(targets)):
            try:
                t0 = time.perf_counter()
                cm = hybrid.compile(str(path), target=target)
                compile_s = time.perf_counter() - t0
                y = cm(x)
                times = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    cm(x)
                    times.append(time.perf_counter() - t0)
            except hybrid.HybridError as e:
                table.add_row(target, "-", "-", "-", "-", f"[red]{e.code}[/]")
                notes.append(f"{target}: [{e.code}] {e.message}")
                continue
            err = float(np.abs(np.asarray(y, np.float64) - expected).max())
            ok = bool(np.allclose(y, expected, rtol=rtol, atol=1e-7))
            table.add_row(target, f"{cm.backend}:{cm.device}", f"{compile_s:.2f}",
                          f"{statistics.median(times) * 1e3:.2f}", f"{err:.3g}", "yes" if ok else "[red]no[/]")
    console.print(table)
    for note in notes:
        console.print(note, highlight=False, soft_wrap=True)


@app.command()
def explain(code: Annotated[str, typer.Argument(help="An error code such as HYB-301.")]) -> None:
    """Print the long explanation of an error code."""
    try:
        console.print(explain_code(code), highlight=False)
    except KeyError:
        console.print(f"[red]unknown error code {code!r}[/]; known codes: {', '.join(sorted(CATALOG))}")
        raise typer.Exit(1) from None


def _register_command_groups() -> None:
    # each module adds its commands; heavy imports stay inside the commands themselves
    from hybrid.cli import bench, bundle, profile, serve
    from hybrid.cli import compile as compile_cli

    for module in (compile_cli, bundle, profile, bench, serve):
        module.register(app)


_register_command_groups()


def main() -> None:
    """Entry point of the ``pyasc`` console script."""
    app()
