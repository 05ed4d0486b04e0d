"""The .hybrid bundle: round trips, platform fallback, caches per fingerprint, calibration, CLI."""

from __future__ import annotations

import json
import logging
import os
import zipfile

import numpy as np
import pytest
import typer
from tests._bundle_tools import members_of, rebuild
from tests._machine import openvino_cpu_offers
from tests._models import matmul_add
from typer.testing import CliRunner

import hybrid
from hybrid.bundle import cache as bundle_cache
from hybrid.bundle import (
    create_bundle,
    detect_platform,
    device_fingerprint,
    inspect_bundle,
    load,
    load_with_info,
    read_calibration,
    save_bundle,
    verify_bundle,
)
from hybrid.errors import BundleError

BACKENDS = ["onnxruntime:cpu", "openvino:cpu"]


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory):
    """SqueezeNet with its weights stored in the file, as real models have them (the light model zoo
    generates its weights with ConstantOfShape; O1 folds them into initializers)."""
    from hybrid.zoo import samples

    path = tmp_path_factory.mktemp("models") / "squeezenet.onnx"
    hybrid.optimize(samples.light_model_path("squeezenet"), level="O1").save(path)
    return path, {"data_0": samples.light_input()}


def _app() -> typer.Typer:
    from hybrid.cli import bench, bundle, profile

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """pyasc (test app)."""

    for module in (bundle, profile, bench):
        module.register(app)
    return app


# ----------------------------------------------------------------- round trips
@pytest.mark.parametrize("target", BACKENDS)
def test_round_trip_is_bit_identical(tmp_path, squeezenet, target):
    """A bundle made on this machine loads from its compiled cache with the very same outputs."""
    path, feeds = squeezenet
    cm = hybrid.compile(path, target=target)
    expected = cm.run(feeds)
    cm.save(str(tmp_path / "m.hybrid"))
    loaded, info = load_with_info(tmp_path / "m.hybrid")
    assert info.source == "bundle-cache" and (info.backend, info.device) == tuple(target.split(":"))
    assert info.notes == ()
    got = loaded.run(feeds)
    assert list(got) == list(expected)
    for name in expected:
        assert np.array_equal(got[name], expected[name])
    assert loaded.signature == cm.signature and loaded.model.name == cm.model.name


def test_hybrid_load_is_the_bundle_loader(tmp_path):
    cm = hybrid.compile(matmul_add(), target="onnxruntime:cpu")
    cm.save(str(tmp_path / "m.hybrid"))
    assert hybrid.load is load
    x = np.ones((3, 4), np.float32)
    assert np.array_equal(hybrid.load(str(tmp_path / "m.hybrid"))(x), cm(x))


def test_round_trip_from_ir_is_bit_identical(tmp_path, squeezenet):
    path, feeds = squeezenet
    cm = hybrid.compile(path, target="onnxruntime:cpu")
    save_bundle(cm, tmp_path / "m.hybrid", caches=False)
    loaded, info = load_with_info(tmp_path / "m.hybrid", use_cache=False)
    assert info.source == "ir"
    assert np.array_equal(loaded.run(feeds)["softmaxout_1"], cm.run(feeds)["softmaxout_1"])
    assert not (tmp_path / "hybrid-cache").exists()  # use_cache=False writes nothing


def test_jetson_bundle_falls_back_with_a_warning(tmp_path, squeezenet, caplog):
    """Made for jetson-xavier on this x86 machine: the manifest carries the Jetson profile, and it still
    loads here, on what is present, saying so."""
    from hybrid.bundle.platforms import machine_arch
    from hybrid.hal import backend_status

    if machine_arch() == "aarch64" or backend_status("tensorrt").available:
        pytest.skip("this machine runs what the Jetson profile asks for: nothing to fall back from")
    path, feeds = squeezenet
    manifest = create_bundle(path, tmp_path / "j.hybrid", platform="jetson-xavier")
    assert manifest.platform.name == "jetson-xavier" and manifest.platform.precision == "fp16"
    assert manifest.platform.backend_options["tensorrt"] == {"fp16_mode": True, "max_workspace_size": 1 << 30}
    assert manifest.caches == [] and manifest.compile is None  # nothing compiled for aarch64 here
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        cm, info = load_with_info(tmp_path / "j.hybrid")
    text = caplog.text
    assert "jetson-xavier" in text and "falling back" in text and "tensorrt:cuda" in text
    assert "fp16 is not available" in text
    assert (info.backend, info.precision) == ("onnxruntime", "fp32")
    expected = hybrid.compile(path, target="onnxruntime:cpu").run(feeds)["softmaxout_1"]
    assert np.array_equal(cm.run(feeds)["softmaxout_1"], expected)
    doc = inspect_bundle(tmp_path / "j.hybrid")
    assert doc["platform"]["name"] == "jetson-xavier" and doc["platform"]["targets"][0] == "tensorrt:cuda"


@pytest.mark.parametrize("target", BACKENDS)
def test_second_load_uses_the_local_cache(tmp_path, squeezenet, target):
    """Without a cache for this machine in the bundle, the first load compiles from the IR and saves the
    artifact; the second load uses it (OpenVINO confirms it imported its blob)."""
    path, feeds = squeezenet
    create_bundle(path, tmp_path / "m.hybrid", platform="arm64", caches=False)
    first, info1 = load_with_info(tmp_path / "m.hybrid", target=target)
    second, info2 = load_with_info(tmp_path / "m.hybrid", target=target)
    assert (info1.source, info2.source) == ("ir", "local-cache")
    assert np.array_equal(first.run(feeds)["softmaxout_1"], second.run(feeds)["softmaxout_1"])
    if target.startswith("openvino"):
        assert bundle_cache.loaded_from_cache(second) is True


def test_corrupt_local_cache_is_rebuilt(tmp_path, squeezenet, caplog):
    path, feeds = squeezenet
    create_bundle(path, tmp_path / "m.hybrid", platform="arm64", caches=False)
    cm, _ = load_with_info(tmp_path / "m.hybrid", target="onnxruntime:cpu")
    (artifact,) = (tmp_path / "hybrid-cache").rglob("model.opt.onnx")
    artifact.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        again, info = load_with_info(tmp_path / "m.hybrid", target="onnxruntime:cpu")
    assert info.source == "ir" and "corrupt" in caplog.text
    assert np.array_equal(again.run(feeds)["softmaxout_1"], cm.run(feeds)["softmaxout_1"])
    assert load_with_info(tmp_path / "m.hybrid", target="onnxruntime:cpu")[1].source == "local-cache"


def test_stale_cache_is_not_used(tmp_path, monkeypatch):
    """A cache from another machine (another fingerprint) is ignored: the model is compiled from the IR."""
    cm = hybrid.compile(matmul_add(), target="onnxruntime:cpu")
    cm.save(str(tmp_path / "m.hybrid"))

    def edit(manifest, members):
        entry = manifest["caches"][0]
        old = entry["fingerprint"]
        entry["fingerprint"] = "0" * 16
        entry["files"] = [f.replace(old, "0" * 16) for f in entry["files"]]
        for name in list(members):
            if old in name:
                members[name.replace(old, "0" * 16)] = members.pop(name)
    stale = rebuild((tmp_path / "m.hybrid").read_bytes(), edit)
    loaded, info = load_with_info(stale)
    assert info.source == "ir" and info.backend == "onnxruntime"
    x = np.ones((2, 4), np.float32)
    assert np.array_equal(loaded(x), cm(x))


@pytest.mark.parametrize("target", BACKENDS)
def test_corrupt_bundle_cache_is_rebuilt_not_trusted(tmp_path, target):
    """A cache whose bytes match the manifest (re-hashed) but are not a valid artifact: rebuilt from the IR."""
    cm = hybrid.compile(matmul_add(), target=target)
    cm.save(str(tmp_path / "m.hybrid"))

    def edit(manifest, members):
        for name in manifest["caches"][0]["files"]:
            members[name] = b"\0garbage" * 100
    data = rebuild((tmp_path / "m.hybrid").read_bytes(), edit)
    loaded, info = load_with_info(data)
    assert info.backend == target.split(":")[0]
    assert any("rejected" in n for n in info.notes) or bundle_cache.loaded_from_cache(loaded) is False
    x = np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(loaded(x), cm(x))


def test_explicit_target_overrides_the_bundle(tmp_path):
    cm = hybrid.compile(matmul_add(), target="onnxruntime:cpu")
    cm.save(str(tmp_path / "m.hybrid"))
    loaded, info = load_with_info(tmp_path / "m.hybrid", target="openvino")
    assert (loaded.backend, info.source) == ("openvino", "ir")
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(loaded(x), cm(x), rtol=1e-6)


# ----------------------------------------------------------------- contents
def test_calibration_round_trip_without_pickle(tmp_path):
    from hybrid.zoo import samples

    path = samples.light_model_path("resnet50")
    name = hybrid.Model.load(path).signature.input_names[0]
    assert "/" in name  # 'gpu_0/data_0': names that are not file names survive
    batch = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
    create_bundle(path, tmp_path / "r.hybrid", caches=False, calibration={name: batch})
    got = read_calibration(tmp_path / "r.hybrid")
    assert list(got) == [name] and np.array_equal(got[name], batch)
    np.savez(tmp_path / "calib.npz", x=batch[:1])
    create_bundle(matmul_add(), tmp_path / "m.hybrid", caches=False, calibration=tmp_path / "calib.npz")
    assert read_calibration(tmp_path / "m.hybrid")["x"].shape == (1, 3, 224, 224)
    assert read_calibration(tmp_path / "r.hybrid") is not None


def test_external_data_for_large_weights(tmp_path, squeezenet):
    path, feeds = squeezenet
    optimized = hybrid.Model.load(path)
    manifest = create_bundle(optimized, tmp_path / "x.hybrid", external_data_bytes=1 << 20)
    assert manifest.model.external_data == ["model/model.onnx.data"]
    sizes = {n: e.size for n, e in manifest.members.items()}
    assert sizes["model/model.onnx.data"] > sizes["model/model.onnx"]  # the tensors of 1 MiB and more moved
    loaded = load(tmp_path / "x.hybrid", target="onnxruntime:cpu", use_cache=False)
    expected = hybrid.compile(optimized, target="onnxruntime:cpu").run(feeds)
    assert np.array_equal(loaded.run(feeds)["softmaxout_1"], expected["softmaxout_1"])
    assert loaded.model.sha256 == optimized.sha256  # the IR is restored exactly
    assert verify_bundle(tmp_path / "x.hybrid")["ok"]


def test_manifest_records_choices(tmp_path):
    # a reduced precision this CPU has (bf16 on AVX-512 BF16 / AMX, fp16 on some ARM), else fp32
    precision = next((p for p in ("bf16", "fp16") if openvino_cpu_offers(p.upper())), "fp32")
    cm = hybrid.compile(matmul_add(), target="openvino:cpu", precision=precision)
    manifest = save_bundle(cm, tmp_path / "m.hybrid", name="mm", task="regression")
    assert (manifest.name, manifest.task, manifest.format_version) == ("mm", "regression", 1)
    assert manifest.compile.backend == "openvino" and manifest.compile.precision == precision
    assert "cache_dir" not in manifest.compile.options
    assert manifest.platform.name == detect_platform().name
    (entry,) = manifest.caches
    assert entry.fingerprint == device_fingerprint("openvino", "cpu").digest
    assert all(f.startswith(f"platforms/{entry.fingerprint}/openvino/") for f in entry.files)
    _, info = load_with_info(tmp_path / "m.hybrid")
    assert (info.source, info.precision) == ("bundle-cache", precision)


def test_a_bundle_declares_the_shapes_it_was_made_for(tmp_path):
    """create_bundle(shapes=...) writes them to the manifest; bad ones are HYB-102 before anything is written."""
    from hybrid.bundle.format import BundleReader
    from hybrid.errors import ConfigError

    cm = hybrid.compile(matmul_add(), target="onnxruntime:cpu")
    name = cm.signature.inputs[0].name
    dims = cm.signature.inputs[0].shape
    assert any(not isinstance(d, int) for d in dims)  # a dynamic input
    shape = tuple(d if isinstance(d, int) else 2 for d in dims)
    ranged = {"min": shape, "opt": shape, "max": tuple(d if isinstance(d, int) else 4 for d in dims)}
    for given, written in ((None, None), ({name: shape}, {name: list(shape)}),
                           ({name: ranged}, {name: {k: list(v) for k, v in ranged.items()}})):
        out = tmp_path / "s.hybrid"
        manifest = save_bundle(cm, out, shapes=given, include_hybrid=False)
        assert inspect_bundle(out)["shapes"] == written
        with BundleReader(out) as reader:
            assert reader.manifest.declared_shapes() == (None if given is None else {name: given[name]})
        assert manifest.shapes is None or manifest.declared_shapes() == {name: given[name]}
    with pytest.raises(ConfigError) as e:
        save_bundle(cm, tmp_path / "bad.hybrid", shapes={"nope": shape}, include_hybrid=False)
    assert e.value.code == "HYB-102" and not (tmp_path / "bad.hybrid").exists()


def test_manifest_refuses_shapes_that_do_not_fit_the_signature(tmp_path):
    from hybrid.bundle.manifest import parse_manifest

    cm = hybrid.compile(matmul_add(), target="onnxruntime:cpu")
    save_bundle(cm, tmp_path / "m.hybrid", include_hybrid=False)
    with zipfile.ZipFile(tmp_path / "m.hybrid") as z:
        doc = json.loads(z.read("manifest.json"))
    rank = len(doc["model"]["inputs"][0]["shape"])
    name = doc["model"]["inputs"][0]["name"]
    for bad in ({"nope": [1] * rank}, {name: [1] * (rank + 1)}, {name: [-1] * rank},
                {name: {"min": [1] * rank, "opt": [1] * rank, "max": [1] * (rank + 1)}}):
        with pytest.raises(BundleError) as e:
            parse_manifest(json.dumps({**doc, "shapes": bad}).encode(), "m.hybrid")
        assert e.value.code == "HYB-502"


def test_bundle_bytes_are_reproducible(tmp_path):
    model = matmul_add()
    create_bundle(model, tmp_path / "a.hybrid", caches=False)
    create_bundle(model, tmp_path / "b.hybrid", caches=False)
    ma, members_a = members_of((tmp_path / "a.hybrid").read_bytes())
    mb, members_b = members_of((tmp_path / "b.hybrid").read_bytes())
    assert members_a == members_b and ma["members"] == mb["members"]


def test_write_is_atomic(tmp_path, monkeypatch):
    """A failure while writing leaves the old bundle untouched and no temp file behind."""
    cm = hybrid.compile(matmul_add(), target="onnxruntime:cpu")
    target = tmp_path / "m.hybrid"
    target.write_bytes(b"old")

    def boom(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(zipfile.ZipFile, "writestr", boom)
    with pytest.raises(OSError, match="disk full"):
        cm.save(str(target))
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["m.hybrid"]


def test_unknown_platform(tmp_path):
    with pytest.raises(BundleError) as info:
        create_bundle(matmul_add(), tmp_path / "m.hybrid", platform="cray-1")
    assert info.value.code == "HYB-508" and "jetson-xavier" in info.value.message


# ----------------------------------------------------------------- CLI
def test_cli_create_inspect_verify(tmp_path, squeezenet):
    path, _ = squeezenet
    runner = CliRunner()
    out = tmp_path / "m.hybrid"
    result = runner.invoke(_app(), ["bundle", "create", str(path), "-o", str(out), "--platform", "x86-64",
                                    "--optimize-level", "O2", "--task", "classification"])
    assert result.exit_code == 0, result.output
    assert "compiled cache: onnxruntime:cpu" in result.output
    result = runner.invoke(_app(), ["bundle", "inspect", str(out), "--json"])
    doc = json.loads(result.output)
    assert doc["model"]["optimized"] and doc["model"]["optimize_level"] == "O2" and doc["task"] == "classification"
    assert doc["caches"][0]["matches_this_machine"] is True
    assert {m["name"] for m in doc["members"]} >= {"manifest.json", "model/model.onnx"}
    result = runner.invoke(_app(), ["bundle", "inspect", str(out)])
    assert result.exit_code == 0 and "matches" in result.output and "data_0" in result.output
    result = runner.invoke(_app(), ["bundle", "verify", str(out)])
    assert result.exit_code == 0 and "OK" in result.output
    tampered = rebuild(out.read_bytes(), lambda m, mem: mem.update({"model/model.onnx": b"x"}), rehash=False)
    (tmp_path / "bad.hybrid").write_bytes(tampered)
    result = runner.invoke(_app(), ["bundle", "verify", str(tmp_path / "bad.hybrid")])
    assert result.exit_code == 1 and "HYB-503" in result.output
    result = runner.invoke(_app(), ["bundle", "verify", str(tmp_path / "bad.hybrid"), "--json"])
    assert result.exit_code == 1 and json.loads(result.output)["code"] == "HYB-503"
    result = runner.invoke(_app(), ["bundle", "create", str(path), "-o", str(out), "--platform", "nope"])
    assert result.exit_code == 1 and "HYB-508" in result.output


def test_cli_create_for_jetson(tmp_path, squeezenet):
    path, _ = squeezenet
    out = tmp_path / "j.hybrid"
    result = CliRunner().invoke(_app(), ["bundle", "create", str(path), "--platform", "jetson-xavier",
                                         "--optimize-level", "O3", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "no compiled cache" in result.output
    assert inspect_bundle(out)["platform"]["backend_options"]["onnxruntime"]["tensorrt"] is True


def test_no_cache_when_the_optimized_graph_dwarfs_the_model(tmp_path):
    """The light zoo's SqueezeNet generates its weights at run time: ORT's optimized graph is 200x the
    model, slower to read than to rebuild, so it is not cached (the bundle still loads)."""
    from hybrid.zoo import samples

    cm = hybrid.compile(samples.light_model_path("squeezenet"), target="onnxruntime:cpu")
    manifest = save_bundle(cm, tmp_path / "m.hybrid")
    assert manifest.caches == [] and manifest.compile.backend == "onnxruntime"
    loaded, info = load_with_info(tmp_path / "m.hybrid")
    assert info.source == "ir" and info.notes == ()
    x = {"data_0": samples.light_input()}
    assert np.array_equal(loaded.run(x)["softmaxout_1"], cm.run(x)["softmaxout_1"])


def test_cli_create_writes_the_serving_settings(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(matmul_add().SerializeToString())
    out = tmp_path / "m.hybrid"
    result = CliRunner().invoke(_app(), ["bundle", "create", str(path), "-o", str(out), "--no-hybrid-wheel",
                                         "--max-batch", "4", "--batch-timeout", "0.01", "--concurrency", "2"])
    assert result.exit_code == 0, result.output
    assert inspect_bundle(out)["serving"] == {"max_batch": 4, "batch_timeout": 0.01, "concurrency": 2}
    result = CliRunner().invoke(_app(), ["bundle", "inspect", str(out)])
    assert result.exit_code == 0 and '"max_batch": 4' in result.output
    bad = tmp_path / "bad.hybrid"
    result = CliRunner().invoke(_app(), ["bundle", "create", str(path), "-o", str(bad), "--max-queue", "0"])
    assert result.exit_code == 1 and "HYB-502" in result.output and "max_queue" in result.output
    assert not bad.exists()  # nothing half-written
