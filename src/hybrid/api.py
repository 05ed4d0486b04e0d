"""Entry points of the facade that use more than one layer: init, set_backend, devices, profile."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybrid import config as _config
from hybrid.hal import backend_class
from hybrid.hal import devices as _devices
from hybrid.hal.device import Device

if TYPE_CHECKING:  # the profiler (numpy) is imported on the first hybrid.profile, not with hybrid.init
    from hybrid.runtime.profiler import ProfileReport

__all__ = ["devices", "init", "profile", "set_backend"]

_ZIP_MAGIC = b"PK\x03\x04"  # a .hybrid bundle is a zip archive; an ONNX model never starts so


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


def _is_bundle(source: Any) -> bool:
    if not isinstance(source, (str, os.PathLike)) or not Path(source).is_file():
        return False
    with open(source, "rb") as f:
        return f.read(4) == _ZIP_MAGIC


def profile(model_or_path: Any, duration: float = 10.0, output: str | os.PathLike | None = "profile.json", *,
            target: str = "auto", inputs: Mapping[str, Any] | None = None, batch: int = 1, warmup: int = 3,
            node_runs: int = 100, quiet: bool = False) -> ProfileReport:
    """Run a model repeatedly for ``duration`` seconds; write a Chrome trace and return the statistics.

    ``hybrid.profile``: a ``.hybrid`` bundle is loaded here (``hybrid.load(path, target=target)``), the rest
    goes to :func:`hybrid.runtime.profiler.profile` as given, which documents the arguments.

    Args:
        model_or_path: A CompiledModel, a .hybrid bundle, or a model (path, bytes, proto, hybrid.Model).
        duration: Seconds of timed plain runs.
        output: Trace file (Chrome trace JSON); None writes none.
        target: Target for models and bundles ('auto' by default).
        inputs: Feeds (generated from the signature when not given).
        batch: Size of symbolic dimensions in generated inputs, and the items per inference.
        warmup: Untimed runs first.
        node_runs: How many runs get node spans.
        quiet: Do not print the summary.

    Raises:
        ConfigError: HYB-102 for a bad argument (checked before a bundle is loaded).
        HybridError: whatever loading, compiling or running the model raises.
    """
    from hybrid.runtime import profiler

    profiler.check_arguments(duration, batch, warmup, node_runs, output)
    source = model_or_path
    if _is_bundle(model_or_path):
        from hybrid.bundle import load

        source = load(model_or_path, target=target)
    return profiler.profile(source, duration, output, target=target, inputs=inputs, batch=batch, warmup=warmup,
                            node_runs=node_runs, quiet=quiet)
