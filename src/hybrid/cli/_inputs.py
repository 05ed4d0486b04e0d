"""``NAME=FILE.npy`` command-line inputs, shared by run, profile and bench."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hybrid.errors import RunError

__all__ = ["load_inputs"]


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
