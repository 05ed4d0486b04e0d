"""compile(target='auto'): the reference check, timing, the decision cache, precision='auto'."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests._backends import backend_registered, registered
from tests._models import matmul_add

import hybrid
from hybrid.errors import ConfigError, RunError
from hybrid.hal import Backend, Executable, ProbedDevice, get_backend
from hybrid.runtime.auto import accuracy, cache, samples, search, timing, trials
from hybrid.runtime.auto import tolerance as checks


@pytest.fixture(autouse=True)
def _short_timing():
    hybrid.init({"autotune": {"time_budget_s": 0.05}})


@pytest.fixture(autouse=True)
def _offline():
    """These tests are about the offline search: a dynamic batch does not switch to online tuning
    (tests/test_auto_online.py covers that)."""
    hybrid.init({"autotune": {"online": False}})


def _no_timing(*args, **kwargs):
    raise AssertionError("timed although it should not have")


def _wide(n: int = 256) -> helper.ModelProto:
    """y = x @ W with x [4, n]: big enough that bf16 rounding shows."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "wide",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _records() -> list:
    return sorted((cache.cache_dir() / "autotune").glob("*.json"))


# ------------------------------------------------------------------------------------------- cache
def test_second_compile_is_served_by_the_cache_without_checks_or_timing(monkeypatch):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    first = hybrid.compile(matmul_add(), target="auto")
    assert any(n.startswith("timed:") for n in first.plan.notes)
    assert len(_records()) == 1
    record = json.loads(_records()[0].read_text())
    assert record["key"]["model"] == hybrid.Model.load(matmul_add()).sha256
    assert record["decision"]["backend"] == first.backend.split("+")[0] or record["decision"]["kind"] == "partition"

    monkeypatch.setattr(search, "time_candidates", _no_timing)
    monkeypatch.setattr(trials.Search, "check", _no_timing)
    second = hybrid.compile(matmul_add(), target="auto")
    assert second.backend == first.backend
    assert second.plan.notes[0].startswith("decision read from the autotune cache")
    np.testing.assert_allclose(second(x), first(x), rtol=1e-5, atol=1e-6)


def test_the_cache_key_follows_the_input_signature_and_precision():
    hybrid.compile(matmul_add(), target="auto", sample_inputs=np.ones((1, 4), np.float32))
    hybrid.compile(matmul_add(), target="auto", sample_inputs=np.ones((8, 4), np.float32))
    hybrid.compile(matmul_add(), target="auto", sample_inputs=np.ones((8, 4), np.float32))
    assert len(_records()) == 2
    hybrid.compile(matmul_add(), target="auto", precision="auto", sample_inputs=np.ones((8, 4), np.float32))
    assert len(_records()) == 3
    keys = [json.loads(p.read_text())["key"] for p in _records()]
    for key in keys:
        assert {"model", "inputs", "device", "backends", "options", "precision", "accuracy"} <= set(key)
        assert key["backends"]["onnxruntime"] == get_backend("onnxruntime").version()


def test_a_corrupt_cache_record_is_ignored_and_rewritten():
    hybrid.compile(matmul_add(), target="auto")
    (path,) = _records()
    path.write_text("{not json")
    cm = hybrid.compile(matmul_add(), target="auto")
    assert not cm.plan.notes[0].startswith("decision read")
    assert json.loads(path.read_text())["decision"]


def test_cache_dir_env_then_init_then_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path / "env"))
    hybrid.init({"cache_dir": str(tmp_path / "cfg")})
    assert cache.cache_dir() == tmp_path / "env"
    monkeypatch.delenv("HYBRID_CACHE_DIR")
    assert cache.cache_dir() == tmp_path / "cfg"
    hybrid.init({"cache_dir": ""})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "hybrid"


def test_autotune_false_takes_the_first_checked_candidate_by_priority(monkeypatch):
    monkeypatch.setattr(search, "time_candidates", _no_timing)
    cm = hybrid.compile(matmul_add(), target="auto", autotune=False)
    assert cm.backend == "onnxruntime"
    assert "autotune=False" in cm.plan.segments[0].reason


# ------------------------------------------------------------------------------------------- correctness
class _Shifted(Executable):
    def __init__(self, inner: Executable) -> None:
        self.inner, self.input_names, self.output_names = inner, inner.input_names, inner.output_names

    def run(self, feeds):
        return [o + 1.0 for o in self.inner.run(feeds)]


class _OffByOne(Backend):
    """A backend that answers fast and wrong: ORT's outputs plus one."""

    name = "offbyone"
    priority = 1

    def _probe(self):
        return [ProbedDevice("cpu", "cpu")]

    def version(self):
        return "1.0"

    def _compile(self, model, device, options):
        return _Shifted(get_backend("onnxruntime").compile(model, "cpu"))


@pytest.fixture
def offbyone():
    yield from registered(_OffByOne)


@pytest.mark.parametrize("autotune_flag", [True, False])
def test_a_backend_with_wrong_answers_never_wins(offbyone, caplog, autotune_flag):
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        cm = hybrid.compile(matmul_add(), target="auto", autotune=autotune_flag)
    assert cm.backend != "offbyone"
    assert "rejected offbyone:cpu" in caplog.text and "output 'y' differs" in caplog.text
    assert "max abs error 1 " in caplog.text
    assert any(n.startswith("rejected offbyone:cpu") for n in cm.plan.notes)
    expected = hybrid.compile(matmul_add(), target="reference")(x)
    np.testing.assert_allclose(cm(x), expected, rtol=1e-5, atol=1e-6)


def test_tolerances_follow_the_dtype():
    y = np.linspace(-1, 1, 100, dtype=np.float32)
    assert checks.compare([y], [y * (1 + 5e-6)], ["y"]) is None
    bad = checks.compare([y], [y * 1.001], ["y"])
    assert bad is not None and bad.output == "y" and "float32" in bad.detail and "of 100 elements" in str(bad)
    h = y.astype(np.float16)
    one_ulp = (h.astype(np.float32) * 1.0004).astype(np.float16)  # fp16 rounding: at most one ulp off
    assert checks.compare([h], [one_ulp], ["h"]) is None
    assert checks.compare([h], [(h.astype(np.float32) * 1.01).astype(np.float16)], ["h"]) is not None
    i = np.arange(5)
    assert checks.compare([i], [i], ["i"]) is None
    assert "exactly" in str(checks.compare([i], [i + (i == 3)], ["i"]))
    assert checks.compare([np.array([np.nan, 1.0])], [np.array([np.nan, 1.0])], ["n"]) is None
    inf = np.array([-np.inf, 1.0], np.float32)
    assert checks.compare([inf], [inf.copy()], ["m"]) is None
    assert checks.compare([inf], [np.array([np.finfo(np.float32).min, 1.0], np.float32)], ["m"]) is not None
    assert "shape" in str(checks.compare([y], [y[:5]], ["y"]))
    assert "dtype" in str(checks.compare([y], [y.astype(np.float64)], ["y"]))


class _Nudged(_OffByOne):
    """A backend that answers fast and right within the fp32 tolerance: ORT's outputs times (1 + 4e-6)."""

    name = "nudged"

    def _compile(self, model, device, options):
        inner = get_backend("onnxruntime").compile(model, "cpu")
        exe = _Shifted(inner)
        exe.run = lambda feeds: [o * np.float32(1 + 4e-6) for o in inner.run(feeds)]
        return exe


@pytest.fixture
def nudged():
    yield from registered(_Nudged)


@pytest.mark.parametrize(("times_us", "winner", "tie"), [
    ({"nudged": 10, "reference": 14, "onnxruntime": 60}, "reference", True),       # 4 us apart: a tie
    ({"nudged": 1000, "reference": 5000, "onnxruntime": 1015}, "onnxruntime", True),  # within 2 %
    ({"nudged": 10, "reference": 100, "onnxruntime": 60}, "nudged", False),        # clearly fastest
    ({"nudged": 1000, "reference": 5000, "onnxruntime": 1050}, "nudged", False),   # 5 % slower is slower
    ({"nudged": 200, "reference": 5000, "onnxruntime": 215}, "nudged", False),     # 15 us is 7.5 % at 0.2 ms
])
def test_a_timing_tie_goes_to_the_candidate_closest_to_the_reference(nudged, monkeypatch, times_us, winner, tie):
    def fake_times(runs, *args, **kwargs):
        return {label: times_us.get(label.split(":")[0], 10_000) * 1e-6 for label in runs}  # others: slow

    monkeypatch.setattr(search, "time_candidates", fake_times)
    cm = hybrid.compile(matmul_add(), target="auto")
    assert cm.backend == winner
    assert any("closer to the reference" in n for n in cm.plan.notes) is tie
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(cm(x), hybrid.compile(matmul_add(), target="reference")(x), rtol=1e-5)


class _OneUlp(_OffByOne):
    """A backend whose answers are the reference's moved by one float32 ulp where |value| < 1: exact to well
    within a hundredth of the dtype's tolerance, yet not bit-equal."""

    name = "oneulp"

    def _compile(self, model, device, options):
        inner = get_backend("reference").compile(model, "cpu")
        exe = _Shifted(inner)
        exe.run = lambda feeds: [np.where(np.abs(o) < 1, np.nextafter(o, np.float32(np.inf)), o)
                                 for o in inner.run(feeds)]
        return exe


def test_a_tie_between_answers_both_exact_goes_to_the_fastest(monkeypatch):
    """Closeness to the reference breaks a tie only when it means something: one ulp (~0.006 tolerance
    units) against the reference's own answer (0) is no reason to take the slower one."""
    times_us = {"oneulp": 1000, "reference": 1015}
    monkeypatch.setattr(search, "time_candidates",
                        lambda runs, *a, **k: {lb: times_us.get(lb.split(":")[0], 10_000) * 1e-6 for lb in runs})
    with backend_registered(_OneUlp):
        cm = hybrid.compile(matmul_add(), target="auto")
        assert cm.backend == "oneulp"
        assert not any("closer to the reference" in n for n in cm.plan.notes)


def test_tie_bounds_come_from_init_and_timing_alone_decides_at_zero(nudged, monkeypatch):
    times = {"nudged": 10e-6, "reference": 14e-6}
    monkeypatch.setattr(search, "time_candidates",
                        lambda runs, *a, **k: {label: times.get(label.split(":")[0], 0.01) for label in runs})
    hybrid.init({"autotune": {"tie_rel": 0, "tie_us": 0}})
    assert timing.timing_policy().tie_bounds == (0.0, 0.0)
    cm = hybrid.compile(matmul_add(), target="auto")
    assert cm.backend == "nudged" and not any("closer to the reference" in n for n in cm.plan.notes)
    hybrid.init({"autotune": {"tie_us": 5}})  # 4 us apart: a tie again; the decision is not read from the cache
    cm = hybrid.compile(matmul_add(), target="auto")
    assert cm.backend == "reference" and not cm.plan.notes[0].startswith("decision read")


@pytest.mark.parametrize(("value", "code"), [({"tie_ms": 1}, "HYB-101"), ({"tie_rel": -0.1}, "HYB-102"),
                                             ({"tie_rel": 1.5}, "HYB-102"), ({"tie_us": "20"}, "HYB-102"),
                                             ({"tie_us": True}, "HYB-102"), ([1], "HYB-102")])
def test_bad_autotune_settings_are_refused(value, code):
    with pytest.raises(ConfigError) as e:
        hybrid.init({"autotune": value})
    assert e.value.code == code
    assert timing.timing_policy().tie_bounds == (0.02, 20 * 1e-6)  # nothing half-applied


def test_deviation_ranks_answers_by_closeness_in_tolerance_units():
    y = np.linspace(-1, 1, 100, dtype=np.float32)
    assert checks.deviation([y], [y.copy()], ["y"]) == 0.0
    near, far = checks.deviation([y], [y * np.float32(1 + 1e-6)], ["y"]), checks.deviation([y], [y + 5e-6], ["y"])
    assert 0 < near < far < 1  # both within the fp32 tolerance, one closer
    assert checks.deviation([np.arange(3)], [np.arange(3) + 1], ["i"]) == float("inf")
    assert checks.deviation([y], [y[:3]], ["y"]) == float("inf")
    nan = np.array([np.nan, np.inf], np.float32)
    assert checks.deviation([nan], [nan.copy()], ["n"]) == 0.0


def test_an_ill_conditioned_output_is_checked_only_as_tightly_as_it_is_stable():
    expected = np.array([1.0, 0.0, 0.0], np.float32)
    got = np.array([0.9, 0.1, 0.0], np.float32)
    assert checks.compare([expected], [got], ["p"]) is not None
    moved = np.array([0.8, 0.2, 0.0], np.float32)  # the reference itself moves this much under noise
    assert checks.compare([expected], [got], ["p"], [moved]) is None


def test_accuracy_budgets():
    a = np.random.default_rng(0).standard_normal(1000)
    assert accuracy.accuracy_failure({"min_cosine": 0.995}, [a], [a + 1e-3], ["y"]) is None
    why = accuracy.accuracy_failure({"min_cosine": 0.995}, [a], [a + 0.5], ["y"])
    assert why and "cosine" in why and "'y'" in why
    assert "relative error" in accuracy.accuracy_failure({"max_rel_error": 1e-6}, [a], [a + 1e-3], ["y"])
    for bad, code in [({"min_cos": 0.9}, "HYB-101"), ({"min_cosine": 2}, "HYB-102"), ({"max_rel_error": "x"},
                                                                                       "HYB-102")]:
        with pytest.raises(ConfigError) as e:
            accuracy.validate_accuracy(bad)
        assert e.value.code == code
    with pytest.raises(ConfigError) as e:
        hybrid.compile(matmul_add(), target="auto", accuracy={"min_cosine": 0.99})
    assert e.value.code == "HYB-102" and "precision='auto'" in e.value.message
    for bad, code in [({"rtol": 2}, "HYB-102"), ({"outputs": {"nope": {}}}, "HYB-102"),
                      ({"outputs": {"y": {"rtol": -1}}}, "HYB-102"), ({"outputs": {"y": {"tol": 1}}}, "HYB-101"),
                      ({"outputs": {"y": {"topk": 0}}}, "HYB-102")]:
        with pytest.raises(ConfigError) as e:
            hybrid.compile(matmul_add(), target="auto", accuracy=bad)
        assert e.value.code == code, bad


# ------------------------------------------------------------------------------------------- precision
def _has_bf16() -> bool:
    return "bf16" in trials.offered_precisions(hybrid.hal.Candidate("openvino", "cpu"))


@pytest.mark.skipif(not _has_bf16(), reason="this CPU offers no bf16 to OpenVINO")
def test_precision_auto_keeps_a_reduced_precision_within_the_budget(monkeypatch):
    monkeypatch.setattr(search, "time_candidates", _no_timing)
    cm = hybrid.compile(_wide(), target="auto", precision="auto", accuracy={"min_cosine": 0.995}, autotune=False)
    seg = cm.plan.segments[0]
    assert (seg.backend, seg.precision) == ("openvino", "bf16")
    assert cm.options["inference_precision"] == "bf16"
    assert any("min cosine vs fp32" in n for n in cm.plan.notes)


@pytest.mark.skipif(not _has_bf16(), reason="this CPU offers no bf16 to OpenVINO")
def test_precision_auto_rejects_a_reduced_precision_beyond_the_budget():
    cm = hybrid.compile(_wide(), target="auto", precision="auto", accuracy={"max_rel_error": 1e-7}, autotune=False)
    assert cm.plan.segments[0].precision == "fp32"
    assert any(n.startswith("rejected openvino:cpu bf16") and "relative error" in n for n in cm.plan.notes)


# ------------------------------------------------------------------------------------------- samples
def test_generated_samples_respect_the_signature_and_index_bounds():
    table = numpy_helper.from_array(np.zeros((7, 2), np.float32), "table")
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["e"]),
                           helper.make_node("Identity", ["f"], ["g"])], "emb",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", 50]),
                           helper.make_tensor_value_info("f", TensorProto.FLOAT, ["B", 3])],
                          [helper.make_tensor_value_info("e", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("g", TensorProto.FLOAT, None)], [table])
    model = hybrid.Model.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    s = samples.make_samples(model)
    assert s["ids"].shape == (1, 50) and s["ids"].dtype == np.int64 and s["ids"].min() >= 0 and s["ids"].max() < 7
    assert s["ids"].max() > 2 and s["f"].shape == (1, 3) and s["f"].dtype == np.float32
    assert samples.make_samples(model, symbolic_size=4)["f"].shape == (4, 3)
    given = samples.make_samples(model, {"ids": np.zeros((2, 50), np.int64), "f": np.ones((2, 3), np.float32)})
    assert given["f"].shape == (2, 3)
    with pytest.raises(RunError) as e:
        samples.make_samples(model, {"ids": np.zeros((2, 50), np.int64), "f": np.ones((3, 3), np.float32)})
    assert e.value.code == "HYB-405"


class _Twin(_OffByOne):
    """A second backend that answers exactly as ONNX Runtime does (an independent opinion in a vote)."""

    name = "twin"

    def _compile(self, model, device, options):
        return get_backend("onnxruntime").compile(model, "cpu")


@pytest.fixture
def twin():
    yield from registered(_Twin)


@pytest.fixture
def reference_one_percent_off(monkeypatch):
    """The reference answers 1 % off, as rounding-decided outputs do (a Softmax over equal logits near 1e10)."""
    reference = type(get_backend("reference"))
    honest = reference._compile
    monkeypatch.setattr(reference, "_compile", lambda self, model, device, options: _Scaled(
        honest(self, model, device, options), 1.01))


def test_independent_backends_outvote_the_reference_when_it_alone_differs(twin, reference_one_percent_off):
    # ONNX Runtime and an independent backend agree with each other: they outvote the reference
    cm = hybrid.compile(matmul_add(), target="auto")
    assert cm.backend in ("onnxruntime", "twin")
    assert any("reference backend was outvoted" in n for n in cm.plan.notes)
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(cm(x), hybrid.compile(matmul_add(), target="onnxruntime")(x), rtol=1e-6)


def test_a_lone_dissenter_is_not_reinstated_by_the_vote(offbyone, reference_one_percent_off):
    # offbyone disagrees with everyone: even with the reference outvoted it stays rejected
    cm = hybrid.compile(matmul_add(), target="auto")
    assert cm.backend != "offbyone"


class _Scaled(Executable):
    def __init__(self, inner: Executable, factor: float) -> None:
        self.inner, self.factor = inner, np.float32(factor)
        self.input_names, self.output_names = inner.input_names, inner.output_names

    def run(self, feeds):
        return [o * self.factor for o in self.inner.run(feeds)]
