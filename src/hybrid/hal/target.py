"""Device discovery across backends, and target strings resolved to (backend, device) candidates.

A target is 'auto', a device ('cpu', 'gpu', 'cuda', 'cuda:1', 'npu:0'), a backend ('onnxruntime'),
or 'backend:device' ('onnxruntime:cuda'). Resolution returns candidates in priority order: GPUs and
NPUs before the CPU for 'auto', and backends by their priority on each device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hybrid.config import get_config
from hybrid.errors import BackendError
from hybrid.hal.backend import ProbedDevice
from hybrid.hal.device import Device, parse_device
from hybrid.hal.registry import BackendStatus, backend_names, backend_status

__all__ = ["Candidate", "apply_device_fallback", "devices", "resolve_device", "resolve_target", "statuses"]

logger = logging.getLogger("hybrid")

_KIND_ORDER = {"cuda": 0, "gpu": 1, "npu": 2, "mps": 3, "cpu": 9}


@dataclass(frozen=True, slots=True)
class Candidate:
    """One (backend, device) pair a model can be compiled for."""

    backend: str
    device: str

    def __str__(self) -> str:
        return f"{self.backend}:{self.device}"


def statuses() -> list[BackendStatus]:
    """Probe every registered backend (cached) and return their statuses."""
    return [backend_status(n) for n in backend_names()]


def _device_order(d: Device | ProbedDevice) -> tuple[int, int]:
    return _KIND_ORDER.get(d.kind, 5), d.index


def devices() -> list[Device]:
    """Every device present on this machine, with the available backends that use it."""
    found: dict[str, dict] = {}
    for st in sorted((s for s in statuses() if s.available), key=lambda s: s.priority):
        for d in st.devices:
            entry = found.setdefault(d.name, {"kind": d.kind, "index": d.index, "backends": [], "props": {}})
            entry["backends"].append(st.name)
            entry["props"].update({f"{st.name}.{k}": v for k, v in d.properties})
            if d.native:
                entry["props"][f"{st.name}.device"] = d.native
    out = [Device(name, e["kind"], e["index"], tuple(e["backends"]), e["props"]) for name, e in found.items()]
    return sorted(out, key=_device_order)


def _available_targets(devs: list[Device]) -> str:
    names = ["auto"] + [d.name for d in devs] + sorted({b for d in devs for b in d.backends})
    return ", ".join(names)


def _match(dev: Device | ProbedDevice, kind: str, index: int | None) -> bool:
    kinds = ("cuda", "gpu") if kind == "gpu" else (kind,)
    return dev.kind in kinds and (index is None or dev.index == index)


def apply_device_fallback(absent: str, why: str = "is not present", *, present: str | None = None,
                          warned: set[str] | None = None) -> None:
    """The ``device_fallback`` policy for a device that cannot be used (the one home of it).

    Raise under 'error'; under 'warn', log that the work falls back to the cpu (once per device when ``warned`` is
    given).

    Args:
        absent: What was asked for, as the message names it ("device 'cuda:1'", "StreamContext: device 'npu'").
        why: Why it cannot be used.
        present: The devices present, for the message (None: not listed).
        warned: Devices already warned about; the warning is logged once per device when given.

    Raises:
        BackendError: HYB-307 under ``device_fallback='error'``.
    """
    listed = "" if present is None else f" (present: {present or 'none'})"
    if get_config().device_fallback == "error":
        raise BackendError("HYB-307", f"{absent} {why}{listed} and device_fallback is 'error'",
                           "use a present device or hybrid.init({'device_fallback': 'warn'})")
    if warned is not None:
        if absent in warned:
            return
        warned.add(absent)
    logger.warning("%s %s%s; falling back to cpu", absent, why, listed)


def _fallback(requested: str, devs: list[Device]) -> list[Device]:
    apply_device_fallback(f"device {requested!r}", present=", ".join(d.name for d in devs))
    return [d for d in devs if d.kind == "cpu"]


def resolve_device(device: str | None, what: str) -> str:
    """The present device that ``device`` names, after the ``device_fallback`` policy ('cpu' for None).

    Raises:
        BackendError: HYB-301 for a string that is not a device name, HYB-307 for an absent device
            under ``device_fallback='error'``.
    """
    if device is None:
        return "cpu"
    parsed = parse_device(device) if isinstance(device, str) else None
    if parsed is None:
        raise BackendError("HYB-301", f"{what}: expected a device such as 'cpu', 'cuda:0', 'gpu' or 'npu', got "
                           f"{device!r}", "use a device name from hybrid.devices()")
    kind, index = parsed
    if kind == "cpu":  # always present; spares probing every backend
        return "cpu"
    present = devices()
    for dev in present:
        if _match(dev, kind, index):
            return dev.name
    apply_device_fallback(f"{what}: device {device!r}", present=", ".join(d.name for d in present))
    return "cpu"


def resolve_target(target: str) -> list[Candidate]:
    """Resolve a target string to (backend, device) candidates in priority order.

    Raises:
        BackendError: HYB-301 (unknown target), HYB-302 (backend unavailable), HYB-303 (device not
            usable by that backend), HYB-307 (device absent under device_fallback='error').
    """
    if not isinstance(target, str) or not target.strip():
        raise BackendError("HYB-301", f"expected a target string such as 'auto' or 'cpu', got {target!r}")
    text = target.strip().lower()
    backend_part, _, device_part = text.partition(":")
    if backend_part in backend_names():
        return _pinned(target, backend_part, device_part)
    devs = devices()
    if text == "auto":
        return [Candidate(b, d.name) for d in devs for b in d.backends]
    parsed = parse_device(text)
    if parsed is None:
        raise BackendError("HYB-301", f"unknown target {target!r}; available targets: "
                           f"{_available_targets(devs)}",
                           "a target is 'auto', a device, a backend, or 'backend:device'")
    chosen = [d for d in devs if _match(d, *parsed)]
    if not chosen:
        chosen = _fallback(text, devs)
    if parsed[1] is None and chosen:
        chosen = [d for d in chosen if d.index == chosen[0].index and d.kind == chosen[0].kind]
    return [Candidate(b, d.name) for d in chosen for b in d.backends]


def _pinned(target: str, backend: str, device_part: str) -> list[Candidate]:
    """The candidates of a target that names a backend, probing only that backend.

    Pinning a backend must not import the others' libraries (torch, OpenVINO: hundreds of MB of memory, issue
    55); every backend is probed only when the device named is not the pinned backend's, to tell a device
    absent from the machine (the fallback policy) from one this backend cannot use (HYB-303).
    """
    st = backend_status(backend)
    if not st.available:
        from hybrid.hal.registry import get_backend

        get_backend(backend)  # raises HYB-302 with the reason and install hint
    own = sorted(st.devices, key=_device_order)
    if device_part:
        parsed = parse_device(device_part)
        if parsed is None:
            raise BackendError("HYB-301", f"target {target!r}: {device_part!r} is not a device name; "
                               f"{backend} has: {', '.join(d.name for d in own)}")
        chosen = [d.name for d in own if _match(d, *parsed)]
        if not chosen:
            devs = devices()
            if not any(_match(d, *parsed) for d in devs):  # absent from the machine: fallback policy
                chosen = [d.name for d in _fallback(device_part, devs) if backend in d.backends]
            if not chosen:
                raise BackendError("HYB-303", f"backend {backend!r} cannot use device "
                                   f"{device_part!r}; it has: {', '.join(d.name for d in own)}",
                                   "pick one of those devices or another backend")
        return [Candidate(backend, name) for name in chosen]
    return [Candidate(backend, d.name) for d in own]
