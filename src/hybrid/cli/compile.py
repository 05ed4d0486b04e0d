"""``pyasc compile MODEL``: compile for a target and show the plan (``--explain``: node by node)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from hybrid.cli._console import console, report_errors

__all__ = ["compile_command", "register"]


def compile_command(
    model: Annotated[str, typer.Argument(help="An .onnx file.")],
    target: Annotated[str, typer.Option("--target", "-t", help="'auto', a device, a backend or 'backend:device'.")]
    = "auto",
    precision: Annotated[str, typer.Option("--precision", "-p", help="fp32, fp16, bf16 or auto.")] = "fp32",
    explain: Annotated[bool, typer.Option("--explain", help="Show where every node runs and why.")] = False,
    min_cosine: Annotated[float | None, typer.Option("--min-cosine",
                                                     help="Accuracy budget for --precision auto.")] = None,
    autotune: Annotated[bool | None, typer.Option("--autotune/--no-autotune",
                                                  help="Time the candidates (default: for 'auto').")] = None,
) -> None:
    """Compile MODEL for a target and print the plan: segments, backends, and how they were chosen."""
    import hybrid

    with report_errors():
        accuracy = {"min_cosine": min_cosine} if min_cosine is not None else None
        cm = hybrid.compile(model, target=target, precision=precision, autotune=autotune, accuracy=accuracy)
    plan = cm.plan
    table = Table(title=f"{cm.model.name}: {cm.backend} on {cm.device}")
    for col in ("#", "backend:device", "precision", "nodes", "inputs", "outputs", "why"):
        table.add_column(col, overflow="fold")
    for i, s in enumerate(plan.segments):
        table.add_row(str(i), f"{s.backend}:{s.device}", s.precision, str(len(s.nodes)),
                      ", ".join(s.inputs) or "-", ", ".join(s.outputs) or "-", s.reason)
    console.print(table)
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    if not explain:
        return
    nodes = Table(title="where each node runs")
    for col in ("node", "op", "backend:device", "why"):
        nodes.add_column(col, overflow="fold")
    if plan.placements:
        for p in plan.placements:
            nodes.add_row(p.node, p.op_type, f"{p.backend}:{p.device}", p.reason)
    else:
        segment = plan.segments[0]
        why = f"the whole graph runs on one backend ({segment.reason})"
        for name, node in zip(segment.nodes, cm.model.graph):
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            nodes.add_row(name, op, f"{segment.backend}:{segment.device}", why)
    console.print(nodes)


def register(app: typer.Typer) -> None:
    """Add the ``compile`` command to the ``pyasc`` app."""
    app.command("compile")(compile_command)
