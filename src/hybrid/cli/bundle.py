"""``pyasc bundle create|inspect|verify|install-libs`` and ``pyasc platforms``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from hybrid.cli import _options as opt
from hybrid.cli import _serving_options as so
from hybrid.cli import _vision_options as vo
from hybrid.cli._console import console, err_console, print_wide, progress, report_errors, styled
from hybrid.errors import HybridError

__all__ = ["register"]

bundle_app = typer.Typer(name="bundle", help="Create, inspect, verify .hybrid bundles and install their wheels.",
                         no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

_PlatformsFile = Annotated[Path | None, typer.Option("--platforms-file", help="TOML file with user-defined "
                                                     "platform profiles (also $HYBRID_PLATFORMS).")]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@bundle_app.command("create")
def create(
    model: Annotated[Path, typer.Argument(help="The model: an .onnx file (or a folder holding one).")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Bundle to write (default: "
                                                "MODEL's name with .hybrid, in the current folder).")] = None,
    platform: Annotated[str, typer.Option("--platform", "-P", help="Platform profile (`pyasc platforms`); "
                                          "auto: this machine.")] = "auto",
    platforms_file: _PlatformsFile = None,
    target: Annotated[str | None, typer.Option("--target", "-t", help="Compile for this target instead of the "
                                               "profile's first present one; auto measures the candidates here "
                                               "(at --shapes) and bundles the choice.")] = None,
    shapes: opt.DeclaredShapes = None,
    min_shapes: opt.MinShapes = None,
    opt_shapes: opt.OptShapes = None,
    max_shapes: opt.MaxShapes = None,
    precision: Annotated[str | None, typer.Option("--precision", "-p", help="fp32, fp16 or bf16 (default: the "
                                                  "profile's).")] = None,
    optimize_level: Annotated[str | None, typer.Option("--optimize-level", "-O", help="O0..O3 graph "
                                                       "optimization before bundling.")] = None,
    layout: Annotated[str | None, typer.Option("--layout", help="nhwc: make the model's image inputs "
                                               "channels-last under the same names (with -O O3); by default "
                                               "they stay as the model has them, whatever the profile "
                                               "prefers.")] = None,
    include_libs: Annotated[bool, typer.Option("--include-libs", help="Vendor the wheels the target needs "
                                               "(fetched with pip for its platform and Python).")] = False,
    python_version: Annotated[str | None, typer.Option("--python-version", help="Python X.Y the "
                                                       "--include-libs wheels are for (default: the platform's "
                                                       "when hybrid runs on it, else this one).")] = None,
    requirement: Annotated[list[str] | None, typer.Option("--requirement", "-r", help="Package to vendor "
                                                          "instead of the profile's (repeatable).")] = None,
    wheel: Annotated[list[Path] | None, typer.Option("--wheel", help="Local wheel to vendor (repeatable).")] = None,
    no_hybrid_wheel: Annotated[bool, typer.Option("--no-hybrid-wheel", help="Do not vendor hybrid itself.")] = False,
    calibration: Annotated[Path | None, typer.Option("--calibration", help="Calibration samples (.npz).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Ship the IR only, no compiled cache.")] = False,
    name: Annotated[str | None, typer.Option("--name", help="Bundle name (default: the model's).")] = None,
    task: Annotated[str | None, typer.Option("--task", help="Task label; detection or classification also "
                                             "declare pre/postprocessing (options below).")] = None,
    fmt: vo.Format = None, classes: vo.Classes = None, conf_threshold: vo.ConfThreshold = None,
    iou_threshold: vo.IouThreshold = None, max_det: vo.MaxDet = None, agnostic: vo.Agnostic = False,
    resize: vo.Resize = None, input_size: vo.InputSize = None, color: vo.Color = None, scale: vo.Scale = None,
    mean: vo.Mean = None, std: vo.Std = None, task_option: vo.TaskOption = None,
    max_batch: so.MaxBatch = None, batch_timeout: so.BatchTimeout = None, max_queue: so.MaxQueue = None,
    request_timeout: so.RequestTimeout = None, concurrency: so.Concurrency = None,
) -> None:
    """Package MODEL for a platform as a .hybrid bundle.

    The IR, a compiled cache when this machine can run the platform, optional calibration data, vendored
    wheels and the dynamic batching `pyasc serve` applies.
    """
    from hybrid.bundle import create_bundle
    from hybrid.cli._inputs import check_declared, declared_shapes, load_model, model_path, resolve_inputs

    with report_errors():
        model = model_path(model)
        out = output or Path(model.stem + ".hybrid")
        task_options = vo.task_options(fmt, classes, conf_threshold, iou_threshold, max_det, agnostic, resize,
                                       input_size, color, scale, mean, std, task_option)
        declared = declared_shapes(shapes, min_shapes, opt_shapes, max_shapes)
        if declared or (target or "").strip().lower() == "auto":
            source = load_model(model)
            if declared:
                check_declared(source.signature, declared)
            if (target or "").strip().lower() == "auto":
                # auto measures: a dynamic input needs the sizes users run (HYB-417), never made-up ones
                declared = resolve_inputs(source, None, declared, command=f"bundle create {model} -t auto",
                                          alternative="").compile_shapes or declared
        with progress(f"bundling {model.name}" + (" (fetching wheels)" if include_libs else "")):
            manifest = create_bundle(
                model, out, platform=platform, target=target, precision=precision, optimize_level=optimize_level,
                caches=not no_cache, calibration=calibration, include_libs=include_libs, python_version=python_version,
                requirements=requirement or None, wheels=wheel or (), include_hybrid=not no_hybrid_wheel, name=name,
                task=task, platforms_file=platforms_file, task_options=task_options,
                serving=so.serving_settings(max_batch, batch_timeout, max_queue, request_timeout, concurrency,
                                            zero_means_off=False) or None, shapes=declared, layout=layout)
    console.print(Text.assemble(f"wrote {out} ({_size(out.stat().st_size)}) for platform ",
                                (manifest.platform.name, "bold")), soft_wrap=True)
    if declared:
        from hybrid.cli._inputs import shapes_text

        console.print(f"  shapes: {shapes_text(declared)}", soft_wrap=True)
    if manifest.compile is not None:
        console.print(f"  compiled for {manifest.compile.backend}:{manifest.compile.device} "
                      f"{manifest.compile.precision}", soft_wrap=True)
    if manifest.caches:
        for c in manifest.caches:
            console.print(f"  compiled cache: {c.backend}:{c.device} {c.precision}, fingerprint {c.fingerprint}")
    else:
        console.print("  no compiled cache: the target compiles the IR on first load")
    if manifest.model.layout:
        console.print(f"  interface layout: {manifest.model.layout} (asked for)", soft_wrap=True)
    if manifest.libs:
        console.print(f"  {len(manifest.libs.wheels)} wheels for {manifest.libs.pip_platforms[0]}, Python "
                      f"{manifest.libs.python_version}; they give {', '.join(manifest.libs.targets) or 'no target'}",
                      soft_wrap=True)
    for warning in manifest.warnings:
        console.print(styled("  warning: ", "yellow"), warning, sep="", soft_wrap=True)


def _kv_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    for k, v in rows:
        table.add_row(k, v if isinstance(v, str) else json.dumps(v))
    return table


@bundle_app.command("inspect")
def inspect(
    bundle: Annotated[Path, typer.Argument(help="The .hybrid bundle.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a bundle's manifest: signature, platform, compile choice, caches, wheels, member sizes."""
    from hybrid.bundle import inspect_bundle
    from hybrid.cli._inputs import shapes_text

    with report_errors(as_json):
        doc = inspect_bundle(bundle)
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    p = doc["platform"]
    console.print(_kv_table(f"{doc['file']} ({_size(doc['file_size'])})", [
        ("name", doc["name"]), ("task", doc["task"] or "-"), ("format", str(doc["format_version"])),
        *([("preprocess", doc["preprocess"]), ("postprocess", doc["postprocess"])] if doc["postprocess"] else []),
        ("created", f"{doc['created_at']} by {doc['created_by']}"),
        ("inputs", ", ".join(doc["signature"]["inputs"])), ("outputs", ", ".join(doc["signature"]["outputs"])),
        ("shapes run", shapes_text(doc["shapes"]) if doc["shapes"] else "-"),
        ("model", f"{doc['model']['path']} opset {doc['model']['opset']} sha256 {doc['model']['sha256'][:16]}..."
                  + (f" (+ {', '.join(doc['model']['external_data'])})" if doc["model"]["external_data"] else "")),
        ("optimize", f"{doc['model']['optimize_level'] or '-'}" + (" applied" if doc["model"]["optimized"] else "")),
        *([("interface layout", f"{doc['model']['layout']} (converted on request)")] if doc["model"]["layout"]
          else []),
        ("platform", f"{p['name']} ({p['os']}/{p['arch']}): {p['description']}"),
        ("targets", ", ".join(p["targets"])), ("profile precision / layout", f"{p['precision']} / {p['layout']}"),
        ("backend options", p["backend_options"] or "-"), ("compile options", p["compile_options"] or "-"),
        ("compiled with", "-" if doc["compile"] is None else
         f"{doc['compile']['backend']}:{doc['compile']['device']} {doc['compile']['precision']} "
         f"{json.dumps(doc['compile']['options'])}"),
        ("calibration", "-" if doc["calibration"] is None else ", ".join(doc["calibration"]["arrays"])),
        ("serving", doc["serving"] or "server defaults"),
        *[("warning", w) for w in doc["warnings"]],
    ]))
    if doc["caches"]:
        table = Table(title="compiled caches")
        for col in ("fingerprint", "backend", "precision", "kind", "size", "this machine", "built on"):
            table.add_column(col)
        for c in doc["caches"]:
            info = c["built_on"]
            table.add_row(c["fingerprint"], f"{c['backend']}:{c['device']}", c["precision"], c["kind"],
                          _size(c["bytes"]), styled("matches", "green") if c["matches_this_machine"] else "no",
                          f"{info.get('cpu', '?')}, {c['backend']} {info.get('backend_version', '?')}")
        print_wide(table)
    if doc["libs"]:
        table = Table(title=f"vendored wheels for {doc['libs']['platform']} (Python {doc['libs']['python_version']}; "
                      f"they give {', '.join(doc['libs']['targets']) or 'no target'})")
        for col in ("name", "version", "size", "sha256"):
            table.add_column(col)
        for w in doc["libs"]["wheels"]:
            table.add_row(w["name"], w["version"], _size(w["size"]), w["sha256"][:16] + "...")
        print_wide(table)
    table = Table(title=f"members ({_size(doc['total_bytes'])} uncompressed)")
    for col in ("member", "size", "stored"):
        table.add_column(col)
    for mem in doc["members"]:
        table.add_row(mem["name"], _size(mem["size"]), _size(mem["compressed"]))
    print_wide(table)


@bundle_app.command("verify")
def verify(
    bundle: Annotated[Path, typer.Argument(help="The .hybrid bundle.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Run every safety and integrity check; exit 0 when the bundle passes, 1 when it does not."""
    from hybrid.bundle import verify_bundle

    try:
        report = verify_bundle(bundle)
    except HybridError as e:
        if as_json:
            typer.echo(json.dumps({"ok": False, "code": e.code, "message": e.message, "hint": e.hint}))
            raise typer.Exit(1) from None
        err_console.print(styled("FAILED", "bold red"), f" {bundle}: [{e.code}] {e.message}", sep="", soft_wrap=True)
        if e.hint:
            err_console.print(f"  hint: {e.hint}", soft_wrap=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(report))
        return
    console.print(styled("OK", "bold green"), f" {bundle}: {report['members']} members, {_size(report['bytes'])}",
                  sep="", soft_wrap=True)
    for check in report["checks"]:
        console.print(f"  passed: {check}")


@bundle_app.command("install-libs")
def install_libs(
    bundle: Annotated[Path, typer.Argument(help="The .hybrid bundle.")],
    dest: Annotated[Path | None, typer.Option("--dest", help="Install into this folder (pip's --target) "
                                              "instead of the interpreter's site-packages.")] = None,
    old_target: Annotated[Path | None, typer.Option("--target", hidden=True, help="Deprecated: --dest.")] = None,
    python: Annotated[str | None, typer.Option("--python", help="Interpreter to install into.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what pip would install.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Skip the platform and Python check.")] = False,
) -> None:
    """Install the bundle's vendored wheels offline (pip --no-index, every hash checked)."""
    from hybrid.bundle import install_libs as _install

    if old_target is not None:
        err_console.print("warning: bundle install-libs --target is deprecated (in pyasc --target is where a "
                          "model runs); use --dest", soft_wrap=True)
    with report_errors():
        report = _install(bundle, target=dest or old_target, python=python, dry_run=dry_run, force=force)
    verb = "would install" if dry_run else "installed"
    console.print(f"{verb} {len(report.wheels)} wheels from {bundle}"
                  + (f" into {report.target}" if report.target else ""))
    if dry_run and report.pip_output.strip():
        console.print(report.pip_output.strip())


def platforms(
    platforms_file: _PlatformsFile = None,
    show: Annotated[str | None, typer.Option("--show", help="Print one profile in full.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the platform profiles: built-in and user-defined (TOML)."""
    from hybrid.bundle.platforms import BUILTIN_PLATFORMS, detect_platform, get_platform, list_platforms

    with report_errors(as_json):
        if show:
            profile = get_platform(show, platforms_file)
            typer.echo(json.dumps(profile.model_dump(mode="json"), indent=2))
            return
        profiles = list_platforms(platforms_file)
        here = detect_platform().name
    if as_json:
        typer.echo(json.dumps({n: p.model_dump(mode="json") for n, p in profiles.items()}, indent=2))
        return
    table = Table(title="platform profiles")
    for col in ("platform", "os/arch", "targets (priority)", "precision", "layout", "description"):
        table.add_column(col, overflow="fold")
    for name, p in profiles.items():
        label = Text(name)
        if name == here:
            label.append(" (this machine)", style="green")
        if not (name in BUILTIN_PLATFORMS and BUILTIN_PLATFORMS[name] == p):
            label.append(" (user)", style="cyan")
        table.add_row(label, f"{p.os}/{p.arch}", ", ".join(p.targets), p.precision, p.layout, p.description)
    print_wide(table)


def register(app: typer.Typer) -> None:
    """Add ``bundle`` (create, inspect, verify, install-libs) and ``platforms`` to the pyasc app."""
    app.add_typer(bundle_app, name="bundle")
    app.command("platforms")(platforms)
