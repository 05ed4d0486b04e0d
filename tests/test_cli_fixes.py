"""Regression tests of the command line (issue 16, 'wrong today'): each with its exit code."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tests._models import matmul_add
from typer.testing import CliRunner

import hybrid
from hybrid.cli.main import app
from hybrid.errors import ModelError

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def _bracket_model(path) -> None:
    """x: float32[batchx64] -> y = Relu(x): a dim name written the way bundle inspect shows shapes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batchx64", 4])
    y = helper.make_tensor_value_info("y[0]", TensorProto.FLOAT, ["batchx64", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y[0]"], name="relu[/b]")], "g[/v2]", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


# 1. user text is printed literally, never parsed as Rich markup
@pytest.mark.parametrize("name", ["model[v2].onnx", "model[/v2].onnx", "model[bold]x[/].onnx"])
def test_bracketed_names_print_literally(tmp_path, name):
    path = tmp_path / name  # 'model[/v2].onnx' is v2].onnx in a folder 'model['
    path.parent.mkdir(exist_ok=True)
    onnx.save(matmul_add(), path)
    r = invoke("run", path, "--random", "--shapes", "x:2x4", "-t", "onnxruntime")
    assert r.exit_code == 0, r.output
    assert f"{path.name} on onnxruntime:cpu" in r.output and "MarkupError" not in r.output
    missing = path.with_name("missing" + path.name)
    r = invoke("run", missing, "--random")
    assert r.exit_code == 1 and "HYB-201" in r.output and str(missing) in r.output


def test_bracketed_signature_and_node_names(tmp_path):
    _bracket_model(tmp_path / "b.onnx")
    r = invoke("run", tmp_path / "b.onnx", "--random", "--shapes", "x:2x4", "-t", "onnxruntime")
    assert r.exit_code == 0, r.output
    assert "y[0]" in r.output
    r = invoke("compile", tmp_path / "b.onnx", "-t", "onnxruntime", "--explain", "--per-node")
    assert r.exit_code == 0, r.output
    assert "relu[/b]" in r.output


def test_bundle_inspect_shows_bracketed_shapes(tmp_path):
    _bracket_model(tmp_path / "b.onnx")
    bundle = tmp_path / "b.hybrid"
    r = invoke("bundle", "create", tmp_path / "b.onnx", "-o", bundle, "-t", "onnxruntime", "--no-hybrid-wheel")
    assert r.exit_code == 0, r.output
    r = invoke("bundle", "inspect", bundle)
    assert r.exit_code == 0, r.output
    assert "[batchx64,4]" in r.output.replace(" ", "") or "batchx64" in r.output
    doc = json.loads(invoke("bundle", "inspect", bundle, "--json").stdout)
    for text in doc["signature"]["inputs"]:
        assert text.replace(" ", "") in r.output.replace(" ", "")


def test_shared_consoles_never_parse_markup():
    # pyasc serve's startup table and every other command print through these two consoles
    from rich.table import Table

    from hybrid.cli._console import console, err_console

    for con in (console, err_console):
        table = Table(title="serving at http://127.0.0.1:8000 [/v2]")
        table.add_column("signature")
        table.add_row("x: float32[batchx64] -> y: float32[batchx64]")
        with con.capture() as cap:
            con.print(table)
            con.print("model[/v2].onnx [bold]not bold[/]")
        text = cap.get()
        assert "x: float32[batchx64] -> y: float32[batchx64]" in text and "[/v2]" in text
        assert "model[/v2].onnx [bold]not bold[/]" in text


# 2. the precision that ran, as the backend reports it
def test_openvino_reports_the_precision_it_runs(tmp_path):
    pytest.importorskip("openvino")
    for asked in ("fp32", "fp16", "bf16"):
        try:
            cm = hybrid.compile(matmul_add(), target="openvino:cpu", precision=asked)
        except hybrid.HybridError:
            continue  # this CPU does not offer it
        ran = cm.executable.precision
        native = cm.executable.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        assert ran == {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}[native]
    cm = hybrid.compile(matmul_add(), target="onnxruntime:cpu")
    assert cm.executable.precision is None  # the neutral default: what was asked


def test_bench_rows_carry_the_precision_that_ran(tmp_path):
    pytest.importorskip("openvino")
    from hybrid.cli.bench import bench

    rows, _ = bench(matmul_add(), targets=["openvino:cpu"], precisions=("fp32", "fp16"), blocks=1, per_block=2,
                    batch=1)
    for r in rows:
        if r.status == "ok":
            cm = hybrid.compile(matmul_add(), target="openvino:cpu", precision=r.precision)
            assert r.precision_run == cm.executable.precision
            assert (r.precision_run == r.precision) == (r.note == "")


# 3. impossible requests exit non-zero
def _has_cuda() -> bool:
    return any(d.kind in ("cuda", "gpu") for d in hybrid.devices())


def test_absent_device_fails_unless_fallback_is_asked_for(tmp_path):
    if _has_cuda():
        pytest.skip("this machine has a GPU")
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    r = invoke("run", tmp_path / "m.onnx", "--shapes", "x:2x4", "-t", "cuda")
    assert r.exit_code == 1 and "HYB-307" in r.output and "--device-fallback warn" in r.output
    r = invoke("run", tmp_path / "m.onnx", "--shapes", "x:2x4", "-t", "cuda", "--device-fallback", "warn")
    assert r.exit_code == 0, r.output
    r = invoke("bench", tmp_path / "m.onnx", "--targets", "onnxruntime,cuda", "--blocks", "1", "--per-block", "1",
               "--batch", "1")
    assert r.exit_code == 1 and "HYB-307" in r.output
    r = invoke("compile", tmp_path / "m.onnx", "-t", "cuda")
    assert r.exit_code == 1 and "HYB-307" in r.output
    r = invoke("run", tmp_path / "m.onnx", "--shapes", "x:2x4", "--device-fallback", "maybe")
    assert r.exit_code == 1 and "HYB-102" in r.output


def test_bench_refuses_precisions_nothing_offers(tmp_path):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    r = invoke("bench", tmp_path / "m.onnx", "--precisions", "int8", "--batch", "1")
    assert r.exit_code == 1 and "HYB-102" in r.output and "quantize" in r.output
    r = invoke("bench", tmp_path / "m.onnx", "--targets", "onnxruntime", "--precisions", "fp16", "--batch", "1")
    assert r.exit_code == 1 and "HYB-304" in r.output and "onnxruntime:cpu fp16" in r.output
    r = invoke("bench", tmp_path / "m.onnx", "--targets", "onnxruntime", "--precisions", "fp32,fp16",
               "--blocks", "1", "--per-block", "1", "--batch", "1", "--markdown")
    assert r.exit_code == 0, r.output
    assert "| onnxruntime:cpu | fp16 | n/a |" in r.output  # asked for explicitly: shown, not dropped


# 4. a node that reads an undefined value is a model error at load
def _dangling(path=None) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="add0")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def test_undefined_value_is_a_model_error(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(_dangling())
    with pytest.raises(ModelError) as info:
        hybrid.Model.load(tmp_path / "bad.onnx")
    assert info.value.code == "HYB-205" and "'add0'" in info.value.message and "'ghost'" in info.value.message
    r = invoke("compile", tmp_path / "bad.onnx", "-t", "onnxruntime")
    assert r.exit_code == 1 and "HYB-205" in r.output and "ghost" in r.output
    r = invoke("run", tmp_path / "bad.onnx", "--random", "-t", "reference")
    assert r.exit_code == 1 and "HYB-205" in r.output


def test_checker_keeps_custom_domains_and_subgraph_scopes(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    custom = helper.make_node("Bar", ["x"], ["y"], domain="com.foo", name="bar")
    model = helper.make_model(helper.make_graph([custom], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.foo", 1)])
    hybrid.Model.load(model.SerializeToString())  # an unregistered domain loads as before
    # an If branch reads 'x' from the enclosing graph: defined
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    branch = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "b", [],
                               [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    model = helper.make_model(helper.make_graph([node], "g", [cond, x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    hybrid.Model.load(model.SerializeToString())
    from hybrid.ir.checker import undefined_inputs

    bad = helper.make_graph([helper.make_node("Relu", ["nope"], ["r"], name="inner")], "b", [],
                            [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=bad, else_branch=branch)
    graph = helper.make_graph([node], "g", [cond, x], [y])
    assert list(undefined_inputs(graph)) == [("inner", "Relu", "nope")]


# 5. OpenVINO's informative lines survive
def test_openvino_compile_failure_keeps_the_reason():
    pytest.importorskip("openvino")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Bar", ["x"], ["y"], domain="com.foo")], "g",
                                                [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.foo", 1)])
    with pytest.raises(hybrid.HybridError) as info:
        hybrid.compile(model, target="openvino:cpu")
    assert info.value.code == "HYB-304" and "com.foo.Bar" in info.value.message
    assert "core.cpp" not in info.value.message


def test_openvino_cpu_properties_go_to_the_cpu_plugin_only():
    from hybrid.backends.openvino import ov_config

    options = {"cpu_pinning": False, "tbb_partitioner": "AUTO"}
    cpu = ov_config(options)
    assert cpu["ENABLE_CPU_PINNING"] == "NO" and cpu["TBB_PARTITIONER"] == "AUTO"
    assert "ENABLE_CPU_PINNING" not in ov_config(options, native="GPU.0")
    assert "TBB_PARTITIONER" not in ov_config(options, native="GPU.0")
    assert "ENABLE_CPU_PINNING" not in ov_config({})  # the plugin's own default unless asked


def test_openvino_compiles_unpinned_when_asked():
    pytest.importorskip("openvino")
    from hybrid.backends.openvino import OpenVINOBackend

    assert OpenVINOBackend.shared_options() == {"cpu_pinning": False}
    compiled = hybrid.compile(matmul_add(), target="openvino", config={"openvino": {"cpu_pinning": False}})
    try:
        native = compiled.executable.compiled  # the OpenVINO CompiledModel itself
        assert native.get_property("ENABLE_CPU_PINNING") is False
        x = np.ones((2, 4), np.float32)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], hybrid.compile(matmul_add(), target="reference").run(
            {"x": x})["y"], rtol=1e-5, atol=1e-6)
    finally:
        compiled.close()


def test_compile_reason_drops_source_lines():
    from hybrid.backends.openvino import compile_reason

    text = ("Exception from src/inference/src/cpp/core.cpp:105:\nCheck 'false' failed at src/x.cpp:151:\n"
            "FrontEnd API failed with OpConversionFailure:\n-- No conversion rule found for operations: a.B\n")
    assert compile_reason(RuntimeError(text)) == ("FrontEnd API failed with OpConversionFailure: No conversion rule "
                                                  "found for operations: a.B")
    assert compile_reason(RuntimeError("")) == "RuntimeError"


# 6. demo with an unknown model
def test_demo_unknown_model_lists_the_valid_ones():
    r = invoke("demo", "--model", "foo")
    assert r.exit_code == 1 and "HYB-102" in r.output and "squeezenet" in r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)


# 7. compile --explain: one line when one backend runs everything
def test_explain_says_it_once_for_a_whole_graph(tmp_path):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    r = invoke("compile", tmp_path / "m.onnx", "-t", "onnxruntime", "--explain")
    assert r.exit_code == 0, r.output
    assert "all 2 nodes run on onnxruntime:cpu" in r.output and "where each node runs" not in r.output
    r = invoke("compile", tmp_path / "m.onnx", "-t", "onnxruntime", "--explain", "--per-node")
    assert r.exit_code == 0 and "where each node runs" in r.output and "mm" in r.output
    r = invoke("compile", tmp_path / "m.onnx", "-t", "onnxruntime", "--per-node")
    assert r.exit_code == 0 and "where each node runs" in r.output
    doc = json.loads(invoke("compile", tmp_path / "m.onnx", "-t", "onnxruntime", "--json").stdout)
    assert doc["backend"] == "onnxruntime" and doc["split"] is False and doc["segments"][0]["nodes"] == 2


# 8. profile: bounded trace, latency from plain runs, validated options
def test_profile_validates_duration_and_output_folder(tmp_path):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    for d in ("0", "-1"):
        r = invoke("profile", tmp_path / "m.onnx", "--duration", d, "-o", tmp_path / "p.json", "-t", "onnxruntime")
        assert r.exit_code == 1 and "HYB-102" in r.output and "duration" in r.output
    r = invoke("profile", tmp_path / "m.onnx", "--duration", "0.1", "-o", tmp_path / "nope" / "p.json",
               "-t", "onnxruntime")
    assert r.exit_code == 1 and "HYB-102" in r.output and "nope" in r.output
    assert not (tmp_path / "nope").exists()


def test_profile_trace_is_bounded_and_latency_excludes_profiled_runs(tmp_path, monkeypatch):
    from hybrid.runtime import profiler

    monkeypatch.setattr(profiler, "MAX_RUN_SPANS", 5)
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    r = invoke("profile", tmp_path / "m.onnx", "--duration", "0.3", "-o", tmp_path / "p.json", "-t", "onnxruntime",
               "--node-runs", "3", "--json", "--batch", "1")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    doc = json.loads((tmp_path / "p.json").read_text())
    runs = [e for e in doc["traceEvents"] if e.get("cat") == "run"]
    profiled = [e for e in doc["traceEvents"] if e.get("cat") == "profiled run"]
    assert len(runs) == 5 < report["runs"] and len(profiled) == report["node_runs"] == 3
    assert any("statistics use all" in n for n in report["notes"])
    nodes = [e for e in doc["traceEvents"] if e.get("cat") == "node"]
    assert nodes and max(n["ts"] for n in nodes) <= runs[0]["ts"]  # node spans only from the profiled runs


# 9. one way of generating inputs: auto-selection's
def test_generated_inputs_are_auto_selections_samples():
    from hybrid.cli._inputs import generated_inputs
    from hybrid.cli.bench import bench
    from hybrid.runtime.auto import make_samples
    from hybrid.runtime.profiler import sample_inputs

    model = hybrid.Model.load(matmul_add())
    expected = make_samples(model, symbolic_size=2)
    for got in (generated_inputs(model, None, 2), sample_inputs(model, 2)):
        assert got.keys() == expected.keys()
        np.testing.assert_array_equal(got["x"], expected["x"])
    assert bench  # bench generates through generated_inputs (same function)


def test_profiler_samples_keep_indices_inside_their_table():
    from hybrid.runtime.profiler import sample_inputs

    table = onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "table")
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 5])
    out = helper.make_tensor_value_info("e", TensorProto.FLOAT, ["N", 5, 4])
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["e"])], "emb", [ids], [out], [table])
    model = hybrid.Model.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    feeds = sample_inputs(model, 4, seed=3)
    assert feeds["ids"].shape == (4, 5) and feeds["ids"].min() >= 0 and feeds["ids"].max() < 3
    cm = hybrid.compile(model, target="onnxruntime")
    cm.run(feeds)  # in range: runs


# 10. one vocabulary
def test_flags_mean_one_thing():
    from hybrid.cli.bench import bench_command
    from hybrid.cli.bundle import create, install_libs
    from hybrid.cli.compile import compile_command

    r = invoke("bundle", "create", "--help")
    assert r.exit_code == 0
    line = next(ln for ln in r.output.splitlines() if "--precision" in ln)
    assert "-p" in line
    line = next(ln for ln in r.output.splitlines() if "--platform " in ln)
    assert " -p " not in line
    r = invoke("compile", "--help")
    assert "-p" in next(ln for ln in r.output.splitlines() if "--precision" in ln)
    r = invoke("bundle", "install-libs", "--help")
    assert "--dest" in r.output and not any(ln.lstrip("│ ").startswith("--target") for ln in r.output.splitlines())
    assert bench_command and create and install_libs and compile_command


@pytest.mark.parametrize("command", [[], ["run"], ["bench"], ["bundle", "inspect"], ["profile"], ["quantize"],
                                     ["demo"], ["compile"]])
def test_help_shows_no_type_after_flags(command):
    r = invoke(*command, "--help")
    assert r.exit_code == 0, r.output
    assert "<bool>" not in r.output and "--help" in r.output


# global options
def test_log_level_and_verbose(tmp_path, monkeypatch):
    import logging

    onnx.save(matmul_add(), tmp_path / "m.onnx")
    logger = logging.getLogger("hybrid")
    before = logger.level
    try:
        assert invoke("--log-level", "debug", "devices", "--json").exit_code == 0
        assert logger.level == logging.DEBUG
        assert invoke("-v", "devices", "--json").exit_code == 0 and logger.level == logging.INFO
        monkeypatch.setenv("HYBRID_LOG_LEVEL", "error")
        assert runner.invoke(app, ["devices", "--json"]).exit_code == 0 and logger.level == logging.ERROR
        r = invoke("--log-level", "loud", "devices")
        assert r.exit_code == 1 and "HYB-104" in r.output
    finally:
        logger.setLevel(before)


def test_json_on_run_and_demo(tmp_path):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    r = invoke("run", tmp_path / "m.onnx", "--shapes", "x:3x4", "-t", "onnxruntime", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["backend"] == "onnxruntime" and doc["outputs"][0]["name"] == "y" and doc["outputs"][0]["shape"] == [3, 3]
    r = invoke("run", tmp_path / "m.onnx", "--shapes", "x:3x5", "-t", "onnxruntime")
    assert r.exit_code == 1 and "HYB-102" in r.output
    r = invoke("demo", "--model", "squeezenet", "--runs", "1", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert any(row["ran_on"] == "onnxruntime:cpu" and row["ok"] for row in rows)


def test_progress_only_on_a_terminal_and_not_quiet(monkeypatch):
    import io
    import sys

    from rich.console import Console

    from hybrid.cli import _console

    buf = io.StringIO()
    monkeypatch.setattr(_console, "err_console", Console(file=buf, force_terminal=True, markup=False))
    monkeypatch.setattr(sys, "stderr", type("Tty", (io.StringIO,), {"isatty": lambda self: True})())
    monkeypatch.setattr(_console.settings, "quiet", False)
    with _console.progress("compiling m[/x].onnx") as update:
        update("still compiling")
    assert list(_console.progress_iter(["a", "b"], "steps", total=2)) == ["a", "b"]
    assert buf.getvalue()  # drawn on the (fake) terminal
    buf.seek(0)
    buf.truncate()
    monkeypatch.setattr(_console.settings, "quiet", True)
    with _console.progress("compiling") as update:
        update("x")
    assert list(_console.progress_iter(["a"], "steps")) == ["a"] and buf.getvalue() == ""
    monkeypatch.setattr(_console.settings, "quiet", False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: nothing drawn
    with _console.progress("compiling"):
        pass
    assert buf.getvalue() == ""


def test_quiet_flag_is_accepted_and_json_stays_clean(tmp_path):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    r = invoke("-q", "compile", tmp_path / "m.onnx", "-t", "onnxruntime", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["backend"] == "onnxruntime"


def test_big_models_are_checked_without_their_weights(tmp_path, monkeypatch):
    from hybrid.ir import checker

    monkeypatch.setattr(checker, "SKELETON_ABOVE_BYTES", 0)  # every model takes the big-model path
    hybrid.Model.load(matmul_add().SerializeToString())  # initializers become inputs: still valid
    bad = matmul_add()
    bad.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 5  # x [N, 5] @ W [4, 3]
    with pytest.raises(ModelError) as info:
        hybrid.Model.load(bad.SerializeToString())
    assert info.value.code == "HYB-205" and "MatMul" in info.value.message
    # external data: checked the same way (the weights stay in their file)
    onnx.save(bad, tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.bin", size_threshold=0)
    with pytest.raises(ModelError):
        hybrid.Model.load(tmp_path / "ext.onnx")
    onnx.save(matmul_add(), tmp_path / "ok.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="w2.bin", size_threshold=0)
    assert hybrid.Model.load(tmp_path / "ok.onnx").signature.input_names == ["x"]


@pytest.mark.parametrize("command", [["run", "missing.onnx", "--random"], ["compile", "missing.onnx"],
                                     ["bench", "missing.onnx"], ["profile", "missing.onnx", "-d", "0.1"],
                                     ["quantize", "missing.onnx", "--method", "dynamic", "-o", "q.onnx"],
                                     ["bundle", "inspect", "missing.hybrid"]])
def test_json_commands_put_their_error_on_stdout_too(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke(*command, "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["code"] in ("HYB-201", "HYB-501", "HYB-502") and doc["message"]
    assert "error[" in r.stderr
