"""The pyasc command: --version, devices, run, demo, explain."""

from __future__ import annotations

import json

import numpy as np
import onnx
from tests._models import matmul_add
from typer.testing import CliRunner

from hybrid._version import __version__
from hybrid.cli.main import app

runner = CliRunner()


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output


def test_devices_json_lists_cpu_and_backend_reasons():
    r = runner.invoke(app, ["devices", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    cpu = next(d for d in doc["devices"] if d["name"] == "cpu")
    assert "onnxruntime" in cpu["backends"]
    for b in doc["backends"]:
        assert b["available"] or b["reason"]
    assert runner.invoke(app, ["devices"]).exit_code == 0


def test_run_with_inputs_and_output(tmp_path):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    r = runner.invoke(app, ["run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}",
                            "--target", "openvino", "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert "y" in r.output and "2x3" in r.output and "float32" in r.output
    with np.load(out, allow_pickle=False) as z:
        assert z["y"].shape == (2, 3)


def test_run_errors_are_coded(tmp_path):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    r = runner.invoke(app, ["run", str(tmp_path / "m.onnx")])
    assert r.exit_code == 1 and "HYB-401" in r.output and "'x'" in r.output
    r = runner.invoke(app, ["run", str(tmp_path / "m.onnx"), "--input", "x"])
    assert r.exit_code == 1 and "HYB-406" in r.output
    r = runner.invoke(app, ["run", str(tmp_path / "m.onnx"), "--random", "--shapes", "x:2x4", "--target", "tpu"])
    assert r.exit_code == 1 and "HYB-301" in r.output
    r = runner.invoke(app, ["run", str(tmp_path / "missing.onnx"), "--random"])
    assert r.exit_code == 1 and "HYB-201" in r.output


def test_run_random_inputs(tmp_path):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    r = runner.invoke(app, ["run", str(tmp_path / "m.onnx"), "--random", "--shapes", "x:2x4"])
    assert r.exit_code == 0, r.output


def test_demo_on_a_small_light_model():
    r = runner.invoke(app, ["demo", "--model", "squeezenet", "--runs", "1"])
    assert r.exit_code == 0, r.output
    # the table's rows (stderr has the log; the note under the table may name onnxruntime:cpu as a loser)
    rows = [line for line in r.stdout.splitlines() if "onnxruntime:cpu" in line and line.startswith("│")]
    assert rows and all("yes" in row for row in rows), r.output


def test_explain():
    r = runner.invoke(app, ["explain", "HYB-404"])
    assert r.exit_code == 0 and "wrong input rank" in r.output
    r = runner.invoke(app, ["explain", "HYB-999"])
    assert r.exit_code == 1


def test_every_command_group_is_registered():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for command in ("devices", "run", "demo", "explain", "compile", "bundle", "platforms", "profile", "bench",
                    "serve"):
        assert command in r.output, command
