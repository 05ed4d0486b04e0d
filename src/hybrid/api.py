"""Process-wide entry points of the facade: init, set_backend, devices."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybrid import config as _config
from hybrid.hal import backend_class
from hybrid.hal import devices as _devices
from hybrid.hal.device import Device

__all__ = ["devices", "init", "set_backend"]


def _validate_backend(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    return backend_class(name).validate_options(options)


def init(config: Mapping[str, Any] | None = None, **kwargs: Any) -> _config.RuntimeConfig:
    """Configure hybrid for this process.

    Keys: ``log_level``, ``device_fallback`` ('warn' | 'error'), ``memory_pool`` (sizes per device:
    ``cpu``, ``pinned``, ``gpu``, ``npu``, e.g. ``'2GB'``), ``backends`` (options per backend, as for
    :func:`set_backend`), ``cache_dir``, ``num_threads``, ``autotune`` (``tie_rel``, ``tie_us``: how close
    to the fastest a candidate of ``target='auto'`` must be to tie; ties go to the answer closest to the
    reference; docs/auto.md). Keys not given keep their value.

    Raises:
        ConfigError: HYB-101 for an unknown key, HYB-102 for a bad value, HYB-103 for a bad size.
        BackendError: HYB-301/306 for an unknown backend or backend option.
    """
    merged = dict(_config.expect_mapping("config", config or {}))
    merged.update(kwargs)
    previous = _config.get_config()
    new = _config.validated_update(merged, _validate_backend)
    if "memory_pool" in merged:
        from hybrid.hal import memory

        try:
            memory.configure_pools(new.memory_pool)
        except BaseException:
            _config.reset(previous)  # a pool that could not be made must not stay in the config
            raise
    return new


def set_backend(name: str, config: Mapping[str, Any] | None = None) -> None:
    """Set the default options of one backend, e.g. ``set_backend('tensorrt', {'fp16_mode': True})``.

    Options are checked against what the backend declares; its library is not imported.

    Raises:
        BackendError: HYB-301 for an unknown backend, HYB-306 for an unknown option or a bad value.
    """
    opts = _validate_backend(name, _config.expect_mapping(f"backends.{name}", config or {}))
    _config.update_backend_options(name, opts)


def devices() -> list[Device]:
    """Every device on this machine with the backends that can use it (probes backends once)."""
    return _devices()
