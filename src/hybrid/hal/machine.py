"""Facts about this machine that caches depend on: where hybrid's cache folder is, which CPU this is.

Both the autotune decision cache and the bundle's compiled caches key their entries by the CPU (model
name and instruction-set flags) and keep them under one cache folder; this module is the single
answer to both questions.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from pathlib import Path

from hybrid.config import get_config

__all__ = ["cache_root", "cpu_facts", "usable_cores"]


def cache_root() -> Path:
    """Hybrid's cache folder.

    $HYBRID_CACHE_DIR, else ``hybrid.init(cache_dir=...)``, else the user cache folder ($XDG_CACHE_HOME/hybrid,
    ~/Library/Caches/hybrid, %LOCALAPPDATA%/hybrid/Cache).
    """
    chosen = os.environ.get("HYBRID_CACHE_DIR") or get_config().cache_dir
    if chosen:
        return Path(chosen)
    system = platform.system()
    if system == "Windows":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "hybrid" / "Cache"
    if system == "Darwin":
        return Path.home() / "Library" / "Caches" / "hybrid"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hybrid"


@functools.lru_cache(maxsize=1)
def cpu_facts() -> tuple[str, str]:
    """The CPU model name and a digest of its feature flags (x86 'flags', ARM 'Features'.

    Empty when the system does not say).
    """
    model = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware", "cpu model") and value.strip():
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16] if flags else ""
    return model, digest


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
