"""Accuracy-aware int8 on trained CNNs (hybrid.zoo.samples_quant): every budget is met, down to all-float;
every int8 op is a candidate (SE blocks, gates, Adds); the speed check decides; the report says why."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")

import hybrid
from hybrid.errors import QuantizationError
from hybrid.passes.quantize import speed
from hybrid.passes.quantize.config import parse_config
from hybrid.passes.quantize.engine import Engine, workdir
from hybrid.passes.quantize.groups import group_nodes, quantized_nodes
from hybrid.zoo import samples_quant

N_CAL, N_EVAL, BATCH = 8, 6, 4


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("quant-models")


@pytest.fixture(scope="module")
def mobilenet(cache):
    # spread: channel ranges as uneven as in long-trained networks, so int8 loses accuracy (~0.99 cosine)
    return samples_quant.build("mobilenet", width=8, size=32, steps=60, spread=40, cache=cache)


@pytest.fixture(scope="module")
def detector(cache):
    return samples_quant.build("detector", width=8, size=32, steps=60, spread=100, cache=cache)


def _batches(kind: str) -> list[np.ndarray]:
    x = samples_quant.images(kind, (N_CAL + N_EVAL) * BATCH, seed=3, size=32)
    return [x[i:i + BATCH] for i in range(0, len(x), BATCH)]


def _cfg(kind: str, **extra):
    return {"quant_mode": "static", "calibration_dataset": _batches(kind), "num_calibration_samples": N_CAL,
            "num_eval_samples": N_EVAL, "speed_check": False, **extra}


def _min_cosine(model, reference, batches) -> float:
    import onnxruntime as ort

    got, ref = (ort.InferenceSession(m.to_bytes(), providers=["CPUExecutionProvider"]) for m in (model, reference))
    worst = 1.0
    for x in batches:
        a = got.run(None, {"input": x})[0].reshape(len(x), -1).astype(np.float64)
        b = ref.run(None, {"input": x})[0].reshape(len(x), -1).astype(np.float64)
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        cos[(a == b).all(axis=1)] = 1.0  # identical rows (float returned): exactly 1
        worst = min(worst, float(cos.min()))
    return worst


@pytest.mark.parametrize("budget", [0.995, 0.9999, 1.0])
def test_any_budget_is_met_down_to_all_float(mobilenet, budget):
    q = hybrid.quantize(mobilenet, _cfg("mobilenet", accuracy={"min_cosine": budget}))
    report = q.metadata["quantization_report"]
    assert report.budget_met is True and report.cosine_min >= budget
    # measured again here, on the same held-back batches, outside hybrid
    assert _min_cosine(q, mobilenet, _batches("mobilenet")[N_CAL:]) >= budget
    plain = hybrid.quantize(mobilenet, _cfg("mobilenet"))
    assert plain.metadata["quantization_report"].cosine_min < 0.9999  # the budgets are not met for free
    if budget == 1.0:  # only float is exact
        assert report.result == "float" and "only float meets" in report.note
        assert q.to_bytes() != plain.to_bytes() and not any(n.op_type == "QuantizeLinear"
                                                             for n in q.to_onnx().graph.node)
    else:
        assert report.result == "quantized" and report.float_groups
        assert any(n.op_type == "QuantizeLinear" for n in q.to_onnx().graph.node)


def test_concatenated_detector_outputs_meet_the_budget(detector):
    q = hybrid.quantize(detector, _cfg("detector", accuracy={"min_cosine": 0.999}))
    report = q.metadata["quantization_report"]
    assert report.budget_met is True and report.result == "quantized"
    assert _min_cosine(q, detector, _batches("detector")[N_CAL:]) >= 0.999


def test_every_int8_op_is_in_a_group_and_se_blocks_are_one(mobilenet):
    with workdir() as tmp:  # the pre-processed float model (BatchNorm folded, functions inlined)
        engine = Engine(mobilenet.to_onnx(), parse_config(_cfg("mobilenet")),
                        [{"input": b} for b in _batches("mobilenet")[:N_CAL]], tmp)
        float_model, plain = engine.proto, onnx.load_from_string(engine.run())
    quantized = quantized_nodes(float_model, plain)
    groups = group_nodes(float_model, quantized)
    grouped = [n for g in groups for n in g.nodes]
    assert sorted(grouped) == sorted(quantized) and len(set(grouped)) == len(grouped)
    ops = {n.name: n.op_type for n in float_model.graph.node}
    assert {"Conv", "Gemm", "Add", "Mul"} <= {ops[n] for n in quantized}  # not only the weighted ops
    se = [g for g in groups if g.kind == "se"]
    assert len(se) == 4  # one per squeeze-excitation block of the model
    for g in se:
        assert g.op_types.count("Conv") == 2 and "Mul" in g.op_types
    # HardSwish is exported as x * HardSigmoid(x): the gate stays with the Conv that produces x
    assert any(g.op_types[:1] == ("Conv",) and "HardSigmoid" in g.op_types and g.kind != "se" for g in groups)


def test_the_speed_check_decides_what_is_returned(mobilenet, monkeypatch):
    calls = []

    def slow_int8(models, feed):
        calls.append(sorted(models))
        return {k: (1.0 if k in ("fp32", "chosen") else 2.0) for k in models}

    monkeypatch.setattr(speed, "TIMER", slow_int8)
    q = hybrid.quantize(mobilenet, _cfg("mobilenet", accuracy={"min_cosine": 0.995}, speed_check=True))
    report = q.metadata["quantization_report"]
    assert any("fp32" in c and len(c) >= 2 for c in calls)
    assert report.result == "float" and "runs at 0.50x fp32" in report.note and report.budget_met
    assert not any(n.op_type == "QuantizeLinear" for n in q.to_onnx().graph.node)

    def fast_int8(models, feed):
        return {k: (3.0 if k == "fp32" else 1.0) for k in models}

    monkeypatch.setattr(speed, "TIMER", fast_int8)
    q = hybrid.quantize(mobilenet, _cfg("mobilenet", accuracy={"min_cosine": 0.995}, speed_check=True))
    report = q.metadata["quantization_report"]
    assert report.result == "quantized" and report.speedup == pytest.approx(3.0)
    assert all(g.speed_cost == pytest.approx(1.0) for g in report.float_groups[:6])
    # without a budget the check is off unless asked for; asked for, it applies to the plain model too
    monkeypatch.setattr(speed, "TIMER", slow_int8)
    assert hybrid.quantize(mobilenet, _cfg("mobilenet")).metadata["quantization_report"].result == "quantized"
    q = hybrid.quantize(mobilenet, _cfg("mobilenet", speed_check=True))
    assert q.metadata["quantization_report"].result == "float"


def test_report_says_what_stayed_float_and_why(mobilenet):
    q = hybrid.quantize(mobilenet, _cfg("mobilenet", accuracy={"min_cosine": 0.9995}))
    report = q.metadata["quantization_report"]
    names = [g.label for g in report.float_groups]
    assert report.kept_float == tuple(names) and names
    assert {g.reason for g in report.float_groups} <= {"budget", "region"}
    assert "budget" in {g.reason for g in report.float_groups}
    scores = dict(report.sensitivity)
    assert all(g.sensitivity == scores[g.label] for g in report.float_groups)
    assert [s for _, s in report.sensitivity] == sorted((s for _, s in report.sensitivity), reverse=True)
    graph = {n.name for n in q.to_onnx().graph.node}
    assert all(set(g.nodes) <= graph for g in report.float_groups)  # kept, under their own names
    assert len(report.recipes) == 9 and report.recipes[0][1] == max(c for _, c in report.recipes)
    assert report.recipes[0][0].split(",")[0] in report.scheme
    assert report.trials > len(report.sensitivity)
    text = str(report)
    assert "kept in float" in text and names[0] in text and "sensitivity" in text


def test_budget_and_speed_keys_are_validated(mobilenet):
    for cfg in ({"accuracy": {"min_cosine": 0.99, "on_unmet": "fp32"}}, {"speed_check": "yes"},
                {"calibration_method": "best"}, {"accuracy": {"on_unmet": "float"}}):
        with pytest.raises(QuantizationError) as e:
            hybrid.quantize(mobilenet, {**_cfg("mobilenet"), **cfg})
        assert e.value.code == "HYB-601", cfg


def test_on_unmet_raise_gives_the_figures(mobilenet):
    with pytest.raises(QuantizationError) as e:
        hybrid.quantize(mobilenet, _cfg("mobilenet", accuracy={"min_cosine": 1.0, "on_unmet": "raise"}))
    assert e.value.code == "HYB-605"
    assert "fully quantized" in e.value.message and "closest int8 model" in e.value.message


def test_a_model_without_quantizable_ops_is_returned_as_float():
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Exp", ["input"], ["output"], name="exp")], "g",
        [onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["batch", 4])],
        [onnx.helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, ["batch", 4])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    data = [np.random.default_rng(i).standard_normal((2, 4)).astype(np.float32) for i in range(6)]
    q = hybrid.quantize(model, {"calibration_dataset": data, "accuracy": {"min_cosine": 0.999}, "speed_check": False})
    report = q.metadata["quantization_report"]
    assert report.budget_met is True and report.cosine_min == pytest.approx(1.0)
