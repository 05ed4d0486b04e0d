"""hybrid as an ONNX backend (``onnx.backend.base.Backend``), so ONNX's own test runner runs it.

Usage with ONNX's runner::

    import onnx.backend.test
    import hybrid.onnx_backend as backend
    globals().update(onnx.backend.test.BackendTest(backend, __name__).test_cases)

The hybrid target defaults to 'auto'; set ``HYBRID_ONNX_BACKEND_TARGET`` (e.g. 'reference') or pass
``target=`` to :func:`prepare`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

__all__ = ["HybridBackend", "HybridBackendRep", "prepare", "run_model", "run_node", "supports_device"]


def _default_target(kwargs: dict[str, Any]) -> str:
    return kwargs.pop("target", None) or os.environ.get("HYBRID_ONNX_BACKEND_TARGET", "auto")


def _as_value(v: Any) -> Any:
    if isinstance(v, TensorProto):
        return numpy_helper.to_array(v)
    return v


class HybridBackendRep(BackendRep):
    """A prepared model: a hybrid CompiledModel behind ONNX's BackendRep contract."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self._names = compiled.signature.input_names

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run on inputs by name (a mapping) or by position (a list, or one value); return the outputs in order."""
        if isinstance(inputs, Mapping):
            feeds = {k: _as_value(v) for k, v in inputs.items()}
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            feeds = {n: _as_value(v) for n, v in zip(self._names, inputs)}
        return tuple(self.compiled.run(feeds).values())


class HybridBackend(Backend):
    """ONNX backend API over hybrid targets."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether hybrid has a device of that kind (see :meth:`supports_device`); the model is not inspected."""
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> HybridBackendRep:
        """Compile ``model`` for the target from ``target=`` or ``HYBRID_ONNX_BACKEND_TARGET`` (default 'auto')."""
        from hybrid.runtime.compiler import compile_model

        target = _default_target(kwargs)
        return HybridBackendRep(compile_model(model, target=target))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        """Prepare ``model`` and run it once on ``inputs``."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence[Any], device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None, **kwargs: Any) -> tuple:
        """Run one node: wrap it in a one-node model typed from ``inputs`` (and ``outputs_info``), then run that.

        The model imports ``opset_version`` (default: the installed onnx's latest) and opset 1 of a custom domain.
        """
        opset = kwargs.pop("opset_version", None) or onnx.defs.onnx_opset_version()
        values = [_as_value(v) for v in inputs]
        names = [n for n in node.input if n]
        graph_inputs = []
        feeds = {}
        for name, value in zip(names, values):
            arr = np.asarray(value)
            elem = helper.np_dtype_to_tensor_dtype(arr.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, arr.shape))
            feeds[name] = arr
        outputs = []
        for i, name in enumerate(n for n in node.output if n):
            if outputs_info and i < len(outputs_info):
                dtype, shape = outputs_info[i]
                outputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
            else:
                outputs.append(onnx.ValueInfoProto(name=name))
        graph = helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, outputs)
        domain_opsets = [helper.make_opsetid("", opset)]
        if node.domain not in ("", "ai.onnx"):
            domain_opsets.append(helper.make_opsetid(node.domain, 1))
        model = helper.make_model(graph, opset_imports=domain_opsets)
        model = onnx.shape_inference.infer_shapes(model)
        return cls.prepare(model, device, **kwargs).run(feeds)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether hybrid found a device of ONNX's kind ``device``: 'CPU' or 'CUDA' (no other kind is supported)."""
        from hybrid.api import devices

        dev = Device(device)
        present = {d.kind for d in devices()}
        if dev.type == DeviceType.CPU:
            return "cpu" in present
        if dev.type == DeviceType.CUDA:
            return "cuda" in present
        return False


prepare = HybridBackend.prepare
run_model = HybridBackend.run_model
run_node = HybridBackend.run_node
supports_device = HybridBackend.supports_device
