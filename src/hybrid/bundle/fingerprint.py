"""The device fingerprint: what a compiled cache depends on, hashed into a short folder name.

A backend's compiled artifact (ONNX Runtime's optimized model with its NCHWc layout for this CPU's
vector width, OpenVINO's blob, a TensorRT engine) is only valid on the same kind of machine with the
same library version. The fingerprint says which: OS and architecture, C library, CPU model and
instruction-set flags, the backend's name and version, and the device it compiled for. A cache is used
only when its fingerprint equals this machine's; otherwise the model is rebuilt from the IR.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass, field
from typing import Any

from hybrid.errors import HybridError
from hybrid.hal import backend_status
from hybrid.hal.machine import cpu_facts

__all__ = ["CACHE_FORMAT", "Fingerprint", "device_fingerprint"]

CACHE_FORMAT = 1  # bump when the way hybrid writes or post-processes caches changes


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A device fingerprint: ``digest`` names the cache folder, ``info`` says what went into it."""

    digest: str
    info: dict[str, Any] = field(compare=False, hash=False)

    def __str__(self) -> str:
        return self.digest


def device_fingerprint(backend: str, device: str = "cpu") -> Fingerprint:
    """The fingerprint of (this machine, ``backend``, ``device``).

    Probes only ``backend`` (for its version and the device's properties); an unknown or unavailable
    backend gets an empty version, so its fingerprint matches no cache built where it was available.
    """
    cpu_model, cpu_flags = cpu_facts()
    version = ""
    props: dict[str, str] = {}
    try:
        status = backend_status(backend)
        version = status.version
        for d in status.devices:
            if d.name == device:
                props = {k: str(v) for k, v in d.properties}
    except HybridError:
        pass
    info = {
        "cache_format": CACHE_FORMAT,
        "os": platform.system().lower(),
        "arch": platform.machine().lower(),
        "libc": "-".join(x for x in platform.libc_ver() if x),
        "cpu": cpu_model,
        "cpu_flags": cpu_flags,
        "backend": backend,
        "backend_version": version,
        "device": device,
        "device_properties": props,
    }
    digest = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]
    return Fingerprint(digest, info)
