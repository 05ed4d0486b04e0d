"""``hybrid.load``: open a bundle, verify it, and compile it here — from its cache when one matches.

Order of preference for ``target='auto'``:

1. a compiled cache in the bundle whose device fingerprint equals this machine's;
2. the backend the bundle was compiled with, then the platform profile's targets, in order, that are
   present here — each from hybrid's local cache (``$HYBRID_CACHE_DIR/bundles``) when it holds a
   verified artifact for this fingerprint, else compiled from the IR (and the artifact saved there);
3. ``hybrid.compile(model, 'auto')`` when none of those is present.

Falling back from what the platform prefers logs a warning that names what was missing. A cache that
fails to restore (corrupt, stale, rejected by its backend) is dropped and the model rebuilt from the IR.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybrid.bundle import cache as _cache
from hybrid.bundle.fingerprint import device_fingerprint
from hybrid.bundle.format import BundleReader, Source
from hybrid.bundle.manifest import CacheEntry, Manifest
from hybrid.bundle.modelio import model_from_proto, parse_model_bytes, resolve_external_data
from hybrid.bundle.platforms import machine_arch
from hybrid.bundle.safety import Limits
from hybrid.bundle.select import available_pairs, merged_options, profile_layer, split_user_config
from hybrid.errors import BackendError, BundleError, HybridError
from hybrid.hal import resolve_target
from hybrid.hal.machine import cache_root
from hybrid.ir import Model, atomic_write_bytes
from hybrid.runtime.compiled import CompiledModel
from hybrid.runtime.compiler import compile_model
from hybrid.vision.tasks import TaskModel, task_model  # a bundle that declares a vision task loads as a TaskModel

__all__ = ["LoadInfo", "load", "load_task", "load_with_info", "read_model"]

logger = logging.getLogger("hybrid")


@dataclass(frozen=True, slots=True)
class LoadInfo:
    """How a bundle was loaded.

    Attributes:
        source: 'bundle-cache' (the bundle's compiled artifact), 'local-cache' (hybrid's cache folder)
            or 'ir' (compiled from the model).
        backend, device, precision: What it runs on.
        fingerprint: This machine's device fingerprint for that backend and device.
        platform: The platform profile the bundle was made for.
        notes: Warnings and fallbacks, in order.
        seconds: Wall time of the load.
        manifest: The bundle's manifest, as the verified reader checked it (``serving``, ``task``...).
    """

    source: str
    backend: str
    device: str
    precision: str
    fingerprint: str
    platform: str
    notes: tuple[str, ...]
    seconds: float
    manifest: Manifest


def read_model(reader: BundleReader) -> Model:
    """The bundle's model with external data resolved from members (BundleError 5xx otherwise)."""
    m = reader.manifest
    proto = parse_model_bytes(reader.read(m.model.path), f"{reader.where}:{m.model.path}")
    model_dir = m.model.path.rpartition("/")[0]
    resolve_external_data(proto, model_dir, reader.read, f"{reader.where}:{m.model.path}", set(m.model.external_data))
    model = model_from_proto(proto, m.name, reader.where)
    sig = model.signature
    if [s.name for s in sig.inputs] != [t.name for t in m.model.inputs] or \
            [s.name for s in sig.outputs] != [t.name for t in m.model.outputs]:
        raise BundleError("HYB-502", f"{reader.where}: the manifest's signature ({[t.name for t in m.model.inputs]}"
                          f" -> {[t.name for t in m.model.outputs]}) differs from the model's ({sig})",
                          "the bundle is damaged; rebuild it")
    return model


def _model_key(m: Manifest) -> str:
    parts = [m.members[p].sha256 for p in (m.model.path, *m.model.external_data)]
    return hashlib.sha256(":".join(parts).encode()).hexdigest()[:24]


def _local_dir(model_key: str, backend: str, device: str, precision: str, options: Mapping[str, Any],
               fingerprint: str) -> Path:
    material = json.dumps([backend, device, precision, options], sort_keys=True, default=str)
    variant = hashlib.sha256(material.encode()).hexdigest()[:12]
    return cache_root() / "bundles" / model_key / f"{fingerprint}-{variant}"


def _read_local(folder: Path) -> tuple[str, dict[str, bytes]] | None:
    """A local cache entry whose files all match their recorded sha256, else None (and it is removed)."""
    try:
        entry = json.loads((folder / "entry.json").read_text())
        files = {name: (folder / "files" / name).read_bytes() for name in entry["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        return None
    if any(hashlib.sha256(data).hexdigest() != entry["files"][name] for name, data in files.items()):
        logger.warning("local cache %s is corrupt; rebuilding it", folder)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return entry["kind"], files


def _write_local(folder: Path, kind: str, files: Mapping[str, bytes]) -> None:
    """Save an artifact: write a sibling temp folder, then rename it into place (atomic)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            for name, data in files.items():
                atomic_write_bytes(tmp / "files" / name, data)
            entry = {"kind": kind, "files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}
            atomic_write_bytes(tmp / "entry.json", json.dumps(entry, sort_keys=True).encode())
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        logger.warning("could not write the local cache %s: %s", folder, e)


def _build(model: Model, m: Manifest, backend: str, device: str, precision: str, options: dict[str, Any],
           bundle_cache: tuple[CacheEntry, dict[str, bytes]] | None, use_cache: bool,
           notes: list[str]) -> tuple[CompiledModel, str, str]:
    """Compile for one (backend, device): bundle cache, else local cache, else the IR (saving it)."""
    fp = device_fingerprint(backend, device).digest
    if not use_cache:
        return _cache.compile_for(model, backend, device, precision, options), "ir", fp
    folder = _local_dir(_model_key(m), backend, device, precision, options, fp)
    if bundle_cache is not None:
        entry, files = bundle_cache
        try:
            cm = _cache.restore(model, backend, device, precision, options, entry.kind, files, folder / "files",
                                f"the bundle's cache for {fp}")
            return cm, "bundle-cache", fp
        except HybridError as e:
            notes.append(f"the bundle's compiled cache for {backend}:{device} was rejected ({e.message}); "
                         "rebuilding from the IR")
            logger.warning(notes[-1])
    local = _read_local(folder)
    if local is not None:
        kind, files = local
        try:
            return _cache.restore(model, backend, device, precision, options, kind, files, folder / "files",
                                  f"local cache {folder}"), "local-cache", fp
        except HybridError as e:
            notes.append(f"local cache {folder} was rejected ({e.message}); rebuilding from the IR")
            logger.warning(notes[-1])
            shutil.rmtree(folder, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="hybrid-capture-") as tmp:
        cm, files = _cache.capture(model, backend, device, precision, options, Path(tmp) / "artifact")
        if files:
            kind = "optimized-model" if _cache.OPTIMIZED_NAME in files else "directory"
            _write_local(folder, kind, files)
    return cm, "ir", fp


def _matching_caches(m: Manifest) -> list[CacheEntry]:
    """The bundle's caches built on a machine with this machine's fingerprint (backend present)."""
    out = []
    for entry in m.caches:
        if available_pairs([f"{entry.backend}:{entry.device}"]) and \
                device_fingerprint(entry.backend, entry.device).digest == entry.fingerprint:
            out.append(entry)
    return out


def _unique(items: list[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def load_with_info(source: Source, target: str = "auto", precision: str | None = None,
                   config: Mapping[str, Any] | None = None, *, use_cache: bool = True,
                   limits: Limits | None = None) -> tuple[CompiledModel, LoadInfo]:
    """Like :func:`load`, and also say how the bundle was loaded (cache or IR, fallbacks, time)."""
    t0 = time.perf_counter()
    notes: list[str] = []
    with BundleReader(source, limits) as reader:
        m = reader.manifest
        profile = m.platform
        model = read_model(reader)
        explicit = not (isinstance(target, str) and target.strip().lower() == "auto")
        caches = [] if (config or not use_cache) else _matching_caches(m)
        # each file by its path inside the cache's folder (the manifest checked they all lie in it)
        cache_files = {id(c): {f.removeprefix(c.folder): reader.read(f) for f in c.files} for c in caches[:1]}
        reader.verify()  # every other member (wheels, other platforms' caches) is hash-checked too
    if explicit:
        pairs = [(c.backend, c.device) for c in resolve_target(target)]
    else:
        compiled_with = [f"{m.compile.backend}:{m.compile.device}"] if m.compile else []
        pairs = available_pairs([*(f"{c.backend}:{c.device}" for c in caches), *compiled_with, *profile.targets])
    errors: list[str] = []
    for backend, device in pairs:
        entry = next((c for c in caches if (c.backend, c.device) == (backend, device) and id(c) in cache_files
                      and (precision is None or precision == c.precision)), None)
        bundled = m.compile if m.compile is not None and (m.compile.backend, m.compile.device) == (backend, device) \
            else None  # the bundle's own compile choice, when it is this pair
        wanted = precision or (entry.precision if entry else bundled.precision if bundled else profile.precision)
        for prec in ([wanted] if precision else _unique([wanted, "fp32"])):
            if entry is not None and prec == entry.precision:
                layers = [("cache", entry.options)]
            else:
                layers = [profile_layer(profile, backend),
                          ("bundle", bundled.options if bundled else {}),
                          ("config", split_user_config(config, backend, device))]
            options, option_notes = merged_options(backend, layers, untrusted=("platform", "bundle", "cache"))
            try:
                cm, source_kind, fp = _build(model, m, backend, device, prec, options,
                                             (entry, cache_files[id(entry)]) if entry and prec == entry.precision
                                             else None, use_cache, notes)
            except HybridError as e:
                errors.append(f"{backend}:{device} {prec}: [{e.code}] {e.message}")
                continue
            for note in option_notes:
                logger.warning(note)
            notes.extend(option_notes)
            if prec != wanted:
                notes.append(f"precision {wanted} is not available on {backend}:{device}; running {prec}")
                logger.warning(notes[-1])
            _warn_fallback(m, backend, device, explicit,
                           [e for e in errors if not e.startswith(f"{backend}:{device} ")], notes)
            info = LoadInfo(source_kind, backend, device, prec, fp, profile.name, tuple(notes),
                            time.perf_counter() - t0, m)
            logger.info("loaded bundle %r on %s:%s from %s in %.3f s", m.name, backend, device, source_kind,
                        info.seconds)
            return task_model(cm, m.task, m.preprocess, m.postprocess), info
    if explicit:
        raise BackendError("HYB-304", f"bundle {m.name!r} could not be compiled for target {target!r}: "
                           + "; ".join(errors or ["no backend of that target is present"]),
                           "try target='auto' or another target (`pyasc devices` lists them)")

    notes.append(f"none of platform {profile.name!r}'s targets ({', '.join(profile.targets)}) could run here"
                 + (f" ({'; '.join(errors)})" if errors else "") + "; using hybrid.compile(target='auto')")
    logger.warning(notes[-1])
    cm = compile_model(model, target="auto", shapes=m.declared_shapes())
    info = LoadInfo("ir", cm.backend, cm.device, _cache.precision_of(cm), "", profile.name, tuple(notes),
                    time.perf_counter() - t0, m)
    return task_model(cm, m.task, m.preprocess, m.postprocess), info


def _warn_fallback(m: Manifest, backend: str, device: str, explicit: bool, errors: list[str],
                   notes: list[str]) -> None:
    """Warn when the bundle runs on something other than what its platform or creator chose."""
    if explicit:
        return
    profile = m.platform
    intended = f"{m.compile.backend}:{m.compile.device}" if m.compile else profile.targets[0]
    if (backend, device) in available_pairs([intended]):
        return
    arch = machine_arch()
    where = f" (made for {profile.arch}, this machine is {arch})" if arch != profile.arch else ""
    notes.append(f"bundle {m.name!r} was made for platform {profile.name!r}{where}; {intended} is not "
                 f"available here, falling back to {backend}:{device}"
                 + (f" (failed: {'; '.join(errors)})" if errors else ""))
    logger.warning(notes[-1])


def load(source: Source, target: str = "auto", precision: str | None = None,
         config: Mapping[str, Any] | None = None, *, use_cache: bool = True,
         limits: Limits | None = None) -> CompiledModel:
    """Load a ``.hybrid`` bundle and compile it for this machine (DESIGN 2.7, 2.9).

    Always a CompiledModel: a bundle that declares a vision task (manifest ``preprocess`` /
    ``postprocess``) loads as a ``hybrid.vision.TaskModel``, the CompiledModel subclass whose call takes
    frames and returns detections or labels (``.run`` stays raw). :func:`load_task` (``hybrid.load_task``)
    loads one typed as a TaskModel.

    Args:
        source: Path of the bundle, or its bytes.
        target: 'auto' (the bundle's platform priority, then what is present) or any hybrid target.
        precision: Override the bundle's precision ('fp32', 'fp16', 'bf16').
        config: Backend options, as for ``hybrid.compile``; a non-empty config bypasses the caches.
        use_cache: False compiles from the IR and neither reads nor writes any cache.
        limits: Size caps (zip-bomb protection); the defaults suit models up to 16 GB.

    Raises:
        BundleError: 5xx for any problem with the bundle (unsafe, modified, malformed, too large).
        BackendError: 3xx when nothing on this machine can compile the model.
    """
    return load_with_info(source, target, precision, config, use_cache=use_cache, limits=limits)[0]


def load_task(source: Source, target: str = "auto", precision: str | None = None,
              config: Mapping[str, Any] | None = None, *, use_cache: bool = True,
              limits: Limits | None = None) -> TaskModel:
    """:func:`load` for a bundle that declares a vision task, typed as the TaskModel it returns.

    ``hybrid.load_task``; it lived in ``hybrid.vision`` before, which sits below the bundle layer.

    Args:
        source: Path of the bundle, or its bytes.
        target: As for :func:`load`.
        precision: As for :func:`load`.
        config: As for :func:`load`.
        use_cache: As for :func:`load`.
        limits: As for :func:`load`.

    Raises:
        BundleError: HYB-502 when the bundle declares no vision task (and the 5xx :func:`load` raises).
        BackendError: 3xx when nothing on this machine can compile the model.
    """
    loaded, _ = load_with_info(source, target, precision, config, use_cache=use_cache, limits=limits)
    if not isinstance(loaded, TaskModel):
        name = loaded.model.name
        loaded.close()
        raise BundleError("HYB-502", f"bundle {name!r} declares no vision task: expected manifest 'preprocess' "
                          "and 'postprocess' sections, found neither",
                          "use hybrid.load for a plain model, or rebuild it with pyasc bundle create --task ...")
    return loaded
