"""Issue 55 item 5: platform bundles say what they cannot give the platform, and keep the model's inputs.

No test downloads: ``fetch_wheels`` (the one place ``pip download`` runs) is replaced by a stand-in that
returns the wheel pip would return for the request, an onnxruntime wheel for manylinux aarch64, and hybrid's
own wheel is left out (``include_hybrid=False`` / ``--no-hybrid-wheel``) where building it is not the point.
"""

from __future__ import annotations

import io
import logging
import sys
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import typer
from onnx import TensorProto, helper, numpy_helper
from tests._models import matmul_add
from typer.testing import CliRunner

from hybrid.bundle import create_bundle
from hybrid.bundle import libs as libs_module
from hybrid.bundle.platforms import BUILTIN_PLATFORMS
from hybrid.errors import BundleError, ConfigError

HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
F = TensorProto.FLOAT


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    """``fetch_wheels`` without the network: records each request, returns a CPU onnxruntime wheel."""
    calls = []

    def fetch(requirements, profile, python_version, dest):
        calls.append((list(requirements), profile.name, python_version))
        dest.mkdir(parents=True, exist_ok=True)
        tag = python_version.replace(".", "")
        wheel = dest / f"onnxruntime-1.20.1-cp{tag}-cp{tag}-manylinux_2_27_{profile.arch}.whl"
        wheel.write_bytes(b"a stand-in for the CPU-only onnxruntime wheel")
        return [wheel]

    monkeypatch.setattr(libs_module, "fetch_wheels", fetch)
    return calls


def _app() -> typer.Typer:
    from hybrid.cli import bundle

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test app"""

    bundle.register(app)
    return app


def _conv_net() -> onnx.ModelProto:
    """An NCHW image model: normalization, Conv, Relu, and both a feature map and pooled logits out."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Sub", ["image", "mean"], ["centered"]),
             helper.make_node("Conv", ["centered", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["features"]),
             helper.make_node("GlobalAveragePool", ["features"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["logits"])]
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0.2, 0.5, 0.7], np.float32).reshape(1, 3, 1, 1), "mean")]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("image", F, [1, 3, 6, 5])],
                              [helper.make_tensor_value_info("features", F, [1, 8, 6, 5]),
                               helper.make_tensor_value_info("logits", F, [1, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _bundled_onnx(path) -> bytes:
    with zipfile.ZipFile(path) as zf:
        return zf.read("model/model.onnx")


def _ort(model: bytes | onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    data = model if isinstance(model, bytes) else model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


# ------------------------------------------------------------------ wheels vs. the platform

def test_jetson_libs_warn_about_gpu_runtimes_and_python(fake_pip, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="hybrid")
    manifest = create_bundle(matmul_add(), tmp_path / "j.hybrid", platform="jetson-xavier", caches=False,
                             include_libs=True, include_hybrid=False)
    (requirements, platform, python), = fake_pip
    assert platform == "jetson-xavier" and requirements[0].startswith("onnxruntime")
    # hybrid needs Python >= 3.11 and JetPack 5's Python is 3.8: the wheels stay for this Python, and say so
    assert python == HERE and manifest.libs.python_version == HERE
    text = "\n".join(manifest.warnings)
    for target in ("tensorrt:cuda", "onnxruntime:cuda", "torch:cuda"):
        assert target in text
    assert "onnxruntime:cpu" in text  # what the wheels do give
    assert "3.8" in text and "JetPack" in text and HERE in text
    assert manifest.libs.targets == ["onnxruntime:cpu", "reference"]
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert all(any(w in m for m in logged) for w in manifest.warnings)


def test_jetson_cli_prints_the_warnings(fake_pip, tmp_path):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    result = CliRunner().invoke(_app(), ["bundle", "create", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "j.hybrid"),
                                         "--platform", "jetson-orin", "--include-libs", "--no-hybrid-wheel",
                                         "--no-cache"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "warning" in line.lower()]
    assert any("tensorrt:cuda" in line for line in lines), result.output
    assert any("3.10" in line and "JetPack 6" in line for line in lines), result.output


def test_python_version_chooses_the_wheels_python(fake_pip, tmp_path):
    # a board whose Python hybrid runs on: its wheels are fetched for that Python, and nothing is said
    board = BUILTIN_PLATFORMS["jetson-orin"].model_copy(update={"name": "orin-py312", "python": "3.12"})
    manifest = create_bundle(matmul_add(), tmp_path / "o.hybrid", platform=board, caches=False,
                             include_libs=True, include_hybrid=False)
    assert fake_pip[-1][2] == "3.12" and manifest.libs.python_version == "3.12"
    assert not any("wheels are for Python" in w for w in manifest.warnings)
    assert any("tensorrt:cuda" in w for w in manifest.warnings)  # the GPU runtimes are still not in the wheels
    # --python-version wins, and a difference from the platform's Python is said with the fix
    manifest = create_bundle(matmul_add(), tmp_path / "p.hybrid", platform=board, caches=False,
                             include_libs=True, include_hybrid=False, python_version="3.13")
    assert fake_pip[-1][2] == "3.13" and manifest.libs.python_version == "3.13"
    (python_note,) = [w for w in manifest.warnings if "wheels are for Python" in w]
    assert "3.13" in python_note and "--python-version 3.12" in python_note


def test_python_version_is_checked_before_any_download(fake_pip, tmp_path, monkeypatch):
    def no_build(dest):
        raise AssertionError("hybrid's wheel should not be built")

    monkeypatch.setattr(libs_module, "hybrid_wheel", no_build)
    with pytest.raises(ConfigError) as info:
        create_bundle(matmul_add(), tmp_path / "x.hybrid", platform="jetson-xavier", caches=False,
                      include_libs=True, python_version="3")
    assert info.value.code == "HYB-102" and "X.Y" in info.value.message
    # hybrid cannot run on JetPack 5's Python 3.8: a vendored hybrid for it is refused up front
    with pytest.raises(BundleError) as info:
        create_bundle(matmul_add(), tmp_path / "x.hybrid", platform="jetson-xavier", caches=False,
                      include_libs=True, python_version="3.8")
    assert info.value.code == "HYB-509" and "3.8" in info.value.message and ">=3.11" in info.value.message
    assert not fake_pip and not (tmp_path / "x.hybrid").exists()


def test_unknown_platform_python_is_said(fake_pip, tmp_path):
    manifest = create_bundle(matmul_add(), tmp_path / "a.hybrid", platform="arm64", caches=False,
                             include_libs=True, include_hybrid=False)
    assert BUILTIN_PLATFORMS["arm64"].python is None
    (python_note,) = manifest.warnings  # onnxruntime:cpu is arm64's first target: no runtime warning
    assert "arm64" in python_note and "not known" in python_note and HERE in python_note
    assert manifest.libs.targets == ["onnxruntime:cpu", "reference"]


def test_builtin_profiles_know_their_python():
    assert BUILTIN_PLATFORMS["jetson-xavier"].python == "3.8"
    assert BUILTIN_PLATFORMS["jetson-orin"].python == "3.10"


# ------------------------------------------------------------------ the model's input contract

def test_ascend_o3_keeps_the_nchw_signature(tmp_path):
    source = _conv_net()
    manifest = create_bundle(source, tmp_path / "a.hybrid", platform="ascend-910b", optimize_level="O3",
                             caches=False)
    assert manifest.model.layout is None
    (note,) = manifest.warnings  # the profile's preference is said, not applied
    assert "NHWC" in note and "'image' [1, 3, 6, 5]" in note and "--layout nhwc" in note
    assert [(t.name, t.shape) for t in manifest.model.inputs] == [("image", [1, 3, 6, 5])]
    assert {t.name: t.shape for t in manifest.model.outputs} == {"features": [1, 8, 6, 5], "logits": [1, 8]}
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 5)).astype(np.float32)
    want, got = _ort(source, {"image": x}), _ort(_bundled_onnx(tmp_path / "a.hybrid"), {"image": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_layout_nhwc_converts_and_says_so(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="hybrid")
    source = _conv_net()
    manifest = create_bundle(source, tmp_path / "n.hybrid", platform="ascend-910b", optimize_level="O3",
                             caches=False, layout="nhwc")
    assert manifest.model.layout == "NHWC"
    assert [(t.name, t.shape) for t in manifest.model.inputs] == [("image", [1, 6, 5, 3])]
    assert {t.name: t.shape for t in manifest.model.outputs}["features"] == [1, 6, 5, 8]
    (note,) = manifest.warnings
    assert "'image'" in note and "NHWC" in note and "[1, 6, 5, 3]" in note
    assert any(note in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    x = np.random.default_rng(2).standard_normal((1, 3, 6, 5)).astype(np.float32)
    want = _ort(source, {"image": x})
    got = _ort(_bundled_onnx(tmp_path / "n.hybrid"), {"image": x.transpose(0, 2, 3, 1)})
    np.testing.assert_allclose(got["features"], want["features"].transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-6)


def test_layout_nhwc_needs_o3_and_a_valid_name(tmp_path):
    for level, layout in (("O2", "nhwc"), (None, "NHWC"), ("O3", "nwhc")):
        with pytest.raises(ConfigError) as info:
            create_bundle(_conv_net(), tmp_path / "x.hybrid", platform="x86-64", optimize_level=level,
                          caches=False, layout=layout)
        assert info.value.code == "HYB-102"
    assert not (tmp_path / "x.hybrid").exists()


def test_layout_nhwc_on_a_model_without_images_says_nothing_changed(tmp_path):
    manifest = create_bundle(matmul_add(), tmp_path / "m.hybrid", optimize_level="O3", caches=False,
                             layout="NHWC")
    assert manifest.model.layout is None
    assert any("changed nothing" in w for w in manifest.warnings)


def test_cli_layout(tmp_path):
    onnx.save(_conv_net(), tmp_path / "c.onnx")
    kept = CliRunner().invoke(_app(), ["bundle", "create", str(tmp_path / "c.onnx"), "-o", str(tmp_path / "k.hybrid"),
                                       "--platform", "ascend-910b", "-O", "O3", "--no-cache"])
    assert kept.exit_code == 0, kept.output
    assert "NCHW" in kept.output and "--layout nhwc" in kept.output  # the profile's preference, not applied
    converted = CliRunner().invoke(_app(), ["bundle", "create", str(tmp_path / "c.onnx"), "-o",
                                            str(tmp_path / "n.hybrid"), "--platform", "ascend-910b", "-O", "O3",
                                            "--no-cache", "--layout", "nhwc"])
    assert converted.exit_code == 0, converted.output
    assert any("warning" in line.lower() and "NHWC" in line for line in converted.output.splitlines())
    with zipfile.ZipFile(tmp_path / "n.hybrid") as zf:
        model = onnx.load(io.BytesIO(zf.read("model/model.onnx")))
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 6, 5, 3]


def test_save_bundle_warns_too(fake_pip, tmp_path):
    import hybrid
    from hybrid.bundle import save_bundle

    cm = hybrid.compile(matmul_add(), target="onnxruntime:cpu")
    manifest = save_bundle(cm, tmp_path / "s.hybrid", platform="jetson-xavier", caches=False, include_libs=True,
                           include_hybrid=False)
    assert any("tensorrt:cuda" in w for w in manifest.warnings)
    assert any("3.8" in w for w in manifest.warnings)
