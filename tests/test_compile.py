"""hybrid.compile: targets, the two CPU backends, input validation, light models, import cost."""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from tests._backends import BrokenBackend
from tests._models import check_light_outputs, light_with_logits, matmul_add, two_inputs

import hybrid
from hybrid.errors import BackendError, RunError
from hybrid.hal import register_backend, reset_discovery, resolve_target
from hybrid.zoo.samples import LIGHT_MODELS

CPU_BACKENDS = ["onnxruntime", "openvino"]


@pytest.mark.parametrize("target", ["auto", "cpu", "onnxruntime", "openvino", "onnxruntime:cpu", "openvino:cpu"])
def test_targets_compile_and_agree(target):
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    cm = hybrid.compile(matmul_add(), target=target)
    assert cm.device == "cpu"
    if ":" in target or target in CPU_BACKENDS:
        assert cm.backend == target.split(":")[0]
    ref = x @ hybrid.Model.load(matmul_add()).graph.initializers["W"].const_value.numpy()
    ref = ref + hybrid.Model.load(matmul_add()).graph.initializers["b"].const_value.numpy()
    np.testing.assert_allclose(cm(x), ref, rtol=1e-5, atol=1e-6)
    out = cm.run({"x": x})
    assert list(out) == ["y"]
    assert str(cm.plan).startswith("[0] ")


def test_call_returns_tuple_for_several_outputs():
    cm = hybrid.compile(two_inputs(), target="onnxruntime")
    a = np.ones((2, 3), np.float32)
    z, kk = cm(a, a, np.array([4, 5], np.int64))
    np.testing.assert_array_equal(z, 2 * a)
    np.testing.assert_array_equal(kk, [4, 5])
    z2, _ = cm(a, b=a, k=np.array([1, 2], np.int64))
    np.testing.assert_array_equal(z2, z)


def test_unknown_target_lists_what_is_available():
    with pytest.raises(BackendError) as e:
        hybrid.compile(matmul_add(), target="tpu")
    assert e.value.code == "HYB-301" and "'tpu'" in e.value.message
    assert "onnxruntime" in e.value.message and "cpu" in e.value.message
    with pytest.raises(BackendError) as e:
        hybrid.compile(matmul_add(), target="onnxruntime:warp")
    assert e.value.code == "HYB-301" and "'warp'" in e.value.message


def test_missing_backend_is_unavailable_with_reason_and_hint():
    register_backend(BrokenBackend)
    try:
        st = {s.name: s for s in hybrid.hal.statuses()}["broken"]
        assert not st.available and "broken_runtime" in st.reason
        with pytest.raises(BackendError) as e:
            hybrid.compile(matmul_add(), target="broken")
        assert e.value.code == "HYB-302" and "broken_runtime" in e.value.message
        assert "pip install broken-runtime" in e.value.hint
        assert "broken" not in [c.backend for c in resolve_target("auto")]
    finally:
        from hybrid.hal import registry

        registry._paths.pop("broken", None)
        registry._classes.pop("broken", None)
        reset_discovery()


def test_absent_gpu_falls_back_to_cpu_with_a_warning(caplog):
    if any(d.is_gpu for d in hybrid.devices()):
        pytest.skip("this machine has a GPU")
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        cm = hybrid.compile(matmul_add(), target="cuda")
    assert cm.device == "cpu" and "'cuda' is not present" in caplog.text
    hybrid.init({"device_fallback": "error"})
    with pytest.raises(BackendError) as e:
        hybrid.compile(matmul_add(), target="gpu")
    assert e.value.code == "HYB-307" and "'gpu'" in e.value.message and "cpu" in e.value.message


def test_compile_config_per_backend_and_flat():
    cm = hybrid.compile(matmul_add(), target="onnxruntime", config={"intra_op_num_threads": 1})
    assert cm.options["intra_op_num_threads"] == 1
    cm = hybrid.compile(matmul_add(), target="openvino", config={"openvino": {"num_threads": 1}})
    assert cm.options["num_threads"] == 1
    with pytest.raises(hybrid.HybridError) as e:
        hybrid.compile(matmul_add(), target="onnxruntime", config={"intra_threads": 1})
    assert e.value.code == "HYB-306" and "intra_threads" in e.value.message


def test_compile_failure_is_a_backend_error():
    from onnx import helper

    bad = matmul_add()
    bad.graph.node.append(helper.make_node("NoSuchOp", ["y"], ["z"]))
    with pytest.raises(BackendError) as e:
        hybrid.compile(bad, target="onnxruntime")
    assert e.value.code == "HYB-304" and "onnxruntime" in e.value.message


# ---------------------------------------------------------------- input validation
@pytest.fixture(scope="module")
def cm2():
    return hybrid.compile(two_inputs(), target="onnxruntime")


def _feeds(n=2):
    return {"a": np.ones((n, 3), np.float32), "b": np.ones((n, 3), np.float32), "k": np.zeros(2, np.int64)}


@pytest.mark.parametrize(("mutate", "code", "words"), [
    (lambda f: f.pop("b"), "HYB-401", ["'b'", "a, b, k"]),
    (lambda f: f.update(c=np.ones(1)), "HYB-402", ["'c'", "a, b, k"]),
    (lambda f: f.update(a=np.ones((2, 3), np.float64)), "HYB-403", ["'a'", "float32", "float64"]),
    (lambda f: f.update(a=np.ones((2, 3, 1), np.float32)), "HYB-404", ["'a'", "rank 2", "rank 3"]),
    (lambda f: f.update(a=np.ones((2, 4), np.float32)), "HYB-405", ["'a'", "dim 1", "3", "4"]),
    (lambda f: f.update(b=np.ones((5, 3), np.float32)), "HYB-405", ["'b'", "'N'", "5", "2"]),
    (lambda f: f.update(k=[0, 0]), "HYB-406", ["'k'", "list"]),
    (lambda f: f.update(k="zeros"), "HYB-406", ["'k'", "str"]),
])
def test_bad_inputs_raise_coded_errors_naming_the_input(cm2, mutate, code, words):
    feeds = _feeds()
    mutate(feeds)
    with pytest.raises(RunError) as e:
        cm2.run(feeds)
    assert e.value.code == code
    for w in words:
        assert w in e.value.message, (w, e.value.message)


def test_feeds_that_passed_before_skip_the_checks_but_nothing_else_does(cm2):
    """The validator remembers (name, dtype, shape) of feeds that passed; any other feeds are checked in full."""
    from hybrid.runtime.validate import InputValidator

    validator = InputValidator(cm2.signature)
    good = _feeds()
    for _ in range(2):
        out = validator.feeds(good)
        assert out == good and out is not good
    reordered = {k: good[k] for k in ("k", "b", "a")}
    assert validator.feeds(reordered).keys() == reordered.keys()
    for update, code in (({"a": np.ones((2, 3), np.float64)}, "HYB-403"),
                         ({"b": np.ones((5, 3), np.float32)}, "HYB-405"),  # 'N' disagrees with a's
                         ({"a": np.ones((2, 4), np.float32)}, "HYB-405")):
        with pytest.raises(RunError) as e:
            validator.feeds({**good, **update})
        assert e.value.code == code
    torch = pytest.importorskip("torch")  # not numpy: converted each call, never remembered
    converted = validator.feeds({**good, "a": torch.ones(2, 3)})
    assert type(converted["a"]) is np.ndarray


def test_positional_errors(cm2):
    a = np.ones((2, 3), np.float32)
    with pytest.raises(RunError) as e:
        cm2(a, a, np.zeros(2, np.int64), a)
    assert e.value.code == "HYB-407" and "at most 3" in e.value.message
    with pytest.raises(RunError) as e:
        cm2(a, a, np.zeros(2, np.int64), a=a)
    assert e.value.code == "HYB-407" and "'a'" in e.value.message
    with pytest.raises(RunError) as e:
        cm2.run([a, a])
    assert e.value.code == "HYB-406"


def test_torch_tensors_are_accepted(cm2):
    torch = pytest.importorskip("torch")
    out = cm2(torch.ones(2, 3), torch.ones(2, 3), torch.zeros(2, dtype=torch.int64))
    np.testing.assert_array_equal(out[0], np.full((2, 3), 2, np.float32))


# ---------------------------------------------------------------- the light models
@functools.cache
def _light_outputs(name: str, backend: str) -> tuple[np.ndarray, ...]:
    from hybrid.zoo.samples import light_input

    model, _ = light_with_logits(name)
    cm = hybrid.compile(model, target=backend)
    return tuple(cm.run({cm.signature.inputs[0].name: light_input()}).values())


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_models_match_shipped_outputs(name, backend):
    """Each CPU backend computes the light models: what the shipped output says on any machine (see
    tests._models.light_with_logits: a softmax over equal logits of ~1e10 is decided by rounding), and
    the logits agree with the other CPU backend's."""
    outputs = _light_outputs(name, backend)
    check_light_outputs(name, list(outputs))
    if len(outputs) == 2:
        other = next(b for b in CPU_BACKENDS if b != backend)
        # fp32 logits of ~1e31 summed in another order (each runtime's own kernels, per CPU): VGG-19's last layers
        # add up 25,088 and 4,096 terms, so any machine may differ by a few 1e-5 relative (6e-5 on an AMD EPYC)
        np.testing.assert_allclose(outputs[1], _light_outputs(name, other)[1], rtol=1e-3)


def test_import_is_light():
    """``import hybrid`` stays cheap by what it imports, not by a clock (the time depends on the machine;
    benchmarks/ measures it): no backend library, no numpy/onnx, and of hybrid itself only the facade (with the
    providers it installs, hybrid.providers, which imports nothing)."""
    code = ("import sys, json; import hybrid; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('hybrid', 'onnxruntime', 'openvino', 'torch', 'tensorrt', 'onnx', 'onnx_ir', 'numpy', 'pydantic'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["hybrid", "hybrid._version", "hybrid.errors", "hybrid.providers"]


def test_third_party_backend_through_the_entry_point_group(monkeypatch):
    from importlib import metadata

    from hybrid.hal import registry

    ep = metadata.EntryPoint(name="thirdparty", value="tests._backends:BrokenBackend", group="hybrid.backends")
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [ep] if group == "hybrid.backends" else [])
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    try:
        assert "thirdparty" in registry.backend_names()
        assert registry.backend_class("thirdparty") is BrokenBackend
        st = registry.backend_status("thirdparty")
        assert not st.available and "broken_runtime" in st.reason
    finally:
        registry._paths.pop("thirdparty", None)
        registry._classes.pop("thirdparty", None)
        reset_discovery()
