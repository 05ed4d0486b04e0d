"""The execution plan: which part of the graph runs on which backend and device, and why."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Placement", "Plan", "Segment"]


@dataclass(frozen=True, slots=True)
class Segment:
    """A contiguous subgraph that runs on one backend and device.

    Attributes:
        backend: Backend name.
        device: Device name.
        nodes: Names (or 'op_type#index' when unnamed) of the nodes it runs, in order.
        inputs: Values it reads from the graph inputs or from earlier segments.
        outputs: Values it produces for later segments or the graph outputs.
        reason: Why the partitioner put these nodes here.
        precision: The inference precision it runs at ('fp32', 'bf16', 'fp16').
    """

    backend: str
    device: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    reason: str = ""
    precision: str = "fp32"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one node runs and why (``pyasc compile --explain``).

    Attributes:
        node: The node's name, or 'op_type#index' when unnamed.
        op_type: The operator, 'domain.op_type' outside the ONNX domains.
        backend: Backend name.
        device: Device name.
        reason: Why it runs there (which backends lack it, or that it stays with its neighbours).
    """

    node: str
    op_type: str
    backend: str
    device: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """The partition of a model into segments, in execution order.

    Attributes:
        segments: The subgraphs in the order they run.
        notes: How the plan was chosen: timings, rejected candidates, the decision cache.
        placements: Per node, where it runs and why (filled when the graph was partitioned).
    """

    segments: tuple[Segment, ...]
    notes: tuple[str, ...] = ()
    placements: tuple[Placement, ...] = ()

    @property
    def backends(self) -> list[str]:
        """The distinct backend names of the segments, sorted."""
        return sorted({s.backend for s in self.segments})

    def __str__(self) -> str:
        lines = []
        for i, s in enumerate(self.segments):
            head = f"[{i}] {s.backend}:{s.device}"
            if s.precision != "fp32":
                head += f" {s.precision}"
            head += f"  {len(s.nodes)} node(s)"
            if s.reason:
                head += f"  ({s.reason})"
            lines.append(head)
            if len(self.segments) > 1:
                lines.append(f"    in:  {', '.join(s.inputs) or '-'}")
                lines.append(f"    out: {', '.join(s.outputs) or '-'}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def explain(self) -> str:
        """The plan followed by one line per node: where it runs and why."""
        lines = [str(self)]
        if self.placements:
            width = max(len(p.node) for p in self.placements)
            ops = max(len(p.op_type) for p in self.placements)
            lines.append("nodes:")
            lines.extend(f"  {p.node:<{width}}  {p.op_type:<{ops}}  {p.backend}:{p.device}  {p.reason}"
                         for p in self.placements)
        else:
            for s in self.segments:
                lines.append(f"all {len(s.nodes)} node(s) run on {s.backend}:{s.device}")
        return "\n".join(lines)
