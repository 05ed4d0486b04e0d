"""Issue 51, item 1: the check process hands back what the serving process imports instead of compiling.

A backend says through the HAL contract how to make, in another process, an artifact it imports cheaply
(``Backend.prepare_artifact``, ``compile(..., artifact=...)``): ONNX Runtime's optimized model, OpenVINO's exported
blob. The check process makes one for each candidate that passes; the lab imports it, and compiles the candidate itself
when the import fails (counted). Issue 53, item 4: the worker module keeps no mutable state of its own; a model's blame
lives in its own :class:`~hybrid.runtime.auto.worker.Checker`.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper

from hybrid.errors import BackendError
from hybrid.hal import Candidate, get_backend
from hybrid.ir import Model
from hybrid.runtime.auto import worker


def _conv_net() -> tuple[Model, dict[str, np.ndarray]]:
    """A small CNN whose graph ORT's and OpenVINO's optimizers both rewrite (Conv + bias + Relu fusion, a pool)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.3, "w2")
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c2"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])
    graph = helper.make_graph(nodes, "conv_net", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])], [w1, b1, w2])
    model = Model.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return model, {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}


def _backends() -> list[str]:
    out = ["onnxruntime"]
    try:
        import openvino  # noqa: F401

        out.append("openvino")
    except ImportError:
        pass
    return out


def _request(model: Model, feeds: dict[str, np.ndarray], backends: list[str]) -> worker.CheckRequest:
    order = (*(f"{b}:cpu" for b in backends), "reference:cpu")
    return worker.CheckRequest(model.to_bytes(), model.name, order, {label: {} for label in order}, 1e-3, {}, feeds)


@pytest.fixture
def checks():
    process = worker.CheckProcess()
    yield process
    process.shutdown()


def test_a_candidate_imported_from_the_check_process_artifact_answers_as_its_compile(checks):
    model, feeds = _conv_net()
    backends = _backends()
    checker = worker.Checker(checks)
    verdicts = checker.check_elsewhere(_request(model, feeds, backends))
    assert verdicts is not None
    made = dict(verdicts.artifacts)
    assert set(made) == {f"{b}:cpu" for b in backends}  # each accelerated candidate that passed; not the reference
    folder = checker.artifact_dir()
    assert folder is not None
    for backend in backends:
        path = made[f"{backend}:cpu"]
        assert os.path.dirname(path) == folder and os.path.getsize(path) > 0
        compiled = get_backend(backend).compile(model, "cpu", {})
        imported = get_backend(backend).compile(model, "cpu", {}, artifact=path)
        assert imported.input_names == compiled.input_names and imported.output_names == compiled.output_names
        for want, got in zip(compiled.run(feeds), imported.run(feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        imported.close()
        compiled.close()
    checker.close()
    assert not os.path.exists(folder)  # the owner's folder goes with it


@pytest.mark.parametrize("backend", _backends())
def test_a_broken_artifact_is_refused_with_hyb_304(tmp_path, backend):
    model, _ = _conv_net()
    broken = tmp_path / "broken.artifact"
    broken.write_bytes(b"not a compiled model")
    with pytest.raises(BackendError) as e:
        get_backend(backend).compile(model, "cpu", {}, artifact=str(broken))
    assert e.value.code == "HYB-304"
    with pytest.raises(BackendError) as e:
        get_backend(backend).compile(model, "cpu", {}, artifact=str(tmp_path / "missing.artifact"))
    assert e.value.code == "HYB-304"


@pytest.mark.parametrize("backend", _backends())
def test_an_artifact_written_here_imports_with_the_same_answers(tmp_path, backend):
    """prepare_artifact with and without the executable already compiled (OpenVINO exports from it)."""
    model, feeds = _conv_net()
    be = get_backend(backend)
    compiled = be.compile(model, "cpu", {})
    for i, given in enumerate((compiled, None)):
        path = str(tmp_path / f"{i}.artifact")
        assert be.prepare_artifact(model, "cpu", {}, path, compiled=given)
        assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]  # written under another name, renamed
        imported = be.compile(model, "cpu", {}, artifact=path)
        for want, got in zip(compiled.run(feeds), imported.run(feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_backend_without_artifacts_says_so(tmp_path):
    model, _ = _conv_net()
    reference = get_backend("reference")
    assert reference.prepare_artifact(model, "cpu", {}, str(tmp_path / "a")) is False
    with pytest.raises(BackendError) as e:
        reference.compile(model, "cpu", {}, artifact=str(tmp_path / "a"))
    assert e.value.code == "HYB-304"


def _lab(model: Model, checks: worker.CheckProcess):
    from hybrid.runtime.auto.lab import RealLab
    from hybrid.runtime.auto.trials import Search

    order = [Candidate("onnxruntime", "cpu"), Candidate("reference", "cpu")]

    def options_of(cand, precision):
        return {}

    start = Search(model, order, options_of, "fp32", None, None).single(order[1], "fp32")
    return RealLab(model, start, order, options_of, "fp32", None, 1e-3, {}, {"test": "i51"}, 1.0, True, checks=checks)


def test_the_lab_imports_what_the_check_process_made_and_compiles_when_the_import_fails(checks, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path / "cache"))
    model, feeds = _conv_net()
    want = get_backend("reference").compile(model, "cpu", {}).run(feeds)
    lab = _lab(model, checks)
    result = lab.check(feeds, lambda: False)
    assert [label for label, _ in result.passed] == ["onnxruntime:cpu"]
    lane = lab.lane("onnxruntime:cpu", feeds)
    assert lane is not None and (lab.imported, lab.import_failures) == (1, 0)
    for w, got in zip(want, lane.executable.run(feeds), strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)
    lab.release("onnxruntime:cpu")

    lab._artifacts["onnxruntime:cpu"] = str(tmp_path / "broken.artifact")  # what a damaged file looks like
    (tmp_path / "broken.artifact").write_bytes(b"\x00garbage")
    lane = lab.lane("onnxruntime:cpu", feeds)
    assert lane is not None and (lab.imported, lab.import_failures) == (1, 1)  # compiled here instead, counted
    for w, got in zip(want, lane.executable.run(feeds), strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)
    folder = lab.checker.artifact_dir()
    lab.close()
    assert folder is not None and not os.path.exists(folder)


def test_two_controllers_do_not_share_blame():
    model, _ = _conv_net()
    shared = worker.CheckProcess()
    first, second = worker.Checker(shared), worker.Checker(shared)
    first.blame(model.to_bytes(), "onnxruntime:cpu", "the check process died on it (killed by SIGSEGV)")
    assert first.blamed(model, "onnxruntime:cpu@2x1") == "the check process died on it (killed by SIGSEGV)"
    assert second.blamed(model, "onnxruntime:cpu") is None
    assert worker.Checker(worker.CheckProcess()).blamed(model, "onnxruntime:cpu") is None


def test_the_worker_module_keeps_no_mutable_state_of_its_own():
    lock_types = (type(threading.Lock()), type(threading.RLock()))
    mutable = (dict, list, set, bytearray, *lock_types, worker.CheckProcess, worker.Checker, worker.PacedUntil)
    found = {name: type(value).__name__ for name, value in vars(worker).items()
             if not name.startswith("__") and isinstance(value, mutable)}
    assert found == {}


class _CountingChecks(worker.CheckProcess):
    """A check process that counts the prestarts asked of it and starts nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.prestarts = 0

    def prestart(self, share: float = 1.0, backends: tuple[str, ...] | None = None) -> None:
        self.prestarts += 1


def test_a_model_whose_buckets_are_cached_starts_no_check_process_until_a_check_asks(tmp_path, monkeypatch):
    """The prestart's imports run unpaced until a check waits: a model seen before would pay them beside its first
    calls for nothing (issue 52: auto's SingleStream p90 under LoadGen, decided from the cache)."""
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path / "cache"))
    model, feeds = _conv_net()
    first_checks = _CountingChecks()
    first = _lab(model, first_checks)
    assert first_checks.prestarts == 1  # nothing known of it: the check process warms up before the first call
    bucket = tuple((name, tuple(int(d) for d in np.shape(v))) for name, v in feeds.items())
    start = next(iter(first.trials))  # the start (the reference here), a candidate the lab has compiled
    first.persist(bucket, start)
    first.close()
    again_checks = _CountingChecks()
    again = _lab(model, again_checks)
    assert again.cached(bucket) == start and again_checks.prestarts == 0
    again.close()
