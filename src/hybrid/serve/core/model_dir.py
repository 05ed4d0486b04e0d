"""What a served folder holds: a model repository, loose model files, or an unpacked bundle.

A folder such as KServe's ``/mnt/models`` (where its storage initializer puts what ``storageUri`` names)
may hold:

- a repository (``<model>/<version>/model.*``, see :mod:`hybrid.serve.core.repository`): any sub-folder;
- loose model files (``*.hybrid``, ``*.onnx``) and no sub-folder: each served as version 1 under its stem;
- an unpacked bundle (``manifest.json`` beside ``model/``, ``platforms/`` ...): packed again into a
  ``.hybrid`` file in a temporary folder (stored members, the manifest first, as the writer does) and
  served under the manifest's name; the bundle reader then checks every member against the manifest's
  SHA-256s, so an unpacked bundle is verified exactly like a packed one.
"""

from __future__ import annotations

import json
import re
import tempfile
import zipfile
from pathlib import Path

from hybrid.errors import ServingError

__all__ = ["folder_layout", "pack_unpacked_bundle"]

MANIFEST = "manifest.json"
MODEL_SUFFIXES = (".hybrid", ".onnx")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")  # the server's model-name rule
_MANIFEST_MAX = 16 << 20
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _error(message: str, hint: str = "see docs/serving.md (KServe) for what a model folder may hold") -> ServingError:
    return ServingError("HYB-707", message, hint)


def folder_layout(folder: Path) -> tuple[str, list[str]]:
    """How to serve ``folder``: ``('repository', [])``, ``('files', [path, ...])`` or ``('bundle', ['NAME=path'])``.

    Raises:
        ServingError: HYB-707 for an unpacked bundle that cannot be packed, or a folder with nothing to serve.
    """
    if (folder / MANIFEST).is_file():
        return "bundle", [pack_unpacked_bundle(folder)]
    entries = [e for e in folder.iterdir() if not e.name.startswith(".")]
    if any(e.is_dir() for e in entries):
        return "repository", []
    files = sorted(str(e) for e in entries if e.is_file() and e.suffix in MODEL_SUFFIXES)
    if not files:
        raise _error(f"{folder} holds no model: expected a repository (<model>/<version>/model.*), "
                     f"{' or '.join('*' + s for s in MODEL_SUFFIXES)} files, or an unpacked bundle ({MANIFEST})")
    return "files", files


def _bundle_name(folder: Path) -> str:
    manifest = folder / MANIFEST
    if manifest.stat().st_size > _MANIFEST_MAX:
        raise _error(f"{manifest} is larger than {_MANIFEST_MAX} bytes")
    try:
        name = json.loads(manifest.read_bytes()).get("name")
    except (ValueError, AttributeError) as e:
        raise _error(f"{manifest} is not a bundle manifest (a JSON object): {e}") from e
    if isinstance(name, str) and _NAME_RE.fullmatch(name):
        return name
    if _NAME_RE.fullmatch(folder.name):
        return folder.name
    raise _error(f"cannot name the bundle unpacked in {folder}: neither its manifest name {name!r} nor the folder "
                 "name is a valid model name", "rename the folder")


def pack_unpacked_bundle(folder: Path) -> str:
    """Zip an unpacked bundle into ``<tmp>/pyasc-bundle-*/NAME.hybrid``; return ``'NAME=path'``.

    Members are the folder's regular files (no links, nothing outside it), stored, the manifest first and
    deflated, as ``hybrid.bundle``'s writer lays them out; their hashes are checked when the bundle loads.

    Raises:
        ServingError: HYB-707 for a link or a special file in the folder.
    """
    root = folder.resolve()
    name = _bundle_name(root)
    members = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise _error(f"{path}: links are not allowed in an unpacked bundle", "copy the file in instead")
        if path.is_dir():
            continue
        if not path.is_file():
            raise _error(f"{path} is not a regular file")
        members.append(path.relative_to(root).as_posix())
    target = Path(tempfile.mkdtemp(prefix="pyasc-bundle-")) / f"{name}.hybrid"
    with zipfile.ZipFile(target, "w", allowZip64=True) as zf:
        for member in sorted(members, key=lambda m: m != MANIFEST):
            info = zipfile.ZipInfo(member, date_time=_EPOCH)
            info.create_system = 3
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED if member == MANIFEST else zipfile.ZIP_STORED
            big = (root / member).stat().st_size > 1 << 31
            with open(root / member, "rb") as src, zf.open(info, "w", force_zip64=big) as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
    return f"{name}={target}"
