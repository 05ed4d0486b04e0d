"""The reference backend: compile and run, custom ops, capability, constant folding, errors, liveness."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper
from tests._models import check_light_outputs, light_with_logits

import hybrid
from hybrid.backends.reference import ReferenceBackend, custom_op, evaluate_node
from hybrid.errors import BackendError, HybridError, RunError
from hybrid.zoo.samples import LIGHT_MODELS


def _model(nodes, inputs, outputs, initializers=(), opset=18, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, v) for d, v in extra_opsets]]
    return helper.make_model(graph, opset_imports=opsets)


def _vi(name, elem=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def test_runs_a_small_model(rng):
    w = rng.standard_normal((4, 3)).astype(np.float32)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                   [_vi("x", shape=[2, 4])], [_vi("y", shape=[2, 3])],
                   [onnx.numpy_helper.from_array(w, "w")])
    cm = hybrid.compile(model, target="reference")
    x = rng.standard_normal((2, 4)).astype(np.float32)
    assert cm.backend == "reference" and cm.device == "cpu"
    np.testing.assert_allclose(cm(x), np.maximum(x @ w, 0), rtol=1e-6)


def test_backend_contract():
    assert ReferenceBackend.name == "reference"
    assert ReferenceBackend.priority == 90
    from hybrid.hal import get_backend

    assert get_backend("reference").probe()[0].name == "cpu"
    assert {"conv_algorithm", "fuse", "fold_constants"} <= set(ReferenceBackend.options)


def test_bad_option_is_refused():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", shape=[2])], [_vi("y", shape=[2])])
    with pytest.raises(BackendError) as e:
        hybrid.compile(model, target="reference", config={"conv_algorithm": "fft"})
    assert e.value.code == "HYB-306"


def test_kernel_rejection_names_node_and_op():
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="stem")],
                   [_vi("x", shape=[1, 3, 8, 8]), _vi("w", shape=[4, 2, 3, 3])], [_vi("y")])
    cm = hybrid.compile(model, target="reference")
    with pytest.raises(RunError) as e:
        cm.run({"x": np.zeros((1, 3, 8, 8), np.float32), "w": np.zeros((4, 2, 3, 3), np.float32)})
    assert e.value.code == "HYB-409"
    assert "'stem'" in e.value.message and "Conv" in e.value.message


def test_custom_op_runs_on_reference():
    @custom_op("ScaledTanh", domain="com.example.test")
    def scaled_tanh(x, *, alpha=1.0):
        return alpha * np.tanh(x)

    assert hybrid.custom_op is custom_op
    node = helper.make_node("ScaledTanh", ["x"], ["y"], domain="com.example.test", alpha=2.0)
    model = _model([node], [_vi("x", shape=[3])], [_vi("y", shape=[3])], extra_opsets=[("com.example.test", 1)])
    cm = hybrid.compile(model, target="reference")
    x = np.array([-1.0, 0.0, 0.5], np.float32)
    np.testing.assert_allclose(cm(x), 2.0 * np.tanh(x), rtol=1e-6)
    assert ReferenceBackend().supports(ir.serde.deserialize_model(model).graph.node(0))


def test_unknown_op_is_a_compile_error():
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example.none")
    model = _model([node], [_vi("x", shape=[3])], [_vi("y")], extra_opsets=[("com.example.none", 1)])
    with pytest.raises(BackendError) as e:
        hybrid.compile(model, target="reference")
    assert e.value.code == "HYB-305"
    assert not ReferenceBackend().supports(ir.serde.deserialize_model(model).graph.node(0))


@pytest.mark.parametrize(("op", "domain", "opset", "expected"), [
    ("Conv", "", 11, True),             # hand kernel
    ("Mod", "", 13, True),              # onnx.reference
    ("LabelEncoder", "ai.onnx.ml", 4, True),
    ("Resize", "", 10, True),           # onnx.reference (the hand kernel starts at opset 11)
    ("Frobnicate", "", 18, False),
])
def test_supports_answers_from_the_kernel_table(op, domain, opset, expected):
    extra = [(domain, opset)] if domain else []
    model = _model([helper.make_node(op, ["x"], ["y"], domain=domain)], [_vi("x")], [_vi("y")],
                   opset=opset if not domain else 18, extra_opsets=extra)
    node = ir.serde.deserialize_model(model).graph.node(0)
    backend = ReferenceBackend()
    assert backend.supports(node, "cpu") is expected
    assert backend.supports(node, "cuda:0") is False


def test_evaluate_node_for_constant_folding():
    a = ir.Value(name="a")
    b = ir.Value(name="b")
    node = ir.Node("", "Add", [a, b], num_outputs=1, version=14)
    out = evaluate_node(node, [np.array([1, 2], np.int64), np.array([10], np.int64)])
    assert out[0].tolist() == [11, 12]
    scalar = evaluate_node(node, [np.array(1.0, np.float32), np.array(2.0, np.float32)])[0]
    assert isinstance(scalar, np.ndarray) and scalar.shape == () and scalar.dtype == np.float32
    sq = ir.Node("", "Unsqueeze", [a, b], num_outputs=1, version=13)
    assert evaluate_node(sq, [np.zeros((2, 3), np.float32), np.array([0], np.int64)])[0].shape == (1, 2, 3)
    with pytest.raises(HybridError) as e:
        evaluate_node(ir.Node("", "Reshape", [a, b], num_outputs=1, version=14),
                      [np.zeros(6, np.float32), np.array([4, 4], np.int64)])
    assert e.value.code == "HYB-409"


def test_intermediates_are_freed_after_last_use():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Abs", ["c"], ["y"])]
    model = _model(nodes, [_vi("x", shape=[2])], [_vi("y", shape=[2])])
    program = hybrid.compile(model, target="reference").executable.program
    freed = [set(s.free) for s in program.steps]
    slot_of = {s.op_type: s.outputs[0] for s in program.steps}
    # 'a' (from Relu) dies at Add, 'b' at Add, 'c' at Abs; the output is never freed
    assert slot_of["Relu"] in freed[2] and slot_of["Neg"] in freed[2] and slot_of["Add"] in freed[3]
    assert all(slot_of["Abs"] not in f for f in freed)


def test_constant_nodes_are_folded_at_compile_time():
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])),
             helper.make_node("Mul", ["x", "w"], ["y"])]
    shape = onnx.numpy_helper.from_array(np.array([3], np.int64), "shape")
    model = _model(nodes, [_vi("x", shape=[3])], [_vi("y", shape=[3])], [shape])
    cm = hybrid.compile(model, target="reference")
    assert [s.op_type for s in cm.executable.program.steps] == ["Mul"]
    np.testing.assert_array_equal(cm(np.ones(3, np.float32)), [2, 2, 2])


def test_if_and_loop_read_outer_values():
    then_g = helper.make_graph([helper.make_node("Add", ["x", "k"], ["t"])], "then", [], [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "k"], ["e"])], "else", [], [_vi("e")])
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Add", ["acc_in", "x"], ["acc_out"])], "body",
                             [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("acc_in")],
                             [_vi("cond_out", TensorProto.BOOL, []), _vi("acc_out")])
    nodes = [helper.make_node("Relu", ["x0"], ["x"]),
             helper.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Loop", ["n", "", "r"], ["s"], body=body)]
    model = _model(nodes, [_vi("x0", shape=[2]), _vi("k", shape=[2]), _vi("c", TensorProto.BOOL, []),
                           _vi("n", TensorProto.INT64, [])], [_vi("s", shape=[2])])
    cm = hybrid.compile(model, target="reference")
    x, k = np.array([1.0, 2.0], np.float32), np.array([0.5, 0.5], np.float32)
    got = cm.run({"x0": x, "k": k, "c": np.array(True), "n": np.array(3, np.int64)})["s"]
    np.testing.assert_allclose(got, x + k + 3 * x)
    got = cm.run({"x0": x, "k": k, "c": np.array(False), "n": np.array(2, np.int64)})["s"]
    np.testing.assert_allclose(got, x - k + 2 * x)


def test_exotic_dtypes_through_ml_dtypes():
    import ml_dtypes

    nodes = [helper.make_node("Cast", ["x"], ["f8"], to=TensorProto.FLOAT8E4M3FN),
             helper.make_node("Cast", ["f8"], ["y"], to=TensorProto.FLOAT),
             helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"])]
    inits = [onnx.numpy_helper.from_array(np.array(0.5, np.float32), "s"),
             helper.make_tensor("z", TensorProto.INT4, [], [1])]
    model = _model(nodes, [_vi("x", shape=[4])], [_vi("y", shape=[4]), _vi("dq", shape=[4])], inits, opset=21)
    cm = hybrid.compile(model, target="reference")
    x = np.array([0.3, -1000.0, 1.7, 2.2], np.float32)
    out = cm.run({"x": x})
    expected_f8 = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(out["y"], expected_f8)
    np.testing.assert_array_equal(out["dq"], (np.clip(np.rint(x / 0.5) + 1, -8, 7) - 1) * 0.5)


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_models_match_their_expected_outputs(light, name):
    # with the logits as a second output: the equal weights drive the logits to 1e10..4e31, where Softmax
    # turns a one-ulp GEMM difference between channels into a different answer (onnx.reference misses it
    # too), so the shipped softmax is checked through its logits (tests._models.light_with_logits)
    cm = hybrid.compile(light_with_logits(name)[0], target="reference")
    out = cm.run({cm.signature.inputs[0].name: light.light_input()})
    check_light_outputs(name, list(out.values()))


def test_fusion_keeps_the_numbers(rng):
    c = 8
    w = rng.standard_normal((c, c, 3, 3)).astype(np.float32)
    stats = [rng.uniform(0.5, 1.5, c).astype(np.float32) for _ in range(4)]
    inits = [onnx.numpy_helper.from_array(w, "w")] + [onnx.numpy_helper.from_array(s, n)
                                                     for s, n in zip(stats, ["sc", "bi", "mu", "va"])]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "sc", "bi", "mu", "va"], ["b"]),
             helper.make_node("Add", ["b", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = _model(nodes, [_vi("x", shape=[1, c, 6, 6])], [_vi("y")], inits)
    x = rng.standard_normal((1, c, 6, 6)).astype(np.float32)
    fused = hybrid.compile(model, target="reference")
    plain = hybrid.compile(model, target="reference", config={"fuse": False})
    assert len(fused.executable.program.steps) == 1 and len(plain.executable.program.steps) == 4
    np.testing.assert_allclose(fused(x), plain(x), rtol=1e-5, atol=1e-5)


def test_per_channel_mul_and_add_fold_into_the_conv(rng):
    c = 4
    w = rng.standard_normal((c, c, 1, 1)).astype(np.float32)
    scale = rng.uniform(0.5, 2, (c, 1, 1)).astype(np.float32)
    shift = rng.standard_normal((c, 1, 1)).astype(np.float32)
    full = rng.standard_normal((1, c, 5, 5)).astype(np.float32)  # not per-channel: stays a step
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in [(w, "w"), (scale, "s"), (shift, "t"), (full, "f")]]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["s", "c"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["a"]), helper.make_node("Add", ["a", "f"], ["y"])]
    model = _model(nodes, [_vi("x", shape=[1, c, 5, 5])], [_vi("y")], inits)
    x = rng.standard_normal((1, c, 5, 5)).astype(np.float32)
    fused = hybrid.compile(model, target="reference")
    plain = hybrid.compile(model, target="reference", config={"fuse": False})
    assert [s.op_type for s in fused.executable.program.steps] == ["Conv"]  # the last Add became the residual
    np.testing.assert_allclose(fused(x), plain(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_num_threads_split_gemms_and_restore_blas(rng, threads):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    w = rng.standard_normal((96, 64, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w2"], ["y"])]
    w2 = rng.standard_normal((80, 96, 1, 1)).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(w2, "w2")]
    model = _model(nodes, [_vi("x", shape=[1, 64, 20, 20])], [_vi("y")], inits)
    before = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    split = hybrid.compile(model, target="reference", config={"num_threads": threads})
    plain = hybrid.compile(model, target="reference", config={"num_threads": 1})
    x = rng.standard_normal((1, 64, 20, 20)).astype(np.float32)
    np.testing.assert_allclose(split(x), plain(x), rtol=1e-4, atol=1e-3)
    assert [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"] == before
    with pytest.raises(BackendError) as e:
        hybrid.compile(model, target="reference", config={"num_threads": 0})
    assert e.value.code == "HYB-306"


def test_standalone_batch_norm_takes_the_relu(rng):
    c = 4
    stats = [rng.uniform(0.5, 1.5, c).astype(np.float32) for _ in range(4)]
    inits = [onnx.numpy_helper.from_array(s, n) for s, n in zip(stats, ["sc", "bi", "mu", "va"])]
    nodes = [helper.make_node("BatchNormalization", ["x", "sc", "bi", "mu", "va"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    model = _model(nodes, [_vi("x", shape=[2, c, 3, 3])], [_vi("y")], inits)
    x = rng.standard_normal((2, c, 3, 3)).astype(np.float32)
    sc, bi, mu, va = (s.reshape(1, c, 1, 1) for s in stats)
    expected = np.maximum((x - mu) / np.sqrt(va + 1e-5) * sc + bi, 0)
    cm = hybrid.compile(model, target="reference")
    assert [s.op_type for s in cm.executable.program.steps] == ["BatchNormalization"]
    np.testing.assert_allclose(cm(x), expected, rtol=1e-5, atol=1e-6)


def test_fused_weights_are_not_kept_twice(light):
    cm = hybrid.compile(str(light.light_model_path("resnet50")), target="reference")
    held = sum(v.nbytes for v in cm.executable.program._template if isinstance(v, np.ndarray))
    assert held < 10e6  # the 8 MB classifier; the conv weights live only in their (fused) kernels


def test_evaluate_node_runs_a_self_contained_if():
    then_g = helper.make_graph([helper.make_node("Constant", [], ["t"], value_floats=[1.0, 2.0])], "then", [],
                               [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Constant", [], ["e"], value_floats=[3.0])], "else", [], [_vi("e")])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                   [_vi("c", TensorProto.BOOL, [])], [_vi("y")])
    node = ir.serde.deserialize_model(model).graph.node(0)
    assert evaluate_node(node, [np.array(True)])[0].tolist() == [1.0, 2.0]
    assert evaluate_node(node, [np.array(False)])[0].tolist() == [3.0]


def test_overlapping_runs_give_blas_its_threads_back(rng):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import threading

    model = _model([helper.make_node("MatMul", ["x", "x"], ["y"])], [_vi("x", shape=[64, 64])], [_vi("y")])
    before = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    cms = [hybrid.compile(model, target="reference", config={"num_threads": 2}) for _ in range(4)]
    x = rng.standard_normal((64, 64)).astype(np.float32)
    errors: list[BaseException] = []

    def work(cm):
        try:
            for _ in range(50):
                np.testing.assert_allclose(cm(x), x @ x, rtol=1e-4, atol=1e-4)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(cm,)) for cm in cms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"] == before


def test_model_local_functions_are_inlined():
    fn = helper.make_function("com.example.fn", "AddRelu", ["a", "b"], ["y"],
                              [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                              [helper.make_opsetid("", 18)])
    graph = helper.make_graph([helper.make_node("AddRelu", ["x", "z"], ["y"], domain="com.example.fn")], "g",
                              [_vi("x", shape=[3]), _vi("z", shape=[3])], [_vi("y", shape=[3])])
    model = helper.make_model(graph, functions=[fn],
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example.fn", 1)])
    cm = hybrid.compile(model, target="reference")
    assert [s.op_type for s in cm.executable.program.steps] == ["Add", "Relu"]
    got = cm(np.array([1.0, -5.0, 2.0], np.float32), np.array([1.0, 1.0, -3.0], np.float32))
    np.testing.assert_array_equal(got, [2.0, 0.0, 0.0])


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_uses_the_absolute_value(rng, p):
    """onnx.reference computes the L1 norm as sum(x), wrong for negative x; the hand kernel does not."""
    x = rng.standard_normal((3, 5)).astype(np.float32)
    model = _model([helper.make_node("LpNormalization", ["x"], ["y"], axis=-1, p=p)], [_vi("x", shape=[3, 5])],
                   [_vi("y", shape=[3, 5])])
    got = hybrid.compile(model, target="reference").run({"x": x})["y"]
    want = x / np.linalg.norm(x, ord=p, axis=-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_array_equal(hybrid.compile(model, target="reference").run({"x": np.zeros_like(x)})["y"], 0)
