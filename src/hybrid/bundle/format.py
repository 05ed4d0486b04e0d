"""The ``.hybrid`` container: an atomic zip writer and a reader that trusts nothing it has not checked.

Layout (DESIGN 2.7)::

    manifest.json                              table of contents (deflated; everything else is stored)
    model/model.onnx                           the IR
    model/model.onnx.data                      external data for large weights (optional)
    platforms/<fingerprint>/<backend>/...      compiled caches per device fingerprint
    calibration/calibration.npz                calibration samples (optional, no pickle)
    libs/*.whl                                 vendored wheels (--include-libs)

Members other than the manifest are stored uncompressed: weights and wheels barely compress, stored
members can be memory-mapped, and a stored member cannot be a compression bomb.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from hybrid.bundle.manifest import MANIFEST_NAME, Manifest, MemberEntry, parse_manifest
from hybrid.bundle.safety import Limits, check_archive, check_member_name, read_member
from hybrid.errors import BundleError
from hybrid.ir import atomic_file

__all__ = ["BundleReader", "BundleWriter", "Source"]

Source = Any  # str | os.PathLike | bytes

_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same inputs give the same bundle bytes
_REGULAR_FILE = 0o100644 << 16


class BundleWriter:
    """Collect members, then write the zip to a temp file next to ``path`` and rename it into place.

    Members are bytes or paths of files (streamed, for wheels and large weights). The manifest is
    built by the caller from :meth:`members` and written first, so ``inspect`` finds it at once.
    """

    def __init__(self) -> None:
        self._members: dict[str, tuple[bytes | Path, MemberEntry]] = {}

    def add_bytes(self, name: str, data: bytes) -> MemberEntry:
        """Add a member from bytes; returns its manifest entry (size and sha256)."""
        check_member_name(name, "writer")
        entry = MemberEntry(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        self._members[name] = (data, entry)
        return entry

    def add_file(self, name: str, path: Path) -> MemberEntry:
        """Add a member from a file on disk; returns its manifest entry (size and sha256)."""
        check_member_name(name, "writer")
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        entry = MemberEntry(sha256=digest.hexdigest(), size=path.stat().st_size)
        self._members[name] = (path, entry)
        return entry

    def members(self) -> dict[str, MemberEntry]:
        """The members added so far, by name."""
        return {name: entry for name, (_, entry) in self._members.items()}

    @staticmethod
    def _info(name: str, compress: bool) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, date_time=_EPOCH)
        info.create_system = 3
        info.external_attr = _REGULAR_FILE
        info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
        return info

    def write(self, path: str | os.PathLike, manifest: Manifest) -> None:
        """Write manifest and members to ``path`` atomically (temp file in the same folder + rename)."""
        with atomic_file(path) as f, zipfile.ZipFile(f, "w", allowZip64=True) as zf:
            zf.writestr(self._info(MANIFEST_NAME, True), manifest.to_json())
            for name, (content, entry) in self._members.items():
                info = self._info(name, False)
                if isinstance(content, bytes):
                    zf.writestr(info, content)
                    continue
                info.file_size = entry.size
                with open(content, "rb") as src, zf.open(info, "w", force_zip64=entry.size > 1 << 31) as out:
                    shutil.copyfileobj(src, out, 1 << 20)


class BundleReader:
    """An opened bundle whose archive structure and manifest have been checked.

    Member bytes are hash-checked against the manifest each time they are read; :meth:`verify`
    checks every member. Use as a context manager (or call :meth:`close`).

    Raises:
        BundleError: 5xx for anything wrong with the file (see ``hybrid.errors`` HYB-501..507).
    """

    def __init__(self, source: Source, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._fp, self.where, self.size = self._open(source)
        try:
            try:
                self._zf = zipfile.ZipFile(self._fp)
            except Exception as e:  # zipfile raises a zoo of types on hostile bytes; all mean "not a bundle"
                raise BundleError("HYB-501", f"{self.where}: not a .hybrid bundle ({type(e).__name__}: "
                                  f"{str(e)[:200]})", "pass a file written by cm.save() or "
                                  "`pyasc bundle create`") from e
            try:
                check_archive(self._zf, self._fp, self.size, self.limits, self.where)
            except BundleError:
                raise
            except Exception as e:  # struct.error, UnicodeDecodeError... from forged headers
                raise BundleError("HYB-501", f"{self.where}: the archive structure is broken "
                                  f"({type(e).__name__}: {str(e)[:200]})", "rebuild the bundle") from e
            self._infos = {i.filename: i for i in self._zf.infolist()}
            self._checked: set[str] = set()
            self.manifest = self._read_manifest()
            self._check_members()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ opening
    @staticmethod
    def _open(source: Source) -> tuple[BinaryIO, str, int]:
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            return io.BytesIO(data), "<bytes>", len(data)
        if not isinstance(source, (str, os.PathLike)):
            raise BundleError("HYB-501", f"expected a .hybrid path or bytes, got {type(source).__name__}",
                              "pass the path of a bundle")
        path = Path(source)
        if not path.is_file():
            raise BundleError("HYB-501", f"bundle {str(path)!r} not found or not a file", "check the path")
        try:
            f = open(path, "rb")  # noqa: SIM115 - kept open for the reader's lifetime, closed by close()
        except OSError as e:
            raise BundleError("HYB-501", f"bundle {str(path)!r} cannot be opened: {e}", "check permissions") from e
        return f, str(path), os.fstat(f.fileno()).st_size

    def _read_manifest(self) -> Manifest:
        info = self._infos.get(MANIFEST_NAME)
        if info is None:
            raise BundleError("HYB-502", f"{self.where}: manifest.json is missing",
                              "pass a file written by cm.save() or `pyasc bundle create`")
        if info.file_size > self.limits.max_manifest_bytes:
            raise BundleError("HYB-505", f"{self.where}: manifest.json is {info.file_size} bytes, over the cap "
                              f"of {self.limits.max_manifest_bytes}", "the bundle is forged")
        data, _ = read_member(self._zf, info, self.where)
        return parse_manifest(data, self.where)

    def _check_members(self) -> None:
        listed = set(self.manifest.members)
        present = set(self._infos) - {MANIFEST_NAME}
        missing = sorted(listed - present)
        if missing:
            raise BundleError("HYB-507", f"{self.where}: members listed in the manifest are missing: "
                              f"{', '.join(missing[:5])}", "the bundle is incomplete; rebuild it")
        extra = sorted(present - listed)
        if extra:
            raise BundleError("HYB-507", f"{self.where}: members not listed in the manifest: "
                              f"{', '.join(extra[:5])}", "someone added files to the bundle; rebuild it")
        for name, entry in self.manifest.members.items():
            if self._infos[name].file_size != entry.size:
                raise BundleError("HYB-503", f"{self.where}: member {name!r} is {self._infos[name].file_size} "
                                  f"bytes, the manifest says {entry.size}", "the bundle was modified; rebuild it")

    # ------------------------------------------------------------------ members
    def read(self, name: str, keep: bool = True) -> bytes:
        """The bytes of member ``name``, checked against the manifest's sha256 (``keep=False``.

        Only check, return b"").

        Raises:
            BundleError: HYB-507 when it is not a member, HYB-503 when its hash differs.
        """
        entry = self.manifest.members.get(name)
        if entry is None or name not in self._infos:
            raise BundleError("HYB-507", f"{self.where}: member {name!r} is not in the bundle",
                              "the bundle is incomplete; rebuild it")
        data, digest = read_member(self._zf, self._infos[name], self.where, keep)
        if digest != entry.sha256:
            raise BundleError("HYB-503", f"{self.where}: member {name!r} has sha256 {digest[:16]}..., the manifest "
                              f"says {entry.sha256[:16]}...", "the bundle was modified or corrupted; rebuild it")
        self._checked.add(name)
        return data

    def verify(self) -> int:
        """Check the sha256 of every member not read yet (streaming, nothing kept).

        Return the bundle's member bytes.
        """
        for name in self.manifest.members:
            if name not in self._checked:
                self.read(name, keep=False)
        return sum(e.size for e in self.manifest.members.values())

    def iter_members(self) -> Iterator[tuple[str, int, int]]:
        """(name, uncompressed size, compressed size) of every member, the manifest first."""
        for name, info in self._infos.items():
            yield name, info.file_size, info.compress_size

    def close(self) -> None:
        """Close the archive."""
        zf = getattr(self, "_zf", None)
        if zf is not None:
            zf.close()
        self._fp.close()

    def __enter__(self) -> BundleReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
