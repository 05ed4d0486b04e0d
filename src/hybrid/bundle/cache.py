"""Compiled caches: capture a backend's compiled artifact, and rebuild a CompiledModel from it.

Two kinds, chosen by the backend (``Backend.cache_strategy``; by default from the options it declares):

- ``optimized-model``: the backend writes its optimized graph to a file (ONNX Runtime's
  ``optimized_model_path``); loading it with graph optimizations disabled skips the optimizer. The graph
  is an ONNX model and is checked like one (no external data, inputs the original model has).
- ``directory``: the backend writes its own cache folder (OpenVINO ``cache_dir`` blobs, TensorRT engine
  caches through ``engine_cache_path``); restoring writes the files back and points the option at them.
  The backend validates its blob and recompiles when it rejects it (``Executable.loaded_from_cache``).

A cache that fails to restore is never trusted: the caller rebuilds from the IR.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from hybrid.bundle.modelio import _external_tensors, parse_model_bytes
from hybrid.bundle.safety import check_member_name
from hybrid.errors import BundleError, HybridError
from hybrid.hal import backend_class
from hybrid.hal.backend import MACHINE_OPTIONS, CacheStrategy
from hybrid.ir import Model, atomic_write_bytes
from hybrid.runtime.compiled import CompiledModel
from hybrid.runtime.compiler import compile_model
from hybrid.runtime.plan import Plan

__all__ = [
    "MACHINE_OPTIONS",
    "CacheStrategy",
    "capture",
    "compile_for",
    "portable_options",
    "precision_of",
    "restore",
    "strategy_for",
    "untrusted_options",
]

logger = logging.getLogger("hybrid")

OPTIMIZED_NAME = "model.opt.onnx"
_MAX_GROWTH = 4  # largest optimized-model size, relative to the model, worth caching


def portable_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Backend options without those that name local files (kept out of bundles and cache keys)."""
    return {k: v for k, v in options.items() if k not in MACHINE_OPTIONS}


def untrusted_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Options read from a bundle, minus those a hostile bundle could abuse; returns (kept, dropped).

    Dropped: options that make a backend write files (a bundle could name any path), raw provider
    options (passed through unchecked), and thread or stream counts beyond 4x this machine's cores.
    """
    cap = 4 * (os.cpu_count() or 1)
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in options.items():
        counts = key.endswith(("_threads", "num_streams", "num_requests"))
        if key in MACHINE_OPTIONS or key == "provider_options" or (
                counts and isinstance(value, int) and not 0 <= value <= cap):
            dropped.append(key)
        else:
            kept[key] = value
    return kept, dropped


def precision_of(cm: CompiledModel) -> str:
    """The precision a CompiledModel runs at (the plan records it; else what the backend says it runs)."""
    segments = getattr(cm.plan, "segments", ())
    if segments and getattr(segments[0], "precision", None) in ("fp32", "fp16", "bf16"):
        return segments[0].precision
    ran = getattr(cm.executable, "precision", None)
    return ran if ran in ("fp16", "bf16") else "fp32"


def strategy_for(backend: str, device: str, options: Mapping[str, Any]) -> CacheStrategy | None:
    """The cache strategy for a (backend, device, options) (``Backend.cache_strategy``), or None.

    None when the backend has none, or names an option it does not declare or that is not one of
    :data:`MACHINE_OPTIONS` (a bundle never carries those: a path in a bundle's options could point anywhere).
    """
    try:
        cls = backend_class(backend)
        strategy = cls.cache_strategy(device, options)
    except HybridError:
        return None
    if strategy is None or strategy.option not in cls.options or strategy.option not in MACHINE_OPTIONS:
        if strategy is not None:
            logger.info("no compiled cache for %s: its cache option %r is not a declared option among %s",
                        backend, strategy.option, MACHINE_OPTIONS)
        return None
    return strategy


def compile_for(model: Model, backend: str, device: str, precision: str, options: Mapping[str, Any]) -> CompiledModel:
    """``hybrid.compile`` for one backend and device (options given per backend.

    Flat keys such as 'tensorrt' would read as backend names).
    """
    return compile_model(model, target=f"{backend}:{device}", precision=precision, config={backend: dict(options)})


def _clean_optimized(data: bytes, model: Model, where: str) -> bytes:
    """Make ORT's optimized graph take exactly the original inputs.

    ORT keeps graph inputs whose initializers it folded away (old-IR models list initializers as
    inputs); left in, they would become required inputs. Inputs no node reads are dropped.
    """
    proto = parse_model_bytes(data, where)
    check_optimized(proto, model, where, strict=False)
    used = {name for node in proto.graph.node for name in node.input}
    wanted = set(model.signature.input_names)
    keep = [v for v in proto.graph.input if v.name in wanted or v.name in used]
    if len(keep) != len(proto.graph.input):
        del proto.graph.input[:]
        proto.graph.input.extend(keep)
    check_optimized(proto, model, where, strict=True)
    return proto.SerializeToString()


def check_optimized(proto: onnx.ModelProto, model: Model, where: str, strict: bool = True) -> None:
    """Check an optimized graph: no external data, and (strict) only the model's inputs and outputs.

    It may not read external data, and (strict) must take only the model's inputs and produce its outputs.

    Raises:
        BundleError: HYB-504 for external data, HYB-502 when the inputs or outputs differ.
    """
    if _external_tensors(proto):
        raise BundleError("HYB-504", f"{where}: the compiled cache references external data",
                          "a cache must be self-contained; rebuild the bundle")
    if not strict:
        return
    inits = {t.name for t in proto.graph.initializer}
    required = {v.name for v in proto.graph.input if v.name not in inits}
    sig = model.signature
    if not required <= set(sig.input_names) or [o.name for o in proto.graph.output] != sig.output_names:
        raise BundleError("HYB-502", f"{where}: the compiled cache takes {sorted(required)} and gives "
                          f"{[o.name for o in proto.graph.output]}, the model {sig.input_names} -> "
                          f"{sig.output_names}", "the cache belongs to another model; rebuild the bundle")


def capture(model: Model, backend: str, device: str, precision: str, options: Mapping[str, Any],
            workdir: Path) -> tuple[CompiledModel, dict[str, bytes]]:
    """Compile ``model`` with the backend writing its artifact into ``workdir``.

    Return the compiled model and the artifact's files (empty when the backend has no cache or wrote nothing).
    """
    opts = portable_options(options)
    strategy = strategy_for(backend, device, opts)
    if strategy is None:
        return compile_for(model, backend, device, precision, opts), {}
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / OPTIMIZED_NAME if strategy.kind == "optimized-model" else workdir
    cm = compile_for(model, backend, device, precision, {**opts, strategy.option: str(target)})
    files: dict[str, bytes] = {}
    if strategy.kind == "optimized-model":
        size = target.stat().st_size if target.is_file() else 0
        # a model whose weights are generated at run time (ConstantOfShape) optimizes into a graph many
        # times its size: reading that back costs more than the optimizer it would save
        if size > _MAX_GROWTH * len(model.to_bytes()) + (1 << 20):
            logger.info("not caching %s's optimized model: %d bytes for a %d-byte model", backend, size,
                        len(model.to_bytes()))
        elif size:
            try:
                files[OPTIMIZED_NAME] = _clean_optimized(target.read_bytes(), model, "compiled cache")
            except BundleError as e:
                logger.info("not caching %s's optimized model: %s", backend, e.message)
    else:
        files = _directory_files(workdir)
    return _with_options(cm, opts), files


def _directory_files(workdir: Path) -> dict[str, bytes]:
    """Every plain file under ``workdir`` by its relative '/'-joined path (a backend may nest its cache.

    TensorRT writes ``tensorrt/<fingerprint>/<key>.engine``); links are not followed.
    """
    files: dict[str, bytes] = {}
    for folder, dirs, names in os.walk(workdir, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                member = path.relative_to(workdir).as_posix()
                files[check_member_name(member, "compiled cache")] = path.read_bytes()
    return files


def _with_options(cm: CompiledModel, options: Mapping[str, Any], model: Model | None = None,
                  note: str | None = None) -> CompiledModel:
    notes = (*cm.plan.notes, note) if note else cm.plan.notes
    return CompiledModel(model or cm.model, cm.executable, Plan(cm.plan.segments, notes), cm.backend, cm.device,
                         dict(options), cm.target)


def loaded_from_cache(cm: CompiledModel) -> bool | None:
    """Whether the backend says it imported its cache (``Executable.loaded_from_cache``.

    OpenVINO's LOADED_FROM_CACHE); None: unknown.
    """
    return getattr(cm.executable, "loaded_from_cache", None)


def restore(model: Model, backend: str, device: str, precision: str, options: Mapping[str, Any], kind: str,
            files: Mapping[str, bytes], workdir: Path, where: str) -> CompiledModel:
    """Build a CompiledModel of ``model`` from a cached artifact.

    Raises:
        HybridError: when the artifact is unusable (the caller then rebuilds from the IR).
    """
    opts = portable_options(options)
    note = f"compiled artifact restored from {where}"
    strategy = strategy_for(backend, device, opts)
    if strategy is None or strategy.kind != kind:
        raise BundleError("HYB-502", f"{where}: backend {backend!r} has no {kind} cache here",
                          "the cache was made by another hybrid version; it is rebuilt")
    if kind == "optimized-model":
        proto = parse_model_bytes(files[OPTIMIZED_NAME], where)
        check_optimized(proto, model, where)
        optimized = Model.load(proto)
        cm = compile_for(optimized, backend, device, precision, {**opts, **strategy.restore_options})
        return _with_options(cm, opts, model=model, note=note)
    workdir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        path = workdir / check_member_name(name, where)
        if not path.is_file() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, data)
    cm = compile_for(model, backend, device, precision, {**opts, strategy.option: str(workdir)})
    if loaded_from_cache(cm) is False:
        note = f"{where} was rejected by {backend}; recompiled from the IR"
    return _with_options(cm, opts, note=note)
