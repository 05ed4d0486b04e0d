"""What auto-selection decided, as frozen records: one backend for the whole graph, or a partition.

A decision is what the cache stores and what the online tuner installs per shape bucket; it is
turned back into an executable with the same options it was judged with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybrid.hal import Candidate
from hybrid.hal.layout import LAYOUT_MARK

__all__ = ["Decision", "PartitionDecision", "SingleDecision", "decision_from_json"]


@dataclass(frozen=True, slots=True)
class SingleDecision:
    """One backend and device runs the whole graph at ``precision``."""

    backend: str
    device: str
    precision: str = "fp32"
    layout: str = ""  # a layout's tag (hybrid.hal.layout), '' for the backend's default

    @property
    def candidate(self) -> Candidate:
        """The one candidate that runs the graph."""
        return Candidate(self.backend, self.device)

    @property
    def label(self) -> str:
        """``backend:device``, with the precision when it is not fp32 and the layout's tag when it is not the default.

        ``openvino:cpu bf16``, ``onnxruntime:cpu@2x1``.
        """
        return (f"{self.backend}:{self.device}" + ("" if self.precision == "fp32" else f" {self.precision}")
                + (f"{LAYOUT_MARK}{self.layout}" if self.layout else ""))

    def to_json(self) -> dict[str, Any]:
        """The decision as the decision cache stores it (``kind`` 'single')."""
        return {"kind": "single", "backend": self.backend, "device": self.device, "precision": self.precision,
                **({"layout": self.layout} if self.layout else {})}


@dataclass(frozen=True, slots=True)
class PartitionDecision:
    """Each node (in graph order) runs on the candidate named ``backend:device`` at that index."""

    assignment: tuple[str, ...]

    @property
    def label(self) -> str:
        """``partition(a + b)``: the candidates in the order the graph first uses them."""
        return "partition(" + " + ".join(dict.fromkeys(self.assignment)) + ")"

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        """Each node's candidate, in graph order."""
        return tuple(Candidate(*label.split(":", 1)) for label in self.assignment)

    def to_json(self) -> dict[str, Any]:
        """The decision as the decision cache stores it (``kind`` 'partition')."""
        return {"kind": "partition", "assignment": list(self.assignment)}


Decision = SingleDecision | PartitionDecision


def decision_from_json(data: Mapping[str, Any]) -> Decision:
    """The decision a cache record holds.

    Raises:
        KeyError, TypeError, ValueError: the record is not a decision (the caller searches again).
    """
    kind = data["kind"]
    if kind == "single":
        return SingleDecision(str(data["backend"]), str(data["device"]), str(data.get("precision", "fp32")),
                              str(data.get("layout", "")))
    if kind == "partition":
        assignment = tuple(str(a) for a in data["assignment"])
        if not all(":" in a for a in assignment):
            raise ValueError(f"partition assignment {assignment!r} has a label without a device")
        return PartitionDecision(assignment)
    raise ValueError(f"unknown decision kind {kind!r}")
