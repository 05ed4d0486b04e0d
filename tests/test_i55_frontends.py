"""Issue 55 item 7: jit notices changed weights; export honours the opset it is asked for, or says it cannot."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import hybrid  # noqa: E402
from hybrid.errors import ModelError  # noqa: E402

PARITY_RTOL = 1e-4  # max |hybrid - eager| relative to max |eager|
JIT_OPSET = 17  # the TorchScript exporter traces in a fraction of the dynamo one's time; the check is the same


def _assert_parity(got, expected) -> None:
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape
    scale = float(np.abs(expected).max()) or 1.0
    assert float(np.abs(got - expected).max()) / scale <= PARITY_RTOL


def _run(model, feeds):
    import onnxruntime as ort

    session = ort.InferenceSession(model.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


# ------------------------------------------------------------------ jit and changed weights
def test_jit_retraces_after_an_in_place_weight_change(caplog):
    torch.manual_seed(0)
    fc = nn.Linear(4, 3)

    @hybrid.jit(target="onnxruntime", opset_version=JIT_OPSET)
    def f(x):
        return fc(x)

    x = torch.randn(2, 4)
    _assert_parity(f(x), fc(x).detach())
    with torch.no_grad():
        fc.weight.mul_(2)
    with caplog.at_level(logging.INFO, logger="hybrid"):
        _assert_parity(f(x), fc(x).detach())
    assert f.cache_info().traces == 2
    assert any("weight" in r.getMessage() and "trac" in r.getMessage() for r in caplog.records)
    f(x)  # unchanged since: a cache hit
    assert f.cache_info().traces == 2


def test_jit_of_a_module_notices_buffers_and_replaced_data():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()
    f = hybrid.jit(net, target="onnxruntime", opset_version=JIT_OPSET)
    x = torch.randn(3, 4)
    _assert_parity(f(x), net(x).detach())
    with torch.no_grad():
        net[1].running_mean.add_(0.5)  # a buffer, changed in place
    _assert_parity(f(x), net(x).detach())
    net[0].bias.data = torch.full((4,), 3.0)  # .data replaced: a new storage, same Parameter object
    _assert_parity(f(x), net(x).detach())
    assert f.cache_info().traces == 3


# ------------------------------------------------------------------ export and the opset asked for
def test_dynamo_converts_to_the_opset_asked_for_when_it_can():
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    model = hybrid.export(net, input_shape=(2, 4), opset_version=14, exporter="dynamo")
    assert model.opset == 14
    x = torch.randn(2, 4)
    _assert_parity(_run(model, {"input": x.numpy()}), net(x).detach())


def test_dynamo_refuses_an_opset_it_cannot_write():
    net = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).eval()
    with pytest.raises(ModelError) as e:
        hybrid.export(net, input_shape=(2, 4), opset_version=11, exporter="dynamo")
    assert e.value.code == "HYB-210"
    assert "opset_version=11" in e.value.message and "LayerNormalization" in e.value.message
    assert "torchscript" in e.value.hint


def _bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                                  vocab_size=100)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 100, (1, 8))
    mask = torch.ones(1, 8, dtype=torch.int64)
    expected = model(ids, attention_mask=mask).last_hidden_state.detach()
    return model, [ids, mask], expected


def test_bert_from_a_config_exports_at_the_default_opset():
    model, inputs, expected = _bert()
    exported = hybrid.export(model, input_shape=inputs)
    assert exported.opset >= 18
    feeds = {"input_ids": inputs[0].numpy(), "attention_mask": inputs[1].numpy()}
    _assert_parity(_run(exported, feeds), expected)


def test_bert_at_opset_11_falls_back_to_dynamo_and_says_which_opset_it_wrote(caplog):
    model, inputs, expected = _bert()
    with caplog.at_level(logging.WARNING, logger="hybrid"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exported = hybrid.export(model, input_shape=inputs, opset_version=11)
    meta = {p.key: p.value for p in exported.to_onnx().metadata_props}
    assert meta["hybrid.exporter"] == "dynamo"
    assert 11 < exported.opset < 18  # the lowest opset the dynamo model converts to (LayerNormalization: 17)
    assert meta["hybrid.opset_requested"] == "11"
    said = [str(w.message) for w in seen] + [r.getMessage() for r in caplog.records]
    assert any(f"opset {exported.opset}" in s and "11" in s for s in said)
    feeds = {"input_ids": inputs[0].numpy(), "attention_mask": inputs[1].numpy()}
    _assert_parity(_run(exported, feeds), expected)
