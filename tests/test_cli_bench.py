"""pyasc bench as a benchmarking tool (--shapes, --duration/--iterations/--warmup, --concurrency, p50/p90/p99,
--json, --report) and pyasc quantize."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from tests._models import matmul_add, two_inputs
from typer.testing import CliRunner

from hybrid.cli.main import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


@pytest.fixture
def model_path(tmp_path):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


def test_bench_json_on_stdout_with_percentiles_and_shapes(model_path):
    r = invoke("bench", model_path, "-t", "onnxruntime", "-p", "fp32", "--shapes", "x:6x4", "--iterations", "20",
               "--blocks", "2", "--warmup", "1", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (row,) = doc["rows"]
    assert row["status"] == "ok" and row["runs"] >= 20 and row["concurrency"] == 1
    assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
    assert row["items_per_s"] > 0 and row["max_abs_err"] < 1e-4 and "latencies_ms" not in row
    assert doc["timing"]["iterations"] == 20 and doc["batch"] == 6 and doc["inputs"] == {"x": [6, 4]}


def test_bench_shapes_reach_the_model(model_path):
    from hybrid.cli.bench import bench

    rows, _ = bench(str(model_path), targets=["onnxruntime"], precisions=("fp32",), blocks=1, per_block=1,
                    batch=5)
    assert rows[0].items_per_s > 0
    r = invoke("bench", model_path, "-t", "onnxruntime", "-p", "fp32", "--shapes", "x:6x5")
    assert r.exit_code == 1 and "HYB-102" in r.output
    r = invoke("bench", model_path, "-t", "onnxruntime", "--shapes", "nope:1x4")
    assert r.exit_code == 1 and "HYB-102" in r.output
    r = invoke("bench", model_path, "-t", "onnxruntime", "--shapes", "x=1x4")
    assert r.exit_code == 1 and "HYB-102" in r.output


def test_bench_duration_and_concurrency(model_path):
    r = invoke("bench", model_path, "-t", "onnxruntime", "-p", "fp32", "--duration", "0.4", "--blocks", "2",
               "--concurrency", "3", "--json", "--batch", "2")
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)["rows"]
    assert row["concurrency"] == 3 and row["runs"] >= 3 and row["items_per_s"] > 0


@pytest.mark.parametrize("args", [["--duration", "0"], ["--iterations", "0"], ["--concurrency", "0"],
                                  ["--duration", "1", "--iterations", "5"], ["--warmup", "-1"]])
def test_bench_refuses_bad_timing_options(model_path, args):
    r = invoke("bench", model_path, "-t", "onnxruntime", *args)
    assert r.exit_code in (1, 2) and ("HYB-102" in r.output or "Invalid value" in r.output), r.output


def test_bench_output_file_has_every_timed_call(model_path, tmp_path):
    out = tmp_path / "rows.json"
    r = invoke("bench", model_path, "-t", "onnxruntime", "-p", "fp32", "--iterations", "7", "--blocks", "1",
               "-o", out, "--shapes", "x:1x4")
    assert r.exit_code == 0, r.output
    (row,) = json.loads(out.read_text())["rows"]
    assert len(row["latencies_ms"]) == row["runs"] >= 7


def test_bench_html_report_is_self_contained(model_path, tmp_path):
    pytest.importorskip("matplotlib")
    report = tmp_path / "report.html"
    r = invoke("bench", model_path, "-t", "onnxruntime,openvino", "-p", "fp32", "--iterations", "6", "--blocks", "2",
               "--report", report, "--shapes", "x:3x4")
    assert r.exit_code == 0, r.output
    text = report.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    # opens offline: nothing is fetched (no src/href/url() pointing at a network address, no <script src>)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", text, re.I) and "<link" not in text
    assert "<script" not in text
    # one plot per metric, each an inline SVG
    figures = re.findall(r"<figure class='plot' data-metric='(\w+)'>.*?</figure>", text, re.S)
    assert figures == ["latency", "throughput", "error"]
    assert text.count("<svg") == 3
    assert "onnxruntime:cpu" in text and "x: float32[3x4] (generated)" in text  # the header: the shapes run


def test_quantize_dynamic_and_static_with_report(tmp_path, model_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "cal.npz", x=rng.standard_normal((40, 1, 4)).astype(np.float32))
    out = tmp_path / "m.int8.onnx"
    r = invoke("quantize", model_path, "--calibration", tmp_path / "cal.npz", "--method", "static", "-o", out,
               "--samples", "24")
    assert r.exit_code == 0, r.output
    assert out.is_file() and "cosine min" in r.output and "accuracy against fp32" in r.output
    r = invoke("quantize", model_path, "--method", "dynamic", "-o", out, "--json", "--shapes", "x:2x4")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["mode"] == "dynamic" and doc["outputs"][0]["name"] == "y" and doc["output"] == str(out)
    folder = tmp_path / "cal"
    folder.mkdir()
    for i in range(20):
        np.save(folder / f"{i:02d}.npy", rng.standard_normal((1, 4)).astype(np.float32))
    r = invoke("quantize", model_path, "--calibration", folder, "-o", out, "--min-cosine", "0.9", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["budget_met"] is True


def test_quantize_errors(tmp_path, model_path):
    out = tmp_path / "q.onnx"
    r = invoke("quantize", model_path, "-o", out)
    assert r.exit_code == 1 and "HYB-602" in r.output and "--calibration" in r.output
    r = invoke("quantize", model_path, "--method", "magic", "-o", out)
    assert r.exit_code == 1 and "HYB-601" in r.output
    np.savez(tmp_path / "bad.npz", z=np.zeros((4, 1, 4), np.float32))
    r = invoke("quantize", model_path, "--calibration", tmp_path / "bad.npz", "-o", out)
    assert r.exit_code == 1 and "HYB-603" in r.output and "'z'" in r.output
    onnx.save(two_inputs(), tmp_path / "two.onnx")
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "0.npy", np.zeros((1, 3), np.float32))
    r = invoke("quantize", tmp_path / "two.onnx", "--calibration", folder, "-o", out)
    assert r.exit_code == 1 and "HYB-602" in r.output
    assert not out.exists()


def test_markdown_never_drops_a_target_that_was_asked_for():
    from hybrid.cli.bench import BenchRow, markdown

    rows = [BenchRow("a:cpu", "fp32", "ok", 0.1, 1.0, 1.1, 900.0, 0.0, 0.0, 1.0, "", 1.2, 1.0, "fp32", 10),
            BenchRow("a:cpu", "fp16", "n/a", note="[HYB-304] no fp16"),
            BenchRow("b:cpu", "fp32", "n/a", note="[HYB-304] cannot compile"),
            BenchRow("c:cpu", "fp16", "ok", 0.1, 1.0, 1.1, 900.0, 0.0, 0.0, 1.0, "", 1.2, 1.0, "bf16", 10)]
    text = markdown(rows, "reference:cpu", ok_only=True)
    assert "| a:cpu | fp16 |" not in text and "| b:cpu | fp32 | n/a |" in text
    assert "| c:cpu | bf16 (asked fp16) |" in text
    assert "| a:cpu | fp16 | n/a |" in markdown(rows, "reference:cpu")
