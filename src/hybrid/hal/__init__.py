"""The hardware abstraction layer: devices, the backend contract, the registry, target resolution.

Importing this package imports no backend library; backends are probed on first use.
"""

from hybrid.hal.backend import Backend, CacheStrategy, Executable, NodeSpan, Option, ProbedDevice
from hybrid.hal.device import Device
from hybrid.hal.registry import (
    BackendStatus,
    backend_class,
    backend_names,
    backend_status,
    get_backend,
    is_installed_backend,
    register_backend,
    reset_discovery,
)
from hybrid.hal.roles import accelerated_first, fallback_backend, is_fallback, split_fallback
from hybrid.hal.target import Candidate, apply_device_fallback, devices, resolve_device, resolve_target, statuses

__all__ = [
    "Backend",
    "BackendStatus",
    "CacheStrategy",
    "Candidate",
    "Device",
    "Executable",
    "NodeSpan",
    "Option",
    "ProbedDevice",
    "accelerated_first",
    "apply_device_fallback",
    "backend_class",
    "backend_names",
    "backend_status",
    "devices",
    "fallback_backend",
    "get_backend",
    "is_fallback",
    "is_installed_backend",
    "register_backend",
    "reset_discovery",
    "resolve_device",
    "resolve_target",
    "split_fallback",
    "statuses",
]
