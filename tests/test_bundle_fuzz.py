"""Fuzz the bundle reader: mutate a valid bundle's bytes and load the result.

Every outcome must be either a BundleError with a 5xx code or a model that gives exactly the original
outputs (a mutation that leaves the content intact, e.g. a timestamp). Nothing else may escape, nothing
may hang, and nothing may be written outside the test's temporary folders.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests._bundle_tools import tiny_bundle

from hybrid.bundle import load, read_calibration, verify_bundle
from hybrid.errors import BundleError

_INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**31, 10**9]
_X = {"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)}


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """A valid bundle (model, compiled cache, calibration data), its expected outputs, and the offsets of
    its zip structures (mutations are biased toward them)."""
    import io

    data, cm = tiny_bundle(tmp_path_factory.mktemp("fuzz") / "m.hybrid")
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        hot = [zf.start_dir, len(data) - 22] + [i.header_offset for i in zf.infolist()]
    return data, cm.run(_X)["y"], sorted(set(hot))


def _mutation(size: int, hot: list[int]):
    pos = st.one_of(st.integers(0, size - 1),
                    st.tuples(st.sampled_from(hot), st.integers(0, 46)).map(lambda t: min(t[0] + t[1], size - 1)))
    return st.one_of(
        st.tuples(st.just("flip"), pos, st.integers(0, 7)),
        st.tuples(st.just("set"), pos, st.integers(0, 255)),
        st.tuples(st.just("u32"), pos, st.sampled_from(_INTERESTING)),
        st.tuples(st.just("truncate"), pos, st.just(0)),
        st.tuples(st.just("insert"), pos, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("delete"), pos, st.integers(1, 64)),
    )


def _apply(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for kind, pos, arg in mutations:
        pos = min(pos, max(len(buf) - 1, 0))
        if kind == "flip" and buf:
            buf[pos] ^= 1 << arg
        elif kind == "set" and buf:
            buf[pos] = arg
        elif kind == "u32":
            buf[pos:pos + 4] = (arg & 0xFFFFFFFF).to_bytes(4, "little")
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = arg
        elif kind == "delete":
            del buf[pos:pos + arg]
    return bytes(buf)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mutated_bundles_fail_cleanly(original, tmp_path, monkeypatch):
    data, expected, hot = original
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path / "cache"))
    outcomes = {"loaded": 0, "rejected": 0}

    @settings(max_examples=2000, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(_mutation(len(data), hot), min_size=1, max_size=3))
    def check(mutations):
        mutated = _apply(data, mutations)
        try:
            cm = load(mutated)
            verify_bundle(mutated)
            read_calibration(mutated)
        except BundleError as e:
            assert e.code.startswith("HYB-5"), e
            outcomes["rejected"] += 1
            return
        # whatever survived is the original model, byte for byte
        assert np.array_equal(cm.run(_X)["y"], expected)
        outcomes["loaded"] += 1

    check()
    assert outcomes["rejected"] + outcomes["loaded"] >= 2000 and outcomes["rejected"] > 1000, outcomes
    assert os.listdir(work) == []
    assert not (tmp_path / "home").exists()


def _paths(doc, prefix=()):
    """Every key path in a JSON document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True), st.text(max_size=12),
    st.sampled_from(["../x", "/etc/passwd", "onnxruntime:cpu", "openvino:cpu", "reference", "tensorrt:cuda",
                     "fp16", "bf16", "NHWC", "optimized-model", "directory", "model/model.onnx",
                     "calibration/calibration.npz", "f16", "disable", "THROUGHPUT"]),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
    st.fixed_dictionaries({"optimized_model_path": st.just("/tmp/evil.onnx"), "intra_op_num_threads": st.just(10**6)}),
)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mutated_manifests_fail_cleanly(original, tmp_path, monkeypatch):
    """Structure-aware: change or delete one manifest value (members untouched, as a crafted bundle would).
    Loading either fails with a 5xx BundleError or gives a model that runs; options that write files or
    spawn threads never reach a backend."""
    import io
    import json

    from tests._bundle_tools import rebuild

    data, expected, _ = original
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    paths = sorted(_paths(manifest), key=str)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path / "cache"))

    def set_path(doc, path, value, delete):
        for key in path[:-1]:
            doc = doc[key]
        if delete and isinstance(doc, dict):
            del doc[path[-1]]
        else:
            doc[path[-1]] = value

    @settings(max_examples=400, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.sampled_from(paths), _VALUES, st.booleans())
    def check(path, value, delete):
        mutated = rebuild(data, lambda m, _members: set_path(m, path, value, delete), rehash=False)
        try:
            cm = load(mutated)
        except BundleError as e:
            assert e.code.startswith("HYB-5"), e
            return
        y = cm.run(_X)["y"]
        assert y.shape == expected.shape and np.isfinite(y).all()

    check()
    assert not os.path.exists("/tmp/evil.onnx")
