"""Warm-up samples of a served model: Triton's ``model_warmup`` (config.pbtxt) and ``pyasc serve --warmup N``.

``model_warmup`` entries are read as Triton reads them: per input ``data_type``, ``dims`` (without the
batch dim when ``max_batch_size > 0``; the entry's ``batch_size`` is prepended), and one of
``zero_data``, ``random_data`` or ``input_data_file`` (raw little-endian bytes in the model folder's
``warmup/`` directory); each entry runs ``count`` times (at least once). ``--warmup N`` makes N random
samples at the declared shapes, with the batch sizes 1..max_batch_size in turn (the sizes the batcher
will form) and 1 for any other dynamic dim.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hybrid.errors import ServingError
from hybrid.serve.core.random_inputs import random_array, samples_of_rows

if TYPE_CHECKING:
    from hybrid.serve.core.model import ServedModel

__all__ = ["pbtxt_samples", "random_samples", "samples_of_rows"]

_WARMUP_DIR = "warmup"
_MAX_SAMPLE_BYTES = 1 << 30


def random_samples(model: ServedModel, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``count`` random samples at the model's declared input shapes (see the module docstring)."""
    top = max(1, model.max_batch_size)
    return samples_of_rows(model, [1 + i % top for i in range(count)], seed)


def pbtxt_samples(model: ServedModel, model_dir: Path) -> list[dict[str, np.ndarray]]:
    """The samples of the ``model_warmup`` entries of the model's config.pbtxt (none without one).

    Raises:
        ServingError: HYB-707 naming the entry for an unknown data type, a missing or short data file.
    """
    from hybrid.serve.tensors import DATATYPES

    config: Any = model.model_config
    if config is None or not len(config.model_warmup):
        return []
    from tritonclient.grpc import model_config_pb2 as mc

    rng = np.random.default_rng(0)
    samples = []
    for entry in config.model_warmup:
        where = f"{model_dir / 'config.pbtxt'}: model_warmup {entry.name!r}"
        sample = {}
        for name, spec in entry.inputs.items():
            type_name = mc.DataType.Name(spec.data_type).removeprefix("TYPE_")
            datatype = "BYTES" if type_name == "STRING" else type_name
            if datatype not in DATATYPES:
                raise ServingError("HYB-707", f"{where}: input {name!r} has data type {type_name}",
                                   "use one of the types Triton's model configuration lists")
            dtype = DATATYPES[datatype]
            shape = tuple(int(d) for d in spec.dims)
            if config.max_batch_size > 0:
                shape = (max(1, entry.batch_size), *shape)
            which = spec.WhichOneof("input_data_type")
            if which == "input_data_file":
                path = (model_dir / _WARMUP_DIR / spec.input_data_file).resolve()
                if model_dir.resolve() not in path.parents or not path.is_file():
                    raise ServingError("HYB-707", f"{where}: input {name!r}: no file {spec.input_data_file!r} in "
                                       f"{model_dir / _WARMUP_DIR}", "put the raw tensor bytes there")
                need = int(np.prod(shape)) * dtype.itemsize
                data = path.read_bytes()[:_MAX_SAMPLE_BYTES]
                if dtype == np.dtype(object) or len(data) < need:
                    raise ServingError("HYB-707", f"{where}: input {name!r}: {path} has {len(data)} bytes, "
                                       f"{datatype} {list(shape)} needs {need}",
                                       "write the tensor's raw little-endian bytes (BYTES inputs: random_data)")
                sample[name] = np.frombuffer(data, dtype, int(np.prod(shape))).reshape(shape)
            elif which == "random_data":
                sample[name] = random_array(dtype, shape, rng)
            else:
                sample[name] = (np.full(shape, b"", dtype=object) if dtype == np.dtype(object)
                                else np.zeros(shape, dtype))
        samples += [sample] * max(1, entry.count)
    return samples
