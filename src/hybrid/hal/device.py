"""Devices as hybrid names them: 'cpu', 'cuda:0', 'gpu:0', 'npu:0'."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEVICE_KINDS", "Device", "parse_device"]

DEVICE_KINDS = ("cpu", "cuda", "gpu", "npu", "mps")


@dataclass(frozen=True, slots=True)
class Device:
    """A device present on this machine and the backends that can use it.

    Attributes:
        name: Canonical name: 'cpu', 'cuda:0', 'gpu:0' (a non-CUDA GPU), 'npu:0', 'mps'.
        kind: 'cpu', 'cuda', 'gpu', 'npu' or 'mps'. CUDA devices are also GPUs for target 'gpu'.
        index: Index among devices of that kind (0 for the CPU).
        backends: Names of the available backends that can run on it, in priority order.
        properties: What the backends report (model name, memory, provider names...).
    """

    name: str
    kind: str
    index: int = 0
    backends: tuple[str, ...] = ()
    properties: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_gpu(self) -> bool:
        """Whether the device is a GPU ('cuda' or 'gpu')."""
        return self.kind in ("cuda", "gpu")

    def __str__(self) -> str:
        return self.name


def parse_device(text: str) -> tuple[str, int | None] | None:
    """Split a device name into (kind, index); index None when not given. None if not a device."""
    kind, _, index = text.strip().lower().partition(":")
    if kind not in DEVICE_KINDS:
        return None
    if not index:
        return kind, None
    if not index.isdigit():
        return None
    return kind, int(index)
