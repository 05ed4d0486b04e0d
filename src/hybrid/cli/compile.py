"""``pyasc compile MODEL``: compile for a target and show the plan (``--explain``: why; ``--per-node``: each node)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from hybrid.cli import _options as opt
from hybrid.cli._console import console, progress, report_errors

__all__ = ["compile_command", "plan_doc", "register"]


def _op(node: Any) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def plan_doc(cm: Any, per_node: bool = False) -> dict[str, Any]:
    """The plan of a compiled model as JSON-ready data (``per_node``: a row per node even when one backend
    runs the whole graph)."""
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


def _declared_shapes(shapes: str | None, min_s: str | None, opt_s: str | None,
                     max_s: str | None) -> dict[str, Any] | None:
    """``--shapes`` and trtexec's ``--minShapes/--optShapes/--maxShapes`` as ``compile(shapes=...)``."""
    from hybrid.runtime.auto import parse_shapes

    out: dict[str, Any] = dict(parse_shapes(shapes)) if shapes else {}
    for key, text in (("min", min_s), ("opt", opt_s), ("max", max_s)):
        for name, dims in (parse_shapes(text) if text else {}).items():
            current = out.get(name)
            rng = current if isinstance(current, dict) else ({"opt": current} if current else {})
            out[name] = {**rng, key: dims}
    return out or None


def compile_command(
    model: Annotated[str, typer.Argument(help="An .onnx file.")],
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
    shapes: Annotated[str | None, typer.Option("--shapes", help="The shapes users run, where auto checks and "
                                               "times: NAME:1x3x480x640[,NAME2:1x128] (trtexec's spelling).")] = None,
    min_shapes: Annotated[str | None, typer.Option("--min-shapes", help="Smallest shapes of a range.")] = None,
    opt_shapes: Annotated[str | None, typer.Option("--opt-shapes", help="Typical shapes of a range (timed).")] = None,
    max_shapes: Annotated[str | None, typer.Option("--max-shapes", help="Largest shapes of a range.")] = None,
    device_fallback: opt.DeviceFallback = "error",
    as_json: opt.Json = False,
) -> None:
    """Compile MODEL for a target and print the plan: segments, backends, and how they were chosen."""
    import hybrid

    with report_errors(as_json):
        opt.apply_device_fallback(device_fallback)
        accuracy = {"min_cosine": min_cosine} if min_cosine is not None else None
        declared = _declared_shapes(shapes, min_shapes, opt_shapes, max_shapes)
        with progress(f"compiling {model} for {target} ({precision})"):
            cm = hybrid.compile(model, target=target, precision=precision, autotune=autotune, accuracy=accuracy,
                                shapes=declared)
    explain = explain or per_node
    doc = plan_doc(cm, per_node=per_node)
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
    console.print(table)
    for note in doc["notes"]:
        console.print(f"note: {note}", soft_wrap=True)
    if not explain:
        return
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
    console.print(nodes)


def register(app: typer.Typer) -> None:
    """Add the ``compile`` command to the ``pyasc`` app."""
    app.command("compile")(compile_command)
