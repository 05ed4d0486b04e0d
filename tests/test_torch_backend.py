"""The torch backend: lowering table, device discovery, auto-selection, conformance, light models.

Every test runs on one torch device, 'cpu' unless ``HYBRID_TEST_DEVICE`` names another
(``HYBRID_TEST_DEVICE=cuda python -m pytest tests/test_torch_backend.py`` on a GPU machine; see
benchmarks/run_gpu_checks.sh). Tests that only make sense on the CPU say so.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests._conformance import conformance
from tests._models import check_light_outputs, light_with_logits, matmul_add

import hybrid
from hybrid.errors import BackendError
from hybrid.hal import backend_status, get_backend, resolve_target
from hybrid.zoo.samples import LIGHT_MODELS, light_input, light_model_with_random_weights

torch = pytest.importorskip("torch")

DEVICE = os.environ.get("HYBRID_TEST_DEVICE", "cpu")
KIND = DEVICE.partition(":")[0]
TARGET = f"torch:{DEVICE}"
# fp32 on CUDA: keep cuDNN/cuBLAS off TF32 so results compare with ONNX Runtime on the CPU
CONFIG = {"allow_tf32": False} if KIND == "cuda" else {}
# measured on the CPU (README, docs/gpu.md); another device may lack kernels for a few dtypes
CONFORMANCE_FLOOR = 1600 if KIND == "cpu" else 1200


def _device_present() -> bool:
    status = backend_status("torch")
    return status.available and any(d.kind == KIND for d in status.devices)


pytestmark = pytest.mark.skipif(not _device_present(), reason=f"torch sees no {DEVICE} device")


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _compile(model, **config):
    return hybrid.compile(model, target=TARGET, config={**CONFIG, **config})


# ---------------------------------------------------------------------------------------------- registry
def test_import_hybrid_and_the_backend_class_import_no_torch():
    code = ("import sys, hybrid, hybrid.backends.torch\n"
            "hybrid.set_backend('torch', {'compile': True, 'compile_mode': 'max-autotune'})\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # the child asserts what a fresh interpreter imported


def test_backend_is_registered_with_priority_30_and_a_cpu_device():
    status = backend_status("torch")
    assert status.available, status.reason
    assert status.priority == 30
    assert status.version == torch.__version__
    names = [d.name for d in status.devices]
    assert "cpu" in names
    if torch.cuda.is_available():
        assert f"cuda:{torch.cuda.device_count() - 1}" in names
    else:
        assert not any(n.startswith("cuda") for n in names)


def test_torch_joins_auto_selection_on_the_cpu():
    auto = [str(c) for c in resolve_target("auto")]
    assert "torch:cpu" in auto
    cpu = [str(c) for c in resolve_target("cpu")]
    assert cpu.index("onnxruntime:cpu") < cpu.index("torch:cpu")  # priority 10 before 30
    assert [str(c) for c in resolve_target("torch")][-1] == "torch:cpu"
    assert "torch" in next(d for d in hybrid.devices() if d.name == "cpu").backends


def test_bad_options_are_rejected_before_torch_runs():
    with pytest.raises(BackendError) as e:
        hybrid.set_backend("torch", {"compile_mode": "fastest"})
    assert e.value.code == "HYB-306"
    with pytest.raises(BackendError) as e:
        hybrid.compile(matmul_add(), target="torch", config={"complie": True})
    assert e.value.code == "HYB-306" and "compile" in e.value.message


# ---------------------------------------------------------------------------------------------- supports
def test_supports_answers_from_the_table():
    backend = get_backend("torch")
    conv = _model([helper.make_node("Conv", ["x", "w"], ["y"])],
                  [_vi("x", TensorProto.FLOAT, [1, 1, 4, 4]), _vi("w", TensorProto.FLOAT, [1, 1, 3, 3])],
                  [_vi("y", TensorProto.FLOAT, None)])
    int_conv = _model([helper.make_node("Conv", ["x", "w"], ["y"])],
                      [_vi("x", TensorProto.INT8, [1, 1, 4, 4]), _vi("w", TensorProto.INT8, [1, 1, 3, 3])],
                      [_vi("y", TensorProto.INT8, None)])
    strings = _model([helper.make_node("Identity", ["s"], ["t"])], [_vi("s", TensorProto.STRING, [2])],
                     [_vi("t", TensorProto.STRING, [2])])
    unknown = _model([helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")],
                     [_vi("x", TensorProto.FLOAT, [2])], [_vi("y", TensorProto.FLOAT, [2])])
    unknown.opset_import.append(helper.make_opsetid("com.example", 1))
    found = {name: backend.supports_model(hybrid.Model.load(m), DEVICE)
             for name, m in [("conv", conv), ("int_conv", int_conv), ("strings", strings), ("unknown", unknown)]}
    assert found["conv"] == []
    assert [n.op_type for n in found["int_conv"]] == ["Conv"]
    assert [n.op_type for n in found["strings"]] == ["Identity"]
    assert [n.op_type for n in found["unknown"]] == ["NoSuchOp"]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [{"axis": 1}, {}])
def test_opset_decides_which_lowering_applies(op, axis):
    # the softmax family before opset 13 flattens at the axis (default 1); from 13 on it works along one axis
    # (default -1)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    outs = {}
    for opset in (11, 13):
        m = _model([helper.make_node(op, ["x"], ["y"], **axis)], [_vi("x", TensorProto.FLOAT, [2, 3, 4])],
                   [_vi("y", TensorProto.FLOAT, [2, 3, 4])], opset=opset)
        outs[opset] = _compile(m)(x)
        ref = hybrid.compile(m, target="onnxruntime")(x)
        np.testing.assert_allclose(outs[opset], ref, rtol=1e-5, atol=1e-6)
    assert not np.allclose(outs[11], outs[13])


def test_unsupported_node_fails_compile_naming_it():
    m = _model([helper.make_node("Relu", ["x"], ["r"], name="first"),
                helper.make_node("StringNormalizer", ["r"], ["y"], name="strings")],
               [_vi("x", TensorProto.FLOAT, [2])], [_vi("y", TensorProto.FLOAT, [2])])
    with pytest.raises(BackendError) as e:
        hybrid.compile(m, target=TARGET)
    assert e.value.code == "HYB-304"
    assert "'strings'" in e.value.message and "StringNormalizer" in e.value.message


# ---------------------------------------------------------------------------------------------- running
def test_matmul_add_matches_numpy_and_weights_live_on_the_device():
    cm = _compile(matmul_add())
    model = hybrid.Model.load(matmul_add())
    w = model.graph.initializers["W"].const_value.numpy()
    b = model.graph.initializers["b"].const_value.numpy()
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(cm(x), x @ w + b, rtol=1e-5, atol=1e-6)
    assert cm.backend == "torch" and cm.device.partition(":")[0] == KIND
    buffers = list(cm.executable.module.buffers())
    assert buffers and all(t.device.type == KIND for t in buffers)


def test_outputs_never_alias_inputs_or_weights():
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    m = _model([helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["w"], ["z"])],
               [_vi("x", TensorProto.FLOAT, [4])], [_vi("y", TensorProto.FLOAT, [4]), _vi("z", TensorProto.FLOAT, [4])],
               [w])
    cm = _compile(m)
    x = np.ones(4, np.float32)
    y, z = cm(x)
    y[:] = 7
    z[:] = 7
    assert x.tolist() == [1, 1, 1, 1]
    assert cm(x)[1].tolist() == [0, 1, 2, 3]


@pytest.mark.skipif(KIND != "cpu", reason="the CPU path shares memory")
def test_cpu_runs_copy_nothing_across_devices():
    from hybrid.hal import memory

    cm = _compile(matmul_add())
    before = memory.transfer_stats("cpu")
    cm(np.ones((3, 4), np.float32))
    assert memory.transfer_stats("cpu") == before


@pytest.mark.gpu
@pytest.mark.skipif(KIND != "cuda", reason="pinned staging is for CUDA")
def test_cuda_inputs_stage_through_the_pinned_pool():
    from hybrid.hal import memory

    hybrid.init({"memory_pool": {"pinned": "16MB"}})
    pool = memory.get_pool("pinned")
    assert pool is not None
    cm = _compile(matmul_add())
    x = np.ones((3, 4), np.float32)
    live = pool.stats().live_blocks
    before = memory.transfer_stats("gpu")
    y = cm(x)
    cm(x)  # same shape: the staging block is reused
    assert pool.stats().live_blocks == live + 1
    after = memory.transfer_stats("gpu")
    assert after.bytes_in - before.bytes_in == 2 * x.nbytes
    assert after.bytes_out - before.bytes_out == 2 * y.nbytes
    hybrid.init({"memory_pool": {}})


def test_dtypes_round_trip_bfloat16_bool_int64():
    import ml_dtypes

    m = _model([helper.make_node("Add", ["a", "a"], ["s"]), helper.make_node("Not", ["b"], ["nb"]),
                helper.make_node("Neg", ["i"], ["ni"])],
               [_vi("a", TensorProto.BFLOAT16, [3]), _vi("b", TensorProto.BOOL, [2]), _vi("i", TensorProto.INT64, [2])],
               [_vi("s", TensorProto.BFLOAT16, [3]), _vi("nb", TensorProto.BOOL, [2]),
                _vi("ni", TensorProto.INT64, [2])])
    a = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    s, nb, ni = _compile(m)(a, np.array([True, False]), np.array([5, -6], np.int64))
    assert s.dtype == np.dtype(ml_dtypes.bfloat16) and s.astype(np.float32).tolist() == [3.0, -4.0, 6.5]
    assert nb.tolist() == [False, True] and ni.tolist() == [-5, 6] and ni.dtype == np.int64


def test_constant_subgraphs_fold_at_build_time():
    # ConstantOfShape -> Add on constants only: no call is left for them in the module
    shape = numpy_helper.from_array(np.array([2, 3], np.int64), "shape")
    m = _model([helper.make_node("ConstantOfShape", ["shape"], ["c"],
                                 value=numpy_helper.from_array(np.array([0.5], np.float32))),
                helper.make_node("Add", ["c", "c"], ["one"]), helper.make_node("Mul", ["x", "one"], ["y"])],
               [_vi("x", TensorProto.FLOAT, [2, 3])], [_vi("y", TensorProto.FLOAT, [2, 3])], [shape])
    cm = _compile(m)
    calls = [n.target.__name__ for n in cm.executable.module.graph.nodes if n.op == "call_function"]
    assert calls == ["mul"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(cm(x), x)


def test_control_flow_and_sequences_run():
    then = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                             [_vi("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", TensorProto.FLOAT, [2])])
    m = _model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
                helper.make_node("SequenceConstruct", ["x", "y"], ["seq"]),
                helper.make_node("ConcatFromSequence", ["seq"], ["cat"], axis=0)],
               [_vi("c", TensorProto.BOOL, []), _vi("x", TensorProto.FLOAT, [2])],
               [_vi("cat", TensorProto.FLOAT, [4])])
    cm = _compile(m)
    x = np.array([1.0, -2.0], np.float32)
    assert cm(np.array(True), x).tolist() == [1, -2, 2, -4]
    assert cm(np.array(False), x).tolist() == [1, -2, -1, 2]


def test_autocast_keeps_declared_output_dtypes():
    cm = _compile(matmul_add(), autocast="bf16")
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    y = cm(x)
    ref = hybrid.compile(matmul_add(), target="onnxruntime")(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=5e-2, atol=5e-2)


def test_torch_compile_option_wraps_the_module():
    cm = _compile(matmul_add(), compile=True, compile_backend="eager")
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(cm(x), hybrid.compile(matmul_add(), target="onnxruntime")(x), rtol=1e-5, atol=1e-6)
    assert type(cm.executable.module).__name__ == "OptimizedModule"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_torch_compile_with_inductor():
    cm = _compile(matmul_add(), compile=True)
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(cm(x), hybrid.compile(matmul_add(), target="onnxruntime")(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- conformance
@pytest.mark.timeout(600)
def test_onnx_node_conformance():
    if CONFIG:
        hybrid.set_backend("torch", CONFIG)  # the conftest fixture resets it after the test
    passed, failed = conformance(TARGET)
    assert passed >= CONFORMANCE_FLOOR, f"{passed} passed on {DEVICE}; failed: {failed}"


# ---------------------------------------------------------------------------------------------- light models
def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# the shipped weights: uniform outputs, cheap; every model
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_models_match_onnxruntime(name):
    # with the logits as a second output: the softmax over ~1e10 equal logits is decided by rounding, so
    # the logits are compared with ONNX Runtime's, and the outputs checked against what the shipped file says
    model, _ = light_with_logits(name)
    got = _run_light(hybrid.compile(model, target=TARGET, config=CONFIG))
    ref = _run_light(hybrid.compile(model, target="onnxruntime"))
    check_light_outputs(name, got)
    np.testing.assert_allclose(got[-1], ref[-1], rtol=1e-4, atol=1e-7)


def _run_light(cm) -> list[np.ndarray]:
    return list(cm.run({cm.signature.inputs[0].name: light_input()}).values())


# random weights (the large fully connected layers of AlexNet, ZFNet and VGG make those slow)
_HEAVY = ("bvlc_alexnet", "vgg19", "zfnet512")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _HEAVY else n
                                  for n in LIGHT_MODELS])
def test_light_models_with_random_weights_match_onnxruntime(name):
    x = light_input()
    varied = light_model_with_random_weights(name)
    y = hybrid.compile(varied, target=TARGET, config=CONFIG)(x)
    expected = hybrid.compile(varied, target="onnxruntime")(x)
    assert _relative(y, expected) <= 1e-4


@pytest.mark.parametrize(("op", "extra_inputs", "attrs"), [
    ("LayerNormalization", ["scale", "bias"], {"axis": -1}),
    ("BatchNormalization", ["scale", "bias", "mean", "var"], {"training_mode": 1}),
])
def test_a_normalization_that_declares_one_output_feeds_the_next_node_a_tensor(rng, op, extra_inputs, attrs):
    """LayerNormalization and training BatchNormalization may declare 1 of their 3 outputs (transformers'
    exports do); the lowering must then hand the next node a tensor, not a tuple."""
    f = TensorProto.FLOAT
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    channels = 3 if op == "LayerNormalization" else 4
    inits = [numpy_helper.from_array(rng.random(channels).astype(np.float32) + 0.5, n) for n in extra_inputs]
    w = numpy_helper.from_array(rng.standard_normal((3, 5)).astype(np.float32), "w")
    nodes = [helper.make_node(op, ["x", *extra_inputs], ["n"], **attrs), helper.make_node("MatMul", ["n", "w"], ["y"])]
    model = _model(nodes, [_vi("x", f, [2, 4, 3, 3])], [_vi("y", f, [2, 4, 3, 5])], [*inits, w], opset=17)
    want = hybrid.compile(model, target="reference").run({"x": x})["y"]
    np.testing.assert_allclose(_compile(model).run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
