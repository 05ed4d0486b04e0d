"""What the server serves: model files and model-repository folders, found, checked and loaded.

A served path is a model file (``.hybrid`` bundle or ``.onnx``; served as version 1 under its file stem,
or under ``NAME`` when given as ``NAME=PATH``) or a repository folder laid out as Triton users expect::

    repo/<model>/config.json            optional: serving settings and "target" for every version
    repo/<model>/config.pbtxt           optional: Triton's model configuration (hybrid.serve.triton.config)
    repo/<model>/<version>/model.hybrid (or model.onnx)

Versions are positive integers; a request without a version gets the highest. Names are checked against
one pattern everywhere (files, folders, URLs), and every path is resolved and must stay inside its
repository, so neither a request nor a link in the folder can reach a file outside it.

Serving settings come from, lowest first: the defaults, the bundle manifest's ``"serving"`` object,
the model folder's ``config.pbtxt``, its ``config.json``, and the command line.

A registry built from paths can load and unload the models of its repositories while serving
(:meth:`ModelRegistry.load`, :meth:`ModelRegistry.unload`; Triton's explicit model control), when the
server allows it. A load may carry the model's files itself (Triton's override files): they are written to a
folder of their own, laid out as a repository, served from there, and removed once the model is replaced or
unloaded, or the registry closes.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybrid.bundle import load_with_info
from hybrid.bundle.manifest import Manifest
from hybrid.config import backend_sections
from hybrid.errors import ConfigError, HybridError, ModelError, ServingError
from hybrid.hal import backend_class, backend_names
from hybrid.runtime.traffic import collector
from hybrid.serve.core.batcher import in_compute_policy
from hybrid.serve.core.model import BatchObserver, BatchSettings, ServedModel

__all__ = ["ModelIndexEntry", "ModelRegistry", "ModelSource", "build_registry", "check_name",
           "configure_backends", "discover", "load_model", "server_backend_defaults", "startup_sources"]

logger = logging.getLogger("hybrid.serve")

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
VERSION_RE = re.compile(r"[1-9][0-9]{0,17}")
MODEL_FILES = ("model.hybrid", "model.onnx")
SUFFIXES = (".hybrid", ".onnx")
CONFIG_FILE = "config.json"
_CONFIG_MAX = 64 << 10


def server_backend_defaults() -> dict[str, dict[str, Any]]:
    """Each installed backend's options for sharing the cores (:meth:`hybrid.hal.Backend.shared_options`).

    A server process shares them between the HTTP event loop and the runtime, whose idle threads must not spin
    between batches and starve the loop that forms the next one (DESIGN 4).
    """
    defaults = {}
    for name in backend_names():
        try:
            shared = backend_class(name).shared_options()
        except HybridError:  # a backend whose module cannot be imported has nothing to set
            continue
        if shared:
            defaults[name] = shared
    return defaults


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One model version to load.

    Attributes:
        name: Name on the server.
        version: Version string.
        path: Resolved path of the model file.
        settings: Serving settings from the bundle's folder (``config.json``), by BatchSettings field.
        target: The target the folder's config.json asks for, if any.
        config: The folder's ``config.pbtxt`` (Triton's ModelConfig), if any.
        notes: The fields of ``config.pbtxt`` not applied (or applied differently from Triton).
        compile: What the folder's config.json asks of the compile: ``precision``, ``min_cosine``.
        labels: The class labels of ``config.pbtxt``'s label files, by output name (the classification extension).
    """

    name: str
    version: str
    path: str
    settings: dict[str, Any] = field(default_factory=dict)
    target: str | None = None
    config: Any = None
    notes: tuple[str, ...] = ()
    compile: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _repo_error(message: str, hint: str | None = None) -> ServingError:
    return ServingError("HYB-707", message, hint or "see docs/serving.md for the repository layout")


def check_name(name: str, what: str = "model name") -> str:
    """Return ``name`` if it is a valid model name (or version, with ``what='version'``); raise HYB-702.

    Names are 1-128 letters, digits, '_', '-', '.', starting with a letter or digit: no separators, no
    '..', nothing a path could be built from that leaves the repository.
    """
    pattern = VERSION_RE if what == "version" else NAME_RE
    if not isinstance(name, str) or not pattern.fullmatch(name):
        expected = "a positive integer" if what == "version" else \
            "1-128 letters, digits, '_', '-' or '.', starting with a letter or digit"
        raise ServingError("HYB-702", f"invalid {what} {name!r}: expected {expected}",
                           "use a name the server lists at startup")
    return name


def _inside(root: Path, path: Path) -> Path:
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise _repo_error(f"{path} leads outside the repository {root} (to {resolved})",
                          "copy the model into the repository instead of linking to it")
    return resolved


def compile_request(precision: str | None, min_cosine: float | None, where: str) -> dict[str, Any]:
    """The compile options of ``--precision`` / ``--min-cosine`` (or config.json's keys), checked.

    Raises:
        ServingError: HYB-707 for a min_cosine that is not a number in (0, 1].
    """
    out: dict[str, Any] = {}
    if precision is not None:
        out["precision"] = precision
    if min_cosine is not None:
        if isinstance(min_cosine, bool) or not isinstance(min_cosine, (int, float)) or not 0 < min_cosine <= 1:
            raise _repo_error(f"{where}: min_cosine must be a number in (0, 1], got {min_cosine!r}",
                              "e.g. 0.995 (the least cosine similarity to the fp32 outputs)")
        out["accuracy"] = {"min_cosine": float(min_cosine)}
    return out


def _read_config(path: Path) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
    if path.stat().st_size > _CONFIG_MAX:
        raise _repo_error(f"{path} is larger than {_CONFIG_MAX} bytes")
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:
        raise _repo_error(f"{path} is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise _repo_error(f"{path} must hold a JSON object, got {type(doc).__name__}")
    target = doc.pop("target", None)
    if target is not None and not isinstance(target, str):
        raise _repo_error(f"{path}: 'target' must be a string, got {target!r}")
    precision = doc.pop("precision", None)
    if precision is not None and not isinstance(precision, str):
        raise _repo_error(f"{path}: 'precision' must be a string, got {precision!r}")
    wanted = compile_request(precision, doc.pop("min_cosine", None), str(path))
    BatchSettings().merged(doc, str(path))  # fail at discovery, not at load
    return doc, target, wanted


_LABELS_MAX = 16 << 20


def _read_labels(root: Path, model_path: Path, files: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """The labels of each output's label file (one per line, line i for class i), read from the model folder."""
    labels: dict[str, tuple[str, ...]] = {}
    for output, name in files.items():
        path = _inside(root, model_path / name)
        if not path.is_file():
            raise _repo_error(f"{model_path / 'config.pbtxt'}: output {output!r} names the label file {name!r}, "
                              f"which {model_path} does not hold", "put the file beside config.pbtxt, or remove "
                              "label_filename")
        if path.stat().st_size > _LABELS_MAX:
            raise _repo_error(f"{path}: a label file of {path.stat().st_size} bytes; at most {_LABELS_MAX} are read")
        try:
            labels[output] = tuple(path.read_text(encoding="utf-8").splitlines())
        except UnicodeDecodeError as e:
            raise _repo_error(f"{path} is not UTF-8 text: {e}", "save the labels as UTF-8, one per line") from e
    return labels


def _read_pbtxt(root: Path, model_path: Path, settings: dict[str, Any],
                override: Any = None) -> tuple[Any, tuple[str, ...], dict[str, tuple[str, ...]]]:
    """The folder's config.pbtxt, if any, its notes and its labels; its settings go under ``settings``.

    config.json's keys win over config.pbtxt's. ``override`` (a ``ModelConfig`` a load request carries) stands for
    the file.
    """
    path = model_path / "config.pbtxt"
    if override is None and not path.exists():
        return None, (), {}
    from hybrid.serve.triton import config as tc

    config = override if override is not None else tc.read_pbtxt(_inside(root, path))
    if override is not None:
        path = model_path / "config.pbtxt (the load request's config)"
    if config.name and config.name != model_path.name:
        raise _repo_error(f"{path}: name {config.name!r} differs from the model folder {model_path.name!r}",
                          "Triton requires the two to match: fix the name or remove it")
    mapped, notes = tc.settings_of(config, str(path))
    tc.schedule_policy(config, str(path))  # checked here, before any compile; applied when the model is made
    BatchSettings().merged(mapped, str(path))
    for key, value in mapped.items():
        settings.setdefault(key, value)
    labels = _read_labels(root, model_path, tc.label_files(config))
    return config, (*notes, *tc.unmapped_fields(config)), labels


def _single_file(arg: str) -> ModelSource:
    name, sep, rest = arg.partition("=")
    if sep and NAME_RE.fullmatch(name) and not Path(arg).exists():
        path = Path(rest)
    else:
        name, path = Path(arg).stem, Path(arg)
    if not NAME_RE.fullmatch(name):
        raise _repo_error(f"cannot serve {arg!r} under the name {name!r}: names are letters, digits, '_', '-' "
                          "and '.'", "give a name: NAME=PATH")
    if not path.is_file():
        raise ModelError("HYB-201", f"model file {str(path)!r} not found", "check the path")
    if path.suffix not in SUFFIXES:
        raise _repo_error(f"{path}: expected a .hybrid bundle, an .onnx model or a repository folder")
    return ModelSource(name, "1", str(path.resolve()))


def _repository(root_arg: Path, overrides: Mapping[str, Any], only: str | None = None) -> list[ModelSource]:
    root = root_arg.resolve()
    found: list[ModelSource] = []
    for model_dir in sorted(root.iterdir()):
        if model_dir.name.startswith(".") or not model_dir.is_dir() or only not in (None, model_dir.name):
            continue
        if not NAME_RE.fullmatch(model_dir.name):
            raise _repo_error(f"{model_dir}: invalid model name {model_dir.name!r}")
        model_path = _inside(root, model_dir)
        config = model_path / CONFIG_FILE
        settings, target, wanted = _read_config(_inside(root, config)) if config.exists() else ({}, None, {})
        pbtxt, notes, labels = _read_pbtxt(root, model_path, settings, overrides.get(model_dir.name))
        versions = [d for d in model_path.iterdir() if d.is_dir() and VERSION_RE.fullmatch(d.name)]
        if not versions:
            raise _repo_error(f"{model_dir} has no version folder (a positive integer such as 1/)")
        if pbtxt is not None:  # Triton's version policy: the others are neither loaded nor listed
            from hybrid.serve.triton.config import policy_versions

            served = set(policy_versions(pbtxt, [int(d.name) for d in versions], str(model_path / "config.pbtxt")))
            versions = [d for d in versions if int(d.name) in served]
        for version_dir in sorted(versions, key=lambda d: int(d.name)):
            files = [version_dir / f for f in MODEL_FILES if (version_dir / f).exists()]
            if len(files) != 1:
                raise _repo_error(f"{version_dir} must hold exactly one of {', '.join(MODEL_FILES)}, found "
                                  f"{len(files)}")
            path = _inside(root, files[0])
            if not path.is_file():
                raise _repo_error(f"{files[0]} is not a file")
            found.append(ModelSource(model_dir.name, version_dir.name, str(path), settings, target, pbtxt, notes,
                                     wanted, labels))
    if not found and only is None:
        raise _repo_error(f"the repository {root} holds no model")
    return found


def discover(paths: Sequence[str | Path], configs: Mapping[str, Any] | None = None,
             only: str | None = None) -> list[ModelSource]:
    """Find every model version under the given files and repository folders.

    Args:
        paths: Model files and repository folders.
        configs: Model name -> the ``ModelConfig`` that stands for its folder's ``config.pbtxt`` (a load request's
            ``config`` parameter).
        only: The one model to find: the other folders of a repository are not read (a broken one does not
            stand in the way of loading this one).

    Raises:
        ModelError: HYB-201 for a path that does not exist.
        ServingError: HYB-707 for a layout error or a model name served twice; HYB-702 for a configuration
            given for a model that is not in a repository folder.
    """
    configs = dict(configs or {})
    sources: list[ModelSource] = []
    for arg in paths:
        path = Path(arg)
        if not path.is_dir():
            sources.append(_single_file(str(arg)))
            continue
        from hybrid.serve.core.model_dir import folder_layout  # a repository, loose model files or an unpacked bundle

        kind, files = folder_layout(path)
        sources += _repository(path, configs, only) if kind == "repository" else [_single_file(f) for f in files]
    if only is not None:
        sources = [s for s in sources if s.name == only]
    for s in sources:
        if s.name in configs and s.config is not configs[s.name]:
            raise ServingError("HYB-702", f"model {s.name!r} is served from a file ({s.path}), not a repository "
                               "folder: a load request's config has no config.pbtxt to stand for",
                               "serve it from a repository (repo/<model>/<version>/model.onnx)")
    seen: set[tuple[str, str]] = set()
    for s in sources:
        if (s.name, s.version) in seen:
            raise _repo_error(f"model {s.name!r} version {s.version} is served twice (last from {s.path})",
                              "name one of them: NAME=PATH")
        seen.add((s.name, s.version))
    return sources


def configure_backends(config: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Set this process's backend defaults for serving: :func:`server_backend_defaults` under ``config``.

    Called by ``pyasc serve`` and by each Ray Serve replica (both own their process) before models load.

    Args:
        config: Backend name -> options, as for ``hybrid.set_backend``; wins over the server defaults.

    Raises:
        ConfigError: HYB-102 when ``config`` is not a mapping of mappings.
        BackendError: HYB-301/306 for an unknown backend or option.
    """
    from hybrid.api import set_backend

    merged = server_backend_defaults()
    for name, opts in backend_sections(config or {}).items():
        merged[name] = {**merged.get(name, {}), **opts}
    for name, opts in merged.items():
        set_backend(name, opts)
    return merged


def _manifest_serving(manifest: Manifest) -> dict[str, Any]:
    """The settings of a bundle's ``"serving"`` object, from the manifest the verified reader checked.

    Keys the bundle left unset keep the server's defaults and command-line values.
    """
    return {} if manifest.serving is None else manifest.serving.model_dump(exclude_none=True)


def _unhonoured(notes: tuple[str, ...], config: Any, device: str) -> tuple[str, ...]:
    """The notes of a configuration without ``instance_group.kind`` where the model runs where it asks.

    pyasc does not place a model by the kind, but ``KIND_CPU`` (or ``KIND_GPU``) is honoured when the model was
    compiled for such a device; ``KIND_AUTO`` always is. Otherwise the kind stays among the fields not applied.
    """
    if "instance_group.kind" not in notes:
        return notes
    from tritonclient.grpc import model_config_pb2 as mc

    groups = mc.ModelInstanceGroup
    on_cpu = device.startswith("cpu")
    honoured = all(g.kind == groups.KIND_AUTO or (g.kind == groups.KIND_CPU and on_cpu)
                   or (g.kind == groups.KIND_GPU and bool(device) and not on_cpu) for g in config.instance_group)
    return tuple(n for n in notes if n != "instance_group.kind") if honoured else notes


def load_model(source: ModelSource, target: str | None = None, overrides: Mapping[str, Any] | None = None,
               defaults: BatchSettings | None = None, observer: BatchObserver | None = None,
               compile_options: Mapping[str, Any] | None = None, warmup: int = 0) -> ServedModel:
    """Compile (``.onnx``) or load (``.hybrid``) one model version, wrap it for serving and warm it up.

    Args:
        source: What to load.
        target: Target for every model; None: the folder's config.json, else 'auto'.
        overrides: Serving settings from the command line; they win over the bundle and the folder.
        defaults: Settings before any override.
        observer: Called after each batch.
        compile_options: ``precision`` and ``accuracy`` for the compile (``--precision``, ``--min-cosine``);
            they win over the folder's config.json. A ``.hybrid`` bundle keeps its own compiled precision.
        warmup: Random warm-up calls (:func:`hybrid.serve.core.warmup.random_samples`) when the folder's
            config.pbtxt has no ``model_warmup``.
    """
    chosen = target or source.target or "auto"
    wanted = {**source.compile, **dict(compile_options or {})}
    manifest: dict[str, Any] = {}
    if source.path.endswith(".hybrid"):
        compiled, info = load_with_info(source.path, target=chosen)
        manifest = _manifest_serving(info.manifest)
        platform = "hybrid"
        if wanted:
            logger.warning("model %r: %s applies to ONNX models; the bundle %s keeps its compiled precision",
                           source.name, ", ".join(wanted), source.path)
            wanted = {}
    else:
        from hybrid.runtime.compiler import compile_model

        compiled = compile_model(source.path, target=chosen, **wanted)
        platform = "onnx"
    where = f"model {source.name!r} version {source.version}"
    settings = (defaults or BatchSettings()).merged(manifest, f"{where} (manifest 'serving')")
    settings = settings.merged(source.settings, f"{where} ({CONFIG_FILE})")
    settings = settings.merged(dict(overrides or {}), f"{where} (command line)")
    if source.config is not None:
        from hybrid.serve.triton.config import check_signature

        try:
            check_signature(source.config, compiled.signature, f"{where} (config.pbtxt)")
        except BaseException:
            compiled.close()
            raise
        notes = _unhonoured(source.notes, source.config, str(getattr(compiled, "device", "")))
        if notes:
            logger.warning("%s: config.pbtxt fields not applied by pyasc: %s", where, "; ".join(notes))
    sequences = None
    if source.config is not None:
        from hybrid.serve.triton.sequences import SequenceSettings

        try:
            sequences = SequenceSettings.from_config(source.config, compiled.signature, f"{where} (config.pbtxt)",
                                                     Path(source.path).parent.parent)
        except BaseException:
            compiled.close()
            raise
    # the configuration is reported by the model-configuration endpoints
    schedule = None
    if source.config is not None:
        from hybrid.serve.triton.config import schedule_policy

        schedule = schedule_policy(source.config, f"{where} (config.pbtxt)")
    served = ServedModel(source.name, source.version, compiled, settings, platform, observer,
                         model_config=source.config, sequences=sequences, schedule=schedule)
    served.labels = dict(source.labels)
    served.compile_request = wanted
    try:
        from hybrid.serve.core.warmup import pbtxt_samples, random_samples

        samples = pbtxt_samples(served, Path(source.path).parent.parent) if source.config is not None else []
        served.warm_up(samples or random_samples(served, warmup))
    except BaseException:
        served.close()
        raise
    logger.info("serving %r version %s from %s on %s:%s (%s)", source.name, source.version, source.path,
                compiled.backend, compiled.device, settings)
    return served


@dataclass(frozen=True, slots=True)
class ModelIndexEntry:
    """One row of the repository index: a model version found or loaded, its state and why."""

    name: str
    version: str
    state: str  # 'READY', 'UNAVAILABLE' (found, not loaded) or 'UNLOADING'
    reason: str = ""


def _ordered(models: Sequence[ServedModel]) -> dict[str, dict[str, ServedModel]]:
    table: dict[str, dict[str, ServedModel]] = {}
    for m in models:
        table.setdefault(m.name, {})[m.version] = m
    return {name: dict(sorted(versions.items(), key=lambda kv: -int(kv[0])))  # highest version first
            for name, versions in table.items()}


class ModelRegistry:
    """The loaded model versions, looked up by name and optional version.

    Args:
        models: The loaded models.
        paths: The files and repositories they came from (what :meth:`index` and :meth:`load` read).
        load_args: What :func:`build_registry` was given besides the paths (a reload passes it on).
    """

    def __init__(self, models: Sequence[ServedModel], paths: Sequence[str | Path] = (),
                 load_args: Mapping[str, Any] | None = None) -> None:
        # replaced whole on load/unload (never mutated in place), so readers on other threads iterate safely
        self._models = _ordered(models)
        self.paths = list(paths)
        self.load_args = dict(load_args or {})
        self._idle_turn = threading.Lock()  # the models' idle tuners race one at a time (tune_when_idle)
        self.observer: BatchObserver | None = None  # given to the models load() adds
        self.on_load: Callable[[ServedModel], Any] | None = None  # called with each model load() adds
        self._control = threading.Lock()
        self._overrides: dict[str, Path] = {}  # model -> the folder a load's files were written to

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The model ``name`` at ``version`` (None: the highest).

        Raises:
            ServingError: HYB-702 for a malformed name or version, HYB-701 when none is served.
        """
        check_name(name)
        if version is not None:
            check_name(version, "version")
        versions = self._models.get(name)
        if not versions:
            raise ServingError("HYB-701", f"no model named {name!r} is served; served: "
                               f"{', '.join(self._models) or 'none'}", "GET /v2/models/<name> with one of them")
        if version is None:
            return next(iter(versions.values()))
        if version not in versions:
            raise ServingError("HYB-701", f"model {name!r} has no version {version}; versions: "
                               f"{', '.join(versions)}", "omit the version for the newest")
        return versions[version]

    def versions(self, name: str) -> list[str]:
        """The served versions of ``name``, highest first (none when it is not served)."""
        return list(self._models.get(name, {}))

    def __iter__(self) -> Iterator[ServedModel]:
        for versions in self._models.values():
            yield from versions.values()

    def __len__(self) -> int:
        return sum(len(v) for v in self._models.values())

    def index(self) -> list[ModelIndexEntry]:
        """Every model version loaded or found under the registry's paths, with its state."""
        entries = {(m.name, m.version): ModelIndexEntry(m.name, m.version, "READY" if m.ready else "UNAVAILABLE")
                   for m in self}
        if self.paths:
            try:
                found = discover(self.paths)
            except HybridError as e:
                logger.warning("repository index: %s", e)
                found = []
            for s in found:
                entries.setdefault((s.name, s.version),
                                   ModelIndexEntry(s.name, s.version, "UNAVAILABLE", "unloaded"))
        return sorted(entries.values(), key=lambda e: (e.name, int(e.version)))

    def load(self, name: str, config: Any = None, files: Mapping[str, bytes] | None = None) -> list[ServedModel]:
        """Load (or reload) every version of ``name`` from the registry's paths, or from the files given.

        The versions served before are replaced, then drained and closed (their queued requests still answered).

        Args:
            name: The model.
            config: Triton's ``config`` load parameter (a ``ModelConfig`` as JSON): it stands for the model's
                ``config.pbtxt`` for this load; the next load without one reads the file again.
            files: The model's files (path inside its folder, such as ``1/model.onnx`` -> bytes; Triton's
                ``file:`` load parameters, checked by :func:`hybrid.serve.triton.config.load_request`): the model
                is served from them alone, written to a folder of its own (removed once the model is replaced or
                unloaded); a later load without files reads the registry's paths again.

        Raises:
            ServingError: HYB-702 for a bad name or configuration or files that do not load as a model, HYB-701
                when no path holds the model, HYB-707 for files that do not make a model folder (a version folder
                with one model file).
            HybridError: what loading raised; the versions served before stay (and files given are removed).
        """
        check_name(name)
        configs = {}
        if config is not None:
            from hybrid.serve.triton.config import config_from_json

            configs[name] = config_from_json(config, name)
        folder = _override_folder(name, files) if files else None
        try:
            with self._control:
                paths = [folder] if folder is not None else self.paths
                sources = discover(paths, configs, only=name) if paths else []
                if not sources:
                    raise ServingError("HYB-701", f"no model named {name!r} in the served repositories "
                                       f"({', '.join(map(str, self.paths)) or 'none'})",
                                       "POST /v2/repository/index lists the models that can be loaded")
                args = {**self.load_args, "idle_tuning": False}  # started below, idle when the whole server is
                fresh = build_registry([], sources=sources, **args)  # in the models' scheduling
                for m in fresh:
                    m.observer = self.observer
                    if self.on_load is not None:
                        self.on_load(m)
                table = dict(self._models)
                old = list(table.pop(name, {}).values())
                table[name] = _ordered(list(fresh))[name]
                self._models = table
                stale = self._overrides.pop(name, None)
                if folder is not None:
                    self._overrides[name] = folder
        except BaseException as e:
            if folder is None:
                raise
            shutil.rmtree(folder, ignore_errors=True)
            if isinstance(e, ModelError):  # the client sent a file that is not a model: its mistake, a 400
                raise ServingError("HYB-702", f"the model files of the load do not load: {e.message}",
                                   e.hint) from e
            raise
        self._retire(old, stale)
        if self.load_args.get("idle_tuning"):
            self.tune_when_idle(list(fresh))
        return list(fresh)

    def unload(self, name: str) -> None:
        """Stop serving every version of ``name``: new requests get HYB-701, queued ones are answered.

        Raises:
            ServingError: HYB-701 when ``name`` is not served.
        """
        self.get(name)
        with self._control:
            table = dict(self._models)
            old = list(table.pop(name, {}).values())
            self._models = table
            stale = self._overrides.pop(name, None)
        self._retire(old, stale)

    @property
    def override_folders(self) -> dict[str, Path]:
        """The folder each model loaded from a request's files is served from, by model name."""
        return dict(self._overrides)

    def idle_for(self, now: float) -> float | None:
        """Seconds at ``now`` (``time.monotonic()``) since the last request to any served model ended.

        None while one runs. A model that is not ready (closed, or warming up) does not count.
        """
        idle = math.inf
        for model in self:
            if model.ready:
                mine = model.idle_for(now)
                if mine is None:
                    return None
                idle = min(idle, mine)
        return idle

    def tune_when_idle(self, models: Sequence[ServedModel] | None = None) -> None:
        """Start the idle tuning of ``models`` (default: all) while the server is idle (:meth:`idle_for`).

        Their races take turns: one model's bucket at a time.
        """
        from hybrid.serve.core.idle_tuning import start_idle_tuning

        for model in self if models is None else models:
            start_idle_tuning(model, self.idle_for, turn=self._idle_turn)

    @staticmethod
    def _retire(models: list[ServedModel], folder: Path | None = None) -> None:
        """Close ``models`` (each drains first), then remove the folder of files they were loaded from."""
        for m in models:
            try:
                m.close()
            except HybridError as e:
                logger.warning("closing %s: %s", m, e)
        if models:  # their objects may be frozen out of the collector (runtime.traffic.collector): let it reclaim them
            collector.thaw()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def drain(self, timeout: float | None = None) -> None:
        """Every model refuses new requests and runs what it has queued."""
        for m in self:
            m.drain(timeout)

    def close(self) -> None:
        """Close every model (each drains, then releases its backend); a failure is logged and the rest still close.

        The folders of models loaded from a request's files are removed after.
        """
        for m in self:
            try:
                m.close()
            except HybridError as e:  # closing must reach every model
                logger.warning("closing %s: %s", m, e)
        with self._control:
            folders, self._overrides = list(self._overrides.values()), {}
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def _override_folder(name: str, files: Mapping[str, bytes]) -> Path:
    """A new repository folder holding ``name``'s folder made of ``files`` (relative path -> bytes), written whole.

    The paths were checked by :func:`hybrid.serve.triton.config.load_request`; each is checked again to stay
    inside the folder.

    Raises:
        ServingError: HYB-702 for a path that leaves the model's folder; OSError where the files cannot be written
            (the folder is removed).
    """
    root = Path(tempfile.mkdtemp(prefix=f"pyasc-load-{name}-")).resolve()
    model = root / name
    try:
        for relative, data in files.items():
            path = (model / relative).resolve()
            if not path.is_relative_to(model):
                raise ServingError("HYB-702", f"load file {relative!r} is outside the model's folder",
                                   "name it inside the folder: file:1/model.onnx")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def startup_sources(paths: Sequence[str | Path], names: Sequence[str]) -> list[ModelSource]:
    """The model versions under ``paths`` of the models ``names`` (``'*'``: all), as ``--load-model`` picks them.

    The paths are checked (:func:`discover`) whatever the names, none included.

    Raises:
        ConfigError: HYB-102 naming a model that no path holds, with the names they do hold.
    """
    found = discover(paths)
    if "*" in names:
        return found
    held = sorted({s.name for s in found})
    missing = [n for n in names if n not in held]
    if missing:
        raise ConfigError("HYB-102", f"--load-model {', '.join(missing)}: no such model in the served repositories "
                          f"(they hold: {', '.join(held) or 'nothing'})", "name a model folder of a repository")
    return [s for s in found if s.name in names]


def build_registry(paths: Sequence[str | Path], target: str | None = None,
                   overrides: Mapping[str, Any] | None = None, defaults: BatchSettings | None = None,
                   sources: Sequence[ModelSource] | None = None, compile_options: Mapping[str, Any] | None = None,
                   warmup: int = 0, idle_tuning: bool = False, freeze_tuning: bool = False) -> ModelRegistry:
    """Discover and load every model under ``paths`` (or the given ``sources``) into a registry.

    Each is compiled with ``compile_options`` and warmed up (see :func:`load_model`), in a thread of the
    models' scheduling (:func:`hybrid.serve.core.batcher.in_compute_policy`), so that the threads a runtime starts
    meanwhile (its intra-op pool) yield CPU weight to the server's front end as the batch runners do, whichever
    thread calls this (the CLI's main thread, or an executor thread of the ``SCHED_BATCH`` front end).
    ``idle_tuning``: once all are loaded, each model that tunes online decides its batch-size buckets while
    the server has no requests (:mod:`hybrid.serve.core.idle_tuning`; ``pyasc serve`` turns it on).
    ``freeze_tuning``: once each is loaded and warmed up, its tuning stops (``CompiledModel.freeze``; ``pyasc serve
    --freeze-tuning``), for the models loaded later through the repository API too.

    Raises:
        HybridError: what discovery or loading raised; models loaded so far are closed first.
    """
    found = list(sources) if sources is not None else discover(paths)
    loaded: list[ServedModel] = []

    def load_all() -> None:
        for source in found:
            loaded.append(load_model(source, target, overrides, defaults, compile_options=compile_options,
                                     warmup=warmup))
            if freeze_tuning:
                loaded[-1].compiled.freeze()

    try:
        in_compute_policy(load_all)
    except BaseException:
        ModelRegistry(loaded).close()
        raise
    registry = ModelRegistry(loaded, paths, {"target": target, "overrides": overrides, "defaults": defaults,
                                             "compile_options": compile_options, "warmup": warmup,
                                             "idle_tuning": idle_tuning, "freeze_tuning": freeze_tuning})
    if idle_tuning:
        registry.tune_when_idle()
    return registry
