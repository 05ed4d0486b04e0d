"""hybrid.profile / pyasc profile (Chrome trace with run, subgraph and node spans) and pyasc bench."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from tests._machine import openvino_cpu_offers
from typer.testing import CliRunner

import hybrid
from hybrid.errors import ConfigError
from hybrid.runtime.profiler import MAX_RUN_SPANS, ProfileReport, profile


@pytest.fixture(scope="module")
def squeezenet():
    from hybrid.zoo import samples

    return samples.light_model_path("squeezenet")


def _app() -> typer.Typer:
    from hybrid.cli import bench
    from hybrid.cli import profile as profile_cli

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test app"""

    profile_cli.register(app)
    bench.register(app)
    return app


def _spans(doc: dict, cat: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == cat]


@pytest.mark.parametrize(("target", "op"), [("onnxruntime:cpu", "Conv"), ("openvino:cpu", "Convolution")])
def test_trace_has_run_subgraph_and_node_spans(tmp_path, squeezenet, target, op):
    out = tmp_path / "profile.json"
    report = profile(squeezenet, duration=2, output=out, target=target, node_runs=10, quiet=True)
    doc = json.loads(out.read_text())  # Chrome trace, JSON object form (Perfetto and chrome://tracing)
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] == "ms"
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M", "C") and isinstance(e["pid"], int) and "name" in e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["tid"], int)
    runs, subgraphs, nodes = _spans(doc, "run"), _spans(doc, "subgraph"), _spans(doc, "node")
    assert len(runs) == len(subgraphs) == report.runs >= 10
    assert report.node_runs == 10 and nodes
    assert {n["args"]["op_type"] for n in nodes} >= {op}
    per_run = len(nodes) / report.node_runs
    assert per_run >= 20  # squeezenet has 26 convolutions
    # node spans sit inside the profiled runs they were measured in; the plain runs give the latency
    profiled = _spans(doc, "profiled run")
    assert len(profiled) == report.node_runs and profiled[-1]["ts"] + profiled[-1]["dur"] <= runs[0]["ts"]
    first = profiled[0]
    inside = [n for n in nodes if first["ts"] <= n["ts"] <= first["ts"] + first["dur"]]
    assert len(inside) >= per_run * 0.8
    assert all(n["ts"] + n["dur"] <= first["ts"] + first["dur"] + 1.0 for n in inside)
    # the summary is computed from the same spans that are in the file
    durations = np.array([r["dur"] for r in runs]) / 1e3
    assert report.latency_ms["p50"] == pytest.approx(np.percentile(durations, 50), rel=1e-3, abs=1e-3)
    assert report.throughput == pytest.approx(len(runs) / (durations.sum() / 1e3), rel=1e-3)
    # (agreement with a separate timing loop is a timing, measured in benchmarks/bundle_load.py)
    # which op type costs most is the machine's (kernels, cache sizes); that the table is the spans' is not
    shares = [s.share for s in report.top_ops]
    assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(1.0)
    assert op in {s.name for s in report.top_ops}
    assert {s.name for s in report.top_ops} <= {n["args"]["op_type"] for n in nodes}
    assert doc["otherData"]["runs"] == report.runs


def test_profile_a_bundle_prints_a_summary(tmp_path, squeezenet, capsys):
    cm = hybrid.compile(squeezenet, target="onnxruntime:cpu")
    cm.save(str(tmp_path / "m.hybrid"))
    report = hybrid.profile(str(tmp_path / "m.hybrid"), duration=0.5, output=str(tmp_path / "p.json"),
                            node_runs=3)
    assert isinstance(report, ProfileReport) and report.backend == "onnxruntime"
    printed = capsys.readouterr().out
    for word in ("p50", "p90", "p99", "inferences/s", "Conv", "perfetto"):
        assert word in printed


def test_backend_without_profiler_still_traces_runs(tmp_path):
    from tests._models import matmul_add

    report = profile(matmul_add(), duration=0.2, output=tmp_path / "p.json", target="reference", quiet=True)
    doc = json.loads((tmp_path / "p.json").read_text())
    # a fast machine runs more than the trace draws: the trace keeps the first MAX_RUN_SPANS runs
    assert len(_spans(doc, "run")) == min(report.runs, MAX_RUN_SPANS) >= 1
    assert (report.notes and not report.top_ops) or report.top_ops


def test_memory_pool_counter_tracks(tmp_path):
    from tests._models import matmul_add

    hybrid.init({"memory_pool": {"cpu": "16MB"}})
    profile(matmul_add(), duration=0.1, output=tmp_path / "p.json", target="onnxruntime:cpu", quiet=True)
    doc = json.loads((tmp_path / "p.json").read_text())
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert counters and counters[0]["name"] == "memory pool cpu"
    assert counters[0]["args"]["reserved"] == 16 << 20


def test_given_inputs_and_batch(tmp_path):
    from tests._models import matmul_add

    x = {"x": np.ones((8, 4), np.float32)}
    report = profile(matmul_add(), duration=0.1, output=None, target="onnxruntime:cpu", inputs=x, batch=8,
                     quiet=True)
    assert report.output is None and report.items_per_s == pytest.approx(8 * report.throughput)


@pytest.mark.parametrize("kwargs", [{"duration": -1}, {"batch": 0}, {"node_runs": "x"}, {"warmup": True}])
def test_bad_arguments(kwargs):
    from tests._models import matmul_add

    with pytest.raises(ConfigError):
        profile(matmul_add(), output=None, quiet=True, **kwargs)


def test_profile_cli(tmp_path, squeezenet):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(_app(), ["profile", str(squeezenet), "--duration", "0.5", "--output", str(out),
                                         "--target", "openvino", "--node-runs", "2"])
    assert result.exit_code == 0, result.output
    assert "p99" in result.output and "Convolution" in result.output
    assert _spans(json.loads(out.read_text()), "node")
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 224, 224), np.float32))
    result = CliRunner().invoke(_app(), ["profile", str(squeezenet), "--duration", "0.2", "--output", str(out),
                                         "--input", f"data_0={tmp_path / 'x.npy'}"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(_app(), ["profile", str(tmp_path / "missing.onnx"), "--duration", "0.1"])
    assert result.exit_code == 1 and "HYB-201" in result.output


def test_bench_migration_report(tmp_path):
    from tests._models import matmul_add

    from hybrid.cli.bench import bench, reference_target

    rows, reference = bench(matmul_add(), targets=["onnxruntime", "openvino"], blocks=2, per_block=3, batch=1)
    assert reference == reference_target()
    by = {(r.target, r.precision): r for r in rows}
    ok = by[("onnxruntime:cpu", "fp32")]
    assert ok.status == "ok" and ok.p50_ms > 0 and ok.items_per_s > 0 and ok.max_abs_err < 1e-5
    assert by[("onnxruntime:cpu", "fp16")].status == "n/a"
    bf16 = by[("openvino:cpu", "bf16")]
    if openvino_cpu_offers("BF16"):  # a CPU feature (AVX-512 BF16, AMX), not every machine's
        assert bf16.status == "ok" and bf16.max_scaled_err < 0.05
    else:
        assert bf16.status == "n/a"
    assert min(r.vs_fastest for r in rows if r.status == "ok") == pytest.approx(1.0)


def test_bench_cli(tmp_path, squeezenet):
    cm = hybrid.compile(squeezenet, target="onnxruntime:cpu")
    cm.save(str(tmp_path / "m.hybrid"))
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(_app(), ["bench", str(tmp_path / "m.hybrid"), "--targets", "onnxruntime,openvino",
                                         "--precisions", "fp32", "--blocks", "1", "--per-block", "2",
                                         "--output", str(out), "--markdown"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "| onnxruntime:cpu | fp32 |" in result.output and "| openvino:cpu | fp32 |" in result.output
    doc = json.loads(out.read_text())
    assert {r["target"] for r in doc["rows"]} == {"onnxruntime:cpu", "openvino:cpu"}
