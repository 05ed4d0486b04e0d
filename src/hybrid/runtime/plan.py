"""The execution plan: which part of the graph runs on which backend and device, and why."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Plan", "Segment"]


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
    """

    backend: str
    device: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """The partition of a model into segments, in execution order."""

    segments: tuple[Segment, ...]
    notes: tuple[str, ...] = ()

    @property
    def backends(self) -> list[str]:
        return sorted({s.backend for s in self.segments})

    def __str__(self) -> str:
        lines = []
        for i, s in enumerate(self.segments):
            head = f"[{i}] {s.backend}:{s.device}  {len(s.nodes)} node(s)"
            if s.reason:
                head += f"  ({s.reason})"
            lines.append(head)
            if len(self.segments) > 1:
                lines.append(f"    in:  {', '.join(s.inputs) or '-'}")
                lines.append(f"    out: {', '.join(s.outputs) or '-'}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)
