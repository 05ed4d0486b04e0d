"""A backend installed through the ``hybrid.backends`` entry point gets what the built-ins get.

tests/plugin_backend/ is a third-party package (``hybrid_demo_backend``, backend 'npdemo'). It is not
pip-installed: the fixture writes the dist-info its pyproject.toml would produce into a temporary folder
on sys.path, so importlib.metadata finds the entry point, then forgets it afterwards. Through the backend
contract's hooks alone it gets a reduced precision (explicit and under precision='auto'), node spans in
``hybrid.profile`` and a compiled artifact cached in bundles; no line of runtime/ or bundle/ names it.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from tests._bundle_tools import rebuild
from tests._models import matmul_add

import hybrid
from hybrid.bundle import cache as bundle_cache
from hybrid.bundle import inspect_bundle
from hybrid.bundle.load import load_with_info
from hybrid.hal import CacheStrategy, backend_class, backend_names, backend_status, is_installed_backend, registry
from hybrid.runtime.profiler import profile

PLUGIN = Path(__file__).parent / "plugin_backend"
SRC = Path(hybrid.__file__).parent
BUILTINS = ("reference", "onnxruntime", "openvino", "torch", "tensorrt")


@pytest.fixture
def npdemo(tmp_path_factory):
    """The demo package importable and its entry point visible, for one test."""
    site = tmp_path_factory.mktemp("site")
    info = site / "hybrid_demo_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hybrid-demo-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hybrid.backends]\nnpdemo = hybrid_demo_backend:DemoBackend\n")
    sys.path[:0] = [str(site), str(PLUGIN)]
    importlib.invalidate_caches()
    registry._entry_points_loaded = False
    registry.reset_discovery()
    try:
        yield "npdemo"
    finally:
        sys.path.remove(str(site))
        sys.path.remove(str(PLUGIN))
        sys.modules.pop("hybrid_demo_backend", None)
        importlib.invalidate_caches()
        with registry._LOCK:
            registry._paths.pop("npdemo", None)
            registry._classes.pop("npdemo", None)
            registry._entry_points_loaded = False
        registry.reset_discovery()


def _x(n: int = 8) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((n, 4)).astype(np.float32)


def test_found_through_the_entry_point(npdemo):
    assert npdemo in backend_names() and is_installed_backend(npdemo)
    status = backend_status(npdemo)
    assert status.available and [d.name for d in status.devices] == ["cpu"]
    assert npdemo in next(d for d in hybrid.devices() if d.name == "cpu").backends


def test_reduced_precision_explicit_and_auto(npdemo):
    expected = hybrid.compile(matmul_add(), target="reference").run({"x": _x()})["y"]
    fp32 = hybrid.compile(matmul_add(), target="npdemo:cpu")
    fp16 = hybrid.compile(matmul_add(), target="npdemo:cpu", precision="fp16")
    assert fp32.plan.segments[0].precision == "fp32" and fp16.plan.segments[0].precision == "fp16"
    assert fp16.options["dtype"] == "float16"
    np.testing.assert_allclose(fp32.run({"x": _x()})["y"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fp16.run({"x": _x()})["y"], expected, rtol=2e-2, atol=2e-2)
    assert not np.array_equal(fp16.run({"x": _x()})["y"], fp32.run({"x": _x()})["y"])  # it did run in fp16
    # precision='auto' tries what precisions() offers; fp32 costs the demo 5 ms a run by design (the batch is
    # declared: with nothing declared a dynamic model is decided on real calls, online)
    chosen = hybrid.compile(matmul_add(), target="npdemo:cpu", precision="auto", shapes={"x": (8, 4)})
    assert (chosen.backend, chosen.plan.segments[0].precision, chosen.options["dtype"]) == \
        ("npdemo", "fp16", "float16")
    np.testing.assert_allclose(chosen.run({"x": _x()})["y"], expected, rtol=2e-2, atol=2e-2)
    with pytest.raises(hybrid.HybridError) as err:
        hybrid.compile(matmul_add(), target="npdemo:cpu", precision="bf16")
    assert err.value.code == "HYB-304"


def test_node_spans_in_the_profile(npdemo, tmp_path):
    report = profile(matmul_add(), duration=0.2, output=tmp_path / "p.json", target="npdemo:cpu",
                     inputs={"x": _x()}, node_runs=4, warmup=1, quiet=True)
    doc = json.loads((tmp_path / "p.json").read_text())
    nodes = [e for e in doc["traceEvents"] if e.get("cat") == "node"]
    profiled = [e for e in doc["traceEvents"] if e.get("cat") == "profiled run"]
    assert report.node_runs == 4 and len(profiled) == 4 and len(nodes) == 8  # two nodes a run
    assert {(n["name"], n["args"]["op_type"]) for n in nodes} == {("mm", "MatMul"), ("add", "Add")}
    assert {s.name for s in report.top_ops} == {"MatMul", "Add"} and not report.notes
    for run in profiled:  # each node sits inside the profiled run it was measured in
        inside = [n for n in nodes if run["ts"] <= n["ts"] and n["ts"] + n["dur"] <= run["ts"] + run["dur"] + 1.0]
        assert len(inside) == 2


def test_compiled_artifact_cached_in_the_bundle(npdemo, tmp_path):
    cm = hybrid.compile(matmul_add(), target="npdemo:cpu", precision="fp16")
    cm.save(str(tmp_path / "m.hybrid"))
    assert [c["backend"] for c in inspect_bundle(tmp_path / "m.hybrid")["caches"]] == ["npdemo"]
    with zipfile.ZipFile(tmp_path / "m.hybrid") as z:  # the demo nests its artifact in a folder (as TensorRT
        nested = [n for n in z.namelist() if n.endswith(".npz") and "/npdemo/" in n]  # does): it comes along
    assert [n.split("/npdemo/")[1].split("/")[0] for n in nested] == ["float16"]
    loaded, info = load_with_info(tmp_path / "m.hybrid")
    assert (info.source, info.backend, info.precision) == ("bundle-cache", "npdemo", "fp16")
    assert bundle_cache.loaded_from_cache(loaded) is True
    assert np.array_equal(loaded.run({"x": _x()})["y"], cm.run({"x": _x()})["y"])

    def spoil(manifest, members):  # bytes that match the manifest (re-hashed) but are no artifact
        for name in manifest["caches"][0]["files"]:
            members[name] = b"\0garbage" * 100

    again, _ = load_with_info(rebuild((tmp_path / "m.hybrid").read_bytes(), spoil))
    assert bundle_cache.loaded_from_cache(again) is False  # the demo rebuilt it, and says so
    assert any("rejected by npdemo" in n for n in again.plan.notes)
    assert np.array_equal(again.run({"x": _x()})["y"], cm.run({"x": _x()})["y"])


def test_builtin_cache_strategies():
    """What each built-in backend's hook answers (class-level: no library needed)."""
    ort = backend_class("onnxruntime")
    assert ort.cache_strategy("cpu", {}) == CacheStrategy("optimized-model", "optimized_model_path",
                                                          {"graph_optimization_level": "disable"})
    assert ort.cache_strategy("cuda:0", {"tensorrt": True}) == CacheStrategy("directory", "engine_cache_path")
    assert backend_class("openvino").cache_strategy("cpu", {}) == CacheStrategy("directory", "cache_dir")
    assert backend_class("reference").cache_strategy("cpu", {}) is None
    assert bundle_cache.strategy_for("reference", "cpu", {}) is None
    assert backend_class("reference").profiling_options("/tmp") == {}
    assert backend_class("openvino").profiling_options("/tmp") == {"profile": True}


def _string_constants(path: Path) -> set[str]:
    """String literals of a module's code, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs}


@pytest.mark.parametrize("module", ["runtime/profiler.py", "bundle/cache.py"])
def test_no_backend_named_in_code(module):
    """These modules reach backends through the contract only: no string in their code names one."""
    names = re.compile(rf"\b({'|'.join((*BUILTINS, 'npdemo'))})\b", re.IGNORECASE)
    named = {s for s in _string_constants(SRC / module) if names.search(s)}
    assert not named, f"{module} names a backend: {sorted(named)}"
