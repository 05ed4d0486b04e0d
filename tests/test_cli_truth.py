"""The command line tells the truth (issue 28), through the real CLI on dynamic-shape zoo models.

neg_dim: x float32[?x?x?x?] (every dim dynamic; the model runs at 1x3x48x192); crnn: x float32[batchx3x48xwidth].
Each test fails on the code before the issue was fixed.
"""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import hybrid
from hybrid.cli.main import app

pytest.importorskip("torch")  # the zoo builds its models with torch

runner = CliRunner()
SHAPES = "x:1x3x48x192"


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def neg_dim(zoo_dir):
    from hybrid import zoo

    return zoo.build("neg_dim", folder=zoo_dir).path


@pytest.fixture(scope="module")
def crnn(zoo_dir):
    from hybrid import zoo

    return zoo.build("crnn", folder=zoo_dir).path


QUICK_BENCH = ("-t", "onnxruntime", "-p", "fp32", "--iterations", "4", "--blocks", "1", "--warmup", "1")


# ------------------------------------------------------------------ no made-up sizes
@pytest.mark.parametrize("command", [["run", "{m}", "--random"], ["bench", "{m}", *QUICK_BENCH],
                                     ["profile", "{m}", "-d", "0.1", "-o", "{tmp}/p.json"],
                                     ["quantize", "{m}", "--method", "dynamic", "-o", "{tmp}/q.onnx"],
                                     ["bundle", "create", "{m}", "-t", "auto", "-o", "{tmp}/b.hybrid",
                                      "--no-hybrid-wheel"]])
def test_a_dynamic_input_without_shapes_is_refused(neg_dim, tmp_path, command):
    args = [a.format(m=neg_dim, tmp=tmp_path) for a in command]
    r = invoke(*args)
    assert r.exit_code == 1, r.output
    assert "HYB-417" in r.output and "dim 0, dim 1, dim 2, dim 3" in r.output
    assert "--shapes x:D0xD1xD2xD3" in r.output  # a line to copy and fill in
    assert not list(tmp_path.iterdir())  # nothing written


def test_named_dynamic_dims_are_named(crnn):
    r = invoke("run", crnn, "--random")
    assert r.exit_code == 1 and "HYB-417" in r.output
    assert "dim 0 (batch), dim 3 (width)" in r.output and "--shapes x:BATCHx3x48xWIDTH" in r.output


def test_the_shapes_run_are_printed_everywhere(neg_dim, tmp_path):
    r = invoke("run", neg_dim, "--shapes", SHAPES, "-t", "onnxruntime")
    assert r.exit_code == 0, r.output
    assert "1x3x48x192" in r.stdout and "input (generated)" in r.stdout
    doc = json.loads(invoke("run", neg_dim, "--shapes", SHAPES, "-t", "onnxruntime", "--json").stdout)
    assert doc["inputs"] == [{"name": "x", "shape": [1, 3, 48, 192], "dtype": "float32", "source": "generated"}]
    r = invoke("bench", neg_dim, *QUICK_BENCH, "--shapes", SHAPES, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["inputs"] == {"x": [1, 3, 48, 192]} and doc["input_sources"] == {"x": "generated"}
    assert any("x: float32[1x3x48x192] (generated)" in line for line in doc["header"])
    r = invoke("profile", neg_dim, "-d", "0.1", "-o", tmp_path / "p.json", "--shapes", SHAPES, "-t", "onnxruntime",
               "--node-runs", "1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["inputs"] == {"x": [1, 3, 48, 192]}
    assert json.loads((tmp_path / "p.json").read_text())["otherData"]["inputs"] == {"x": [1, 3, 48, 192]}


# ------------------------------------------------------------------ --shapes reach the selection
def _spy(monkeypatch, module, name):
    seen = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


def test_shapes_reach_compile_in_run_profile_and_bench(neg_dim, tmp_path, monkeypatch):
    import hybrid.runtime.compiler as compiler

    seen = _spy(monkeypatch, hybrid, "compile")
    assert invoke("run", neg_dim, "--shapes", SHAPES, "-t", "onnxruntime").exit_code == 0
    assert invoke("profile", neg_dim, "-d", "0.1", "-o", tmp_path / "p.json", "--shapes", SHAPES,
                  "-t", "onnxruntime", "--node-runs", "0").exit_code == 0
    assert [kw["shapes"] for kw in seen] == [{"x": (1, 3, 48, 192)}] * 2
    seen = _spy(monkeypatch, compiler, "compile_model")
    r = invoke("bench", neg_dim, *QUICK_BENCH, "--min-shapes", "x:1x3x48x96", "--opt-shapes", SHAPES,
               "--max-shapes", "x:2x3x48x384")
    assert r.exit_code == 0, r.output
    ranges = {"x": {"min": (1, 3, 48, 96), "opt": (1, 3, 48, 192), "max": (2, 3, 48, 384)}}
    assert seen and all(kw["shapes"] == ranges for kw in seen)
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 48, 96), np.float32))  # an input file's shape is declared too
    seen.clear()
    assert invoke("bench", neg_dim, *QUICK_BENCH, "-i", f"x={tmp_path / 'x.npy'}").exit_code == 0
    assert seen and all(kw["shapes"] == {"x": (2, 3, 48, 96)} for kw in seen)


def test_compile_hands_autotune_through(neg_dim, monkeypatch):
    seen = _spy(monkeypatch, hybrid, "compile")
    for flag, want in (("--autotune", True), ("--no-autotune", False)):
        assert invoke("compile", neg_dim, "--shapes", SHAPES, flag, "--json").exit_code == 0
        assert seen[-1]["autotune"] is want and seen[-1]["shapes"] == {"x": (1, 3, 48, 192)}


def test_bundle_create_auto_packages_the_measured_choice(neg_dim, tmp_path):
    picked = json.loads(invoke("compile", neg_dim, "--shapes", SHAPES, "--json").stdout)
    out = tmp_path / "b.hybrid"
    r = invoke("bundle", "create", neg_dim, "-t", "auto", "--shapes", SHAPES, "-o", out, "--no-hybrid-wheel")
    assert r.exit_code == 0, r.output
    assert "shapes: x: 1x3x48x192" in r.output
    doc = json.loads(invoke("bundle", "inspect", out, "--json").stdout)
    assert (doc["compile"]["backend"], doc["compile"]["device"]) == (picked["backend"], picked["device"])


def test_a_bundle_made_with_shapes_runs_at_them(neg_dim, tmp_path):
    """bundle create / compile -o with --shapes declare them; run, bench and profile of the bundle use them."""
    made = tmp_path / "b.hybrid"
    assert invoke("bundle", "create", neg_dim, "-t", "onnxruntime", "--shapes", SHAPES, "-o", made,
                  "--no-hybrid-wheel").exit_code == 0
    compiled = tmp_path / "c.hybrid"
    assert invoke("compile", neg_dim, "-t", "onnxruntime", "--shapes", SHAPES, "-o", compiled).exit_code == 0
    for out in (made, compiled):
        assert json.loads(invoke("bundle", "inspect", out, "--json").stdout)["shapes"] == {"x": [1, 3, 48, 192]}
        r = invoke("run", out, "--random", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["inputs"][0]["shape"] == [1, 3, 48, 192]
    r = invoke("bench", made, *QUICK_BENCH, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["inputs"] == {"x": [1, 3, 48, 192]}
    r = invoke("run", made, "--random", "--shapes", "x:2x3x48x192", "--json")  # --shapes still wins
    assert json.loads(r.stdout)["inputs"][0]["shape"] == [2, 3, 48, 192]
    r = invoke("run", made)  # the bundle's shapes size the input, but nothing is generated unasked
    assert r.exit_code == 1 and "HYB-401" in r.output and "--random" in r.output


def test_compile_output_saves_the_compiled_model(neg_dim, tmp_path):
    out = tmp_path / "c.hybrid"
    r = invoke("compile", neg_dim, "-t", "onnxruntime", "--shapes", SHAPES, "-o", out)
    assert r.exit_code == 0, r.output
    assert out.is_file() and f"wrote {out}" in r.output
    r = invoke("run", out, "--shapes", SHAPES, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["backend"] == "onnxruntime"
    r = invoke("compile", neg_dim, "-o", tmp_path / "c.onnx")
    assert r.exit_code == 1 and "HYB-102" in r.output and ".hybrid" in r.output


# ------------------------------------------------------------------ quantize
def test_quantize_validates_the_cosine(neg_dim, tmp_path):
    for bad in ("1.5", "0", "-0.2"):
        r = invoke("quantize", neg_dim, "--method", "dynamic", "--shapes", SHAPES, "--min-cosine", bad,
                   "-o", tmp_path / "q.onnx")
        assert r.exit_code == 1 and "HYB-601" in r.output and "(0, 1]" in r.output
    assert not (tmp_path / "q.onnx").exists()


def test_quantize_reports_what_it_wrote_and_its_speed(neg_dim, tmp_path, monkeypatch):
    from hybrid.cli import quantize as qcli

    out = tmp_path / "q.onnx"
    r = invoke("quantize", neg_dim, "--method", "dynamic", "--shapes", SHAPES, "-o", out, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["precision"] == "int8" and "dynamic quantization" in doc["format"] and doc["result"] == "quantized"
    assert doc["inputs"] == {"x": [1, 3, 48, 192]}
    speed = doc["speed"]
    assert speed["target"] == "onnxruntime:cpu" and speed["fp32_ms"] > 0 and speed["quantized_ms"] > 0
    assert 0.9 < speed["cosine"] <= 1.0 + 1e-6 and speed["max_abs_err"] >= 0
    # slower than fp32: a warning (the timing is replaced: tests assert behaviour, not speed)
    monkeypatch.setattr(qcli, "_speed", lambda *a: {"target": "onnxruntime:cpu", "fp32_ms": 2.0, "quantized_ms": 11.9,
                                                    "speedup": 2.0 / 11.9, "cosine": 0.99991, "max_abs_err": 0.01})
    r = invoke("quantize", neg_dim, "--method", "dynamic", "--shapes", SHAPES, "-o", out)
    assert r.exit_code == 0, r.output
    assert "wrote" in r.stdout and "int8" in r.stdout and "11.9 ms vs fp32 2 ms (0.17x fp32)" in r.stdout
    assert "cosine 0.99991" in r.stdout
    assert "warning" in r.stderr and "slower than fp32 on onnxruntime:cpu" in r.stderr


def test_quantize_says_when_it_wrote_the_float_model(neg_dim, tmp_path, monkeypatch):
    from hybrid.passes.quantize import speed

    # int8 measured slower than fp32: the library returns fp32, and the command must say so
    monkeypatch.setattr(speed, "TIMER", lambda models, feed: {k: 1.0 if k == "fp32" else 3.0 for k in models})
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "cal.npz", x=rng.random((12, 1, 3, 48, 192), dtype=np.float32))
    r = invoke("quantize", neg_dim, "--calibration", tmp_path / "cal.npz", "--samples", "8", "--min-cosine", "0.99",
               "-o", tmp_path / "q.onnx")
    assert r.exit_code == 0, r.output
    assert "float (not quantized), fp32" in r.stdout and "QDQ" not in r.stdout.splitlines()[0]
    assert "returned fp32" in r.stdout


def test_quantize_exits_1_when_the_budget_is_unmet(neg_dim, tmp_path, monkeypatch):
    seen = []

    def unmet(model, cfg):
        seen.append(cfg)
        raise hybrid.QuantizationError("HYB-605", "no int8 model meets min_cosine 0.9999 (best 0.9981)")

    monkeypatch.setattr(hybrid, "quantize", unmet)
    r = invoke("quantize", neg_dim, "--method", "dynamic", "--shapes", SHAPES, "--min-cosine", "0.9999",
               "-o", tmp_path / "q.onnx")
    assert r.exit_code == 1 and "HYB-605" in r.output and not (tmp_path / "q.onnx").exists()
    assert seen[0]["accuracy"] == {"min_cosine": 0.9999, "on_unmet": "raise"}


# ------------------------------------------------------------------ bench
def test_bench_has_an_accuracy_verdict_stats_and_a_header(neg_dim):
    r = invoke("bench", neg_dim, *QUICK_BENCH, "--shapes", SHAPES)
    assert r.exit_code == 0, r.output
    out = r.stdout
    for text in ("machine:", "versions: pyasc", "onnxruntime 1", "inputs: x: float32[1x3x48x192]",
                 "fp32 rtol 0.001 atol 0.0001 cosine >= 0.999", "┃ target", "count", "min ms", "mean ms", "p95 ms",
                 "max ms", "err / max|ref|", "cosine", "accuracy", "pass"):
        assert text in out, text
    assert "|---|" not in out and "max rel err" not in out  # a Rich table; no misnamed column
    doc = json.loads(invoke("bench", neg_dim, *QUICK_BENCH, "--shapes", SHAPES, "--json").stdout)
    (row,) = doc["rows"]
    assert row["accuracy_ok"] is True and row["cosine"] > 0.999 and "max_rel_err" not in row
    assert row["runs"] == 4 and row["min_ms"] <= row["p50_ms"] <= row["p95_ms"] <= row["max_ms"]
    assert doc["tolerance"] == {"fp32": {"rtol": 1e-3, "atol": 1e-4, "min_cosine": 0.999}}
    r = invoke("bench", neg_dim, *QUICK_BENCH, "--shapes", SHAPES, "--markdown")
    assert "| onnxruntime:cpu | fp32 |" in r.stdout and "|---|" in r.stdout


def test_bench_fails_a_wrong_row_on_the_given_input(neg_dim, tmp_path, monkeypatch):
    import hybrid.runtime.compiler as compiler

    real = compiler.compile_model

    def off_by_a_bit(model, target="auto", **kw):  # the contender (not the reference) answers 1 % off
        cm = real(model, target=target, **kw)
        if target.startswith("onnxruntime"):
            run = cm.run
            cm.run = lambda feeds: {k: v * 1.01 for k, v in run(feeds).items()}
        return cm

    monkeypatch.setattr(compiler, "compile_model", off_by_a_bit)
    np.save(tmp_path / "x.npy", np.random.default_rng(1).random((1, 3, 48, 192), dtype=np.float32))
    r = invoke("bench", neg_dim, *QUICK_BENCH, "-i", f"x={tmp_path / 'x.npy'}", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (row,) = doc["rows"]
    assert row["accuracy_ok"] is False and "outside rtol 0.001" in row["accuracy_note"]
    assert doc["input_sources"] == {"x": "file"}
    assert "accuracy check failed" in r.stderr
    r = invoke("bench", neg_dim, *QUICK_BENCH, "-i", f"x={tmp_path / 'x.npy'}", "--rtol", "0.02", "--json")
    assert json.loads(r.stdout)["rows"][0]["accuracy_ok"] is True  # within a stated, looser tolerance


def test_bench_backend_options_and_openvino_hint(neg_dim, monkeypatch):
    pytest.importorskip("openvino")
    import hybrid.runtime.compiler as compiler

    seen = _spy(monkeypatch, compiler, "compile_model")
    r = invoke("bench", neg_dim, "-t", "openvino", "-p", "fp32", "--iterations", "4", "--blocks", "1",
               "--shapes", SHAPES, "--hint", "throughput", "--nstreams", "2", "--nthreads", "1", "-c", "2")
    assert r.exit_code == 0, r.output
    configs = [kw.get("config") for kw in seen if kw.get("config")]
    assert configs and all(c == {"openvino": {"performance_hint": "THROUGHPUT", "num_streams": 2, "num_threads": 1}}
                           for c in configs)
    r = invoke("bench", neg_dim, *QUICK_BENCH, "--shapes", SHAPES, "--backend-option", "onnxruntime.nope=1")
    assert r.exit_code == 1 and "HYB-306" in r.output
    r = invoke("bench", neg_dim, *QUICK_BENCH, "--shapes", SHAPES, "--hint", "fastest")
    assert r.exit_code == 1 and "HYB-102" in r.output
    r = invoke("bench", neg_dim, *QUICK_BENCH, "--shapes", SHAPES, "--min-cosine", "1.5")
    assert r.exit_code == 1 and "HYB-102" in r.output


# ------------------------------------------------------------------ run, first contact, explain
def test_run_precision(neg_dim):
    doc = json.loads(invoke("run", neg_dim, "--shapes", SHAPES, "-t", "onnxruntime", "-p", "fp32", "--json").stdout)
    assert doc["precision"] == "fp32"
    r = invoke("run", neg_dim, "--shapes", SHAPES, "-t", "onnxruntime", "--precision", "fp16")
    assert r.exit_code == 1 and "HYB-304" in r.output and "fp16" in r.output


def test_first_contact_names_every_way_to_give_an_input(neg_dim):
    r = invoke("run", neg_dim)
    assert r.exit_code == 1 and "HYB-401" in r.output
    hint = next(line for line in r.output.splitlines() if "hint:" in line)
    assert "-i x=" in hint and "--random" in hint and "--shapes" in hint
    text = invoke("run", "--help").output
    assert "generated only with --random or" in " ".join(text.split())


def test_explain_gives_the_cause_and_the_fix_of_every_code():
    from hybrid.errors import CATALOG, FIXES

    missing = sorted(set(CATALOG) - set(FIXES))
    assert not missing, f"add a fix to hybrid.errors.FIXES for {missing}"
    for code in CATALOG:
        r = invoke("explain", code)
        assert r.exit_code == 0 and "cause:" in r.output and "fix:" in r.output, code
    assert "precision" in invoke("explain", "HYB-304").output


# ------------------------------------------------------------------ hygiene
def test_files_are_written_with_the_umask(neg_dim, tmp_path):
    old = os.umask(0o022)
    try:
        assert invoke("run", neg_dim, "--shapes", SHAPES, "-t", "onnxruntime", "-o", tmp_path / "o.npz").exit_code == 0
        assert invoke("compile", neg_dim, "-t", "onnxruntime", "-o", tmp_path / "c.hybrid").exit_code == 0
        for name in ("o.npz", "c.hybrid"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
        os.umask(0o077)
        assert invoke("run", neg_dim, "--shapes", SHAPES, "-t", "onnxruntime", "-o", tmp_path / "p.npz").exit_code == 0
        assert stat.S_IMODE((tmp_path / "p.npz").stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_contradictory_flags_are_errors(neg_dim, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 48, 96), np.float32))
    r = invoke("run", neg_dim, "-i", f"x={tmp_path / 'x.npy'}", "--shapes", SHAPES)
    assert r.exit_code == 1 and "HYB-102" in r.output and "contradict" in r.output
    r = invoke("compile", neg_dim, "--shapes", SHAPES, "--min-shapes", SHAPES)
    assert r.exit_code == 1 and "HYB-102" in r.output and "--min-shapes" in r.output
    r = invoke("bench", neg_dim, *QUICK_BENCH, "--shapes", SHAPES, "--json", "--markdown")
    assert r.exit_code == 1 and "HYB-102" in r.output
    r = invoke("quantize", neg_dim, "--calibration", tmp_path / "x.npy", "--shapes", SHAPES, "-o", tmp_path / "q.onnx")
    assert r.exit_code == 1 and "HYB-601" in r.output


def test_output_suffix_decides_the_format(neg_dim, tmp_path):
    r = invoke("run", neg_dim, "--shapes", SHAPES, "-t", "onnxruntime", "-o", tmp_path / "y.npy")
    assert r.exit_code == 0, r.output
    y = np.load(tmp_path / "y.npy", allow_pickle=False)
    assert isinstance(y, np.ndarray) and y.shape == (1, 2)
    r = invoke("run", neg_dim, "--shapes", SHAPES, "-o", tmp_path / "y.txt")
    assert r.exit_code == 1 and "HYB-102" in r.output and not (tmp_path / "y.txt").exists()
    from tests._models import two_inputs

    onnx.save(two_inputs(), tmp_path / "two.onnx")
    r = invoke("run", tmp_path / "two.onnx", "--shapes", "a:1x3,b:1x3", "-t", "onnxruntime", "-o", tmp_path / "z.npy")
    assert r.exit_code == 1 and "HYB-102" in r.output and "2 outputs" in r.output and ".npz" in r.output


def test_a_folder_as_model(neg_dim, tmp_path):
    r = invoke("run", neg_dim.parent, "--shapes", SHAPES, "-t", "onnxruntime")  # holds one model: taken
    assert r.exit_code == 0, r.output
    r = invoke("run", tmp_path, "--random")
    assert r.exit_code == 1 and "HYB-203" in r.output and "is a folder" in r.output and "not found" not in r.output


def test_messages_show_the_command_lines_spelling(crnn, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 40, 320), np.float32))
    r = invoke("run", crnn, "-i", f"x={tmp_path / 'x.npy'}")
    assert r.exit_code == 1 and "HYB-405" in r.output and "holds 1x3x40x320" in r.output
    assert "(1, 3" not in r.output and "shapes['x']" not in r.output
    r = invoke("run", crnn, "-i", f"y={tmp_path / 'x.npy'}")
    assert r.exit_code == 1 and "HYB-402" in r.output and "no input 'y'" in r.output
    r = invoke("run", crnn, "--shapes", "x:1x3x40x320")
    assert r.exit_code == 1 and "HYB-102" in r.output
    assert "x:1x3x40x320" in r.output and "dim 2 of x is fixed at 48" in r.output
    assert "(1, 3" not in r.output and "shapes['x']" not in r.output
    r = invoke("run", crnn, "--min-shapes", "x:1x3x48x320", "--max-shapes", "x:1x3x48x160")
    assert r.exit_code == 1 and "out of order" in r.output and "--max-shapes x:1x3x48x160" in r.output
    assert "(1, 3" not in r.output and "['min']" not in r.output


def test_docs_state_every_commands_exit_codes():
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text[text.index("## Exit codes by command"):]
    for command in ("devices", "run", "compile", "demo", "bench", "profile", "quantize", "bundle create",
                    "bundle inspect", "bundle verify", "bundle install-libs", "platforms", "serve", "explain"):
        assert f"| `pyasc {command}` |" in section, command


def test_tables_are_not_cut_when_not_on_a_terminal(neg_dim):
    # a log or a pipe: Rich assumes 80 columns (here 60); the tables print as wide as they need instead
    r = runner.invoke(app, ["bench", str(neg_dim), *QUICK_BENCH, "--shapes", SHAPES], env={"COLUMNS": "60"})
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout and "err / max|ref|" in r.stdout and "│ onnxruntime:cpu │ fp32" in r.stdout
    r = runner.invoke(app, ["run", str(neg_dim), "--shapes", SHAPES, "-t", "onnxruntime"], env={"COLUMNS": "30"})
    assert r.exit_code == 0 and "…" not in r.stdout and "1x3x48x192" in r.stdout
