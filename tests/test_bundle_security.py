"""Named tests for each threat to the .hybrid reader: every one must end in a BundleError with a 5xx code.

Threats from real advisories: ONNX external-data traversal (CVE-2022-25882 and its bypass
CVE-2024-27318), overlapping zip entries (CVE-2024-0450), forged sizes; plus the classic zip hazards
(absolute paths, '..', links, duplicates, bombs) and pickle.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import stat
import struct
import warnings
import zipfile
import zlib

import numpy as np
import onnx
import pytest
from tests._bundle_tools import EPOCH, central_entries, members_of, patch_u32, rebuild, tiny_bundle, write_zip

from hybrid.bundle import Limits, load, read_calibration, verify_bundle
from hybrid.bundle.format import BundleReader
from hybrid.errors import BundleError


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> bytes:
    return tiny_bundle(tmp_path_factory.mktemp("valid") / "m.hybrid")[0]


def _code(data: bytes, fn=None, match: str = "", **kwargs) -> str:
    """The code of the BundleError that opening (or ``fn``) raises; its message must contain ``match``."""
    with pytest.raises(BundleError) as info:
        (fn or (lambda d: BundleReader(d, **kwargs).close()))(data)
    assert info.value.code.startswith("HYB-5"), info.value
    assert match in info.value.message, info.value
    return info.value.code


# ----------------------------------------------------------------- ONNX external data (CVE-2022-25882/27318)
def _external(location: str, declare: str | None = None, blob: bytes | None = None):
    def edit(manifest, members):
        proto = onnx.ModelProto()
        proto.ParseFromString(members["model/model.onnx"])
        tensor = next(t for t in proto.graph.initializer if t.name == "W")
        raw = tensor.raw_data
        onnx.external_data_helper.set_external_data(tensor, location, 0, len(raw))
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.ClearField("raw_data")
        members["model/model.onnx"] = proto.SerializeToString()
        if declare:
            members[declare] = blob if blob is not None else raw
            manifest["model"]["external_data"] = [declare]
    return edit


@pytest.mark.parametrize("location", [
    "../../../../etc/passwd", "../manifest.json", "data/../../../secret", "/etc/passwd", "//server/share/x",
    "C:\\Windows\\win.ini", "C:/x", "..\\..\\secret", "model.onnx.data\x00../x", "file:../x", ".hidden",
])
def test_external_data_traversal_rejected(valid, location):
    """CVE-2022-25882 / CVE-2024-27318: a tensor's external data may not leave the model folder."""
    data = rebuild(valid, _external(location, declare="model/model.onnx.data"))
    assert _code(data, load, match="external data location") == "HYB-504"
    assert _code(data, verify_bundle, match="external data location") == "HYB-504"


def test_external_data_only_from_declared_members(valid):
    """A location naming another member (even inside the bundle) is refused unless declared."""
    assert _code(rebuild(valid, _external("model.onnx")), load) == "HYB-507"
    assert _code(rebuild(valid, _external("weights.bin")), load) == "HYB-507"


def test_external_data_symlink_member_rejected(valid):
    """The CVE-2024-27318 bypass went through a link: a link entry never reaches the resolver."""
    manifest, members = members_of(rebuild(valid, _external("model.onnx.data", declare="model/model.onnx.data")))
    link = zipfile.ZipInfo("model/model.onnx.data", date_time=EPOCH)
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    entries = [("manifest.json", json.dumps(manifest).encode())]
    entries += [(link if n == "model/model.onnx.data" else n, b"/etc/passwd" if n == "model/model.onnx.data" else b)
                for n, b in members.items()]
    assert _code(write_zip(entries), load, match="symbolic link") == "HYB-504"


def test_external_data_forged_offset_rejected(valid):
    edit = _external("model.onnx.data", declare="model/model.onnx.data", blob=b"\0" * 8)
    assert _code(rebuild(valid, edit), load, match="asks for bytes") == "HYB-505"


def test_external_data_resolved_in_memory(tmp_path):
    """A legitimate bundle with external data loads with bit-identical outputs."""
    from tests._models import matmul_add

    import hybrid
    from hybrid.bundle import create_bundle

    manifest = create_bundle(matmul_add(), tmp_path / "ext.hybrid", external_data_bytes=0, caches=False)
    assert manifest.model.external_data == ["model/model.onnx.data"]
    x = {"x": np.random.default_rng(0).random((2, 4), dtype=np.float32)}
    expected = hybrid.compile(matmul_add(), target="onnxruntime:cpu").run(x)["y"]
    assert np.array_equal(load(tmp_path / "ext.hybrid", target="onnxruntime:cpu").run(x)["y"], expected)


# ----------------------------------------------------------------- overlapping entries (CVE-2024-0450)
def _central(name: bytes, offset: int, crc: int, size: int) -> bytes:
    return struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, 0, 0, 0, 0x21, crc, size, size,
                       len(name), 0, 0, 0, 0, 0o100644 << 16, offset) + name


def _local(name: bytes, crc: int, size: int) -> bytes:
    return struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0x21, crc, size, size, len(name), 0) + name


def _archive(local_blob: bytes, centrals: list[bytes]) -> bytes:
    cd = b"".join(centrals)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(centrals), len(centrals), len(cd), len(local_blob), 0)
    return local_blob + cd + end


def test_overlapping_entries_rejected():
    """CVE-2024-0450 'quoted overlap': entry b's record lies inside entry a's data."""
    b_data = b"x" * 1000
    b_record = _local(b"b", zlib.crc32(b_data), len(b_data)) + b_data
    a_record = _local(b"a", zlib.crc32(b_record), len(b_record)) + b_record
    b_offset = len(_local(b"a", 0, 0))
    data = _archive(a_record, [_central(b"a", 0, zlib.crc32(b_record), len(b_record)),
                               _central(b"b", b_offset, zlib.crc32(b_data), len(b_data))])
    assert _code(data, match="overlap") == "HYB-505"


def test_full_overlap_rejected():
    """Two names, one local record: the local name differs from one of them (a forged directory)."""
    payload = b"y" * 100
    record = _local(b"a", zlib.crc32(payload), len(payload)) + payload
    data = _archive(record, [_central(b"a", 0, zlib.crc32(payload), len(payload)),
                             _central(b"b", 0, zlib.crc32(payload), len(payload))])
    assert _code(data, match="local header") == "HYB-505"


# ----------------------------------------------------------------- bombs and caps
def test_compression_ratio_bomb_rejected():
    info = zipfile.ZipInfo("bomb.bin", date_time=EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    data = write_zip([(info, b"\0" * (8 << 20))])
    assert len(data) < 100_000
    assert _code(data, match="ratio over") == "HYB-505"


@pytest.mark.parametrize(("limits", "match"), [(Limits(max_members=2), "at most 2 members"),
                                               (Limits(max_total_bytes=200), "add up to more than 200"),
                                               (Limits(max_member_bytes=100), "over the cap of 100"),
                                               (Limits(max_manifest_bytes=64), "over the cap of 64")])
def test_size_and_count_caps(valid, limits, match):
    assert _code(valid, limits=limits, match=match) == "HYB-505"


# ----------------------------------------------------------------- forged sizes
def test_forged_central_size_rejected(valid):
    first = central_entries(valid)[1]  # the model member (stored)
    assert _code(patch_u32(valid, first + 24, 5_000_000), match="declares 5000000 bytes but 197") == "HYB-505"
    both = patch_u32(patch_u32(valid, first + 20, 5_000_000), first + 24, 5_000_000)
    assert _code(both, match="the local header says") == "HYB-505"


def test_forged_local_size_rejected(valid):
    with zipfile.ZipFile(io.BytesIO(valid)) as zf:
        info = zf.getinfo("model/model.onnx")
    for field in (18, 22):  # compressed and uncompressed size in the local header
        forged = patch_u32(valid, info.header_offset + field, info.file_size - 10)
        assert _code(forged, match="the local header says") == "HYB-505"


def test_forged_manifest_size_rejected(valid):
    def edit(manifest, members):
        manifest["members"]["model/model.onnx"]["size"] += 1
    assert _code(rebuild(valid, edit, rehash=False)) == "HYB-503"


def test_forged_npy_shape_rejected(valid):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})
    npy = buf.getvalue() + b"\0" * 16
    npz = write_zip([("a0.npy", npy)])

    def edit(manifest, members):
        members["calibration/calibration.npz"] = npz
    data = rebuild(valid, edit)
    assert _code(data, read_calibration, match="header declares shape") == "HYB-505"
    assert _code(data, verify_bundle, match="header declares shape") == "HYB-505"


# ----------------------------------------------------------------- names, links, duplicates
@pytest.mark.parametrize("name", ["/etc/cron.d/x", "../x", "a/../../x", "C:/x", "c:\\x", ".hidden", "a//b",
                                  "a\\..\\..\\b", "platforms/./x", "x" * 600, "a/" * 9 + "b"])
def test_unsafe_member_names_rejected(name):
    assert _code(write_zip([(name, b"data")]), match="member name") == "HYB-504"


@pytest.mark.parametrize("mode", [stat.S_IFLNK, stat.S_IFCHR, stat.S_IFBLK, stat.S_IFIFO, stat.S_IFSOCK,
                                  stat.S_IFDIR])
def test_link_and_special_entries_rejected(mode):
    """Symbolic links, hard-link-like and device entries (zip external_attr) are never accepted."""
    info = zipfile.ZipInfo("model/model.onnx", date_time=EPOCH)
    info.create_system = 3
    info.external_attr = (mode | 0o644) << 16
    assert _code(write_zip([(info, b"/etc/passwd")]), match="expected a regular file") == "HYB-504"


def test_dos_directory_entry_rejected():
    info = zipfile.ZipInfo("model", date_time=EPOCH)
    info.external_attr = 0x10
    assert _code(write_zip([(info, b"")]), match="directory") == "HYB-504"


@pytest.mark.parametrize("second", ["model/model.onnx", "Model/Model.onnx"])
def test_duplicate_names_rejected(valid, second):
    manifest, members = members_of(valid)
    entries = [("manifest.json", json.dumps(manifest).encode()), *members.items(), (second, b"evil")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate it is asked to write
        data = write_zip(entries)
    assert _code(data, match="appears twice") == "HYB-504"


# ----------------------------------------------------------------- integrity and schema
def test_member_hash_mismatch_rejected(valid):
    def edit(manifest, members):
        blob = bytearray(members["model/model.onnx"])
        blob[-1] ^= 1
        members["model/model.onnx"] = bytes(blob)
    assert _code(rebuild(valid, edit, rehash=False), load) == "HYB-503"


def test_unlisted_and_missing_members_rejected(valid):
    assert _code(rebuild(valid, lambda m, mem: mem.update({"extra.bin": b"x"}), rehash=False)) == "HYB-507"
    assert _code(rebuild(valid, lambda m, mem: mem.pop("calibration/calibration.npz"), rehash=False)) == "HYB-507"


def test_newer_format_version_rejected(valid):
    assert _code(rebuild(valid, lambda m, mem: m.update(format_version=99))) == "HYB-506"


@pytest.mark.parametrize("manifest", [b"not json", b"[1, 2]", b"{}", b"[" * 100_000 + b"]" * 100_000,
                                      b'{"format_version": 1, "members": {"../x": {"sha256": "0", "size": 1}}}'])
def test_invalid_manifest_rejected(manifest):
    assert _code(write_zip([("manifest.json", manifest)])) in ("HYB-502", "HYB-504")


def test_not_a_bundle_rejected(valid, tmp_path):
    assert _code(b"PK\x03\x04 definitely not a zip") == "HYB-501"
    assert _code(valid[: len(valid) // 2]) == "HYB-501"
    assert _code(b"") == "HYB-501"
    assert _code(str(tmp_path / "missing.hybrid"), load) == "HYB-501"


def test_encrypted_and_unknown_compression_rejected(valid):
    first = central_entries(valid)[1]
    flags = struct.unpack("<H", valid[first + 8:first + 10])[0]
    encrypted = valid[:first + 8] + struct.pack("<H", flags | 1) + valid[first + 10:]
    assert _code(encrypted, match="encrypted") == "HYB-501"
    bzip = valid[:first + 10] + struct.pack("<H", 12) + valid[first + 12:]
    assert _code(bzip, match="compression method 12") == "HYB-501"


# ----------------------------------------------------------------- no pickle, anywhere
def test_pickled_calibration_rejected(valid):
    buf = io.BytesIO()
    np.savez(buf, a0=np.array([{"x": 1}], dtype=object))

    def edit(manifest, members):
        members["calibration/calibration.npz"] = buf.getvalue()
    data = rebuild(valid, edit)
    assert _code(data, read_calibration, match="pickle") == "HYB-504"
    assert _code(data, verify_bundle, match="pickle") == "HYB-504"


def test_loading_never_unpickles(valid, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used")
    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    verify_bundle(valid)
    assert read_calibration(valid)["x"].shape == (6, 4)
    load(valid)


def test_bundle_sources_do_not_import_pickle():
    import pathlib

    import hybrid.bundle

    for path in pathlib.Path(hybrid.bundle.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert "import pickle" not in text and "allow_pickle=True" not in text, path


def test_cache_with_external_data_is_not_trusted(valid, caplog):
    """A crafted optimized-model cache that points outside: verify refuses it, load rebuilds from the IR."""
    def edit(manifest, members):
        name = manifest["caches"][0]["files"][0]
        proto = onnx.ModelProto()
        proto.ParseFromString(members[name])
        tensor = proto.graph.initializer[0]
        onnx.external_data_helper.set_external_data(tensor, "../../../etc/passwd", 0, 16)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.ClearField("raw_data")
        members[name] = proto.SerializeToString()
    data = rebuild(valid, edit)
    assert _code(data, verify_bundle, match="external data") == "HYB-504"
    from hybrid.bundle import load_with_info

    cm, info = load_with_info(data)
    assert info.source != "bundle-cache" and any("rejected" in n for n in info.notes)
    x = np.ones((1, 4), np.float32)
    assert cm.run({"x": x})["y"].shape == (1, 3)


def test_manifest_hashes_cover_every_member(valid):
    manifest, members = members_of(valid)
    assert set(manifest["members"]) == set(members)
    for name, blob in members.items():
        assert manifest["members"][name]["sha256"] == hashlib.sha256(blob).hexdigest()
