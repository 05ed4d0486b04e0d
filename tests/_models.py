"""Small ONNX models built in code for tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def matmul_add(batch: int | str = "N", opset: int = 17) -> onnx.ModelProto:
    """y = x @ W + b with x [batch, 4] float32; W, b initializers."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"], name="mm"),
             helper.make_node("Add", ["xw", "b"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "matmul_add", [x], [y], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def two_inputs() -> onnx.ModelProto:
    """z = a + b with a [N, 3] float32 and b [N, 3] float32, plus an int64 input k [2] passed through."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 3])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, [2])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])
    kk = helper.make_tensor_value_info("kk", TensorProto.INT64, [2])
    nodes = [helper.make_node("Add", ["a", "b"], ["z"]), helper.make_node("Identity", ["k"], ["kk"])]
    graph = helper.make_graph(nodes, "two_inputs", [a, b, k], [z, kk])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run_unoptimized(model, x):
    """All outputs of ``model`` (a hybrid.Model) on its first input ``x``, by ONNX Runtime with every
    graph optimization off: what a rewritten graph computes, with nothing of ORT's own rewriting."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.to_bytes(), so, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})
