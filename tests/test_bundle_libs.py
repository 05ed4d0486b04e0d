"""Vendored wheels (--include-libs): the lock list, hash checks, and an offline install-libs.

No test here needs the network: the wheel is built locally from a dummy package. The one real download
(wheels for an aarch64 target) runs only with HYBRID_NETWORK_TESTS=1 and skips when pip cannot reach
the registry.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import typer
from tests._bundle_tools import rebuild
from tests._models import matmul_add
from typer.testing import CliRunner

from hybrid.bundle import create_bundle, inspect_bundle, install_libs, verify_bundle
from hybrid.bundle.libs import fetch_wheels, parse_wheel_name
from hybrid.bundle.platforms import BUILTIN_PLATFORMS
from hybrid.errors import BundleError


@pytest.fixture(scope="module")
def dummy_wheel(tmp_path_factory):
    """A real wheel of a one-module package, built offline with `pip wheel`."""
    src = tmp_path_factory.mktemp("dummy_src")
    (src / "dummy_pkg").mkdir()
    (src / "dummy_pkg" / "__init__.py").write_text("MARKER = 'vendored by hybrid'\n")
    (src / "setup.py").write_text(textwrap.dedent("""
        from setuptools import setup
        setup(name="dummy-pkg", version="0.1", packages=["dummy_pkg"])
    """))
    out = tmp_path_factory.mktemp("dummy_whl")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(out), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture
def libs_bundle(tmp_path, dummy_wheel):
    path = tmp_path / "libs.hybrid"
    manifest = create_bundle(matmul_add(), path, caches=False, include_libs=True, requirements=[],
                             wheels=[dummy_wheel], include_hybrid=False)
    return path, manifest


def test_lock_list(libs_bundle, dummy_wheel):
    _, manifest = libs_bundle
    (entry,) = manifest.libs.wheels
    assert (entry.name, entry.version) == ("dummy-pkg", "0.1")
    assert entry.file == f"libs/{dummy_wheel.name}"
    assert entry.sha256 == hashlib.sha256(dummy_wheel.read_bytes()).hexdigest()
    assert entry.size == dummy_wheel.stat().st_size
    assert manifest.libs.platform == "x86-64" or manifest.libs.platform == manifest.platform.name
    assert manifest.libs.python_version == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert manifest.members[entry.file].sha256 == entry.sha256
    assert verify_bundle(libs_bundle[0])["ok"]
    assert inspect_bundle(libs_bundle[0])["libs"]["wheels"][0]["name"] == "dummy-pkg"


def test_install_libs_offline(libs_bundle, tmp_path):
    path, _ = libs_bundle
    site = tmp_path / "site"
    report = install_libs(path, target=site)
    assert report.wheels == (libs_bundle[1].libs.wheels[0].file.split("/")[1],)
    assert (site / "dummy_pkg" / "__init__.py").read_text() == "MARKER = 'vendored by hybrid'\n"
    check = subprocess.run([sys.executable, "-c", "import dummy_pkg; print(dummy_pkg.MARKER)"],
                           env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, check=True)
    assert check.stdout.strip() == "vendored by hybrid"


def test_install_libs_refuses_a_tampered_wheel(libs_bundle, tmp_path):
    path, manifest = libs_bundle
    name = manifest.libs.wheels[0].file

    def swap(m, members):
        members[name] = members[name] + b"\0"
    # the bytes changed but the manifest did not: the member hash fails
    (tmp_path / "a.hybrid").write_bytes(rebuild(path.read_bytes(), swap, rehash=False))
    with pytest.raises(BundleError) as info:
        install_libs(tmp_path / "a.hybrid", target=tmp_path / "site")
    assert info.value.code in ("HYB-503", "HYB-505")

    def lie(m, members):
        members[name] = members[name] + b"\0"
        m["members"][name] = {"sha256": hashlib.sha256(members[name]).hexdigest(), "size": len(members[name])}
    # members re-hashed, lock entry not: the manifest itself is inconsistent
    (tmp_path / "b.hybrid").write_bytes(rebuild(path.read_bytes(), lie, rehash=False))
    with pytest.raises(BundleError) as info:
        install_libs(tmp_path / "b.hybrid", target=tmp_path / "site")
    assert info.value.code == "HYB-502" and "lock" in info.value.message
    assert not (tmp_path / "site").exists()


def test_install_libs_refuses_another_platform(libs_bundle, tmp_path):
    path, _ = libs_bundle

    def retarget(m, members):
        m["libs"]["pip_platforms"] = ["manylinux_2_31_aarch64"] if not os.uname().machine.startswith("aarch") \
            else ["manylinux_2_31_x86_64"]
    (tmp_path / "o.hybrid").write_bytes(rebuild(path.read_bytes(), retarget))
    with pytest.raises(BundleError) as info:
        install_libs(tmp_path / "o.hybrid", target=tmp_path / "site")
    assert info.value.code == "HYB-509" and "--force" in (info.value.hint or "")
    install_libs(tmp_path / "o.hybrid", target=tmp_path / "site", force=True)  # a pure-Python wheel fits anyway


def test_bundle_without_libs(tmp_path):
    create_bundle(matmul_add(), tmp_path / "m.hybrid", caches=False)
    with pytest.raises(BundleError) as info:
        install_libs(tmp_path / "m.hybrid")
    assert info.value.code == "HYB-509" and "--include-libs" in info.value.hint


def test_install_libs_cli_dry_run(libs_bundle, tmp_path):
    from hybrid.cli import bundle

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test app"""

    bundle.register(app)
    result = CliRunner().invoke(app, ["bundle", "install-libs", str(libs_bundle[0]), "--target",
                                      str(tmp_path / "site"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "would install 1 wheels" in result.output and "dummy" in result.output.lower()


def test_wheel_names():
    assert parse_wheel_name("numpy-2.4.6-cp311-cp311-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl") == \
        ("numpy", "2.4.6")
    assert parse_wheel_name("onnx_ir-1.1.0-py3-none-any.whl") == ("onnx-ir", "1.1.0")
    assert parse_wheel_name("torch-2.13.0+cpu-1-cp311-cp311-linux_x86_64.whl") == ("torch", "2.13.0+cpu")
    for bad in ("../evil.whl", "x.whl", "numpy-2.0.tar.gz"):
        with pytest.raises(BundleError):
            parse_wheel_name(bad)


def test_missing_local_wheel(tmp_path):
    with pytest.raises(BundleError) as info:
        create_bundle(matmul_add(), tmp_path / "m.hybrid", caches=False, include_libs=True, requirements=[],
                      wheels=[tmp_path / "nope-1.0-py3-none-any.whl"], include_hybrid=False)
    assert info.value.code == "HYB-509"


@pytest.mark.skipif(os.environ.get("HYBRID_NETWORK_TESTS") != "1", reason="set HYBRID_NETWORK_TESTS=1 to download")
def test_real_download_for_jetson(tmp_path):
    """pip fetches aarch64 / Python 3.11 wheels for the Jetson profile on this x86 machine."""
    profile = BUILTIN_PLATFORMS["jetson-xavier"]
    try:
        wheels = fetch_wheels(["numpy"], profile, "3.11", tmp_path)
    except BundleError as e:
        pytest.skip(f"pip cannot reach the registry: {e.message}")
    (numpy,) = [w for w in wheels if w.name.startswith("numpy-")]
    assert "aarch64" in numpy.name and "cp311" in numpy.name
    manifest = create_bundle(matmul_add(), tmp_path / "j.hybrid", platform="jetson-xavier", include_libs=True,
                             requirements=["numpy"], include_hybrid=True)
    names = {w.name for w in manifest.libs.wheels}
    assert {"numpy", "pyasc"} <= names
    assert all("x86_64" not in w.file for w in manifest.libs.wheels)
    print(json.dumps([w.file for w in manifest.libs.wheels], indent=1))
