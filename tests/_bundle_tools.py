"""Helpers for the bundle tests: small bundles, and hostile ones built byte by byte."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
from collections.abc import Callable

import numpy as np
from tests._models import matmul_add

EPOCH = (1980, 1, 1, 0, 0, 0)


def tiny_bundle(path, target: str = "onnxruntime:cpu", calibration: bool = True) -> tuple[bytes, object]:
    """Save the matmul_add model compiled for ``target`` (with its cache and calibration data); return
    (bundle bytes, the CompiledModel)."""
    import hybrid
    from hybrid.bundle import save_bundle

    cm = hybrid.compile(matmul_add(), target=target)
    calib = {"x": np.arange(24, dtype=np.float32).reshape(6, 4)} if calibration else None
    save_bundle(cm, path, calibration=calib)
    return path.read_bytes(), cm


def members_of(data: bytes) -> tuple[dict, dict[str, bytes]]:
    """(manifest dict, other members) of a bundle."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        members = {i.filename: zf.read(i) for i in zf.infolist() if i.filename != "manifest.json"}
    return manifest, members


def write_zip(entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> bytes:
    """A zip of (name or ZipInfo, bytes) entries, stored unless the ZipInfo says otherwise."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for info, data in entries:
            if isinstance(info, str):
                info = zipfile.ZipInfo(info, date_time=EPOCH)
            zf.writestr(info, data)
    return buf.getvalue()


def rebuild(data: bytes, edit: Callable[[dict, dict[str, bytes]], None], rehash: bool = True) -> bytes:
    """Let ``edit`` change the manifest and members of a valid bundle, then write it again. With
    ``rehash`` the manifest's sha256 and sizes are recomputed, as an attacker crafting a bundle would."""
    manifest, members = members_of(data)
    edit(manifest, members)
    if rehash:
        manifest["members"] = {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)}
                               for n, b in members.items()}
        if manifest.get("libs"):
            for w in manifest["libs"]["wheels"]:
                if w["file"] in members:
                    w["sha256"] = manifest["members"][w["file"]]["sha256"]
    return write_zip([("manifest.json", json.dumps(manifest).encode()), *members.items()])


def central_entries(data: bytes) -> list[int]:
    """Offsets of the central-directory headers of a zip, in order (a stored npz member holds some too)."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        start = zf.start_dir
    out, i = [], data.find(b"PK\x01\x02", start)
    while i != -1:
        out.append(i)
        i = data.find(b"PK\x01\x02", i + 4)
    return out


def patch_u32(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + struct.pack("<I", value) + data[offset + 4:]
