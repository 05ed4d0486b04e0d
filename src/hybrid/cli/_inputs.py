"""Command-line inputs shared by run, bench, profile, quantize and bundle create.

``--input NAME=FILE.npy``, ``--shapes NAME:DIMS`` (or trtexec's ``--min/--opt/--max-shapes`` range),
``--batch`` and generated inputs. One rule for every command: a symbolic dim gets its size from
``--shapes``, from an ``--input`` file, from another input that shares the dim's name, or (dim 0 only)
from ``--batch``; else the command stops with HYB-417 naming the dims. No size is ever made up.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.errors import ConfigError, ModelError, RunError

__all__ = ["Inputs", "bundle_shapes", "check_declared", "declared_shapes", "dims", "generated_inputs", "load_compiled",
           "load_inputs", "load_model", "model_path", "parse_shapes", "resolve_inputs", "shapes_line", "shapes_text"]

_MODEL_SUFFIXES = (".onnx", ".hybrid")


def dims(shape: Any) -> str:
    """A shape in the command line's spelling: ``1x3x480x640`` (``scalar`` for ``()``, ``?`` for unknown)."""
    if shape is None:
        return "?"
    return "x".join(str(d) for d in shape) or "scalar"


def model_path(path: Path) -> Path:
    """MODEL as given, or the one model file in a folder given as MODEL.

    Raises:
        ModelError: HYB-201 for a path that does not exist; HYB-203 for a folder that holds no model or
            several (naming them).
    """
    path = Path(path)
    if not path.is_dir():
        return path  # a missing file is HYB-201 from the loader, with its wording
    found = sorted(p for p in path.iterdir() if p.suffix in _MODEL_SUFFIXES and p.is_file())
    if len(found) == 1:
        return found[0]
    listed = ", ".join(p.name for p in found[:8]) + (" ..." if len(found) > 8 else "")
    what = f"holds {len(found)} models ({listed})" if found else "holds no .onnx or .hybrid file"
    raise ModelError("HYB-203", f"MODEL {str(path)!r} is a folder, and it {what}",
                     "give the model file itself, e.g. " + (str(found[0]) if found else f"{path}/model.onnx"))


def load_model(path: Path) -> Any:
    """The hybrid.Model of an .onnx file or a .hybrid bundle (a folder holding one model is accepted)."""
    from hybrid.ir import Model

    path = model_path(path)
    if path.is_file():
        with open(path, "rb") as f:
            is_zip = f.read(4) == b"PK\x03\x04"
        if is_zip:
            from hybrid.bundle.format import BundleReader
            from hybrid.bundle.load import read_model

            with BundleReader(path) as reader:
                return read_model(reader)
    return Model.load(path)  # HYB-201 for a missing file


def bundle_shapes(path: Path, given: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The shapes a ``.hybrid`` bundle declares (``bundle create --shapes``), but for the inputs in ``given``.

    None for an .onnx file or a bundle that declares none: run, bench and profile use these when no
    ``--shapes`` is given, so a bundle made for 1x3x480x640 runs at 1x3x480x640 without repeating it.
    """
    if path.suffix != ".hybrid" or not path.is_file():
        return None
    from hybrid.bundle.format import BundleReader

    with BundleReader(path) as reader:
        shapes = reader.manifest.declared_shapes() or {}
    shapes = {k: v for k, v in shapes.items() if k not in (given or {})}
    return shapes or None


def load_inputs(specs: list[str] | None) -> dict[str, np.ndarray] | None:
    """``NAME=FILE.npy`` options to feeds (numpy.load without pickle); None when none are given."""
    if not specs:
        return None
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path or not Path(path).is_file():
            raise RunError("HYB-406", f"--input expects NAME=FILE.npy with an existing file, got {spec!r}",
                           "e.g. --input data_0=image.npy")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise RunError("HYB-406", f"--input {name}: {path!r} is not a .npy array ({e})",
                           "save inputs with numpy.save") from e
    return feeds


def parse_shapes(text: str | None) -> dict[str, tuple[int, ...]]:
    """``--shapes x:1x3x480x640,mask:1x128`` (trtexec's spelling) to ``{'x': (1, 3, 480, 640), ...}``.

    Raises:
        ConfigError: HYB-102 naming the part that does not parse.
    """
    if not text:
        return {}
    from hybrid.runtime.auto import parse_shapes as parse

    return dict(parse(text))


def declared_shapes(shapes: str | None, min_s: str | None = None, opt_s: str | None = None,
                    max_s: str | None = None) -> dict[str, Any] | None:
    """``--shapes`` or trtexec's ``--min-shapes/--opt-shapes/--max-shapes`` as ``compile(shapes=...)``.

    Raises:
        ConfigError: HYB-102 when both ``--shapes`` and a range flag are given (they contradict), or a
            range names an input in ``--min-shapes`` but not in ``--max-shapes`` (or the reverse).
    """
    ranged = [f for f, t in (("--min-shapes", min_s), ("--opt-shapes", opt_s), ("--max-shapes", max_s)) if t]
    if shapes and ranged:
        raise ConfigError("HYB-102", f"--shapes and {', '.join(ranged)} both give the shapes to run; give one",
                          "--shapes x:1x3x480x640 for one shape, or --min-shapes/--opt-shapes/--max-shapes for a "
                          "range")
    if shapes:
        return dict(parse_shapes(shapes)) or None
    parts = {key: parse_shapes(text) for key, text in (("min", min_s), ("opt", opt_s), ("max", max_s)) if text}
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, named in parts.items():
        for name, shape in named.items():
            out.setdefault(name, {})[key] = shape
    for name, rng in out.items():
        if ("min" in rng) != ("max" in rng):
            have, lack = ("min", "max") if "min" in rng else ("max", "min")
            raise ConfigError("HYB-102", f"--{have}-shapes names input {name!r}, --{lack}-shapes does not",
                              f"give {name} in --min-shapes and --max-shapes (and --opt-shapes for the timed one)")
    return out or None


def _is_dynamic(d: Any) -> bool:
    return not isinstance(d, int) or d < 0


def _opt(value: Any) -> tuple[int, ...]:
    if isinstance(value, Mapping):
        return tuple(value.get("opt", value.get("max")))
    return tuple(value)


def check_declared(signature: Any, declared: Mapping[str, Any]) -> None:
    """``--shapes`` against the model, in the command line's words (no tuple reprs)."""
    specs = {s.name: s for s in signature.inputs}
    for name, value in declared.items():
        if name not in specs:
            raise ConfigError("HYB-102", f"--shapes names input {name!r}; the model's inputs: "
                              f"{', '.join(specs) or 'none'}", "name the model's inputs")
        spec = specs[name]
        for key, shape in (value.items() if isinstance(value, Mapping) else (("", value),)):
            flag = f"--{key}-shapes" if key else "--shapes"
            if spec.shape is None:
                continue
            if len(shape) != len(spec.shape):
                raise ConfigError("HYB-102", f"{flag} {name}:{dims(shape)}: the model's {name} has rank "
                                  f"{len(spec.shape)} ({dims(spec.shape)}), {flag} gives {len(shape)} dims",
                                  f"one size per dim, e.g. {flag} {shapes_line(spec)}")
            for i, (want, got) in enumerate(zip(spec.shape, shape)):
                if not _is_dynamic(want) and want != got:
                    raise ConfigError("HYB-102", f"{flag} {name}:{dims(shape)}: dim {i} of {name} is fixed at "
                                      f"{want} in the model ({dims(spec.shape)}), got {got}",
                                      f"use {want} for dim {i}")
        if isinstance(value, Mapping):
            order = [value[k] for k in ("min", "opt", "max") if k in value]
            if len({len(x) for x in order}) == 1 and not all(
                    all(a <= b for a, b in zip(lo, hi)) for lo, hi in itertools.pairwise(order)):
                given = ", ".join(f"--{k}-shapes {name}:{dims(value[k])}" for k in ("min", "opt", "max") if k in value)
                raise ConfigError("HYB-102", f"the range of {name} is out of order: {given}",
                                  "every dim needs min <= opt <= max")


def shapes_text(declared: Mapping[str, Any]) -> str:
    """Declared shapes in words: ``x: 1x3x480x640`` or ``x: min 1x3x320x320, opt ..., max ...``."""
    out = []
    for name, value in declared.items():
        if isinstance(value, Mapping):
            out.append(f"{name}: " + ", ".join(f"{k} {dims(v)}" for k, v in value.items()))
        else:
            out.append(f"{name}: {dims(value)}")
    return "; ".join(out)


def shapes_line(spec: Any) -> str:
    """``NAME:DIMS`` for ``--shapes``, with a placeholder for each dynamic dim.

    Static dims as the model has them; a dynamic dim as its name in capitals (``x:1x3xHEIGHTxWIDTH``),
    ``D<axis>`` for an unnamed one.
    """
    if spec.shape is None:
        return f"{spec.name}:D0xD1"
    parts = []
    for i, d in enumerate(spec.shape):
        if not _is_dynamic(d):
            parts.append(str(d))
        elif isinstance(d, str) and d != "?" and d.isidentifier():
            parts.append(d.upper())
        else:
            parts.append(f"D{i}")
    return f"{spec.name}:{'x'.join(parts)}"


@dataclass
class Inputs:
    """The feeds a command runs, and where each input's shape came from.

    Attributes:
        feeds: Every input, as arrays.
        sources: Per input, 'file' (``--input``) or 'generated'.
        compile_shapes: ``compile(shapes=...)`` for the inputs with dynamic dims: the declared range, or the
            shape run (None for a static model).
    """

    feeds: dict[str, np.ndarray]
    sources: dict[str, str] = field(default_factory=dict)
    compile_shapes: dict[str, Any] | None = None

    @property
    def shapes(self) -> dict[str, list[int]]:
        """Each input's shape as run (JSON-ready)."""
        return {k: [int(n) for n in np.shape(v)] for k, v in self.feeds.items()}

    def describe(self) -> str:
        """``x: float32[1x3x480x640] (generated)`` for every input, comma separated."""
        return ", ".join(f"{k}: {np.asarray(v).dtype}[{dims(np.shape(v))}] ({self.sources.get(k, 'file')})"
                         for k, v in self.feeds.items()) or "none"


def resolve_inputs(model: Any, given: Mapping[str, np.ndarray] | None = None,
                   declared: Mapping[str, Any] | None = None, *, generate: bool = True, batch: int | None = None,
                   seed: int = 0, command: str = "run MODEL", alternative: str = "--input NAME=FILE.npy",
                   has_batch: bool = False) -> Inputs:
    """The inputs a command runs ``model`` (a hybrid.Model) on.

    The ``--input`` files, the rest generated the way auto-selection makes its samples at sizes the user
    gave.

    Args:
        model: The model.
        given: ``--input`` arrays.
        declared: :func:`declared_shapes` (``--shapes`` or a range; generated inputs take ``opt``).
        generate: Generate the inputs not given (run without ``--random``/``--shapes`` does not).
        batch: ``--batch``: the size of dim 0 where it is dynamic and nothing else sizes it.
        seed: Random seed of generated inputs.
        command: The command and model, for the hint (``bench det.onnx``: ``pyasc bench det.onnx --shapes ...``).
        alternative: The other way to give a size, for the hint ('' for none).
        has_batch: The command has ``--batch`` (the hint names it when only dim 0 lacks a size).

    Raises:
        ConfigError: HYB-102 for ``--shapes`` that do not fit the model or contradict an ``--input`` file.
        RunError: HYB-401 for inputs missing when nothing is generated; HYB-417 for a dynamic dim nothing
            gives a size to; HYB-406 for an input that cannot be generated.
    """
    from hybrid.runtime.auto import normalize_shapes
    from hybrid.runtime.profiler import sample_inputs

    sig = model.signature
    given = dict(given or {})
    declared = dict(declared or {})
    check_declared(sig, declared)
    normalize_shapes(sig, declared)  # range order and the rest
    specs_by_name = {s.name: s for s in sig.inputs}
    for name, arr in given.items():
        spec = specs_by_name.get(name)
        if spec is None:
            raise RunError("HYB-402", f"--input {name}: the model has no input {name!r}; its inputs: "
                           f"{', '.join(str(s) for s in sig.inputs)}", "name the file after one of the model's inputs")
        shape = tuple(np.shape(arr))
        if spec.shape is not None and len(shape) != len(spec.shape):
            raise RunError("HYB-404", f"--input {name}: the file holds {dims(shape)} (rank {len(shape)}), the model's "
                           f"{name} is {dims(spec.shape)} (rank {len(spec.shape)})",
                           "save the array with the model's rank (np.expand_dims(x, 0) adds a batch axis)")
        for i, (want, got) in enumerate(zip(spec.shape or (), shape)):
            if not _is_dynamic(want) and want != got:
                raise RunError("HYB-405", f"--input {name}: the file holds {dims(shape)}; dim {i} of {name} is fixed "
                               f"at {want} in the model ({dims(spec.shape)}), got {got}", f"use {want} for dim {i}")
        if name in declared and _opt(declared[name]) != tuple(np.shape(arr)):
            raise ConfigError("HYB-102", f"--input {name} is {dims(np.shape(arr))} but --shapes says "
                              f"{name}:{dims(_opt(declared[name]))}; they contradict",
                              f"drop {name} from --shapes (the file's shape is used)")
    specs = [s for s in sig.inputs]
    missing = [s for s in specs if s.name not in given]
    if missing and not generate:
        names = ", ".join(repr(s.name) for s in missing)
        raise RunError("HYB-401", f"model {model.name!r} needs input{'s' if len(missing) > 1 else ''} {names} "
                       f"and none was given; its inputs: {', '.join(str(s) for s in specs)}",
                       f"-i {missing[0].name}=FILE.npy gives it from a file; --random generates it"
                       + (f" (with --shapes {shapes_line(missing[0])} for its dynamic dims)"
                          if missing[0].name not in declared
                          and (missing[0].shape is None or any(map(_is_dynamic, missing[0].shape))) else ""))
    # sizes of named dims from what is known: the files, then the declared shapes
    named: dict[str, int] = {}
    for s in specs:
        shape = np.shape(given[s.name]) if s.name in given else _opt(declared[s.name]) if s.name in declared \
            else None
        if shape is not None and s.shape is not None and len(shape) == len(s.shape):
            for d, n in zip(s.shape, shape):
                if isinstance(d, str) and d != "?":
                    named.setdefault(d, int(n))
    concrete: dict[str, tuple[int, ...]] = {}
    unsized: list[tuple[Any, list[str]]] = []
    for s in missing:
        if s.name in declared:
            concrete[s.name] = _opt(declared[s.name])
            continue
        if s.kind != "tensor":
            continue  # sample_inputs says what it cannot make
        if s.shape is None:
            unsized.append((s, ["its rank"]))
            continue
        shape, lacking = [], []
        for i, d in enumerate(s.shape):
            if not _is_dynamic(d):
                shape.append(d)
            elif isinstance(d, str) and d in named:
                shape.append(named[d])
            elif i == 0 and batch is not None:
                shape.append(batch)
            else:
                lacking.append(f"dim {i} ({d})" if isinstance(d, str) and d != "?" else f"dim {i}")
                shape.append(1)
        if lacking:
            unsized.append((s, lacking))
        else:
            concrete[s.name] = tuple(shape)
    if unsized:
        only_dim0 = all(len(lack) == 1 and lack[0].split(" ")[:2] == ["dim", "0"] for _, lack in unsized)
        what = "; ".join(f"{s.name} {s.dtype}[{dims(s.shape)}]: {', '.join(lacking)}" for s, lacking in unsized)
        line = ",".join(shapes_line(s) for s, _ in unsized)
        raise RunError("HYB-417", f"dynamic input dims have no size: {what}; give the shapes to run (nothing is "
                       "made up)", f"pyasc {command} --shapes {line} (replace the capitals with the sizes "
                       "you run)" + (f", or {alternative}" if alternative else "")
                       + (" (--batch N sizes a dynamic dim 0)" if has_batch and only_dim0 else ""))
    feeds: dict[str, np.ndarray] = {}
    if concrete:
        made = sample_inputs(model, 1, seed, shapes=concrete)
        feeds.update({k: v for k, v in made.items() if k not in given})
    feeds.update(given)
    feeds = {s.name: feeds[s.name] for s in specs if s.name in feeds}
    dynamic = [s for s in specs if s.shape is None or any(map(_is_dynamic, s.shape))]
    compile_shapes = {s.name: declared[s.name] if s.name in declared else tuple(np.shape(feeds[s.name]))
                      for s in dynamic if s.name in feeds and s.kind == "tensor"} or None
    return Inputs(feeds, {k: "file" if k in given else "generated" for k in feeds}, compile_shapes)


def generated_inputs(model: Any, shapes: str | Mapping[str, tuple[int, ...]] | None = None, batch: int | None = None,
                     seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for ``model`` (a hybrid.Model) at the sizes given.

    Made the way auto-selection makes its samples (:func:`hybrid.runtime.profiler.sample_inputs`), sized
    as :func:`resolve_inputs` sizes them.

    Raises:
        ConfigError: HYB-102 for bad ``--shapes`` text or a shape that does not fit the model.
        RunError: HYB-417 for a dynamic dim nothing sizes; HYB-406 for an input that cannot be generated.
    """
    given = parse_shapes(shapes) if isinstance(shapes, str) else dict(shapes or {})
    return resolve_inputs(model, None, given, batch=batch, seed=seed).feeds


def load_compiled(model: Path, target: str, precision: str | None = None, shapes: dict | None = None,
                  source: Any = None) -> Any:
    """MODEL compiled for TARGET.

    A bundle loads (its compiled choice); an .onnx compiles, auto measuring at ``shapes``.
    """
    import hybrid

    if model.suffix == ".hybrid":
        return hybrid.load(str(model), target=target, precision=precision)
    return hybrid.compile(source if source is not None else str(model), target=target,
                          precision=precision or "fp32", shapes=shapes)
