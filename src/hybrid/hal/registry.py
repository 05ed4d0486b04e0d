"""The backend registry: built-ins by module path, third parties by entry point, probed lazily.

Nothing here imports a backend library until a backend is probed. Discovery never raises: a backend
whose library is missing or broken is recorded as unavailable with the reason, which
``hybrid.devices()`` and ``pyasc devices`` show.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
from dataclasses import dataclass
from importlib import metadata

from hybrid.errors import BackendError, first_line
from hybrid.hal.backend import Backend, ProbedDevice

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendStatus",
    "backend_class",
    "backend_names",
    "backend_status",
    "get_backend",
    "is_installed_backend",
    "register_backend",
    "reset_discovery",
]

logger = logging.getLogger("hybrid")

ENTRY_POINT_GROUP = "hybrid.backends"

_BUILTINS: dict[str, str] = {
    "reference": "hybrid.backends.reference:ReferenceBackend",
    "onnxruntime": "hybrid.backends.onnxruntime:OnnxRuntimeBackend",
    "openvino": "hybrid.backends.openvino:OpenVINOBackend",
    "torch": "hybrid.backends.torch:TorchBackend",
    "tensorrt": "hybrid.backends.tensorrt:TensorRTBackend",
}


@dataclass(frozen=True, slots=True)
class BackendStatus:
    """What discovery found about one backend."""

    name: str
    available: bool
    version: str = ""
    devices: tuple[ProbedDevice, ...] = ()
    reason: str = ""
    priority: int = 100


_LOCK = threading.RLock()
_paths: dict[str, str] = dict(_BUILTINS)
_classes: dict[str, type[Backend]] = {}
_instances: dict[str, Backend] = {}
_status: dict[str, BackendStatus] = {}
_entry_points_loaded = False
_registered_here: set[str] = set()  # registered with register_backend in this process (not installed)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception as e:
        logger.warning("could not read entry points %r: %s", ENTRY_POINT_GROUP, e)
        return
    for ep in eps:
        _paths.setdefault(ep.name, ep.value)


def register_backend(backend: type[Backend] | str, name: str | None = None) -> None:
    """Register a backend class (or ``'module:Class'`` path) under ``name`` (default: its ``name``).

    Third-party packages usually register through the ``hybrid.backends`` entry-point group instead.
    """
    with _LOCK:
        if isinstance(backend, str):
            if name is None:
                raise ValueError("register_backend('module:Class') needs a name")
            _paths[name] = backend
            _classes.pop(name, None)
        else:
            key = name or backend.name
            _classes[key] = backend
            _paths[key] = f"{backend.__module__}:{backend.__qualname__}"
        _instances.pop(name or getattr(backend, "name", ""), None)
        _status.pop(name or getattr(backend, "name", ""), None)
        _registered_here.add(name or getattr(backend, "name", ""))


def is_installed_backend(name: str) -> bool:
    """Whether another Python process would find backend ``name`` too.

    A built-in or one installed through the ``hybrid.backends`` entry points, not one registered at run time with
    :func:`register_backend`.
    """
    with _LOCK:
        _load_entry_points()
        return name in _paths and name not in _registered_here


def backend_names() -> list[str]:
    """Every registered backend name, available or not."""
    with _LOCK:
        _load_entry_points()
        return list(_paths)


def backend_class(name: str) -> type[Backend]:
    """Import and return the class of backend ``name`` (its library is not imported).

    Raises:
        BackendError: HYB-301 when no backend has that name.
    """
    with _LOCK:
        _load_entry_points()
        if name in _classes:
            return _classes[name]
        path = _paths.get(name)
        if path is None:
            raise BackendError("HYB-301", f"unknown backend {name!r}; known backends: "
                               f"{', '.join(sorted(_paths))}", "pick one of the known backends")
        module, _, attr = path.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except Exception as e:
            raise BackendError("HYB-302", f"backend {name!r} could not be imported from {path!r}: {e}",
                               "reinstall the package that provides it") from e
        _classes[name] = cls
        return cls


def get_backend(name: str) -> Backend:
    """Return the backend instance, probing it once.

    Raises:
        BackendError: HYB-301 for an unknown name, HYB-302 when it is unavailable (with the reason).
    """
    status = backend_status(name)
    if not status.available:
        cls_hint = ""
        with contextlib.suppress(BackendError):
            cls_hint = backend_class(name).install_hint
        raise BackendError("HYB-302", f"backend {name!r} is not available: {status.reason}",
                           cls_hint or "run `pyasc devices` to see what is available")
    return _instances[name]


def backend_status(name: str) -> BackendStatus:
    """Probe backend ``name`` once (cached) and return what was found.

    Never raises for a broken library, only for an unknown name (HYB-301).
    """
    with _LOCK:
        if name in _status:
            return _status[name]
        try:
            cls = backend_class(name)
        except BackendError as e:
            if e.code == "HYB-301":
                raise
            status = BackendStatus(name, False, reason=e.message)
            _status[name] = status
            return status
        try:
            inst = cls()
            devices = tuple(inst.probe())
            version = inst.version()
            if not devices:
                status = BackendStatus(name, False, version, reason="no usable device found",
                                       priority=cls.priority)
            else:
                _instances[name] = inst
                status = BackendStatus(name, True, version, devices, priority=cls.priority)
        except Exception as e:
            reason = f"{type(e).__name__}: {first_line(e)}"
            status = BackendStatus(name, False, reason=reason, priority=cls.priority)
        _status[name] = status
        logger.debug("backend %s: %s", name, status)
        return status


def reset_discovery() -> None:
    """Forget probe results (tests, or after installing a library in a running process)."""
    with _LOCK:
        _instances.clear()
        _status.clear()
