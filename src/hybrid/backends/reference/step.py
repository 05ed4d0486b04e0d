"""``Step``: one node of a compiled reference program, ready to run.

Its own module so that the interpreter (which builds steps) and the kernel-level fusions (which merge
them) both import it, and neither imports the other for its type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybrid.backends.reference import registry

__all__ = ["Step"]


@dataclass(slots=True)
class Step:
    """One node ready to run: its callable, input and output slots, and slots dead after it."""

    run: Callable[..., tuple]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    free: tuple[int, ...]
    label: str
    op_type: str
    kernel: str
    consts: tuple[Any, ...] = ()
    ctx: registry.NodeContext | None = None
