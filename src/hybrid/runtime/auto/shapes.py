"""The shapes users run: ``compile(shapes=...)``, trtexec-style ranges, and shape buckets.

``shapes={'x': (1, 3, 480, 640)}`` fixes the shape auto-selection checks and times at;
``shapes={'x': {'min': (1, 3, 320, 320), 'opt': (1, 3, 480, 640), 'max': (1, 3, 640, 640)}}`` (the
``--minShapes/--optShapes/--maxShapes`` of trtexec) checks at all three and times at ``opt``. On the
command line the same is ``--shapes x:1x3x480x640`` (trtexec's spelling). Inputs not named take
their symbolic dims from a named input that shares the dim's name, else 1.

When nothing is declared, auto-selection learns the shapes from real calls, grouped in *buckets*:
every dynamic dim rounded up to a power of two, so that a video at 480x640 and one at 480x632 share
a decision while a 1x128 and an 8x512 batch of tokens do not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hybrid.errors import ConfigError
from hybrid.ir.signature import UNKNOWN_DIM, Signature, TensorSpec

__all__ = ["ShapeRange", "bucket_of", "concrete_shapes", "has_dynamic_inputs", "normalize_shapes", "parse_shapes"]

Shape = tuple[int, ...]
RANGE_KEYS = ("min", "opt", "max")


@dataclass(frozen=True, slots=True)
class ShapeRange:
    """The shapes one input is run at: ``opt`` is timed; ``min`` and ``max`` are checked too."""

    min: Shape
    opt: Shape
    max: Shape

    @property
    def distinct(self) -> tuple[Shape, ...]:
        """``opt`` first, then ``min`` and ``max`` where they differ from it."""
        return tuple(dict.fromkeys((self.opt, self.min, self.max)))


def _shape(name: str, value: Any, what: str) -> Shape:
    if isinstance(value, str):
        return _parse_dims(name, value)
    if not isinstance(value, Sequence) or any(isinstance(d, bool) or not isinstance(d, int) for d in value):
        raise ConfigError("HYB-102", f"shapes[{name!r}]{what}: expected a tuple of positive ints such as "
                          f"(1, 3, 480, 640), got {value!r}", "give every dim as an int")
    if any(d < 1 for d in value):
        raise ConfigError("HYB-102", f"shapes[{name!r}]{what}: dims must be >= 1, got {tuple(value)}",
                          "a dim of 0 or -1 is not a shape anyone runs; give the real size")
    return tuple(int(d) for d in value)


def _parse_dims(name: str, text: str) -> Shape:
    try:
        dims = tuple(int(d) for d in text.strip().lower().split("x"))
    except ValueError:
        raise ConfigError("HYB-102", f"shape of {name!r}: expected dims joined by 'x' such as 1x3x480x640, "
                          f"got {text!r}", "write the shape as trtexec does: name:1x3x480x640") from None
    return _shape(name, dims, "")


def parse_shapes(text: str) -> dict[str, Shape]:
    """Parse trtexec's spelling ``x:1x3x480x640,mask:1x128`` into ``{'x': (1, 3, 480, 640), ...}``.

    Raises:
        ConfigError: HYB-102 naming the part that does not parse.
    """
    out: dict[str, Shape] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, dims = part.rpartition(":")
        if not sep or not name:
            raise ConfigError("HYB-102", f"--shapes: expected NAME:DIMS such as x:1x3x480x640, got {part!r}",
                              "separate inputs with commas: x:1x3x480x640,mask:1x128")
        out[name.strip().strip("'\"")] = _parse_dims(name, dims)
    if not out:
        raise ConfigError("HYB-102", f"--shapes: expected at least one NAME:DIMS, got {text!r}",
                          "e.g. --shapes x:1x3x480x640")
    return out


def _check_against(spec: TensorSpec, shape: Shape, what: str) -> None:
    if spec.shape is None:
        return
    if len(shape) != len(spec.shape):
        raise ConfigError("HYB-102", f"shapes[{spec.name!r}]{what}: the model's input has rank {len(spec.shape)} "
                          f"{spec.shape}, got rank {len(shape)} {shape}", "give one size per dim")
    for i, (want, got) in enumerate(zip(spec.shape, shape)):
        if isinstance(want, int) and want >= 0 and want != got:
            raise ConfigError("HYB-102", f"shapes[{spec.name!r}]{what}: dim {i} is fixed at {want} in the model, "
                              f"got {got} (shape {shape})", f"use {want} for dim {i}")


def normalize_shapes(signature: Signature, shapes: Mapping[str, Any] | None) -> dict[str, ShapeRange]:
    """Validate ``compile(shapes=...)`` against the signature; every named input as a ShapeRange.

    Raises:
        ConfigError: HYB-102 for an unknown input, a wrong rank, a fixed dim changed, dims < 1,
            or a range whose min/opt/max are out of order.
    """
    if shapes is None:
        return {}
    if not isinstance(shapes, Mapping):
        raise ConfigError("HYB-102", f"shapes: expected a mapping of input name -> shape, got {type(shapes).__name__}",
                          "e.g. shapes={'x': (1, 3, 480, 640)}")
    specs = {s.name: s for s in signature.inputs}
    out: dict[str, ShapeRange] = {}
    for name, value in shapes.items():
        if name not in specs:
            raise ConfigError("HYB-102", f"shapes: the model has no input {name!r}; its inputs: "
                              f"{', '.join(specs) or 'none'}", "name the model's inputs")
        if isinstance(value, Mapping):
            unknown = set(value) - set(RANGE_KEYS)
            if unknown or ("opt" not in value and not {"min", "max"} <= set(value)):
                raise ConfigError("HYB-102", f"shapes[{name!r}]: expected a range with keys min, opt, max (opt alone "
                                  f"or all three), got keys {sorted(value)}",
                                  "e.g. {'min': (1, 3, 320, 320), 'opt': (1, 3, 480, 640), 'max': (1, 3, 640, 640)}")
            got = {k: _shape(name, v, f"[{k!r}]") for k, v in value.items()}
            opt = got.get("opt", got.get("max"))
            rng = ShapeRange(got.get("min", opt), opt, got.get("max", opt))
        else:
            one = _shape(name, value, "")
            rng = ShapeRange(one, one, one)
        for key in RANGE_KEYS:
            _check_against(specs[name], getattr(rng, key), f"[{key!r}]")
        if len({len(rng.min), len(rng.opt), len(rng.max)}) != 1 or not all(
                a <= b <= c for a, b, c in zip(rng.min, rng.opt, rng.max)):
            raise ConfigError("HYB-102", f"shapes[{name!r}]: expected min <= opt <= max in every dim, got min "
                              f"{rng.min}, opt {rng.opt}, max {rng.max}", "order the range's shapes")
        out[name] = rng
    return out


def concrete_shapes(signature: Signature, ranges: Mapping[str, ShapeRange], which: str = "opt",
                    default: int = 1) -> dict[str, Shape | None]:
    """A concrete shape for every tensor input.

    Declared ones from ``ranges`` (``which`` of min/opt/max), the others with each symbolic dim taken from a declared
    input that shares its name, else ``default``. None for an input of unknown rank.
    """
    named: dict[str, int] = {}
    for spec in signature.inputs:
        if spec.name in ranges and spec.shape is not None:
            shape = getattr(ranges[spec.name], which)
            for d, n in zip(spec.shape, shape):
                if isinstance(d, str) and d != UNKNOWN_DIM:
                    named.setdefault(d, n)
    out: dict[str, Shape | None] = {}
    for spec in signature.inputs:
        if spec.name in ranges:
            out[spec.name] = getattr(ranges[spec.name], which)
        elif spec.shape is None:
            out[spec.name] = None
        else:
            out[spec.name] = tuple(d if isinstance(d, int) and d >= 0 else named.get(d, default) if isinstance(d, str)
                                   else default for d in spec.shape)
    return out


def has_dynamic_inputs(signature: Signature) -> bool:
    """Whether any tensor input has a symbolic or unknown dim (or an unknown rank)."""
    return any(s.kind == "tensor" and (s.shape is None or any(not isinstance(d, int) or d < 0 for d in s.shape))
               for s in signature.inputs)


def _round_up(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def bucket_of(signature: Signature, feeds: Mapping[str, Any]) -> tuple[tuple[str, Shape], ...]:
    """The shape bucket of validated feeds.

    Each input's shape with its dynamic dims rounded up to a power of two (static dims as they are); inputs without a
    shape (sequences) are left out.
    """
    out = []
    for spec in signature.inputs:
        value = feeds.get(spec.name)
        shape = getattr(value, "shape", None)
        if shape is None:
            continue
        fixed = spec.shape if spec.shape is not None and len(spec.shape) == len(shape) else (None,) * len(shape)
        out.append((spec.name, tuple(int(n) if isinstance(d, int) and d >= 0 else _round_up(n)
                                     for d, n in zip(fixed, shape))))
    return tuple(out)
