"""The decision cache of ``compile(target='auto')``: JSON records keyed by what a decision depends on.

Decisions are cached as JSON files, written atomically, keyed by the sha256 of what the decision
depends on (:func:`decision_key`): model hash, input shapes (or shape bucket), target and
candidates, precision and accuracy budget, backend options and versions, and the device
fingerprint. A record that does not match its key exactly (another version, a hash collision, a
half-written file) is ignored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hybrid.config import get_config
from hybrid.hal import devices
from hybrid.hal.machine import cache_root, cpu_facts, usable_cores
from hybrid.ir import atomic_write_bytes

__all__ = ["cache_dir", "decision_key", "device_fingerprint", "load_decision", "save_decision"]

logger = logging.getLogger("hybrid")

CACHE_SCHEMA = 2  # 2: typed decisions (hybrid.runtime.auto.decision), shape buckets


def cache_dir() -> Path:
    """Where decisions live (under :func:`hybrid.hal.machine.cache_root`, in ``autotune/``)."""
    return cache_root()


def device_fingerprint() -> dict[str, Any]:
    """What makes timings of this machine comparable.

    CPU model and features, usable cores, thread setting, and every device the backends see.
    """
    cpu, flags = cpu_facts()
    cores = usable_cores()
    return {
        "machine": platform.machine(), "system": platform.system(), "cpu": cpu, "cpu_flags": flags,
        "cores": cores, "num_threads": get_config().num_threads,
        "devices": [[d.name, d.kind, sorted(str(p) for p in d.properties.items())] for d in devices()],
    }


def decision_key(material: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The cache key (sha256 of the canonical JSON) and the JSON-safe material it was made from."""
    safe = json.loads(json.dumps({"schema": CACHE_SCHEMA, **material}, sort_keys=True, default=str))
    digest = hashlib.sha256(json.dumps(safe, sort_keys=True).encode()).hexdigest()
    return digest, safe


def _path(key: str) -> Path:
    return cache_dir() / "autotune" / f"{key[:40]}.json"


def load_decision(key: str, material: Mapping[str, Any]) -> dict[str, Any] | None:
    """The cached record for ``key`` (with its ``path``).

    None when it is missing, unreadable, or made from other material.
    """
    path = _path(key)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != material or "decision" not in record:
        logger.debug("ignoring stale or foreign autotune record %s", path)
        return None
    record["path"] = str(path)
    return record


def save_decision(key: str, material: Mapping[str, Any], decision: Mapping[str, Any],
                  notes: list[str]) -> Path | None:
    """Write the decision atomically (temp file + rename); a read-only cache only logs."""
    path = _path(key)
    record = {"key": material, "decision": dict(decision), "notes": notes, "created": time.time()}
    try:
        atomic_write_bytes(path, json.dumps(record, indent=1, sort_keys=True, default=str).encode())
    except OSError as e:
        logger.warning("could not write the autotune cache %s: %s", path, e)
        return None
    return path
