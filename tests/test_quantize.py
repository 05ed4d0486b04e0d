"""hybrid.quantize: every mode, the accuracy report, accuracy-aware layer selection, calibration errors,
and quantized models on every CPU backend."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import hybrid  # noqa: E402
from hybrid.errors import QuantizationError  # noqa: E402
from hybrid.hal import backend_status  # noqa: E402
from hybrid.passes.quantize import QuantizationReport  # noqa: E402


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class Outlier(nn.Module):
    """fc2's input has one channel ~300x larger than the rest, as in trained transformers: per-tensor
    int8 activations starve the other channels, so fc1/fc2 are the sensitive layers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 8)
        with torch.no_grad():
            self.fc1.weight[0] *= 300
            self.fc1.bias[0] = 300
            self.fc2.weight[:, 0] /= 300

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


@pytest.fixture(scope="module")
def classifier():
    torch.manual_seed(0)
    net = Classifier().eval()
    return net, hybrid.export(net, input_shape=(1, 3, 16, 16), dynamic_axes={"input": {0: "batch"}})


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((4, 3, 16, 16)).astype(np.float32) for _ in range(12)]


@pytest.fixture(scope="module")
def outlier():
    torch.manual_seed(0)
    return hybrid.export(Outlier().eval(), input_shape=(4, 16), dynamic_axes={"input": {0: "batch"}})


@pytest.fixture(scope="module")
def vectors():
    rng = np.random.default_rng(1)
    return [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(20)]


def _report(model) -> QuantizationReport:
    report = model.metadata["quantization_report"]
    assert isinstance(report, QuantizationReport)
    return report


# ------------------------------------------------------------------ modes and the report
@pytest.mark.parametrize("mode", ["static", "dynamic", "fp16", "bf16"])
def test_every_mode_reports_accuracy_on_held_back_samples(classifier, images, mode):
    _, model = classifier
    q = hybrid.quantize(model, {"quant_mode": mode, "calibration_dataset": images, "num_calibration_samples": 8,
                                "num_eval_samples": 4})
    report = _report(q)
    assert report.mode == mode
    assert report.eval_samples == 4
    assert report.eval_source == ("held-out" if mode == "static" else "dataset")
    (out,) = report.outputs
    assert out.name == "output" and out.cosine_min > 0.99 and out.snr_db > 15 and out.top1_agreement is not None
    assert out.max_abs_error >= 0 and -1 <= out.cosine_min <= out.cosine_mean <= 1 + 1e-9
    assert q.signature == model.signature
    summary = json.loads({p.key: p.value for p in q.to_onnx().metadata_props}["hybrid.quantization"])
    assert summary["mode"] == mode and summary["outputs"][0]["name"] == "output"
    assert mode in str(report)


def test_static_int8_shrinks_the_model_and_uses_qdq(classifier, images):
    _, model = classifier
    q = hybrid.quantize(model, {"quant_mode": "static", "calibration_dataset": images, "calibration_method": "minmax",
                                "activation_dtype": "uint8", "per_channel": False})
    report = _report(q)
    ops = {n.op_type for n in q.to_onnx().graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert report.quantized_bytes < report.fp32_bytes
    int8_weights = [t for t in q.to_onnx().graph.initializer if t.data_type == 3 and len(t.dims) == 4]
    assert len(int8_weights) == 2  # both Conv kernels stored as int8
    assert "uint8 activations" in report.scheme and "per-tensor" in report.scheme


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_calibration_methods(classifier, images, method):
    _, model = classifier
    q = hybrid.quantize(model, {"calibration_dataset": images, "calibration_method": method,
                                "num_calibration_samples": 4, "num_eval_samples": 2})
    assert _report(q).outputs[0].cosine_min > 0.95


def test_dynamic_without_data_reports_on_synthetic_inputs(outlier):
    q = hybrid.quantize(outlier, {"quant_mode": "dynamic", "op_types": ["MatMul", "Gemm"]})
    assert _report(q).eval_source == "synthetic" and _report(q).eval_samples > 0


def test_samples_of_every_form(classifier, images):
    _, model = classifier
    labels = torch.zeros(4, dtype=torch.int64)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(np.concatenate(images)),
                                             torch.zeros(len(images) * 4, dtype=torch.int64))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4)  # (x, label) batches
    forms = {
        "loader": loader,
        "tensors": [torch.from_numpy(x) for x in images],
        "dicts": [{"input": x} for x in images],
        "pairs": [(torch.from_numpy(x), labels) for x in images],
        "generator": (x.astype(np.float64) for x in images),  # cast to the model's float32
    }
    for name, data in forms.items():
        q = hybrid.quantize(model, {"calibration_dataset": data, "num_calibration_samples": 6, "num_eval_samples": 3})
        assert _report(q).eval_samples == 3, name


def test_few_samples_still_hold_some_back(classifier, images):
    _, model = classifier
    q = hybrid.quantize(model, {"calibration_dataset": images[:5]})
    report = _report(q)
    assert report.eval_source == "held-out" and report.eval_samples == 1
    one = hybrid.quantize(model, {"calibration_dataset": images[:1]})
    assert _report(one).eval_source == "calibration"


# ------------------------------------------------------------------ accuracy-aware quantization
def test_accuracy_budget_keeps_the_measured_most_sensitive_layers_in_float(outlier, vectors):
    plain = hybrid.quantize(outlier, {"quant_mode": "static", "calibration_dataset": vectors})
    assert _report(plain).cosine_min < 0.9  # the outlier channel ruins per-tensor int8

    q = hybrid.quantize(outlier, {"quant_mode": "static", "calibration_dataset": vectors,
                                  "accuracy": {"min_cosine": 0.99}, "speed_check": False})
    report = _report(q)
    assert report.budget_met is True and report.cosine_min >= 0.99
    ranked = [name for name, _ in report.sensitivity]
    scores = [score for _, score in report.sensitivity]
    assert scores == sorted(scores, reverse=True) and len(ranked) == 3
    assert report.kept_float == tuple(ranked[: len(report.kept_float)])
    assert 1 <= len(report.kept_float) < 3
    # fc3 reads well-scaled activations: measured as the least sensitive and left quantized
    last = next(n for n in outlier.to_onnx().graph.node if n.output[0] == outlier.signature.output_names[0])
    assert ranked[-1] == last.name and last.name not in report.kept_float
    assert "kept in float" in str(report)


def test_a_budget_only_float_meets_returns_float_or_raises_hyb_605(vectors):
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            return torch.relu(self.fc(x)) + x

    model = hybrid.export(Residual().eval(), input_shape=(4, 16))
    cfg = {"calibration_dataset": vectors, "accuracy": {"max_abs_error": 0.0, "on_unmet": "raise"}}
    with pytest.raises(QuantizationError) as e:
        hybrid.quantize(model, cfg)
    assert e.value.code == "HYB-605" and "only float meets" in e.value.message and "max abs error" in e.value.message
    q = hybrid.quantize(model, {**cfg, "accuracy": {"max_abs_error": 0.0}})  # on_unmet='float' is the default
    report = _report(q)
    assert report.result == "float" and report.budget_met is True and "only float meets" in report.note
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in q.to_onnx().graph.node}
    assert {g.reason for g in report.float_groups} == {"float"} and report.float_groups


# ------------------------------------------------------------------ quantized models run everywhere
@pytest.mark.parametrize("backend", ["onnxruntime", "openvino", "reference"])
@pytest.mark.parametrize("mode", ["static", "dynamic", "fp16", "bf16"])
def test_quantized_models_run_on_every_backend(classifier, images, mode, backend):
    if not backend_status(backend).available:
        pytest.skip(f"{backend} is not available")
    net, model = classifier
    q = hybrid.quantize(model, {"quant_mode": mode, "calibration_dataset": images, "num_calibration_samples": 6,
                                "num_eval_samples": 2, "op_types": ["MatMul", "Gemm", "Conv"] if mode == "dynamic"
                                else None})
    x = images[-1]
    got = hybrid.compile(q, backend)(x)
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    cos = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cos.min() > 0.99


# ------------------------------------------------------------------ bad data and config
def _code(model, cfg) -> tuple[str, str]:
    with pytest.raises(QuantizationError) as e:
        hybrid.quantize(model, cfg)
    return e.value.code, e.value.message


def test_bad_calibration_data_names_the_sample(classifier, images):
    _, model = classifier
    good = list(images[:4])
    assert _code(model, {"calibration_dataset": []})[0] == "HYB-602"
    assert _code(model, {"quant_mode": "static"})[0] == "HYB-602"
    code, msg = _code(model, {"calibration_dataset": [*good[:2], {"image": good[0]}]})
    assert code == "HYB-603" and "sample 2" in msg and "image" in msg
    code, msg = _code(model, {"calibration_dataset": [*good[:3], np.zeros((4, 3, 8, 8), np.float32)]})
    assert code == "HYB-603" and "sample 3" in msg and "(4, 3, 8, 8)" in msg
    code, msg = _code(model, {"calibration_dataset": [good[0], np.zeros((3, 16, 16), np.float32)]})
    assert code == "HYB-603" and "sample 1" in msg and "rank" in msg
    code, msg = _code(model, {"calibration_dataset": [good[0], good[1].astype(np.int32)]})
    assert code == "HYB-603" and "dtype" in msg
    nan = good[1].copy()
    nan[0, 0, 0, 0] = np.nan
    code, msg = _code(model, {"calibration_dataset": [good[0], nan]})
    assert code == "HYB-604" and "sample 1" in msg and "'input'" in msg


@pytest.mark.parametrize("cfg", [
    {"quant_mode": "int4"},
    {"quant_mod": "static"},
    {"activation_dtype": "int16"},
    {"calibration_method": "kl"},
    {"num_calibration_samples": 0},
    {"per_channel": "yes"},
    {"accuracy": {"min_cos": 0.9}},
    {"accuracy": {}},
    {"calibration_dataset": 42},
])
def test_bad_config_is_hyb_601(outlier, cfg):
    assert _code(outlier, cfg)[0] == "HYB-601"


def test_progress_bars_stay_quiet_off_a_terminal(outlier, vectors, capfd):
    hybrid.quantize(outlier, {"calibration_dataset": vectors, "accuracy": {"min_cosine": 0.99}})
    captured = capfd.readouterr()
    assert captured.out == "" and "calibrating" not in captured.err and "sensitivity" not in captured.err
