"""make_batch_dynamic: static-batch models that take any batch, or HYB-209 naming the pinning node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests._models import run_unoptimized

import hybrid
from hybrid.errors import ModelError
from hybrid.passes import make_batch_dynamic

F = TensorProto.FLOAT


@pytest.fixture(autouse=True)
def _verify(monkeypatch):
    monkeypatch.setenv("HYBRID_VERIFY_PASSES", "1")


def _run(model, x):
    return run_unoptimized(model, x)[0]


def _build(nodes, x_shape, y_shape, inits, name="x"):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(name, F, x_shape)],
                              [helper.make_tensor_value_info("y", F, y_shape)],
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()])
    return hybrid.Model.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("name", ["resnet50", "shufflenet", "squeezenet", "inception_v1"])
def test_light_models_take_any_batch(light, name):
    model = hybrid.Model.load(light.light_model_path(name))
    dynamic = make_batch_dynamic(model)
    assert dynamic.signature.inputs[0].shape == ("N", 3, 224, 224)
    assert dynamic.signature.outputs[0].shape[0] == "N"
    assert model.signature.inputs[0].shape[0] == 1  # the input model is untouched
    x = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
    out = _run(dynamic, x)
    assert out.shape[0] == 2
    np.testing.assert_allclose(out[:1], _run(model, x[:1]), rtol=1e-5, atol=1e-7)


def test_batch_rows_match_single_runs():
    # a small net with a pinned Reshape between convolution and classifier, random weights
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
             "shape": np.array([1, 4 * 16], np.int64),
             "fc": rng.standard_normal((64, 5)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "fc"], ["y"])]
    model = _build(nodes, [1, 3, 4, 4], [1, 5], inits)
    dynamic = hybrid.optimize(model, "O2", {"dynamic_batch": "batch"})
    assert dynamic.signature.inputs[0].shape == ("batch", 3, 4, 4)
    assert dynamic.signature.outputs[0].shape == ("batch", 5)
    x = rng.standard_normal((3, 3, 4, 4)).astype(np.float32)
    rows = np.concatenate([_run(model, x[i:i + 1]) for i in range(3)])
    np.testing.assert_allclose(_run(dynamic, x), rows, rtol=1e-5, atol=1e-5)


def test_already_dynamic_is_unchanged():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _build(nodes, ["N", 3], ["N", 3], {})
    out = make_batch_dynamic(model)
    assert out.signature == model.signature


def test_a_reshape_that_mixes_the_batch_is_named():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="merge_batch")]
    model = _build(nodes, [2, 4, 6], [8, 6], {"shape": np.array([8, 6], np.int64)})
    with pytest.raises(ModelError) as info:
        make_batch_dynamic(model)
    assert info.value.code == "HYB-209" and "'merge_batch'" in str(info.value) and "[8, 6]" in str(info.value)


def test_a_constant_operand_that_pins_the_batch_is_named():
    # Concat with a [1, 4] constant along axis 1 only works for batch 1
    nodes = [helper.make_node("Concat", ["x", "c"], ["y"], axis=1, name="glue")]
    model = _build(nodes, [1, 4], [1, 8], {"c": np.zeros((1, 4), np.float32)})
    with pytest.raises(ModelError) as info:
        make_batch_dynamic(model)
    assert info.value.code == "HYB-209" and "'glue'" in str(info.value) and "'y'" in str(info.value)


def test_a_pin_behind_a_transpose_is_named():
    # attention-style: the batch moves to axis 1, then a constant Reshape merges it with the heads
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "merged"], ["m"], name="merge_heads"),
             helper.make_node("Reshape", ["m", "split"], ["s"]),
             helper.make_node("Transpose", ["s"], ["y"], perm=[1, 0, 2])]
    inits = {"merged": np.array([6, 8], np.int64), "split": np.array([6, 2, 4], np.int64)}
    model = _build(nodes, [2, 6, 4], [2, 6, 4], inits)
    with pytest.raises(ModelError) as info:
        make_batch_dynamic(model)
    message = str(info.value)
    assert info.value.code == "HYB-209" and "'merge_heads'" in message and "[6, 2, 4] at batch 2" in message


def test_a_slice_of_the_batch_is_not_a_pin():
    # x[0:1] takes any batch and returns one row: nothing to refuse
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])]
    inits = {"starts": np.array([0], np.int64), "ends": np.array([1], np.int64), "axes": np.array([0], np.int64)}
    dynamic = make_batch_dynamic(_build(nodes, [1, 4], [1, 4], inits))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(_run(dynamic, x), x[:1])


def test_inputs_without_a_batch_dimension_are_refused():
    scalar = _build([helper.make_node("Relu", ["x"], ["y"])], [], [], {})
    with pytest.raises(ModelError, match="rank 0") as info:
        make_batch_dynamic(scalar)
    assert info.value.code == "HYB-209"
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", F, [1, 3]),
                               helper.make_tensor_value_info("b", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, [2, 3])])
    with pytest.raises(ModelError, match="a=1, b=2"):
        make_batch_dynamic(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
