"""A zoo of realistic models, made in-process: no download, for auto-selection tests and benchmarks.

Each model is built by torch (exported with the TorchScript exporter, as most published ONNX files were)
or with ``onnx.helper`` around torch-exported parts, with weights trained for a few seconds on a synthetic
but learnable task (or initialised the way the real architecture is), so outputs are not degenerate.
It carries the real-world traits that made ``target='auto'`` fail in issue 13, listed in ``quirks``:

============================  ===========================================================================
quirk                         meaning
============================  ===========================================================================
``dynamic_hw``                image height and width are named dynamic dims
``dynamic_width``             the width of a text line is a named dynamic dim
``lstm`` / ``state_io``       ONNX LSTM ops / recurrent state tensors are inputs and outputs
``multi_output``              several outputs (7)
``shape_driven_resize``       Resize whose ``sizes`` come from Shape of another tensor
``int64_inputs``              token ids and attention mask are int64
``attention_mask``            padding positions masked out through an additive mask
``if`` / ``dynamic_rank``     an If on input data whose branches answer different ranks
``loop``                      a Loop whose trip count depends on the data (early exit)
``data_dependent_shape``      an output whose length is known only after running (the Loop's scan output)
``dim_-1`` / ``dim_?``        batch dim stored as dim_value -1, other dims as dim_param "?"
``external_data``             weights in a separate ``.onnx.data`` file beside the model
``ir3``                       IR version 3 (opset 8)
``initializers_as_inputs``    every initializer also listed as a graph input (IR < 4 style)
``wrong_output_shape``        the declared output shape is wrong ([1, 10] for a [1, 5] result)
============================  ===========================================================================

Usage::

    from hybrid import zoo
    m = zoo.build("detector")            # cached under hybrid's cache folder / "zoo"
    feeds = m.feeds(seed=0)              # realistic inputs at m.shapes
    m.path, m.shapes, m.ranges, m.quirks

Builds are deterministic: fixed seeds, one torch thread while training, so the same torch version writes
the same bytes. ``import hybrid.zoo`` does not import torch; :func:`build` does.

The zoo is the one home of hybrid's sample models; two more sets live beside the catalog:

- :mod:`hybrid.zoo.samples`: ONNX's light model zoo, nine classic CNNs shipped inside the ``onnx`` wheel with
  their expected outputs (``pyasc demo``, the tests, the benchmarks);
- :mod:`hybrid.zoo.samples_quant`: CNNs trained briefly in-process for quantization work (tests, benchmarks).
"""

from __future__ import annotations

import importlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.errors import ModelError, RunError
from hybrid.zoo._catalog import RECIPES, Recipe

__all__ = ["NAMES", "ZOO_VERSION", "ZooModel", "build"]

logger = logging.getLogger("hybrid.zoo")

NAMES: tuple[str, ...] = tuple(RECIPES)
ZOO_VERSION = 2  # bump when a builder changes what it writes: it is part of the cache key

_LOCK = threading.Lock()  # one build at a time in a process (threads of a test run would race otherwise)
_BUILT: dict[str, Path] = {}  # key folder name -> a complete copy this process made or found


@dataclass(frozen=True, slots=True)
class ZooModel:
    """A built zoo model: its file and the facts a test or a benchmark needs to run it realistically.

    Attributes:
        name: one of :data:`NAMES`.
        path: the ``.onnx`` file (for ``external_data``, ``<name>.onnx.data`` lies beside it).
        shapes: the realistic shape users run, per input.
        ranges: trtexec-style ``{'min', 'opt', 'max'}`` shapes per dynamic input (empty for static models).
        quirks: the real-world traits the model carries (see the module docstring).
        description: what the model is.
    """

    name: str
    path: Path
    shapes: dict[str, tuple[int, ...]]
    ranges: dict[str, dict[str, tuple[int, ...]]]
    quirks: tuple[str, ...]
    description: str
    _recipe: Recipe = field(repr=False, compare=False)

    def feeds(self, seed: int = 0, shapes: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
        """Realistic inputs at :attr:`shapes`, or at ``shapes`` for the inputs it names.

        Images are in [0, 1] (text lines normalized to [-1, 1], as OCR models expect), token ids lie in the
        vocabulary with a valid attention mask, recurrent states have the state's shape. Same seed, same
        arrays.

        Raises:
            RunError: HYB-402 for an input the model does not have, HYB-404 for a wrong rank, HYB-405 for a
                dim the model fixes, or sizes the inputs must share and do not.
        """
        chosen = dict(self.shapes)
        for name, shape in (shapes or {}).items():
            chosen[name] = self._check_shape(name, shape)
        self._follow_batch(chosen, set(shapes or ()))
        return self._recipe.feeder(np.random.default_rng(seed), chosen, seed)

    def _check_shape(self, name: str, shape: Any) -> tuple[int, ...]:
        inputs = self._recipe.inputs
        if name not in inputs:
            raise RunError("HYB-402", f"zoo model {self.name!r} has no input {name!r}; its inputs: {list(inputs)}",
                           "name one of the model's inputs")
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise RunError("HYB-405", f"zoo feeds: shape for {name!r} must be a tuple of ints, got {shape!r}") from None
        _, template = inputs[name]
        if len(dims) != len(template):
            raise RunError("HYB-404", f"zoo model {self.name!r}: input {name!r} has rank {len(template)}, "
                           f"got shape {dims}", f"give {len(template)} dims, like {self.shapes[name]}")
        for axis, (want, got) in enumerate(zip(template, dims)):
            if got < 1 or (want is not None and want != got):
                expected = "a positive size" if want is None else str(want)
                raise RunError("HYB-405", f"zoo model {self.name!r}: input {name!r} dim {axis} must be {expected}, "
                               f"got {got} (shape {dims})", f"the model's dims: {_spell(template)}")
        return dims

    def _follow_batch(self, chosen: dict[str, tuple[int, ...]], given: set[str]) -> None:
        # a dim tied to a given input's dim follows it unless the tied input was given too (vad_lstm's state
        # follows the audio's batch; the encoder's mask follows the ids)
        for src, src_axis, dst, dst_axis in self._recipe.links:
            if src in given and dst not in given:
                dims = list(chosen[dst])
                dims[dst_axis] = chosen[src][src_axis]
                chosen[dst] = tuple(dims)


def _spell(template: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("dynamic" if d is None else str(d) for d in template) + "]"


def build(name: str, folder: str | os.PathLike[str] | None = None) -> ZooModel:
    """Build zoo model ``name`` (or find it already built) and describe it.

    Args:
        name: one of :data:`NAMES`.
        folder: where to keep the files; default ``hybrid.hal.machine.cache_root() / 'zoo'`` (which follows
            ``HYBRID_CACHE_DIR``). Files are keyed by name, :data:`ZOO_VERSION` and the torch version, and
            written atomically, so concurrent builders never see half a file. A model this process already
            built or found in another folder is copied from there rather than built again (tests that give
            each test its own ``HYBRID_CACHE_DIR`` stay fast).

    Raises:
        ModelError: HYB-211 for an unknown name; HYB-207 when torch is not installed.
    """
    recipe = RECIPES.get(name) if isinstance(name, str) else None
    if recipe is None:
        raise ModelError("HYB-211", f"unknown zoo model {name!r}; the zoo has {', '.join(NAMES)}",
                         "pick one of hybrid.zoo.NAMES")
    from hybrid.frontends._common import require_torch

    torch = require_torch()
    if folder is None:
        from hybrid.hal.machine import cache_root

        root = cache_root() / "zoo"
    else:
        root = Path(folder)
    version = str(torch.__version__).replace("+", "_")
    path = root / f"{name}-v{ZOO_VERSION}-torch{version}" / f"{name}.onnx"
    with _LOCK:
        if not _complete(path, recipe):
            source = _BUILT.get(path.parent.name)
            if source is not None and _complete(source, recipe):
                _copy(recipe, source, path)  # another cache folder (a test's own) already has it: no rebuild
            else:
                _write(recipe, path)
        _BUILT[path.parent.name] = path
    return ZooModel(name, path, {k: tuple(v) for k, v in recipe.shapes.items()},
                    {k: dict(v) for k, v in recipe.ranges.items()}, recipe.quirks, recipe.description, recipe)


def _data_path(path: Path) -> Path:
    return path.with_name(path.name + ".data")


def _complete(path: Path, recipe: Recipe) -> bool:
    return path.is_file() and (not recipe.external_data or _data_path(path).is_file())


def _copy(recipe: Recipe, source: Path, path: Path) -> None:
    from hybrid.ir import atomic_write_bytes

    if recipe.external_data:
        atomic_write_bytes(_data_path(path), _data_path(source).read_bytes())
    atomic_write_bytes(path, source.read_bytes())  # the model last: its presence means complete
    logger.info("zoo: copied %s from %s", recipe.name, source.parent)


def _write(recipe: Recipe, path: Path) -> None:
    started = time.perf_counter()
    module = importlib.import_module(f"hybrid.zoo.{recipe.module}")
    proto = getattr(module, f"build_{recipe.name}")()
    path.parent.mkdir(parents=True, exist_ok=True)
    if recipe.external_data:
        import onnx

        # save into a private folder, then move the data file and, last, the model into place
        with tempfile.TemporaryDirectory(prefix=f".{recipe.name}.", dir=path.parent) as tmp:
            staged = Path(tmp) / path.name
            onnx.save_model(proto, staged, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=_data_path(path).name, size_threshold=0)
            os.replace(_data_path(staged), _data_path(path))
            os.replace(staged, path)
    else:
        from hybrid.ir import atomic_write_bytes

        atomic_write_bytes(path, proto.SerializeToString())
    logger.info("zoo: built %s in %.1f s -> %s", recipe.name, time.perf_counter() - started, path)
