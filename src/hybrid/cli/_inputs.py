"""Command-line inputs shared by run, profile and bench: ``--input NAME=FILE.npy``, ``--shapes NAME:DIMS``
and generated inputs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.errors import RunError

__all__ = ["generated_inputs", "load_inputs", "parse_shapes"]


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


def generated_inputs(model: Any, shapes: str | Mapping[str, tuple[int, ...]] | None = None, batch: int = 1,
                     seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for ``model`` (a hybrid.Model) made the way auto-selection makes its samples
    (:func:`hybrid.runtime.profiler.sample_inputs`), so bench, run, profile and target='auto' agree.

    Args:
        model: The model.
        shapes: ``--shapes`` text or ``{name: shape}``; symbolic dims of other inputs that share a dim's
            name follow it, the rest are ``batch``.
        batch: Size of the symbolic dims not fixed by ``shapes``.
        seed: Random seed.

    Raises:
        ConfigError: HYB-102 for bad ``--shapes`` text or a shape that does not fit the model (checked as
            ``compile(shapes=...)`` checks it).
        RunError: HYB-406 for an input that cannot be generated.
    """
    from hybrid.runtime.auto import normalize_shapes
    from hybrid.runtime.profiler import sample_inputs

    given = parse_shapes(shapes) if isinstance(shapes, str) else dict(shapes or {})
    normalize_shapes(model.signature, given)
    return sample_inputs(model, batch, seed, shapes=given)
