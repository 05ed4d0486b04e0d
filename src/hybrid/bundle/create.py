"""Writing bundles: ``cm.save(path)`` and ``pyasc bundle create``.

``save_bundle`` packs a CompiledModel with this machine's compiled cache and the task declarations the
model carries (``cm.task_declarations()``: a ``hybrid.vision.TaskModel``'s pre- and postprocessing).
``create_bundle`` starts from a model and a platform profile: it optimizes the model at the requested
level, compiles it here when this machine can run the platform (same OS and architecture) so the bundle
carries a cache for it, and otherwise ships the IR alone, which the target compiles on first load.

A bundle never changes the model's inputs unless asked: a profile's preferred layout (NHWC on Ascend) is
said, not applied; ``layout='NHWC'`` (``--layout nhwc``) converts the image inputs and says so. What the
bundle cannot give its platform (runtimes its wheels lack, another Python) is logged as a warning and
written to the manifest's ``warnings``.
"""

from __future__ import annotations

import datetime
import logging
import os
import platform as _platform
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hybrid._version import __version__
from hybrid.bundle import cache as _cache
from hybrid.bundle import libs as _libs
from hybrid.bundle.arrays import read_npz, write_npz
from hybrid.bundle.fingerprint import device_fingerprint
from hybrid.bundle.format import BundleWriter
from hybrid.bundle.manifest import (
    FORMAT_VERSION,
    CacheEntry,
    CalibrationEntry,
    CompileEntry,
    LibsEntry,
    Manifest,
    ModelEntry,
    ServingEntry,
    TensorEntry,
    cache_folder,
)
from hybrid.bundle.modelio import DATA_NAME, MODEL_DIR, MODEL_PATH, split_external_data
from hybrid.bundle.platforms import PlatformProfile, get_platform, machine_arch
from hybrid.bundle.select import available_pairs, merged_options, profile_layer, split_user_config
from hybrid.errors import BackendError, BundleError, ConfigError, HybridError
from hybrid.ir import Model, TensorSpec
from hybrid.passes import optimize
from hybrid.passes.layout import LAYOUT_KEY, channels_last_candidates
from hybrid.runtime.auto import normalize_shapes
from hybrid.runtime.compiled import CompiledModel
from hybrid.runtime.compiler import compile_model
from hybrid.vision.tasks import declarations

__all__ = ["create_bundle", "save_bundle"]

logger = logging.getLogger("hybrid")

CALIBRATION_PATH = "calibration/calibration.npz"
EXTERNAL_DATA_MODEL_BYTES = 512 << 20  # above this much weight data, large tensors go to model.onnx.data
EXTERNAL_DATA_TENSOR_BYTES = 1 << 20
_LEVELS = ("O0", "O1", "O2", "O3")


def _tensor_entry(spec: TensorSpec) -> TensorEntry:
    return TensorEntry(name=spec.name, dtype=None if spec.dtype is None else str(spec.dtype),
                       shape=None if spec.shape is None else list(spec.shape), kind=spec.kind)


def _calibration(data: Any) -> Mapping[str, Any]:
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if not path.is_file():
            raise BundleError("HYB-501", f"calibration file {str(path)!r} not found", "pass an .npz file")
        return read_npz(path.read_bytes(), str(path))
    if not isinstance(data, Mapping):
        raise BundleError("HYB-502", f"calibration: expected an .npz path or a mapping name -> array, got "
                          f"{type(data).__name__}", "e.g. calibration={'input': batch_of_samples}")
    return data


def _capture_caches(cm: CompiledModel, precision: str, workdir: Path,
                    writer: BundleWriter) -> list[CacheEntry]:
    """Capture ``cm``'s compiled artifact for this machine's fingerprint as bundle members."""
    if len(cm.plan.segments) != 1:
        logger.info("not caching %r: its plan has %d segments; the target compiles it from the IR",
                    cm.model.name, len(cm.plan.segments))
        return []
    _, files = _cache.capture(cm.model, cm.backend, cm.device, precision, cm.options, workdir)
    if not files:
        return []
    fp = device_fingerprint(cm.backend, cm.device)
    folder = cache_folder(fp.digest, cm.backend)
    for name, data in files.items():
        writer.add_bytes(f"{folder}{name}", data)
    kind = "optimized-model" if _cache.OPTIMIZED_NAME in files else "directory"
    return [CacheEntry(backend=cm.backend, device=cm.device, precision=precision,
                       options=_cache.portable_options(cm.options), fingerprint=fp.digest,
                       fingerprint_info=fp.info, kind=kind, files=[f"{folder}{n}" for n in files])]


def _write(path: str | os.PathLike, model: Model, profile: PlatformProfile, cm: CompiledModel | None, *,
           caches: bool, calibration: Any, libs: tuple[LibsEntry, list[Path]] | None, name: str | None,
           task: str | None, optimize_level: str | None, optimized: bool, external_data_bytes: int,
           task_options: Mapping[str, Any] | None = None, serving: Mapping[str, Any] | None = None,
           shapes: Mapping[str, Any] | None = None, warnings: Sequence[str] = ()) -> Manifest:
    vision = declarations(task, task_options, model, name or model.name)  # HYB-502 before writing
    serving_entry = _serving_entry(serving)
    shapes_entry = _shapes_entry(model, shapes)
    writer = BundleWriter()
    data, blob = split_external_data(model, external_data_bytes, EXTERNAL_DATA_TENSOR_BYTES)
    writer.add_bytes(MODEL_PATH, data)
    external = []
    if blob is not None:
        writer.add_bytes(f"{MODEL_DIR}/{DATA_NAME}", blob)
        external.append(f"{MODEL_DIR}/{DATA_NAME}")
    compile_entry = None
    cache_entries: list[CacheEntry] = []
    if cm is not None:
        precision = _cache.precision_of(cm)
        if len(cm.plan.segments) == 1:
            compile_entry = CompileEntry(backend=cm.backend, device=cm.device, precision=precision,
                                         options=_cache.portable_options(cm.options))
        if caches:
            with tempfile.TemporaryDirectory(prefix="hybrid-capture-") as tmp:
                cache_entries = _capture_caches(cm, precision, Path(tmp) / "artifact", writer)
    calibration_entry = None
    if calibration is not None:
        npz, keys = write_npz(_calibration(calibration))
        writer.add_bytes(CALIBRATION_PATH, npz)
        calibration_entry = CalibrationEntry(path=CALIBRATION_PATH, arrays=keys)
    libs_entry = None
    if libs is not None:
        libs_entry, wheel_paths = libs
        for wheel in wheel_paths:
            writer.add_file(f"libs/{wheel.name}", wheel)
    sig = model.signature
    inputs, outputs = [_tensor_entry(s) for s in sig.inputs], [_tensor_entry(s) for s in sig.outputs]
    manifest = Manifest(
        format_version=FORMAT_VERSION, created_by=f"pyasc {__version__} (Python {_platform.python_version()}, "
        f"{_platform.system()} {machine_arch()})", created_at=datetime.datetime.now(datetime.UTC).isoformat(
            timespec="seconds"), name=name or model.name, task=task, **vision, serving=serving_entry,
        shapes=shapes_entry,
        model=ModelEntry(path=MODEL_PATH, sha256=model.sha256, opset=model.opset, external_data=external,
                         inputs=inputs, outputs=outputs,
                         layout="NHWC" if model.ir.metadata_props.get(LAYOUT_KEY) == "NHWC" else None),
        platform=profile, optimize_level=optimize_level, optimized=optimized, compile=compile_entry,
        caches=cache_entries, calibration=calibration_entry, libs=libs_entry, warnings=list(warnings),
        members=writer.members())
    writer.write(path, manifest)
    for warning in manifest.warnings:
        logger.warning("%s: %s", Path(path).name, warning)
    logger.info("wrote bundle %s (%d members)", path, len(manifest.members) + 1)
    return manifest


def _libs_for(profile: PlatformProfile, include_libs: bool, python_version: str | None,
              requirements: Sequence[str] | None, wheels: Sequence[str | os.PathLike], include_hybrid: bool,
              workdir: Path) -> tuple[tuple[LibsEntry, list[Path]] | None, list[str]]:
    """The vendored wheels (None without ``include_libs``) and what they cannot give the platform."""
    if not include_libs:
        return None, []
    version = _libs.wheels_python(profile, python_version)
    entry, paths = _libs.vendor(profile, version, requirements, wheels, include_hybrid, workdir)
    return (entry, paths), _libs.platform_warnings(profile, entry, python_version)


def _shapes_entry(model: Model, shapes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``shapes`` as the manifest writes them: a list of dims, or min/opt/max lists for a range.

    Raises:
        ConfigError: HYB-102 for shapes that do not fit the model (before anything is written).
    """
    ranges = normalize_shapes(model.signature, shapes)
    if not ranges:
        return None
    return {name: list(r.opt) if r.min == r.opt == r.max else {"min": list(r.min), "opt": list(r.opt),
                                                                 "max": list(r.max)}
            for name, r in ranges.items()}


def _serving_entry(serving: Mapping[str, Any] | None) -> ServingEntry | None:
    """Validate the serving settings before anything is written (HYB-502 naming the bad key)."""
    if not serving:
        return None
    try:
        return ServingEntry(**dict(serving))
    except (TypeError, ValueError) as e:
        raise BundleError("HYB-502", f"serving settings {dict(serving)!r} are invalid: {str(e).splitlines()[0]}",
                          "keys: max_batch, batch_timeout, max_queue, request_timeout, concurrency") from e


def save_bundle(cm: CompiledModel, path: str | os.PathLike, *, platform: str | PlatformProfile = "auto",
                caches: bool = True, calibration: Any = None, name: str | None = None, task: str | None = None,
                include_libs: bool = False, python_version: str | None = None,
                requirements: Sequence[str] | None = None, wheels: Sequence[str | os.PathLike] = (),
                include_hybrid: bool = True, external_data_bytes: int = EXTERNAL_DATA_MODEL_BYTES,
                task_options: Mapping[str, Any] | None = None, serving: Mapping[str, Any] | None = None,
                shapes: Mapping[str, Any] | None = None) -> Manifest:
    """Write ``cm`` as a ``.hybrid`` bundle with this machine's compiled cache (``cm.save(path)``).

    Args:
        cm: The compiled model.
        path: Output file (written atomically).
        platform: Profile recorded in the manifest ('auto': this machine's).
        caches: Include the compiled artifact for this machine's fingerprint.
        calibration: Calibration samples: an .npz path or a mapping name -> array.
        name: Recorded in the manifest (default: the model's name).
        task: Recorded in the manifest ('detection', 'classification', or any label).
        include_libs: Vendor the wheels the target needs (see :func:`create_bundle`).
        python_version: Target Python 'X.Y' for the wheels.
        requirements: Packages to fetch.
        wheels: Local wheel files to add.
        include_hybrid: Add a wheel of hybrid itself.
        external_data_bytes: Weight bytes above which large tensors are stored as external data.
        task_options: Pre/postprocessing of a 'detection' or 'classification' task (see :func:`create_bundle`).
            Neither ``task`` nor ``task_options`` given: the model's own (``cm.task_declarations()``: a
            ``hybrid.vision.TaskModel`` keeps its declarations, a plain CompiledModel has none).
        serving: Dynamic-batching settings for ``pyasc serve`` (see :func:`create_bundle`).
        shapes: The shapes users run, written to the manifest's ``shapes`` (see :func:`create_bundle`).

    Returns:
        The manifest written.
    """
    if task is None and task_options is None:
        declared = cm.task_declarations()
        if declared is not None:
            task, task_options = declared
    profile = get_platform(platform)
    with tempfile.TemporaryDirectory(prefix="hybrid-libs-") as tmp:
        libs, warnings = _libs_for(profile, include_libs, python_version, requirements, wheels, include_hybrid,
                                   Path(tmp))
        return _write(path, cm.model, profile, cm, caches=caches, calibration=calibration, libs=libs, name=name,
                      task=task, optimize_level=None, optimized=False, external_data_bytes=external_data_bytes,
                      task_options=task_options, serving=serving, shapes=shapes, warnings=warnings)


def _requested_layout(layout: str | None, level: str | None) -> str | None:
    """'NHWC' when the interface is to be made channels-last, None to keep the model's.

    Raises:
        ConfigError: HYB-102 for a layout other than NCHW/NHWC, or NHWC below level O3.
    """
    if layout is None:
        return None
    name = layout.upper() if isinstance(layout, str) else layout
    if name not in ("NCHW", "NHWC"):
        raise ConfigError("HYB-102", f"layout: expected 'NCHW' (keep the model's inputs) or 'NHWC', got {layout!r}",
                          "--layout nhwc makes the image inputs channels-last; leave it out to keep them")
    if name == "NHWC" and level != "O3":
        raise ConfigError("HYB-102", f"layout 'NHWC' is converted by the O3 pass list; the optimize level given is "
                          f"{level or 'none'}", "add --optimize-level O3 (O3 keeps the numerics)")
    return None if name == "NCHW" else name


def _optimize(model: Model, level: str | None, layout: str | None) -> tuple[Model, bool]:
    """``hybrid.optimize`` at ``level``; ``layout='NHWC'`` makes the image inputs channels-last."""
    if level is None or level == "O0":
        return model, False
    if level not in _LEVELS:
        raise ConfigError("HYB-102", f"optimize level: expected one of {_LEVELS}, got {level!r}")
    return optimize(model, level=level, config={"layout": layout} if layout else None), True


def _dims(spec: TensorSpec) -> str:
    return "?" if spec.shape is None else str(list(spec.shape))


def _layout_warnings(source: Model, bundled: Model, requested: str | None, profile: PlatformProfile) -> list[str]:
    """What a requested NHWC conversion changed, or the profile's layout preference that was not applied."""
    if requested == "NHWC":
        before = {s.name: s for s in (*source.signature.inputs, *source.signature.outputs)}
        changed = [(s, before[s.name]) for s in (*bundled.signature.inputs, *bundled.signature.outputs)
                   if s.name in before and s.shape != before[s.name].shape]
        if not changed:
            return [f"layout NHWC was asked for and changed nothing: no rank-4 input of {bundled.name!r} feeds a "
                    "channels-first operator (Conv, pooling, normalization)"]
        said = ", ".join(f"{'input' if s in bundled.signature.inputs else 'output'} {s.name!r} is {_dims(s)} "
                         f"(the source model's: {_dims(old)})" for s, old in changed)
        return [f"layout NHWC (asked for): the model's interface is channels-last now: {said}; callers must send "
                "NHWC arrays under the same names"]
    if profile.layout == "NHWC":
        kept = channels_last_candidates(bundled.ir)
        if kept:
            inputs = {s.name: s for s in bundled.signature.inputs}
            said = ", ".join(f"{n!r} {_dims(inputs[n])}" for n in kept if n in inputs)
            return [f"platform {profile.name} prefers NHWC inputs; the bundle keeps the model's NCHW input {said} "
                    "unchanged: pass --layout nhwc (layout='NHWC') with --optimize-level O3 to make it channels-last"]
    return []


def _compile_here(model: Model, profile: PlatformProfile, target: str | None, precision: str | None,
                  config: Mapping[str, Any] | None, shapes: Mapping[str, Any] | None = None) -> CompiledModel | None:
    """Compile for the first of the profile's targets present here (None if this machine cannot).

    Target 'auto' measures the candidates here at ``shapes`` and bundles the choice.
    """
    if profile.arch != machine_arch() or profile.os != _platform.system().lower():
        logger.info("platform %r is %s/%s, this machine %s/%s: bundling the IR only", profile.name, profile.os,
                    profile.arch, _platform.system().lower(), machine_arch())
        return None
    if target is not None and target.strip().lower() == "auto":
        return compile_model(model, target="auto", precision=precision or profile.precision, config=config,
                             shapes=shapes)
    errors = []
    for backend, device in available_pairs([target] if target else profile.targets):
        wanted = precision or profile.precision
        for prec in dict.fromkeys([wanted] if precision else [wanted, "fp32"]):
            options, notes = merged_options(backend, [profile_layer(profile, backend),
                                                      ("config", split_user_config(config, backend, device))])
            for note in notes:
                logger.warning(note)
            try:
                return compile_model(model, target=f"{backend}:{device}", precision=prec, config={backend: options},
                                     shapes=shapes)
            except HybridError as e:
                errors.append(f"{backend}:{device} {prec}: {e.message}")
    if target:
        raise BackendError("HYB-304", f"could not compile {model.name!r} for target {target!r}: "
                           + ("; ".join(errors) or "that target is not present here"),
                           "`pyasc devices` lists the targets present")
    logger.warning("none of platform %r's targets compiled %r here (%s); bundling the IR only", profile.name,
                   model.name, "; ".join(errors) or "none present")
    return None


def create_bundle(model: Any, output: str | os.PathLike, *, platform: str | PlatformProfile = "auto",
                  target: str | None = None, precision: str | None = None, config: Mapping[str, Any] | None = None,
                  optimize_level: str | None = None, caches: bool = True, calibration: Any = None,
                  include_libs: bool = False, python_version: str | None = None,
                  requirements: Sequence[str] | None = None, wheels: Sequence[str | os.PathLike] = (),
                  include_hybrid: bool = True, name: str | None = None, task: str | None = None,
                  platforms_file: str | os.PathLike | None = None,
                  external_data_bytes: int = EXTERNAL_DATA_MODEL_BYTES,
                  task_options: Mapping[str, Any] | None = None,
                  serving: Mapping[str, Any] | None = None, shapes: Mapping[str, Any] | None = None,
                  layout: str | None = None) -> Manifest:
    """Build a bundle for a platform (``pyasc bundle create``).

    Args:
        model: A path, bytes, ModelProto, onnx_ir.Model or hybrid.Model.
        output: The .hybrid file to write (atomically).
        platform: Profile name ('auto': this machine) or a PlatformProfile.
        target: Compile for this target instead of the profile's first present one.
        precision: Override the profile's precision.
        config: Backend options for compiling here, as for ``hybrid.compile``.
        optimize_level: 'O0'..'O3', applied with ``hybrid.optimize`` before bundling.
        layout: 'NHWC' makes the model's rank-4 image inputs (and image outputs) channels-last under the
            same names (needs level O3), said in a warning and in the manifest. None or 'NCHW' (the default)
            keeps the model's interface, whatever layout the profile prefers.
        caches: Compile here and include the artifact when this machine can run the platform.
        calibration: Calibration samples: an .npz path or a mapping name -> array.
        include_libs: Vendor the wheels the target needs (fetched with pip for its platform and Python).
        python_version: Target Python 'X.Y' for the wheels (default: the platform's own when hybrid runs on
            it, else this interpreter's; a difference from the platform's Python is warned about).
        requirements: Packages to fetch (default: the profile's runtimes, pinned to the versions here).
        wheels: Local wheel files to add (their dependencies are fetched too).
        include_hybrid: Add a wheel of hybrid itself.
        name: Recorded in the manifest (default: the model file's stem, else the model's name).
        task: Recorded in the manifest ('detection', 'classification', or any label).
        platforms_file: TOML file with user-defined profiles.
        external_data_bytes: Weight bytes above which large tensors are stored as external data.
        task_options: For task 'detection' or 'classification': the pre/postprocessing keys that make the
            loaded model take frames and return answers (``{'format': 'yolov8', 'classes': 'classes.txt'}``;
            see docs/vision.md), written to the manifest's ``preprocess`` / ``postprocess``.
        serving: Dynamic-batching settings for ``pyasc serve`` (``max_batch``, ``batch_timeout``,
            ``max_queue``, ``request_timeout``, ``concurrency``), written to the manifest's ``serving``.
        shapes: The shapes users run, as for ``hybrid.compile(shapes=...)``: with ``target='auto'`` the
            candidates are measured at them and the choice is bundled. They are written to the manifest's
            ``shapes``, which ``pyasc run/bench/profile`` on the bundle and ``hybrid.load`` compiling its IR use.

    Raises:
        BundleError: HYB-508 for an unknown platform, HYB-509 when fetching wheels fails or hybrid cannot
            run on ``python_version``, HYB-502 for invalid task options.
        ConfigError: HYB-102 for a bad ``layout``, ``optimize_level`` or ``python_version``.
        ModelError, BackendError: when the model does not load or (with ``target``) does not compile.
    """
    profile = get_platform(platform, platforms_file)
    wanted_layout = _requested_layout(layout, optimize_level)
    if include_libs:
        _libs.wheels_python(profile, python_version)  # a Python hybrid cannot run on fails before any work
    source = Model.load(model)
    hmodel, optimized = _optimize(source, optimize_level, wanted_layout)
    warnings = _layout_warnings(source, hmodel, wanted_layout, profile)
    if name is None and isinstance(model, (str, os.PathLike)):
        name = Path(model).stem
    cm = _compile_here(hmodel, profile, target, precision, config, shapes) if caches or target else None
    with tempfile.TemporaryDirectory(prefix="hybrid-libs-") as tmp:
        libs, libs_warnings = _libs_for(profile, include_libs, python_version, requirements, wheels, include_hybrid,
                                        Path(tmp))
        return _write(output, hmodel, profile, cm, caches=caches, calibration=calibration, libs=libs, name=name,
                      task=task, optimize_level=optimize_level, optimized=optimized,
                      external_data_bytes=external_data_bytes, task_options=task_options, serving=serving,
                      shapes=shapes, warnings=[*warnings, *libs_warnings])
