"""The ``pyasc`` command: devices, run, demo, explain (and the command groups registered below)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from hybrid._version import __version__
from hybrid.cli import _options as opt
from hybrid.cli._console import (
    configure_logging,
    console,
    err_console,
    hide_flag_types,
    print_wide,
    progress,
    report_errors,
    settings,
    styled,
)
from hybrid.cli._inputs import load_compiled, load_inputs
from hybrid.errors import CATALOG
from hybrid.errors import explain as explain_code

app = typer.Typer(name="pyasc", help="PyASC: deploy a model once, run it on any accelerator.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"pyasc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True,
                                          help="Print the version and exit.")] = False,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, show_default=False,
                                         help="Log more: -v info, -vv debug (on stderr).")] = 0,
    log_level: Annotated[str | None, typer.Option("--log-level", envvar="HYBRID_LOG_LEVEL", show_envvar=True,
                                                  help="Log level of hybrid: debug, info, warning, error "
                                                       "(overrides -v).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars (they are off anyway when "
                                        "stderr is not a terminal).")] = False,
) -> None:
    """PyASC: deploy a model once, run it on any accelerator the machine has."""
    settings.quiet = quiet
    with report_errors():
        configure_logging(verbose, log_level)


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
    print_wide(table)
    btable = Table(title="backends")
    for col in ("backend", "available", "version", "devices / reason"):
        btable.add_column(col)
    for s in sts:
        btable.add_row(s.name, "yes" if s.available else "no", s.version,
                       ", ".join(d.name for d in s.devices) if s.available else s.reason)
    print_wide(btable)


def _stats(arr: np.ndarray) -> dict[str, float | None]:
    if arr.dtype.kind in "fiub" and arr.size:
        return {"min": float(arr.min()), "max": float(arr.max()), "mean": float(arr.astype(np.float64).mean())}
    return {"min": None, "max": None, "mean": None}


def _write_outputs(path: Path, outs: dict[str, Any]) -> None:
    """``-o``: ``.npy`` for a one-output model, ``.npz`` for any (one array per output name)."""
    import io

    from hybrid.errors import ConfigError
    from hybrid.ir import atomic_write_bytes

    buf = io.BytesIO()
    if path.suffix == ".npy":
        if len(outs) != 1:
            raise ConfigError("HYB-102", f"--output {path.name}: a .npy holds one array, the model has "
                              f"{len(outs)} outputs ({', '.join(outs)})", f"write {path.with_suffix('.npz')} "
                              "(one array per output name)")
        np.save(buf, np.asarray(next(iter(outs.values()))), allow_pickle=False)
    elif path.suffix == ".npz":
        np.savez(buf, **{k: np.asarray(v) for k, v in outs.items()})
    else:
        raise ConfigError("HYB-102", f"--output {str(path)!r}: expected a .npz (every output) or a .npy (a "
                          f"one-output model), got {path.suffix or 'no suffix'}", "e.g. -o outputs.npz")
    atomic_write_bytes(path, buf.getvalue())


@app.command()
def run(
    model: Annotated[Path, typer.Argument(help="An .onnx model or a .hybrid bundle (or a folder holding one).")],
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE.npy (repeatable). Inputs "
                                                     "not given are generated only with --random or --shapes; "
                                                     "else the command stops (HYB-401).")] = None,
    target: opt.Target = "auto",
    precision: Annotated[str | None, typer.Option("--precision", "-p", help="fp32, fp16, bf16 or auto (default "
                                                  "fp32; a bundle's own precision when MODEL is a .hybrid).")] = None,
    random: Annotated[bool, typer.Option("--random", help="Generate the inputs --input does not give (standard "
                                         "normal floats, as target='auto' and bench do); dynamic dims need "
                                         "--shapes.")] = False,
    shapes: Annotated[str | None, typer.Option("--shapes", help="Shapes to run (and for auto to measure at), "
                                               "trtexec's spelling: NAME:1x3x480x640[,NAME2:1x128]; implies "
                                               "--random for the inputs not given.")] = None,
    min_shapes: opt.MinShapes = None,
    opt_shapes: opt.OptShapes = None,
    max_shapes: opt.MaxShapes = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the outputs: .npz (one array per "
                                                "output) or .npy (a one-output model).")] = None,
    device_fallback: opt.DeviceFallback = "error",
    as_json: opt.Json = False,
) -> None:
    """Compile MODEL for TARGET, run it once, print the inputs' and outputs' shapes, dtypes and stats."""
    from hybrid.cli._inputs import bundle_shapes, declared_shapes, dims, load_model, model_path, resolve_inputs

    with report_errors(as_json):
        opt.apply_device_fallback(device_fallback)
        model = model_path(model)
        declared = declared_shapes(shapes, min_shapes, opt_shapes, max_shapes)
        if output is not None and output.suffix not in (".npz", ".npy"):
            _write_outputs(output, {})  # HYB-102 before anything runs
        source = load_model(model)
        given = load_inputs(inputs)
        feeds = resolve_inputs(source, given, declared or bundle_shapes(model, given),
                               generate=random or declared is not None, command=f"run {model}")
        with progress(f"compiling {model.name} for {target}"):
            cm = load_compiled(model, target, precision, feeds.compile_shapes, source)
        t0 = time.perf_counter()
        outs = cm.run(feeds.feeds)
        ms = (time.perf_counter() - t0) * 1e3
        if output is not None:
            _write_outputs(output, outs)
    rows = [{"name": name, "shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype), **_stats(np.asarray(v))}
            for name, v in outs.items()]
    ran = getattr(cm.executable, "precision", None) or precision or "fp32"
    if as_json:
        typer.echo(json.dumps({"model": str(model), "backend": cm.backend, "device": cm.device, "precision": ran,
                               "ms": ms, "inputs": [{"name": k, "shape": v, "dtype": str(feeds.feeds[k].dtype),
                                                     "source": feeds.sources[k]} for k, v in feeds.shapes.items()],
                               "outputs": rows, "written": None if output is None else str(output)}, indent=2))
        return
    table = Table(title=f"{model.name} on {cm.backend}:{cm.device} {ran} ({ms:.2f} ms)")
    for col in ("", "name", "shape", "dtype", "min", "max", "mean"):
        table.add_column(col)
    for k, v in feeds.feeds.items():
        arr = np.asarray(v)
        stats = ["-" if x is None else f"{x:.6g}" for x in _stats(arr).values()]
        table.add_row(f"input ({feeds.sources[k]})", k, dims(arr.shape), str(arr.dtype), *stats)
    for r in rows:
        stats = ["-" if r[k] is None else f"{r[k]:.6g}" for k in ("min", "max", "mean")]
        table.add_row("output", r["name"], dims(r["shape"]), r["dtype"], *stats)
    print_wide(table)
    if output is not None:
        console.print(f"wrote {output}")


@app.command()
def explain(code: Annotated[str, typer.Argument(help="An error code such as HYB-301.")]) -> None:
    """Print the long explanation of an error code."""
    try:
        console.print(explain_code(code))
    except KeyError:
        err_console.print(styled(f"unknown error code {code!r}", "red"), f"; known codes: {', '.join(sorted(CATALOG))}",
                          sep="", soft_wrap=True)
        raise typer.Exit(1) from None


def _register_command_groups() -> None:
    # each module adds its commands; heavy imports stay inside the commands themselves
    from hybrid.cli import bench, bundle, demo, profile, quantize, serve
    from hybrid.cli import compile as compile_cli

    for module in (demo, compile_cli, bundle, profile, bench, quantize, serve):
        module.register(app)


_register_command_groups()
hide_flag_types()


def main() -> None:
    """Entry point of the ``pyasc`` console script."""
    app()
