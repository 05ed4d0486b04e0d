"""Models built in code for the partitioner and auto-selection tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CUSTOM_DOMAIN = "com.example.tests"


def register_swish() -> None:
    """Register the custom op ``com.example.tests.Swish`` on the reference backend (idempotent)."""
    import hybrid

    @hybrid.custom_op("Swish", domain=CUSTOM_DOMAIN)
    def swish(x, *, beta=1.0):
        return (x / (1 + np.exp(-beta * x))).astype(x.dtype)


def swish_reference(x: np.ndarray, beta: float = 1.5) -> np.ndarray:
    return x / (1 + np.exp(-beta * x))


def fallback_model() -> onnx.ModelProto:
    """Conv -> Erf in float64 (onnxruntime has no double Erf) -> custom Swish (reference only) -> Relu -> Conv.

    x is [N, 3, 8, 8] float32; y is [N, 2, 8, 8].
    """
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    w2 = numpy_helper.from_array(rng.standard_normal((2, 4, 1, 1)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Cast", ["c"], ["cd"], name="to_double", to=TensorProto.DOUBLE),
        helper.make_node("Erf", ["cd"], ["ed"], name="erf64"),
        helper.make_node("Cast", ["ed"], ["e"], name="to_float", to=TensorProto.FLOAT),
        helper.make_node("Swish", ["e"], ["s"], name="swish", domain=CUSTOM_DOMAIN, beta=1.5),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 8, 8])
    graph = helper.make_graph(nodes, "fallback", [x], [y], [w, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CUSTOM_DOMAIN, 1)])


def fallback_expected(x: np.ndarray) -> np.ndarray:
    """The fallback model computed in float64 with numpy and math.erf."""
    from math import erf

    m = fallback_model()
    w = numpy_helper.to_array(m.graph.initializer[0]).astype(np.float64)
    w2 = numpy_helper.to_array(m.graph.initializer[1]).astype(np.float64)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    n, _, h, wd = x.shape
    c = np.zeros((n, 4, h, wd))
    for i in range(h):
        for j in range(wd):
            c[:, :, i, j] = np.einsum("nchw,ochw->no", xp[:, :, i:i + 3, j:j + 3], w)
    e = np.vectorize(erf)(c).astype(np.float32).astype(np.float64)
    r = np.maximum(swish_reference(e), 0)
    return np.einsum("nchw,oc->nohw", r, w2[:, :, 0, 0]).astype(np.float32)


def chain(ops: list[str], domain_of: dict[str, str] | None = None) -> onnx.ModelProto:
    """x -> op0 -> op1 -> ... -> y on float32 [2, 3], one node per op type, named n0, n1, ..."""
    domain_of = domain_of or {}
    names = ["x"] + [f"v{i}" for i in range(len(ops) - 1)] + ["y"]
    nodes = [helper.make_node(op, [names[i]], [names[i + 1]], name=f"n{i}", domain=domain_of.get(op, ""))
             for i, op in enumerate(ops)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in set(domain_of.values())]
    return helper.make_model(graph, opset_imports=opsets)
