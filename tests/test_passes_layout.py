"""NCHW -> NHWC interface conversion at O3."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests._models import run_unoptimized

import hybrid
from hybrid.errors import ConfigError

F = TensorProto.FLOAT


@pytest.fixture(autouse=True)
def _verify(monkeypatch):
    monkeypatch.setenv("HYBRID_VERIFY_PASSES", "1")


def _conv_net(first=None):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Sub", ["image", "mean"], ["centered"]),  # normalization before the Conv
             helper.make_node("Conv", ["centered", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["features"]),
             helper.make_node("GlobalAveragePool", ["features"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["logits"])]
    if first is not None:
        nodes = [first, *nodes]
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.full((1, 3, 1, 1), 0.5, np.float32), "mean")]
    image = "raw" if first is not None else "image"
    shape = [1, 6, 6, 3] if first is not None else [1, 3, 6, 6]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info(image, F, shape)],
                              [helper.make_tensor_value_info("features", F, [1, 8, 6, 6]),
                               helper.make_tensor_value_info("logits", F, [1, 8])], inits)
    return hybrid.Model.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_nhwc_interface_keeps_the_numbers():
    model = _conv_net()
    nhwc = hybrid.optimize(model, "O3", {"layout": "NHWC"})
    assert nhwc.signature.inputs[0].shape == (1, 6, 6, 3)
    assert nhwc.signature.outputs[0].shape == (1, 6, 6, 8)  # rank-4 feature map: channels last too
    assert nhwc.signature.outputs[1].shape == (1, 8)        # a rank-2 output is left alone
    assert nhwc.signature.input_names == model.signature.input_names
    assert nhwc.signature.output_names == model.signature.output_names
    assert nhwc.ir.metadata_props["hybrid.layout"] == "NHWC"
    assert collections.Counter(n.op_type for n in nhwc.graph)["Transpose"] == 2
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)
    features, logits = run_unoptimized(model, x)
    features_nhwc, logits_nhwc = run_unoptimized(nhwc, x.transpose(0, 2, 3, 1).copy())
    np.testing.assert_allclose(features_nhwc, features.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits_nhwc, logits, rtol=1e-5, atol=1e-5)


def test_nhwc_is_idempotent_and_opt_in():
    once = hybrid.optimize(_conv_net(), "O3", {"layout": "NHWC"})
    twice = hybrid.optimize(once, "O3", {"layout": "NHWC"})
    assert twice.signature == once.signature and len(twice.graph) == len(once.graph)
    plain = hybrid.optimize(_conv_net(), "O3")
    assert "Transpose" not in {n.op_type for n in plain.graph}
    assert plain.signature.inputs[0].shape == (1, 3, 6, 6)
    with pytest.raises(ConfigError) as info:
        hybrid.optimize(_conv_net(), "O2", {"layout": "NHWC"})
    assert info.value.code == "HYB-102" and "O3" in str(info.value)


def test_an_nhwc_input_is_left_alone():
    model = _conv_net(first=helper.make_node("Transpose", ["raw"], ["image"], perm=[0, 3, 1, 2]))
    out = hybrid.optimize(model, "O3", {"layout": "NHWC"})
    assert out.signature.inputs[0].shape == (1, 6, 6, 3)
    x = np.random.default_rng(2).standard_normal((1, 6, 6, 3)).astype(np.float32)
    np.testing.assert_allclose(run_unoptimized(out, x)[1], run_unoptimized(model, x)[1], rtol=1e-5, atol=1e-5)


def test_nhwc_on_a_light_model(light):
    model = hybrid.Model.load(light.light_model_path("squeezenet"))
    nhwc = hybrid.optimize(model, "O3", {"layout": "NHWC"})
    assert nhwc.signature.inputs[0].shape == (1, 224, 224, 3)
    # the output comes from a Softmax, not a channels-first operator: its layout is left as it is
    assert nhwc.signature.outputs[0].shape == (1, 1000, 1, 1)
    x = light.light_input()
    (reference,) = run_unoptimized(model, x)
    (result,) = run_unoptimized(nhwc, x.transpose(0, 2, 3, 1).copy())
    np.testing.assert_allclose(result, reference, rtol=1e-5, atol=1e-7)
