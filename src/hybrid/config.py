"""Runtime configuration state, validation and size parsing (behind ``hybrid.init``).

The configuration is a small validated tree. Unknown keys are rejected with HYB-101 naming the key and
the valid ones; bad values with HYB-102; sizes such as ``'4GB'`` are parsed by :func:`parse_size`
(K/M/G/T are powers of 1024, as in PyTorch's and OpenVINO's size settings).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybrid.errors import ConfigError

__all__ = [
    "AutotuneSettings",
    "RuntimeConfig",
    "autotune_config",
    "expect_mapping",
    "get_config",
    "parse_size",
    "reset",
    "set_log_level",
    "update_backend_options",
    "validated_update",
]

logger = logging.getLogger("hybrid")

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

POOL_DEVICES = ("cpu", "pinned", "gpu", "npu")

class AutotuneSettings(BaseModel):
    """``hybrid.init({'autotune': {...}})``: how ``target='auto'`` decides (docs/auto.md).

    Attributes:
        tie_rel, tie_us: Timings this close to the fastest (relative, microseconds) tie; the tie goes to
            the answer closest to the reference.
        online: With nothing declared about a dynamic-shape model's inputs, tune on real calls per
            shape bucket (False: decide once on generated samples).
        calls_per_bucket: Real calls each candidate serves in a bucket before the bucket's decision.
        overhead_cap: Share of a busy core the background checks of online tuning may take (their process's
            nice level; in a thread, the share of wall time they run).
        rtol: Model-level relative tolerance of the fp32 parity check (ONNX's model tests use 1e-3).
        check_process: Run online tuning's checks in a separate low-priority process (False: in a thread).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    tie_rel: float = Field(0.02, ge=0.0, lt=1.0)
    tie_us: float = Field(20.0, ge=0.0, lt=1e6)
    online: bool = True
    calls_per_bucket: int = Field(8, ge=2, le=10_000)
    overhead_cap: float = Field(0.1, gt=0.0, le=1.0)
    rtol: float = Field(1e-3, ge=0.0, lt=1.0)
    check_process: bool = True


AUTOTUNE_KEYS = tuple(AutotuneSettings.model_fields)


def autotune_settings(values: Mapping[str, Any]) -> AutotuneSettings:
    """Validate an ``autotune`` section.

    Raises:
        ConfigError: HYB-101 for an unknown key, HYB-102 for a value of the wrong type or range.
    """
    _reject_unknown("autotune", values, list(AUTOTUNE_KEYS))
    try:
        return AutotuneSettings(**{k: float(v) if isinstance(v, int) and not isinstance(v, bool) and
                                   AutotuneSettings.model_fields[k].annotation is float else v
                                   for k, v in values.items()})
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        expected = err["msg"].removeprefix("Input should be ").removeprefix("input should be ")
        raise ConfigError("HYB-102", f"autotune.{key}: expected {expected}, got {err.get('input')!r}",
                          "e.g. hybrid.init({'autotune': {'tie_rel': 0.02, 'tie_us': 20, 'online': True}})") from None
FALLBACK_POLICIES = ("warn", "error")
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse_size(value: int | str, key: str = "size") -> int:
    """Parse a byte size: an int, or a string like ``'512MB'``, ``'4GB'``, ``'1.5GiB'``.

    Raises:
        ConfigError: HYB-103 when the value is not a size.
    """
    if isinstance(value, bool):
        raise ConfigError("HYB-103", f"{key}: expected a size like '4GB' or a byte count, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError("HYB-103", f"{key}: expected a non-negative size, got {value}")
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = (m.group(2) or "").lower().replace("i", "").rstrip("b")
            return int(float(m.group(1)) * _UNITS[unit])
    raise ConfigError("HYB-103", f"{key}: expected a size like '512MB' or '4GB', got {value!r}",
                      "use an int byte count or a number with K, M, G or T (powers of 1024)")


@dataclass(slots=True)
class RuntimeConfig:
    """The process-wide configuration set by :func:`init` and :func:`set_backend`."""

    device_fallback: str = "warn"
    memory_pool: dict[str, int] = field(default_factory=dict)
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_dir: str | None = None
    num_threads: int | None = None
    autotune: dict[str, Any] = field(default_factory=dict)  # validated by AutotuneSettings, as given


_LOCK = threading.Lock()
_CONFIG = RuntimeConfig()


def autotune_config() -> AutotuneSettings:
    """The live ``autotune`` settings with their defaults filled in."""
    return AutotuneSettings(**_CONFIG.autotune)


def get_config() -> RuntimeConfig:
    """Return the live process-wide configuration (read it, do not mutate it)."""
    return _CONFIG


def reset(config: RuntimeConfig | None = None) -> None:
    """Restore ``config`` (default: the default configuration); used by tests and failed inits."""
    global _CONFIG
    with _LOCK:
        _CONFIG = config if config is not None else RuntimeConfig()


def _reject_unknown(section: str, given: Mapping[str, Any], valid: tuple[str, ...] | list[str]) -> None:
    for key in given:
        if key not in valid:
            where = f"{section}.{key}" if section else str(key)
            raise ConfigError("HYB-101", f"unknown configuration key {where!r}; valid keys: "
                              f"{', '.join(sorted(valid))}", "check the spelling of the key")


def expect_mapping(key: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError("HYB-102", f"{key}: expected a mapping, got {type(value).__name__}")
    return value


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("HYB-102", f"{key}: expected a positive int, got {value!r}")
    return value


def validated_update(merged: Mapping[str, Any],
                     backend_validator: Any = None) -> RuntimeConfig:
    """Validate an ``init`` mapping and install the resulting configuration.

    Args:
        merged: The keys given to ``hybrid.init``.
        backend_validator: ``fn(name, options) -> dict`` that checks one backend's options (the HAL's,
            passed in by the caller so that this module imports nothing above it).

    Raises:
        ConfigError: HYB-101 for an unknown key, HYB-102 for a bad value, HYB-103 for a bad size.
    """
    valid = ("log_level", "device_fallback", "memory_pool", "backends", "cache_dir", "num_threads", "autotune")
    _reject_unknown("", merged, valid)
    global _CONFIG
    with _LOCK:
        new = RuntimeConfig(
            device_fallback=_CONFIG.device_fallback,
            memory_pool=dict(_CONFIG.memory_pool),
            backends={k: dict(v) for k, v in _CONFIG.backends.items()},
            cache_dir=_CONFIG.cache_dir,
            num_threads=_CONFIG.num_threads,
            autotune=dict(_CONFIG.autotune),
        )
        if "device_fallback" in merged:
            policy = merged["device_fallback"]
            if policy not in FALLBACK_POLICIES:
                raise ConfigError("HYB-102", f"device_fallback: expected one of {FALLBACK_POLICIES}, "
                                  f"got {policy!r}")
            new.device_fallback = policy
        if "memory_pool" in merged:
            pool = expect_mapping("memory_pool", merged["memory_pool"])
            _reject_unknown("memory_pool", pool, POOL_DEVICES)
            new.memory_pool = {k: parse_size(v, f"memory_pool.{k}") for k, v in pool.items()}
        if "backends" in merged:
            for name, opts in expect_mapping("backends", merged["backends"]).items():
                opts = dict(expect_mapping(f"backends.{name}", opts or {}))
                new.backends[name] = backend_validator(name, opts) if backend_validator else opts
        if "cache_dir" in merged:
            if not isinstance(merged["cache_dir"], str):
                raise ConfigError("HYB-102", f"cache_dir: expected a path string, got {merged['cache_dir']!r}")
            new.cache_dir = merged["cache_dir"]
        if "num_threads" in merged:
            new.num_threads = _positive_int("num_threads", merged["num_threads"])
        if "autotune" in merged:
            tune = {**new.autotune, **expect_mapping("autotune", merged["autotune"])}
            new.autotune = autotune_settings(tune).model_dump(include=set(tune))
        if "log_level" in merged:
            set_log_level(merged["log_level"])
        _CONFIG = new
    return new


def update_backend_options(name: str, options: Mapping[str, Any]) -> None:
    """Merge already validated options into one backend's defaults."""
    with _LOCK:
        _CONFIG.backends[name] = {**_CONFIG.backends.get(name, {}), **options}


def set_log_level(level: str | int) -> None:
    """Set the level of the ``hybrid`` logger ('DEBUG', 'INFO', ... or a logging int).

    Raises:
        ConfigError: HYB-104 for an unknown level.
    """
    if isinstance(level, str) and level.upper() in _LEVELS:
        value = getattr(logging, level.upper())
    elif isinstance(level, int) and not isinstance(level, bool):
        value = level
    else:
        raise ConfigError("HYB-104", f"log level: expected one of {', '.join(_LEVELS)} or an int, "
                          f"got {level!r}")
    logger.setLevel(value)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s hybrid: %(message)s"))
        logger.addHandler(handler)
