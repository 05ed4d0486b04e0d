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


def light_with_logits(name: str) -> tuple[onnx.ModelProto, bool]:
    """Light model ``name`` with the input of its final Softmax added as a second graph output.

    Most light models end in a Softmax over 1000 logits that are all equal and huge (SqueezeNet 9.5e9,
    ResNet-50 1.3e19, VGG-19 3.7e31): one ULP of a different summation order there is 1e3 or more, which
    turns the shipped uniform softmax one-hot. Whether a backend "matches the shipped output" is then
    decided by the machine's rounding; the logits are what is computed and can be compared on any machine.

    Returns:
        The model, and whether it had a final Softmax (if not, it is returned unchanged).
    """
    from hybrid.zoo.samples import light_model_path

    m = onnx.load(str(light_model_path(name)))
    last = m.graph.node[-1]
    if last.op_type != "Softmax":
        return m, False
    m.graph.output.append(helper.make_tensor_value_info(last.input[0], TensorProto.FLOAT, None))
    return m, True


def check_light_outputs(name: str, outputs: list[np.ndarray]) -> None:
    """Assert what holds on any machine for light model ``name``'s outputs (see :func:`light_with_logits`).

    A model without a final Softmax is compared with its shipped output at ONNX's tolerance. For one with
    a Softmax, the shipped output (uniform: 1/1000 each) says the exact logits are all equal: the logits
    must be equal within fp32 accumulation error, and the softmax must be a distribution of the shipped shape.
    """
    from hybrid.zoo.samples import LIGHT_RTOL, light_expected

    expected = light_expected(name)
    if len(outputs) == 1:
        np.testing.assert_allclose(outputs[0], expected, rtol=LIGHT_RTOL.get(name, 1e-3), atol=1e-7)
        return
    probabilities, logits = outputs
    assert probabilities.shape == expected.shape == logits.shape
    assert np.ptp(expected) == 0, "the shipped softmax is uniform: its logits are equal"
    assert np.all(np.isfinite(logits)) and abs(float(logits.flat[0])) > 0
    np.testing.assert_allclose(logits, np.full_like(logits, logits.flat[0]), rtol=1e-5)
    assert np.all((probabilities >= 0) & (probabilities <= 1))
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
