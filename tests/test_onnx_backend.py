"""hybrid.onnx_backend under ONNX's own backend test runner and API."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import helper
from tests._models import matmul_add

import hybrid.onnx_backend as backend


def test_prepare_run_model_and_supports_device():
    x = np.ones((2, 4), np.float32)
    rep = backend.prepare(matmul_add(), "CPU", target="onnxruntime")
    (y,) = rep.run([x])
    (y2,) = backend.run_model(matmul_add(), {"x": x}, target="openvino")
    np.testing.assert_allclose(y, y2, rtol=1e-5)
    assert backend.supports_device("CPU")


def test_run_node():
    node = helper.make_node("Relu", ["x"], ["y"])
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    (y,) = backend.run_node(node, [x])
    np.testing.assert_array_equal(y, [0.0, 0.0, 2.0])


# ONNX's own runner machinery (BackendTest.assert_similar_outputs) over a slice of node cases
_NODE_CASES = ["test_relu", "test_add", "test_matmul_2d", "test_softmax_axis_0", "test_conv_with_strides_padding",
               "test_maxpool_2d_default", "test_sequence_insert_at_back"]


@pytest.mark.parametrize("name", _NODE_CASES)
def test_node_cases_through_the_onnx_backend_api(name, monkeypatch):
    from onnx.backend.test.case.node import collect_testcases

    monkeypatch.setenv("HYBRID_ONNX_BACKEND_TARGET", "onnxruntime")
    (case,) = [c for c in collect_testcases() if c.name == name]
    rep = backend.prepare(case.model, "CPU")
    for inputs, outputs in case.data_sets:
        got = rep.run(list(inputs))
        onnx.backend.test.BackendTest.assert_similar_outputs(list(outputs), list(got), case.rtol, case.atol)
