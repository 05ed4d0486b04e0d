"""Issue 55: profile runs a task bundle at its declared input size, and under target='auto' every figure (header,
latencies, per-operator table) comes from one candidate: the one auto serves for the profiled shape."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import typer
from onnx import TensorProto, helper, numpy_helper
from tests._backends import backend_registered
from tests.test_auto_shapes import _SmallOnly, conv_net
from typer.testing import CliRunner

import hybrid
from hybrid.runtime.profiler import profile


def _classifier() -> onnx.ModelProto:
    """x [N, 3, H, W] (H, W dynamic) -> Conv 3x3 (padded) -> Relu -> GlobalAveragePool -> Flatten -> logits [N, 5]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((4, 5)).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["logits"])]
    graph = helper.make_graph(nodes, "cls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])], [w, fc])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def task_bundle(tmp_path_factory):
    """A classification bundle of a model with dynamic H and W, declared at 32x48 (``--input-size 32x48``)."""
    folder = tmp_path_factory.mktemp("i55_profile")
    cm = hybrid.compile(_classifier(), target="onnxruntime")
    tm = hybrid.vision.TaskModel.from_options(cm, "classification", size=[32, 48])
    path = folder / "cls.hybrid"
    tm.save(str(path))
    return path


def _app() -> typer.Typer:
    from hybrid.cli import profile as profile_cli

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test app"""

    profile_cli.register(app)
    return app


def test_cli_profiles_a_task_bundle_at_its_declared_input_size(tmp_path, task_bundle):
    out = tmp_path / "p.json"
    res = CliRunner().invoke(_app(), ["profile", str(task_bundle), "-d", "0.2", "--node-runs", "2", "-o", str(out),
                                      "--target", "onnxruntime", "--json"])
    assert res.exit_code == 0, res.output  # was HYB-417: the declared size was not used
    doc = json.loads(res.output)
    assert doc["inputs"] == {"x": [1, 3, 32, 48]}
    assert json.loads(out.read_text())["otherData"]["inputs"] == {"x": [1, 3, 32, 48]}
    res = CliRunner().invoke(_app(), ["profile", str(task_bundle), "-d", "0.2", "--node-runs", "0", "-o", str(out),
                                      "--target", "onnxruntime", "--batch", "3", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["inputs"] == {"x": [3, 3, 32, 48]}
    # --shapes still wins over the declaration (a task model's raw input may be run at other sizes)
    res = CliRunner().invoke(_app(), ["profile", str(task_bundle), "-d", "0.2", "--node-runs", "0", "-o", str(out),
                                      "--target", "onnxruntime", "--shapes", "x:2x3x16x16", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["inputs"] == {"x": [2, 3, 16, 16]}


def test_api_profiles_a_task_bundle_at_its_declared_input_size(tmp_path, task_bundle):
    out = tmp_path / "p.json"
    report = hybrid.profile(str(task_bundle), duration=0.2, output=out, target="onnxruntime", node_runs=2,
                            batch=2, quiet=True)
    assert report.inputs == {"x": [2, 3, 32, 48]}  # was 2x3x2x2: the batch size given to every dynamic dim
    assert json.loads(out.read_text())["otherData"]["inputs"] == {"x": [2, 3, 32, 48]}
    tm = hybrid.load(str(task_bundle), target="onnxruntime")
    assert profile(tm, duration=0.2, output=None, node_runs=0, quiet=True).inputs == {"x": [1, 3, 32, 48]}


@pytest.fixture
def _quick_tuning():
    hybrid.init({"autotune": {"decide_within_s": 6.0, "overhead_cap": 1.0}})
    yield
    hybrid.init({})


def _node_track(trace: dict) -> str:
    (name,) = [e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e.get("tid") == 3]
    return name


@pytest.mark.usefixtures("_quick_tuning")
def test_auto_profiles_the_one_candidate_auto_serves_for_the_profiled_shape(tmp_path):
    # smallonly is first by priority (auto starts on it) but cannot run a batch of 8: at the profiled shape another
    # candidate serves. Before: the node table was asked of the start (smallonly, which has no profiler), while the
    # header and the latencies came from whatever the router served (and raced) during the timed runs.
    with backend_registered(_SmallOnly):
        cm = hybrid.compile(conv_net(), target="auto")
        assert cm.tunes_online and cm.backend == "smallonly"
        x = np.random.default_rng(0).random((8, 3, 16, 16), np.float32)
        out = tmp_path / "p.json"
        report = profile(cm, duration=0.3, output=out, inputs={"x": x}, batch=8, node_runs=3, quiet=True)
        (status,) = [s for s in cm.tuning if s.key == (("x", (8, 3, 16, 16)),)]
        assert status.state == "decided"
        backend, _, device = status.serving.split(" ")[0].partition(":")
        assert (report.backend, report.device) == (backend, device) != ("smallonly", "cpu")
        assert report.top_ops and report.node_runs == 3  # ONNX Runtime and OpenVINO both have profilers
        trace = json.loads(out.read_text())
        assert trace["otherData"]["backend"] == backend
        assert _node_track(trace) == f"nodes ({backend})"
        assert not any("smallonly" in n for n in report.notes)
        assert any(status.serving in n for n in report.notes)  # the note says which candidate was profiled
        # the timed runs ran the pinned candidate, not the router (whose turns would mix candidates' times)
        calls = status.calls
        profile(cm, duration=0.3, output=None, inputs={"x": x}, batch=8, node_runs=0, quiet=True)
        (again,) = [s for s in cm.tuning if s.key == status.key]
        assert again.calls == calls and again.serving == status.serving
        cm.close()
