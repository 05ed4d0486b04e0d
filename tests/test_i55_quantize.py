"""Issue 55 item 3: int8 of a model exported at the article's opset 11, and activation_dtype honoured or refused."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")
nn = torch.nn

import hybrid  # noqa: E402
from hybrid.errors import QuantizationError  # noqa: E402

N_CALIBRATION, N_EVAL = 8, 4


class ConvBN(nn.Module):
    """Conv+BatchNorm+ReLU twice, then a Linear head: the article's CNN in miniature."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.flatten(self.body(x), 1))


@pytest.fixture(scope="module")
def opset11():
    torch.manual_seed(0)
    net = ConvBN().eval()
    with torch.no_grad():  # BatchNorm statistics that are not the identity, so folding them matters
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
    model = hybrid.export(net, input_shape=(1, 3, 16, 16), opset_version=11)
    assert model.opset == 11
    return model


@pytest.fixture(scope="module")
def samples():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(N_CALIBRATION + N_EVAL)]


def _quantize(model, samples, **cfg):
    return hybrid.quantize(model, {"quant_mode": "static", "calibration_dataset": samples,
                                   "num_calibration_samples": N_CALIBRATION, "num_eval_samples": N_EVAL, **cfg})


def _run(model, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _activation_zero_point_types(model) -> set[str]:
    """Element types of the zero points of every QuantizeLinear that quantizes an activation (not a weight)."""
    proto = model.to_onnx()
    inits = {t.name: t for t in proto.graph.initializer}
    return {TensorProto.DataType.Name(inits[n.input[2]].data_type) for n in proto.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in inits and len(n.input) > 2}


def test_static_int8_of_an_opset_11_export_upgrades_the_opset(opset11, samples):
    q = _quantize(opset11, samples)
    report = q.metadata["quantization_report"]
    assert report.result == "quantized"
    assert q.opset >= 13
    assert "11" in report.opset_conversion and "13" in report.opset_conversion
    assert "per-channel" in report.scheme
    assert "opset" in str(report)  # the printed report says it too
    x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32)
    assert _cosine(_run(q, x), _run(opset11, x)) > 0.99
    assert report.cosine_min > 0.99


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_activation_dtype_is_honoured(opset11, samples, dtype):
    q = _quantize(opset11, samples, activation_dtype=dtype)
    assert _activation_zero_point_types(q) == {dtype.upper()}
    assert f"{dtype} activations" in q.metadata["quantization_report"].scheme


def test_unconvertible_opset_falls_back_to_per_tensor_with_a_note(opset11, samples, monkeypatch):
    def refuse(model, version):
        raise RuntimeError("No Adapter From Version $11 for Frobnicate")

    monkeypatch.setattr(onnx.version_converter, "convert_version", refuse)
    q = _quantize(opset11, samples)
    report = q.metadata["quantization_report"]
    assert report.result == "quantized" and q.opset == 11
    assert "per-tensor" in report.scheme
    assert "per-tensor" in report.opset_conversion and "Frobnicate" in report.opset_conversion
    assert report.cosine_min > 0.99


def test_bf16_of_an_opset_11_export(opset11, samples):
    q = hybrid.quantize(opset11, {"quant_mode": "bf16", "calibration_dataset": samples})
    assert q.opset >= 13 and q.metadata["quantization_report"].cosine_min > 0.99


def test_dynamic_int8_activations_are_refused_with_the_fix(opset11, samples):
    # ONNX Runtime quantizes activations at run time to uint8 only (DynamicQuantizeLinear)
    with pytest.raises(QuantizationError) as e:
        hybrid.quantize(opset11, {"quant_mode": "dynamic", "activation_dtype": "int8", "calibration_dataset": samples})
    assert e.value.code == "HYB-601"
    assert "uint8" in e.value.message and "'static'" in e.value.hint


def test_uint8_weights_with_int8_activations_are_refused_and_auto_follows_the_weights(opset11, samples):
    with pytest.raises(QuantizationError) as e:
        _quantize(opset11, samples, weight_dtype="uint8", activation_dtype="int8")
    assert e.value.code == "HYB-601" and "uint8" in e.value.hint
    q = _quantize(opset11, samples, weight_dtype="uint8")
    assert _activation_zero_point_types(q) == {"UINT8"}


def test_a_per_channel_model_at_opset_11_names_the_fix():
    # what the quantizer wrote before the opset upgrade: DequantizeLinear with an axis at opset 11
    w = numpy_helper.from_array(np.ones((2, 3), np.int8), "w_q")
    scale = numpy_helper.from_array(np.ones(2, np.float32), "w_scale")
    zp = numpy_helper.from_array(np.zeros(2, np.int8), "w_zp")
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], axis=0),
         helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w, scale, zp])
    bad = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]).SerializeToString()
    from hybrid.passes.quantize.report import Evaluator

    with pytest.raises(QuantizationError) as e:
        Evaluator(bad, [{"x": np.ones((1, 2), np.float32)}])
    assert e.value.code == "HYB-606"
    assert "opset" in e.value.hint and "per_channel=False" in e.value.hint
