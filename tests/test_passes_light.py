"""The optimizer on ONNX's light model zoo: same numbers at O2 as at O0, far fewer nodes.

"Within 1e-5 relative" is measured as max|O2 - O0| <= 1e-5 * max|O0| per output (an element-wise
ratio is meaningless for entries near zero). The shipped light models generate every weight as one
constant, so their softmax outputs are flat; the randomized variants give every weight and batch-norm
statistic its own random value and drop the final Softmax, so that the comparison sees real logits.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from tests._models import check_light_outputs, light_with_logits

import hybrid
from hybrid.passes import DEFAULT_FOLD_SIZE_LIMIT
from hybrid.zoo.samples import LIGHT_MODELS, light_input, light_model_path

REL = 1e-5


@pytest.fixture(autouse=True)
def _verify(monkeypatch):
    monkeypatch.setenv("HYBRID_VERIFY_PASSES", "1")


def _ort(model, x, every=False):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # compare our graphs, not ORT's
    so.intra_op_num_threads = 2
    session = ort.InferenceSession(model.to_bytes(), so, providers=["CPUExecutionProvider"])
    outputs = session.run(None, {session.get_inputs()[0].name: x})
    return outputs if every else outputs[0]


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def randomized(name, seed=0):
    """Light model ``name`` at O1 with random weights and no final Softmax."""
    rng = np.random.default_rng(seed)
    model = hybrid.optimize(light_model_path(name), "O1")
    work = model.ir.clone()
    graph = work.graph
    variances = {n.inputs[4].name for n in graph if n.op_type == "BatchNormalization"}
    for name_, value in list(graph.initializers.items()):
        array = value.const_value.numpy()
        if array.dtype != np.float32 or array.ndim == 0:
            continue
        if name_ in variances:
            new = rng.uniform(0.5, 1.5, array.shape)
        elif array.ndim >= 2:  # He initialization keeps activations in range through 100+ layers
            new = rng.standard_normal(array.shape) * np.sqrt(2.0 / max(1, int(np.prod(array.shape[1:]))))
        else:
            new = rng.uniform(-0.5, 1.5, array.shape)
        value.const_value = ir.tensor(new.astype(np.float32), name=name_)
    last = graph.node(len(graph) - 1)
    if last.op_type == "Softmax":
        graph.outputs[0] = last.inputs[0]
        graph.remove(last, safe=True)
    return hybrid.Model(work)


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_o2_equals_o0_on_every_light_model(name):
    # with the logits as a second output: the shipped softmax over equal logits of up to 4e31 is decided by
    # rounding, so O2 against O0 is judged on the logits (tests._models.light_with_logits)
    model = hybrid.Model.load(light_with_logits(name)[0])
    optimized = hybrid.optimize(model, "O2")
    assert len(optimized.graph) < len(model.graph)
    for node in optimized.graph:  # every weight generator folded, but those over fold_size_limit
        if node.op_type == "ConstantOfShape":
            assert np.prod(node.inputs[0].const_value.numpy()) * 4 > DEFAULT_FOLD_SIZE_LIMIT
    x = light_input()
    reference, result = _ort(model, x, every=True), _ort(optimized, x, every=True)
    assert len(result) == len(reference) and _rel(result[-1], reference[-1]) <= REL
    check_light_outputs(name, result)


def test_resnet50_node_count():
    model = hybrid.Model.load(light_model_path("resnet50"))
    assert len(model.graph) == 415
    o1, o2 = hybrid.optimize(model, "O1"), hybrid.optimize(model, "O2")
    assert len(o1.graph) == 176  # the 239 weight generators folded
    assert len(o2.graph) <= 130  # and the 53 BatchNormalizations folded into their Convs
    assert {n.op_type for n in o2.graph} == {"Conv", "Relu", "Sum", "MaxPool", "AveragePool", "Reshape", "Gemm",
                                             "Softmax"}
    assert len(hybrid.optimize(o2, "O2").graph) == len(o2.graph)  # a fixpoint: nothing left to do


@pytest.mark.parametrize("name", ["resnet50", "densenet121", "inception_v2", "shufflenet"])
def test_o2_keeps_the_numbers_with_random_weights(name):
    model = randomized(name)
    optimized = hybrid.optimize(model, "O2")
    assert len(optimized.graph) < len(model.graph)  # batch norms and scales fused
    x = np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)
    reference = _ort(model, x)
    assert float(np.std(reference)) > 1.0  # real logits, not a flat softmax
    assert _rel(_ort(optimized, x), reference) <= REL


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino not installed")
def test_o2_keeps_the_numbers_on_openvino():
    import openvino as ov

    model = randomized("resnet50")
    optimized = hybrid.optimize(model, "O2")
    core = ov.Core()
    x = np.random.default_rng(2).random((1, 3, 224, 224), dtype=np.float32)
    config = {"INFERENCE_PRECISION_HINT": "f32"}
    outputs = [core.compile_model(core.read_model(m.to_bytes(), b""), "CPU", config)([x])[0]
               for m in (model, optimized)]
    assert _rel(outputs[1], outputs[0]) <= REL
    assert _rel(outputs[1], _ort(model, x)) <= 1e-4  # and OpenVINO agrees with ONNX Runtime
