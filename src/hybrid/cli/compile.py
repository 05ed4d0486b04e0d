"""``pyasc compile MODEL``: compile for a target and show the plan (``--explain``: why; ``--per-node``: each node)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from hybrid.cli import _options as opt
from hybrid.cli._console import console, print_wide, progress, report_errors
from hybrid.errors import ConfigError

__all__ = ["compile_command", "plan_doc", "register"]


def _op(node: Any) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def plan_doc(cm: Any, per_node: bool = False) -> dict[str, Any]:
    """The plan of a compiled model as JSON-ready data.

    ``per_node``: a row per node even when one backend runs the whole graph.
    """
    plan = cm.plan
    segments = [{"backend": s.backend, "device": s.device, "precision": s.precision, "nodes": len(s.nodes),
                 "inputs": list(s.inputs), "outputs": list(s.outputs), "reason": s.reason} for s in plan.segments]
    ran = getattr(cm.executable, "precision", None)
    if ran and len(segments) == 1:
        segments[0]["precision_run"] = ran
    doc: dict[str, Any] = {"model": cm.model.name, "backend": cm.backend, "device": cm.device,
                           "segments": segments, "notes": list(plan.notes), "split": len(plan.segments) > 1}
    if plan.placements:
        doc["placements"] = [{"node": p.node, "op": p.op_type, "backend": p.backend, "device": p.device,
                              "reason": p.reason} for p in plan.placements]
    elif per_node and plan.segments:
        seg = plan.segments[0]
        doc["placements"] = [{"node": name, "op": _op(node), "backend": seg.backend, "device": seg.device,
                              "reason": seg.reason} for name, node in zip(seg.nodes, cm.model.graph)]
    return doc


def compile_command(
    model: Annotated[Path, typer.Argument(help="An .onnx file (or a folder holding one).")],
    target: opt.Target = "auto",
    precision: Annotated[str, typer.Option("--precision", "-p", help="fp32, fp16, bf16 or auto.")] = "fp32",
    explain: Annotated[bool, typer.Option("--explain", help="Say where the graph runs and why: one line when one "
                                          "backend runs it all, a row per node where it is split.")] = False,
    per_node: Annotated[bool, typer.Option("--per-node", help="--explain with a row per node even when one "
                                           "backend runs the whole graph.")] = False,
    min_cosine: Annotated[float | None, typer.Option("--min-cosine",
                                                     help="Accuracy budget for --precision auto.")] = None,
    autotune: Annotated[bool | None, typer.Option("--autotune/--no-autotune",
                                                  help="Time the candidates (default: for 'auto').")] = None,
    shapes: opt.DeclaredShapes = None,
    min_shapes: opt.MinShapes = None,
    opt_shapes: opt.OptShapes = None,
    max_shapes: opt.MaxShapes = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Save the compiled model as a .hybrid "
                                                "bundle (the choice made here, with this machine's compiled "
                                                "cache; cm.save).")] = None,
    device_fallback: opt.DeviceFallback = "error",
    as_json: opt.Json = False,
) -> None:
    """Compile MODEL for a target and print the plan: segments, backends, and how they were chosen."""
    import hybrid
    from hybrid.cli._inputs import check_declared, declared_shapes, load_model, model_path, shapes_text

    with report_errors(as_json):
        opt.apply_device_fallback(device_fallback)
        if output is not None and output.suffix != ".hybrid":
            raise ConfigError("HYB-102", f"--output {str(output)!r}: compile writes a .hybrid bundle, got "
                              f"{output.suffix or 'no suffix'}", f"e.g. -o {output.with_suffix('.hybrid').name}")
        if min_cosine is not None and not 0 < min_cosine <= 1:
            raise ConfigError("HYB-102", f"--min-cosine: expected a cosine in (0, 1], got {min_cosine:g}",
                              "e.g. --min-cosine 0.995")
        accuracy = {"min_cosine": min_cosine} if min_cosine is not None else None
        declared = declared_shapes(shapes, min_shapes, opt_shapes, max_shapes)
        model = model_path(model)
        source = load_model(model)
        if declared:
            check_declared(source.signature, declared)
        with progress(f"compiling {model.name} for {target} ({precision})"):
            cm = hybrid.compile(source, target=target, precision=precision, autotune=autotune, accuracy=accuracy,
                                shapes=declared)
        if output is not None:
            from hybrid.bundle import save_bundle

            with progress(f"writing {output.name}"):
                save_bundle(cm, output, shapes=declared)  # cm.save, declaring the shapes it was compiled for
    explain = explain or per_node
    doc = plan_doc(cm, per_node=per_node)
    if declared:
        doc["shapes"] = {k: {r: list(x) for r, x in v.items()} if isinstance(v, dict) else list(v)
                         for k, v in declared.items()}
    if output is not None:
        doc["written"] = str(output)
    tuner = getattr(cm.executable, "policy", None)
    if tuner is not None:  # target='auto' decides on real calls: say how, and where each bucket stands
        doc["tuning_policy"] = dataclasses.asdict(tuner)
        doc["tuning"] = [t.as_dict() for t in cm.tuning]
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    table = Table(title=f"{cm.model.name}: {cm.backend} on {cm.device}")
    for col in ("#", "backend:device", "precision", "nodes", "inputs", "outputs", "why"):
        table.add_column(col, overflow="fold")
    for i, s in enumerate(doc["segments"]):
        prec = s["precision"] if s.get("precision_run", s["precision"]) == s["precision"] else \
            f"{s['precision_run']} (asked {s['precision']})"
        table.add_row(str(i), f"{s['backend']}:{s['device']}", prec, str(s["nodes"]),
                      ", ".join(s["inputs"]) or "-", ", ".join(s["outputs"]) or "-", s["reason"])
    print_wide(table)
    if declared:
        console.print(f"shapes: {shapes_text(declared)}", soft_wrap=True)
    if output is not None:
        console.print(f"wrote {output} (load it with hybrid.load or pyasc run/serve)", soft_wrap=True)
    for note in doc["notes"]:
        console.print(f"note: {note}", soft_wrap=True)
    if not explain:
        return
    if "tuning_policy" in doc:
        pol = doc["tuning_policy"]
        console.print(f"online tuning: each shape bucket is decided on real calls within {pol['decide_within_s']:g} s "
                      f"of its first call (or {pol['decide_within_calls']} calls of a slow model), the turns adding "
                      f"at most {pol['max_tax']:.0%} to the mean latency; cm.tune(samples) or pyasc serve --warmup "
                      "decides before the first request", soft_wrap=True)
        for t in doc["tuning"]:
            cands = ", ".join(f"{c['label']} {c['outcome']}" + (f" {c['ratio']:.3g}x" if c["ratio"] else "")
                              for c in t["candidates"])
            console.print(f"bucket {t['bucket']}: {t['state']} ({t['phase']}), serving {t['serving']}; {cands}",
                          soft_wrap=True)
    if "placements" not in doc:
        seg = doc["segments"][0]
        console.print(f"all {seg['nodes']} nodes run on {seg['backend']}:{seg['device']} ({seg['reason']}); "
                      "--per-node lists them", soft_wrap=True)
        return
    nodes = Table(title="where each node runs")
    for col in ("node", "op", "backend:device", "why"):
        nodes.add_column(col, overflow="fold")
    for p in doc["placements"]:
        nodes.add_row(p["node"], p["op"], f"{p['backend']}:{p['device']}", p["reason"])
    print_wide(nodes)


def register(app: typer.Typer) -> None:
    """Add the ``compile`` command to the ``pyasc`` app."""
    app.command("compile")(compile_command)
