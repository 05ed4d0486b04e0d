"""Issue 55 item 4: pinning a backend imports only that backend; the check worker goes when idle.

``hybrid.compile(path, target='onnxruntime')`` used to probe every registered backend while resolving the
target, which imported torch and OpenVINO (RSS 25 -> 343 MB before any model).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")  # the zoo builds its models with torch


@pytest.fixture(scope="module")
def zoo_model(tmp_path_factory):
    from hybrid import zoo

    return zoo.build("external_data", folder=tmp_path_factory.mktemp("zoo"))


def _modules_after(code: str, tmp_path) -> dict:
    """Run ``code`` in a fresh interpreter; it must print one JSON line last."""
    env = {**os.environ, "HYBRID_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_pinned_onnxruntime_target_imports_neither_torch_nor_openvino(zoo_model, tmp_path):
    feeds_path = tmp_path / "feeds.npz"
    import numpy as np

    np.savez(feeds_path, **zoo_model.feeds(seed=0))
    found = _modules_after(f"""
        import json, sys
        import numpy as np
        import hybrid
        feeds = dict(np.load({str(feeds_path)!r}))
        cm = hybrid.compile({str(zoo_model.path)!r}, target='onnxruntime')
        out = cm.run(feeds)
        import onnxruntime as ort
        raw = ort.InferenceSession({str(zoo_model.path)!r}, providers=['CPUExecutionProvider']).run(None, feeds)
        same = all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(out.values(), raw))
        print(json.dumps({{"backend": cm.backend, "same": bool(same),
                          "mods": sorted(m for m in ("torch", "openvino", "tensorrt", "sympy", "hybrid.runtime.auto")
                                         if m in sys.modules)}}))
    """, tmp_path)
    assert found["backend"] == "onnxruntime"
    assert found["same"]
    assert found["mods"] == []


def test_a_pinned_backend_with_a_device_probes_only_that_backend(zoo_model, tmp_path):
    found = _modules_after(f"""
        import json, sys
        import hybrid
        cm = hybrid.compile({str(zoo_model.path)!r}, target='onnxruntime:cpu')
        print(json.dumps({{"device": cm.device,
                          "mods": sorted(m for m in ("torch", "openvino", "tensorrt") if m in sys.modules)}}))
    """, tmp_path)
    assert found == {"device": "cpu", "mods": []}


def test_devices_still_discover_every_backend_after_a_pinned_compile(zoo_model, tmp_path):
    found = _modules_after(f"""
        import json
        import hybrid
        hybrid.compile({str(zoo_model.path)!r}, target='onnxruntime')
        print(json.dumps(sorted({{b for d in hybrid.devices() for b in d.backends}})))
    """, tmp_path)
    from hybrid.hal import backend_status

    expected = sorted(n for n in ("reference", "onnxruntime", "openvino", "torch") if backend_status(n).available)
    assert set(expected) <= set(found)


def test_onnx_ir_imports_sympy_only_for_symbolic_arithmetic(tmp_path):
    """onnx-ir >= 1.1 imports SymPy (about 32 MB) at import; under hybrid only its symbolic arithmetic does."""
    found = _modules_after("""
        import json, sys
        import hybrid
        import onnx_ir as ir
        before = "sympy" in sys.modules
        dim = ir.SymbolicDim("n") + 1
        import sympy
        print(json.dumps({"before": before, "value": dim.value, "real": type(sys.modules["sympy"]).__name__,
                          "expr": isinstance(ir.SymbolicDim("2*n")._expr, sympy.Expr),
                          "evaluated": ir.Shape([ir.SymbolicDim("n"), 3]).evaluate({"n": 4}).dims}))
    """, tmp_path)
    assert found == {"before": False, "value": "n + 1", "real": "module", "expr": True, "evaluated": [4, 3]}


def _relu_model():
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=onnx.IR_VERSION)


def test_compiling_a_bundle_names_hybrid_load(tmp_path):
    """``hybrid.compile('m.hybrid')`` said "the bytes do not parse"; it says it is a bundle and how to load it."""
    import numpy as np

    import hybrid

    path = tmp_path / "m.hybrid"
    hybrid.compile(_relu_model(), target="reference").save(path)
    for source in (path, str(path), path.read_bytes()):
        with pytest.raises(hybrid.ModelError) as e:
            hybrid.compile(source, target="onnxruntime")
        assert e.value.code == "HYB-203"
        assert ".hybrid bundle" in e.value.message and "hybrid.load(" in e.value.hint
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    np.testing.assert_array_equal(hybrid.load(path, target="onnxruntime").run({"x": x})["y"], np.maximum(x, 0))


# ---------------------------------------------------------------- the check process: what it imports, when it ends
@pytest.fixture
def fresh_worker(monkeypatch):
    """The check process module with a scripted idle clock and no worker left over from another test."""
    from hybrid.runtime.auto import worker

    now = [1000.0]
    checks = worker.CheckProcess(clock=lambda: now[0])
    yield worker, checks, now
    checks.shutdown()


def _relu_request(worker):
    import numpy as np

    from hybrid.ir import Model

    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    return worker.CheckRequest(Model.load(_relu_model()).to_bytes(), "relu", ("onnxruntime:cpu", "reference:cpu"),
                               {"onnxruntime:cpu": {}, "reference:cpu": {}}, 1e-3, {}, {"x": x})


def _libraries_of(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the worker's memory map from /proc")
def test_the_check_process_imports_only_the_candidates_it_checks(fresh_worker):
    worker, checks, _ = fresh_worker
    w = checks.worker()
    assert w.ask(("probe", ("onnxruntime", "reference"))) == "ok"
    verdicts = worker.Checker(checks).check_elsewhere(_relu_request(worker))
    assert verdicts is not None and {label: why for label, why, *_ in verdicts.results} == {
        "onnxruntime:cpu": None, "reference:cpu": None}
    maps = _libraries_of(w.proc.pid)
    assert "onnxruntime" in maps
    assert "libtorch" not in maps and "libopenvino" not in maps


def test_the_check_process_ends_when_idle_and_starts_again_on_demand(fresh_worker):
    from hybrid.runtime.auto.policy import TuningPolicy

    worker, checks, now = fresh_worker
    idle_s = TuningPolicy().check_idle_s
    first = checks.worker()
    assert first.ask(("probe", ("reference",))) == "ok"
    now[0] += idle_s - 0.5
    assert checks.reap_idle() == pytest.approx(0.5)  # not idle long enough yet
    assert first.proc.poll() is None
    with first.lock:  # answering a request: never ended, however long it takes
        now[0] += 0.5
        assert checks.reap_idle() == idle_s
        assert first.proc.poll() is None
    first.last_used = now[0] - idle_s
    assert checks.reap_idle() is None  # idle for the policy's time: ended
    assert first.proc.wait(timeout=10) is not None
    verdicts = worker.Checker(checks).check_elsewhere(_relu_request(worker))  # the next check starts a new one
    assert verdicts is not None and all(why is None for _, why, *_ in verdicts.results)
    assert checks.current is not None and checks.current.proc.pid != first.proc.pid


def test_a_compile_from_a_file_keeps_no_parsed_copy_of_the_model(tmp_path):
    """The backend holds the weights after a compile; hybrid kept the ModelProto and the onnx-ir model too."""
    import numpy as np
    import onnx

    import hybrid

    path = tmp_path / "relu.onnx"
    onnx.save(_relu_model(), path)
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    cm = hybrid.compile(path, target="onnxruntime")
    assert cm.model._proto is None and cm.model._ir is None  # the serialized bytes only (ONNX Runtime's own)
    np.testing.assert_array_equal(cm.run({"x": x})["y"], np.maximum(x, 0))
    assert [n.op_type for n in cm.model.graph] == ["Relu"] and cm.model.opset == 13  # parsed again on demand
    cm.save(tmp_path / "m.hybrid")
    np.testing.assert_array_equal(hybrid.load(tmp_path / "m.hybrid", target="onnxruntime").run({"x": x})["y"],
                                  np.maximum(x, 0))
    own = hybrid.Model.load(path)
    graph = own.graph
    hybrid.compile(own, target="onnxruntime")
    assert own.graph is graph  # a model the caller holds is left as it was
