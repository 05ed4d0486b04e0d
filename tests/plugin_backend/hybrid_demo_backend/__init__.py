"""A third-party backend that reaches hybrid through the ``hybrid.backends`` entry point only.

It runs graphs of MatMul, Add and Relu with numpy, in fp32 or fp16, and implements the backend
contract's optional hooks, so that hybrid's runtime and bundle layers serve it as they serve the
built-in backends without naming it:

- ``precisions`` / ``precision_options``: fp16 (``dtype='float16'``). Its fp32 path sleeps a little on
  every run by design, so ``precision='auto'`` has a reason to choose fp16.
- ``profiling_options`` (the default: it declares ``profile``) and ``Executable.node_spans``: each node
  is timed with ``perf_counter_ns`` and handed back as :class:`hybrid.hal.NodeSpan`.
- ``cache_strategy``: a 'directory' cache under ``cache_dir``; compiling finds its artifact there (an
  .npz of the weights at the run precision and the node list) and ``Executable.loaded_from_cache`` says
  whether it did; an artifact it cannot read is rebuilt.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from hybrid.errors import BackendError
from hybrid.hal import Backend, CacheStrategy, Executable, NodeSpan, Option, ProbedDevice

__all__ = ["DemoBackend", "DemoExecutable"]

OPS = {"MatMul": np.matmul, "Add": np.add, "Relu": lambda x: np.maximum(x, 0)}
FP32_DELAY_S = 0.005  # the fp32 path's deliberate cost per run (see the module doc)


class DemoExecutable(Executable):
    """A list of numpy calls over named arrays."""

    def __init__(self, program: list[tuple[str, str, list[str], str]], weights: dict[str, np.ndarray],
                 input_names: list[str], output_names: list[str], dtype: str, profiling: bool,
                 loaded: bool | None) -> None:
        self.program = program
        self.weights = weights
        self.input_names = input_names
        self.output_names = output_names
        self.dtype = np.dtype(dtype)
        self._loaded = loaded
        self._timings: collections.deque[list[tuple[str, str, int, int]]] | None = \
            collections.deque(maxlen=1024) if profiling else None

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        env = dict(self.weights)
        env.update({k: np.asarray(v).astype(self.dtype, copy=False) for k, v in feeds.items()})
        times = []
        for name, op, inputs, output in self.program:
            t0 = time.perf_counter_ns()
            env[output] = OPS[op](*(env[i] for i in inputs))
            times.append((name, op, t0, time.perf_counter_ns()))
        if self._timings is not None:
            self._timings.append(times)
        if self.dtype == np.float32:
            time.sleep(FP32_DELAY_S)  # real time: the cost that hybrid's timing of real runs must see
        return [env[n].astype(np.float32) for n in self.output_names]

    @property
    def precision(self) -> str | None:
        return "fp16" if self.dtype == np.float16 else "fp32"

    @property
    def loaded_from_cache(self) -> bool | None:
        return self._loaded

    def node_spans(self, calls: Sequence[tuple[int, int]]) -> list[NodeSpan]:
        if not self._timings or not calls:
            return []
        count = min(len(calls), len(self._timings))
        first = len(calls) - count
        out = []
        for i, times in enumerate(list(self._timings)[len(self._timings) - count:]):
            start = calls[first + i][0]
            out += [NodeSpan(name, op, first + i, (t0 - start) / 1e3, (t1 - t0) / 1e3, {"dtype": self.dtype.name})
                    for name, op, t0, t1 in times]
        return out


class DemoBackend(Backend):
    """numpy, fp32 or fp16, on the CPU."""

    name = "npdemo"
    priority = 90
    install_hint = "pip install hybrid-demo-backend"
    options = {
        "dtype": Option((str,), "float32", ("float32", "float16"), "the precision it computes in"),
        "cache_dir": Option((str,), doc="folder of compiled artifacts"),
        "profile": Option((bool,), doc="time every node"),
    }

    def _probe(self) -> list[ProbedDevice]:
        return [ProbedDevice("cpu", "cpu", 0, "numpy")]

    def version(self) -> str:
        return f"0.1 (numpy {np.__version__})"

    def supports(self, node: Any, device: str = "cpu") -> bool:
        return node.op_type in OPS and node.domain in ("", "ai.onnx")

    def _precisions(self, device: str) -> tuple[str, ...]:
        return ("fp16",)

    def _precision_options(self, device: str, precision: str) -> dict[str, Any]:
        return {"dtype": "float16"}

    @classmethod
    def cache_strategy(cls, device: str, options: Mapping[str, Any]) -> CacheStrategy | None:
        return CacheStrategy("directory", "cache_dir")

    def _compile(self, model: Any, device: str, options: dict[str, Any]) -> Executable:
        data = model.to_bytes()
        dtype = options.get("dtype", "float32")
        sig = model.signature
        profiling = bool(options.get("profile"))
        folder = options.get("cache_dir")
        artifact = None
        if folder:
            key = hashlib.sha256(data + dtype.encode()).hexdigest()[:16]
            artifact = Path(folder) / dtype / f"npdemo-{key}.npz"  # nested, as TensorRT's engine cache is
            found = _read(artifact)
            if found is not None:
                program, weights = found
                return DemoExecutable(program, weights, sig.input_names, sig.output_names, dtype, profiling, True)
        proto = onnx.load_model_from_string(data)
        program = []
        for i, node in enumerate(proto.graph.node):
            if node.op_type not in OPS or node.domain not in ("", "ai.onnx"):
                raise BackendError("HYB-304", f"npdemo cannot run {node.op_type} (node {node.name or i!r})",
                                   "use a graph of MatMul, Add and Relu, or another backend")
            program.append((node.name or f"{node.op_type}_{i}", node.op_type, list(node.input), node.output[0]))
        weights = {t.name: numpy_helper.to_array(t).astype(dtype) for t in proto.graph.initializer}
        if artifact is not None:
            _write(artifact, program, weights)
        return DemoExecutable(program, weights, sig.input_names, sig.output_names, dtype, profiling,
                              False if artifact is not None else None)


def _read(path: Path) -> tuple[list[tuple[str, str, list[str], str]], dict[str, np.ndarray]] | None:
    """The artifact at ``path``, or None when there is none or it cannot be read (it is then rebuilt)."""
    if not path.is_file():
        return None
    try:
        with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        program = [tuple(step) for step in json.loads(arrays.pop("__program__").tobytes())]
    except Exception:
        return None
    return program, arrays  # type: ignore[return-value]


def _write(path: Path, program: list[tuple[str, str, list[str], str]], weights: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, __program__=np.frombuffer(json.dumps(program).encode(), np.uint8), **weights)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)
