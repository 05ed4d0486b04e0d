"""Platform profiles: the built-ins, user-defined ones in TOML, detection, and `pyasc platforms`."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from hybrid.bundle.platforms import (
    BUILTIN_PLATFORMS,
    PlatformProfile,
    detect_platform,
    get_platform,
    list_platforms,
    load_platforms_file,
    machine_arch,
)
from hybrid.errors import BundleError, ConfigError

USER_TOML = """
[platforms.rk3588]
base = "arm64"
description = "Rockchip RK3588 board"
precision = "fp16"
[platforms.rk3588.backend_options.onnxruntime]
intra_op_num_threads = 4

[platforms.my-ascend]
base = "ascend-910b"
targets = ["onnxruntime:npu", "onnxruntime:cpu"]
[platforms.my-ascend.backend_options.onnxruntime]
op_select_impl_mode = "high_precision"

[platforms.bare]
arch = "x86_64"
targets = ["openvino:cpu"]
"""


def test_builtin_profiles_match_the_article():
    assert set(BUILTIN_PLATFORMS) == {"x86-64", "arm64", "jetson-xavier", "jetson-orin", "nvidia-gpu",
                                      "ascend-910b", "ascend-310p"}
    for name in ("jetson-xavier", "jetson-orin"):
        p = BUILTIN_PLATFORMS[name]
        assert p.precision == "fp16" and p.arch == "aarch64" and p.targets[0] == "tensorrt:cuda"
        # hybrid.set_backend('tensorrt', config={'fp16_mode': True, 'max_workspace_size': 1 << 30})
        assert p.backend_options["tensorrt"] == {"fp16_mode": True, "max_workspace_size": 1 << 30}
    for name in ("ascend-910b", "ascend-310p"):
        p = BUILTIN_PLATFORMS[name]
        assert p.layout == "NHWC" and p.targets[0] == "onnxruntime:npu"
        # ascend_config = {'compile_options': {'aoe_mode': 'subgraph', 'precision_mode': 'force_fp16'}}
        assert p.compile_options == {"aoe_mode": "subgraph", "precision_mode": "force_fp16"}
        assert p.backend_options["onnxruntime"]["precision_mode"] == "force_fp16"
    assert BUILTIN_PLATFORMS["x86-64"].precision == "fp32" and BUILTIN_PLATFORMS["x86-64"].layout == "NCHW"


def test_builtin_backend_options_are_valid_for_installed_backends():
    from hybrid.hal import backend_class

    for p in BUILTIN_PLATFORMS.values():
        for backend, options in p.backend_options.items():
            if backend in ("onnxruntime", "openvino"):
                assert backend_class(backend).validate_options(options) == options


def test_pip_platform_tags():
    tags = BUILTIN_PLATFORMS["jetson-xavier"].pip_platforms
    assert tags[0] == "manylinux_2_31_aarch64" and "manylinux_2_17_aarch64" in tags
    assert tags[-1] == "manylinux2014_aarch64" and all("x86_64" not in t for t in tags)
    assert BUILTIN_PLATFORMS["x86-64"].pip_platforms[0] == "manylinux_2_28_x86_64"


def test_user_profiles_from_toml(tmp_path):
    path = tmp_path / "platforms.toml"
    path.write_text(USER_TOML)
    found = load_platforms_file(path)
    rk = found["rk3588"]
    assert (rk.arch, rk.precision, rk.targets) == ("aarch64", "fp16", BUILTIN_PLATFORMS["arm64"].targets)
    assert rk.backend_options["onnxruntime"] == {"intra_op_num_threads": 4}
    asc = found["my-ascend"]
    assert asc.layout == "NHWC" and asc.targets == ["onnxruntime:npu", "onnxruntime:cpu"]
    assert asc.backend_options["onnxruntime"] == {"precision_mode": "force_fp16",
                                                  "op_select_impl_mode": "high_precision"}
    assert found["bare"].precision == "fp32"
    assert get_platform("rk3588", path) == rk
    assert set(list_platforms(path)) == set(BUILTIN_PLATFORMS) | {"rk3588", "my-ascend", "bare"}


def test_platforms_env_variable(tmp_path, monkeypatch):
    path = tmp_path / "p.toml"
    path.write_text(USER_TOML)
    monkeypatch.setenv("HYBRID_PLATFORMS", str(path))
    assert get_platform("rk3588").name == "rk3588"


@pytest.mark.parametrize(("text", "match"), [
    ("not = [toml", "TOML"),
    ("[other]\nx = 1", "platforms.NAME"),
    ("[platforms.x]\nbase = 'nope'", "base"),
    ("[platforms.x]\narch = 'sparc'\ntargets = ['cpu']", "arch"),
    ("[platforms.x]\narch = 'x86_64'\ntargets = []", "targets"),
    ("[platforms.x]\narch = 'x86_64'\ntargets = ['cpu']\nprecision = 'int3'", "precision"),
    ("[platforms.x]\narch = 'x86_64'\ntargets = ['cpu']\ncolour = 'red'", "colour"),
    ("[platforms.X]\narch = 'x86_64'\ntargets = ['cpu']", "name"),
])
def test_bad_platforms_file(tmp_path, text, match):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_platforms_file(path)
    assert info.value.code == "HYB-102" and match in info.value.message


def test_missing_platforms_file(tmp_path):
    with pytest.raises(ConfigError):
        load_platforms_file(tmp_path / "missing.toml")


def test_unknown_platform_lists_known_ones():
    with pytest.raises(BundleError) as info:
        get_platform("commodore-64")
    assert info.value.code == "HYB-508" and "ascend-910b" in info.value.message


def test_detect_this_machine():
    profile = detect_platform()
    assert profile.arch == machine_arch()
    assert get_platform("auto") == profile
    if machine_arch() == "x86_64":
        assert profile.name in ("x86-64", "nvidia-gpu", "ascend-310p")


def test_profiles_are_frozen():
    with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError for a frozen model
        BUILTIN_PLATFORMS["x86-64"].precision = "fp16"
    assert isinstance(BUILTIN_PLATFORMS["arm64"], PlatformProfile)


def test_platforms_cli(tmp_path):
    from hybrid.cli import bundle

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test app"""

    bundle.register(app)
    runner = CliRunner()
    result = runner.invoke(app, ["platforms"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in BUILTIN_PLATFORMS:
        assert name in result.output
    assert "this machine" in result.output
    path = tmp_path / "p.toml"
    path.write_text(USER_TOML)
    result = runner.invoke(app, ["platforms", "--platforms-file", str(path), "--json"])
    assert json.loads(result.output)["rk3588"]["precision"] == "fp16"
    result = runner.invoke(app, ["platforms", "--show", "jetson-orin"])
    assert json.loads(result.output)["backend_options"]["tensorrt"]["fp16_mode"] is True
    result = runner.invoke(app, ["platforms", "--show", "nope"])
    assert result.exit_code == 1 and "HYB-508" in result.output
