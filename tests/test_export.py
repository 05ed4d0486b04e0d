"""hybrid.export: torch modules to hybrid models, parity with torch eager on every CPU backend, errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import hybrid  # noqa: E402
from hybrid.errors import ModelError  # noqa: E402
from hybrid.hal import backend_status  # noqa: E402

BACKENDS = ("onnxruntime", "openvino", "reference")
PARITY_RTOL = 1e-4  # max |hybrid - eager| relative to max |eager|, per output


def _available(name: str) -> bool:
    try:
        return backend_status(name).available
    except hybrid.HybridError:
        return False


def _backend(name: str) -> str:
    if not _available(name):
        pytest.skip(f"backend {name} is not available here")
    return name


def _assert_parity(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    scale = float(np.abs(expected).max()) or 1.0
    err = float(np.abs(got.astype(np.float64) - expected).max()) / scale
    assert err <= PARITY_RTOL, f"relative error {err:.2e} > {PARITY_RTOL}"


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    net = SmallCNN()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so that folding them is tested
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return net.eval()


@pytest.fixture(scope="module")
def cnn():
    return _cnn()


@pytest.fixture(scope="module")
def cnn_models(cnn):
    """The CNN exported by both exporters with a dynamic batch."""
    return {
        "torchscript": hybrid.export(cnn, input_shape=(1, 3, 32, 32), opset_version=11,
                                     dynamic_axes={"input": {0: "batch"}}),
        "dynamo": hybrid.export(cnn, input_shape=(1, 3, 32, 32), dynamic_axes={"input": {0: "batch"}}),
    }


@pytest.fixture(scope="module")
def bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=6, hidden_size=384, num_attention_heads=12,
                                     intermediate_size=1536)
    return transformers.BertModel(config).eval()


@pytest.fixture(scope="module")
def bert_model(bert):
    example = torch.ones(1, 16, dtype=torch.int64)
    return hybrid.export(bert, input_shape=[example, example],
                         dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})


def _bert_inputs(batch: int, seq: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(batch)
    ids = rng.integers(0, 30522, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - 3:] = 0  # padded tail
    return ids, mask


# ------------------------------------------------------------------ the seed's call
def test_seed_call_exports_opset_11_with_dynamic_batch(cnn):
    model = hybrid.export(cnn, input_shape=(1, 3, 224, 224), opset_version=11, dynamic_axes={"input": {0: "batch"}})
    assert isinstance(model, hybrid.Model)
    assert model.opset == 11
    (spec,) = model.signature.inputs
    assert spec.name == "input" and spec.shape == ("batch", 3, 224, 224) and spec.dtype == np.float32
    assert model.signature.outputs[0].shape == ("batch", 10)
    props = {p.key: p.value for p in model.to_onnx().metadata_props}
    assert props["hybrid.exporter"] == "torchscript"
    assert model.name == "SmallCNN"


def test_exporter_choice_follows_the_opset(cnn_models):
    exporters = {k: {p.key: p.value for p in m.to_onnx().metadata_props}["hybrid.exporter"]
                 for k, m in cnn_models.items()}
    assert exporters == {"torchscript": "torchscript", "dynamo": "dynamo"}
    assert cnn_models["dynamo"].opset >= 18


# ------------------------------------------------------------------ parity with torch eager
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_cnn_parity_at_batch_1_and_7(cnn, cnn_models, backend, exporter):
    compiled = hybrid.compile(cnn_models[exporter], _backend(backend))
    for batch in (1, 7):
        x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            expected = cnn(x).numpy()
        _assert_parity(compiled(x.numpy()), expected)


def test_bert_signature_names_come_from_forward_and_its_output(bert_model):
    sig = bert_model.signature
    assert sig.input_names == ["input_ids", "attention_mask"]
    assert [s.shape for s in sig.inputs] == [("batch", "seq"), ("batch", "seq")]
    assert sig.output_names == ["last_hidden_state", "pooler_output"]
    assert sig.outputs[0].shape == ("batch", "seq", 384)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bert_parity_at_batch_1_and_7(bert, bert_model, backend):
    compiled = hybrid.compile(bert_model, _backend(backend))
    for batch in (1, 7):
        ids, mask = _bert_inputs(batch)
        with torch.no_grad():
            expected = bert(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
        out = compiled.run({"input_ids": ids, "attention_mask": mask})
        _assert_parity(out["last_hidden_state"], expected.last_hidden_state.numpy())
        _assert_parity(out["pooler_output"], expected.pooler_output.numpy())


# ------------------------------------------------------------------ names and several inputs
class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, a, b):
        return self.proj(a) + b, (a * b).sum(-1)


def test_several_inputs_with_names_shapes_and_examples():
    net = TwoInputs().eval()
    model = hybrid.export(net, input_shape=[(2, 4), torch.ones(2, 4)], input_names=["left", "right"],
                          output_names=["sum", "dot"], dynamic_axes={"left": [0], "right": [0]})
    sig = model.signature
    assert sig.input_names == ["left", "right"] and sig.output_names == ["sum", "dot"]
    assert all(isinstance(s.shape[0], str) for s in sig.inputs)
    a, b = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    got = hybrid.compile(model, "onnxruntime").run({"left": a, "right": b})
    with torch.no_grad():
        s, d = net(torch.from_numpy(a), torch.from_numpy(b))
    _assert_parity(got["sum"], s.numpy())
    _assert_parity(got["dot"], d.numpy())


def test_default_names_are_forward_parameters_and_output_positions():
    model = hybrid.export(TwoInputs().eval(), input_shape=[(2, 4), (2, 4)])
    assert model.signature.input_names == ["a", "b"]
    assert model.signature.output_names == ["output_0", "output_1"]


def test_onnx_models_pass_through(tmp_path, cnn_models):
    path = tmp_path / "m.onnx"
    cnn_models["dynamo"].save(path)
    assert hybrid.export(str(path)).signature == cnn_models["dynamo"].signature
    with pytest.raises(ModelError) as e:
        hybrid.export(str(path), input_shape=(1, 3))
    assert e.value.code == "HYB-210"


# ------------------------------------------------------------------ failures
class Raises(nn.Module):
    def forward(self, x):
        raise ValueError("boom in the block")


class Unsupported(nn.Module):
    def forward(self, x):
        return torch.linalg.eigvals(x[0, 0]).real


class Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Identity(), inner)

    def forward(self, x):
        return self.block(x)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_unsupported_op_names_torch_message_and_module_path(exporter):
    with pytest.raises(ModelError) as e:
        hybrid.export(Wrapper(Unsupported()), input_shape=(1, 1, 4, 4), exporter=exporter)
    err = e.value
    assert err.code == "HYB-206"
    assert "'block.1' (Unsupported)" in err.message
    assert "linalg_eig" in err.message  # torch's own words
    assert isinstance(err.__cause__, Exception)


def test_python_error_in_forward_names_module_path():
    with pytest.raises(ModelError) as e:
        hybrid.export(Wrapper(Raises()), input_shape=(1, 4))
    assert e.value.code == "HYB-206"
    assert "'block.1' (Raises)" in e.value.message and "boom in the block" in e.value.message


@pytest.mark.parametrize("kwargs", [
    {"input_shape": None},
    {"input_shape": (1, 4), "dynamic_axes": {"nope": {0: "batch"}}},
    {"input_shape": (1, 4), "input_names": ["a", "b"]},
    {"input_shape": (1, 4), "output_names": ["a", "b"]},
    {"input_shape": (1, 4), "exporter": "onnxmagic"},
    {"input_shape": ["not a shape"]},
])
def test_bad_arguments_are_hyb_210(kwargs):
    with pytest.raises(ModelError) as e:
        hybrid.export(nn.Linear(4, 2).eval(), **kwargs)
    assert e.value.code == "HYB-210"


def test_missing_torch_is_hyb_207(monkeypatch):
    from hybrid.frontends._common import require_torch

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ModelError) as e:
        require_torch()
    assert e.value.code == "HYB-207" and "pyasc[torch]" in e.value.hint


def test_missing_onnxscript_falls_back_to_torchscript_or_is_hyb_207(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    model = hybrid.export(nn.Linear(4, 2).eval(), input_shape=(1, 4))
    assert {p.key: p.value for p in model.to_onnx().metadata_props}["hybrid.exporter"] == "torchscript"
    with pytest.raises(ModelError) as e:
        hybrid.export(nn.Linear(4, 2).eval(), input_shape=(1, 4), exporter="dynamo")
    assert e.value.code == "HYB-207" and "onnxscript" in e.value.message


def test_export_keeps_training_mode():
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    hybrid.export(net, input_shape=(2, 4))
    assert net.training


def test_import_hybrid_does_not_import_torch():
    code = ("import sys, hybrid; hybrid.export; hybrid.jit; hybrid.quantize; "
            "bad = [m for m in ('torch', 'onnxruntime', 'openvino') if m in sys.modules]; "
            "assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # the child asserts what a fresh interpreter imported
