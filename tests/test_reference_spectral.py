"""DFT and STFT hand kernels: the same numbers as onnx.reference, on its cases and on random ones."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper
from onnx.backend.test.case.node import collect_testcases
from onnx.reference import ReferenceEvaluator

import hybrid
from hybrid.backends.reference.interpreter import node_runner

SPECTRAL = [c for c in collect_testcases() if c.name.startswith(("test_dft", "test_stft"))]


@pytest.mark.parametrize("case", SPECTRAL, ids=lambda c: c.name)
def test_conformance_cases_are_bit_equal_to_onnx_reference(case):
    cm = hybrid.compile(case.model, target="reference")
    names = [s.name for s in cm.signature.inputs]
    ref = ReferenceEvaluator(case.model)
    for ins, outs in case.data_sets:
        feeds = dict(zip(names, ins))
        got = list(cm.run(feeds).values())
        want = ref.run(None, feeds)
        for g, w, o in zip(got, want, outs):
            np.testing.assert_array_equal(g, w)
            np.testing.assert_allclose(g, o, rtol=case.rtol, atol=case.atol)


def _dft_model(shape, opset, *, axis, inverse, onesided, dft_length=None):
    inputs = ["x", "n" if dft_length is not None else ""]
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset >= 20:
        inputs.append("axis")
    else:
        attrs["axis"] = axis
    inits = [helper.make_tensor("axis", TensorProto.INT64, [], [axis])] if opset >= 20 else []
    if dft_length is not None:
        inits.append(helper.make_tensor("n", TensorProto.INT64, [], [dft_length]))
    node = helper.make_node("DFT", inputs, ["y"], **attrs)
    g = helper.make_graph([node], "dft", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize(("channels", "inverse", "onesided"), [(1, 0, 0), (1, 0, 1), (2, 0, 0), (2, 1, 0), (2, 1, 1)])
@pytest.mark.parametrize("dft_length", [None, 7, 16])
def test_random_dfts_are_bit_equal(rng, opset, channels, inverse, onesided, dft_length):
    shape = [2, 12, 5, channels]
    model = _dft_model(shape, opset, axis=1, inverse=inverse, onesided=onesided, dft_length=dft_length)
    x = rng.standard_normal(shape).astype(np.float32)
    got = hybrid.compile(model, target="reference").run({"x": x})["y"]
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize(("length", "step", "window", "frame_length", "channels", "onesided"), [
    (128, 8, 16, None, 1, 1), (100, 7, 16, None, 2, 0), (64, 4, None, 16, 1, 0), (50, 3, 20, 16, 1, 1),
    (33, 5, 12, 16, 1, 1)])
def test_random_stfts_are_bit_equal(rng, length, step, window, frame_length, channels, onesided):
    inputs = ["x", "step", "w" if window else "", "n" if frame_length else ""]
    inits = [helper.make_tensor("step", TensorProto.INT64, [], [step])]
    if window:
        inits.append(helper.make_tensor("w", TensorProto.FLOAT, [window], np.hanning(window).astype(np.float32)))
    if frame_length:
        inits.append(helper.make_tensor("n", TensorProto.INT64, [], [frame_length]))
    node = helper.make_node("STFT", [i for i in inputs], ["y"], onesided=onesided)
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, length, channels])
    g = helper.make_graph([node], "stft", [x_info], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, length, channels)).astype(np.float32)
    got = hybrid.compile(model, target="reference").run({"x": x})["y"]
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_bad_signal_is_a_run_error():
    model = _dft_model([2, 8, 3], 20, axis=1, inverse=0, onesided=0)
    cm = hybrid.compile(model, target="reference")
    with pytest.raises(hybrid.HybridError) as e:
        cm.run({"x": np.zeros((2, 8, 3), np.float32)})
    assert "real/imaginary" in str(e.value) or "1 (real) or 2" in str(e.value)


@pytest.mark.parametrize("case", [c for c in SPECTRAL if c.name in ("test_dft", "test_dft_opset19", "test_stft")],
                         ids=lambda c: c.name)
def test_spectral_nodes_run_hand_kernels(case):
    model = ir.serde.deserialize_model(case.model)
    node = model.graph.node(0)
    _, kind, _ = node_runner(node, dict(model.opset_imports), {}, [None] * len(node.inputs), [], None)
    assert kind == "hand"
