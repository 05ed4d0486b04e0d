"""Checks that make reading an untrusted ``.hybrid`` zip safe.

Everything here treats the bytes as hostile: member names are checked against an allowlist (no absolute
paths, no ``..``, no hidden or odd characters), link and special-file entries are refused, duplicate
names (also after Unicode and case folding) are refused, and the archive's declared sizes are checked
before anything is decompressed: member count, total size and compression ratio are capped (zip
bombs), local headers must agree with the central directory (forged sizes), and no two entries may
share bytes (the overlapping-entry bomb of CVE-2024-0450, which Python 3.11.7's zipfile accepts).
Nothing is ever extracted to disk; members are read into memory with their size enforced.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import stat
import struct
import unicodedata
import zipfile
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from hybrid.errors import BundleError

__all__ = [
    "Limits",
    "check_archive",
    "check_member_name",
    "external_data_member",
    "read_member",
]

# one path component: starts with a letter, digit or '_' (so never '.', '..' or a hidden file) and uses
# only characters that mean the same thing on every file system
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+=-]{0,254}$")
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_MAGIC = b"PK\x03\x04"
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps applied before a bundle's bytes are trusted (zip-bomb and forged-size protection).

    Attributes:
        max_members: Most entries in the archive.
        max_total_bytes: Most uncompressed bytes over all members.
        max_member_bytes: Most uncompressed bytes of one member.
        max_ratio: Largest uncompressed/compressed ratio of a member larger than ``ratio_floor_bytes``.
        ratio_floor_bytes: Members up to this size are exempt from the ratio cap (tiny files compress
            well and cannot be a bomb).
        max_manifest_bytes: Most bytes of manifest.json.
        max_name_length: Longest member name.
        max_depth: Most path components in a member name.
    """

    max_members: int = 10_000
    max_total_bytes: int = 32 << 30
    max_member_bytes: int = 16 << 30
    max_ratio: int = 100
    ratio_floor_bytes: int = 1 << 20
    max_manifest_bytes: int = 8 << 20
    max_name_length: int = 512
    max_depth: int = 8


def check_member_name(name: str, where: str, limits: Limits = Limits()) -> str:
    """Return ``name`` if it is a safe relative member path, else raise HYB-504."""
    if not isinstance(name, str) or not name:
        raise BundleError("HYB-504", f"{where}: expected a member name, found {name!r}",
                          "the bundle was not written by hybrid; rebuild it with `pyasc bundle create`")
    problem = None
    if len(name) > limits.max_name_length:
        problem = f"longer than {limits.max_name_length} characters"
    elif name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        problem = "an absolute path"
    else:
        parts = name.split("/")
        if any(p == ".." for p in parts) or any(".." in p.split("\\") for p in parts):
            problem = "a '..' component that leaves the bundle"
        elif len(parts) > limits.max_depth:
            problem = f"nested deeper than {limits.max_depth} folders"
        elif not all(_COMPONENT.match(p) for p in parts):
            problem = "characters outside [A-Za-z0-9._+=-], an empty or hidden component"
    if problem:
        raise BundleError("HYB-504", f"{where}: member name {name!r} is {problem}",
                          "the bundle may be malicious; do not extract it by hand, rebuild it from the model")
    return name


def _kind_of(info: zipfile.ZipInfo) -> str | None:
    """What an entry is, if it is not a plain file: 'directory', 'symbolic link', ..."""
    if info.filename.endswith("/") or info.external_attr & 0x10:  # 0x10: MS-DOS directory attribute
        return "directory"
    mode = info.external_attr >> 16
    if info.create_system == 3 and mode:  # unix: the high 16 bits are st_mode
        kind = stat.S_IFMT(mode)
        names = {stat.S_IFLNK: "symbolic link", stat.S_IFDIR: "directory", stat.S_IFCHR: "character device",
                 stat.S_IFBLK: "block device", stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}
        if kind not in (0, stat.S_IFREG):  # 0: no type bits (Python's zipfile writes 0o600 alone)
            # zip has no hard-link type: anything but a regular file (or an unset mode) is refused
            return names.get(kind, f"special file (mode {oct(mode)})")
    return None


def _local_header(fp: BinaryIO, info: zipfile.ZipInfo, file_size: int, where: str) -> int:
    """Read the entry's local header; return where its data ends (incl. a data descriptor) or raise."""
    if info.header_offset < 0 or info.header_offset + _LOCAL_HEADER.size > file_size:
        raise BundleError("HYB-505", f"{where}: member {info.filename!r} claims a header at offset "
                          f"{info.header_offset}, outside the {file_size}-byte file",
                          "the archive's sizes are forged or it is truncated")
    fp.seek(info.header_offset)
    raw = fp.read(_LOCAL_HEADER.size)
    fields = _LOCAL_HEADER.unpack(raw)
    if fields[0] != _LOCAL_MAGIC:
        raise BundleError("HYB-501", f"{where}: member {info.filename!r} has no local header at offset "
                          f"{info.header_offset}", "the file is truncated or not a bundle")
    flags, crc, csize, usize, name_len, extra_len = fields[3], fields[7], fields[8], fields[9], fields[10], fields[11]
    name = fp.read(name_len)
    encoding = "utf-8" if flags & 0x800 else "cp437"
    if name.decode(encoding, errors="replace") != info.orig_filename:
        raise BundleError("HYB-505", f"{where}: member {info.orig_filename!r} is named "
                          f"{name.decode(encoding, errors='replace')!r} in its local header",
                          "two readers would see different files: the archive is forged")
    # with bit 3 set the sizes follow the data; 0xFFFFFFFF means they are in a zip64 extra field
    sizes_here = not flags & 0x08 and 0xFFFFFFFF not in (csize, usize)
    if sizes_here and (csize, usize, crc) != (info.compress_size, info.file_size, info.CRC):
        raise BundleError("HYB-505", f"{where}: member {info.filename!r}: the local header says "
                          f"{csize}/{usize} bytes (compressed/uncompressed), the central directory "
                          f"{info.compress_size}/{info.file_size}",
                          "the sizes are forged: readers would disagree on the member's content")
    start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    return start + info.compress_size + (12 if flags & 0x08 else 0)


def check_archive(zf: zipfile.ZipFile, fp: BinaryIO, file_size: int, limits: Limits, where: str) -> None:
    """Check every entry of an opened archive before any member is decompressed.

    Raises:
        BundleError: HYB-504 (unsafe name, link or special entry, duplicate), HYB-505 (count, size,
            ratio, forged or overlapping sizes), HYB-501 (encrypted or unknown compression).
    """
    infos = zf.infolist()
    if len(infos) > limits.max_members:
        raise BundleError("HYB-505", f"{where}: expected at most {limits.max_members} members, found "
                          f"{len(infos)}", "raise the limit only for a bundle you trust")
    seen: dict[str, str] = {}
    total = 0
    spans: list[tuple[int, int, str]] = []
    for info in infos:
        name = info.filename
        check_member_name(name, where, limits)
        kind = _kind_of(info)
        if kind:
            raise BundleError("HYB-504", f"{where}: member {name!r} is a {kind}, expected a regular file",
                              "links and special files could point outside the bundle")
        key = unicodedata.normalize("NFC", name).casefold()
        if key in seen:
            raise BundleError("HYB-504", f"{where}: member {name!r} appears twice (also as {seen[key]!r})",
                              "readers would disagree on which copy counts: the archive is forged")
        seen[key] = name
        if info.flag_bits & 0x1:
            raise BundleError("HYB-501", f"{where}: member {name!r} is encrypted", "bundles are never encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise BundleError("HYB-501", f"{where}: member {name!r} uses compression method "
                              f"{info.compress_type}, expected stored (0) or deflated (8)",
                              "rebuild the bundle with `pyasc bundle create`")
        if info.file_size > limits.max_member_bytes:
            raise BundleError("HYB-505", f"{where}: member {name!r} is {info.file_size} bytes uncompressed, "
                              f"over the cap of {limits.max_member_bytes}", "raise the limit only for a trusted "
                              "bundle")
        total += info.file_size
        if total > limits.max_total_bytes:
            raise BundleError("HYB-505", f"{where}: members add up to more than {limits.max_total_bytes} bytes "
                              "uncompressed", "raise the limit only for a bundle you trust")
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise BundleError("HYB-505", f"{where}: stored member {name!r} declares {info.file_size} bytes but "
                              f"{info.compress_size} stored", "the sizes are forged")
        if info.file_size > limits.ratio_floor_bytes and (
                info.file_size > limits.max_ratio * max(info.compress_size, 1)):
            raise BundleError("HYB-505", f"{where}: member {name!r} expands {info.compress_size} bytes to "
                              f"{info.file_size} (ratio over {limits.max_ratio})", "this is a zip bomb")
        spans.append((info.header_offset, _local_header(fp, info, file_size, where), name))
    directory_start = getattr(zf, "start_dir", file_size)  # CPython's offset of the central directory
    spans.sort()
    for (_, end, name), (next_start, _, next_name) in itertools.pairwise(spans):
        if end > next_start:
            raise BundleError("HYB-505", f"{where}: members {name!r} and {next_name!r} overlap (one's data "
                              f"runs to byte {end}, the next starts at {next_start})",
                              "overlapping entries are a zip bomb (CVE-2024-0450)")
    if spans and spans[-1][1] > min(directory_start, file_size):
        raise BundleError("HYB-505", f"{where}: member {spans[-1][2]!r} runs to byte {spans[-1][1]}, into the "
                          f"central directory at {directory_start}", "the sizes are forged")


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, keep: bool = True) -> tuple[bytes, str]:
    """Decompress one member with its declared size enforced; return (bytes, sha256 hex).

    With ``keep=False`` the bytes are only hashed (streaming) and ``b""`` is returned.

    Raises:
        BundleError: HYB-505 when the data is longer or shorter than declared, HYB-503 when the zip CRC
            fails, HYB-501 when the compressed stream is broken.
    """
    digest = hashlib.sha256()
    parts: list[bytes] = []
    count = 0
    try:
        with zf.open(info) as f:
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    break
                count += len(chunk)
                if count > info.file_size:
                    raise BundleError("HYB-505", f"{where}: member {info.filename!r} decompresses to more than "
                                      f"its declared {info.file_size} bytes", "the sizes are forged")
                digest.update(chunk)
                if keep:
                    parts.append(chunk)
    except BundleError:
        raise
    except zipfile.BadZipFile as e:
        code = "HYB-503" if "CRC" in str(e) else "HYB-501"
        raise BundleError(code, f"{where}: member {info.filename!r} is corrupt: {e}",
                          "the bundle was modified or damaged; rebuild or re-download it") from e
    except (zlib.error, EOFError, OSError, ValueError, NotImplementedError, RuntimeError) as e:
        raise BundleError("HYB-501", f"{where}: member {info.filename!r} cannot be decompressed: "
                          f"{type(e).__name__}: {e}", "the bundle is damaged; rebuild or re-download it") from e
    if count != info.file_size:
        raise BundleError("HYB-505", f"{where}: member {info.filename!r} holds {count} bytes, its header "
                          f"declares {info.file_size}", "the sizes are forged or the file is truncated")
    return b"".join(parts), digest.hexdigest()


def external_data_member(location: str, model_dir: str, where: str) -> str:
    """The bundle member an ONNX tensor's external-data ``location`` names, confined to ``model_dir``.

    This is the bundle's answer to CVE-2022-25882 and CVE-2024-27318 (external data that escapes the
    model folder): the location must be a plain relative name; it is never resolved on a file system.

    Raises:
        BundleError: HYB-504 for an absolute path, '..', a backslash, a drive or any odd character.
    """
    if not isinstance(location, str) or "\\" in location or "\x00" in location or ":" in location:
        raise BundleError("HYB-504", f"{where}: external data location {location!r} is not a plain relative "
                          "name", "keep external data next to model.onnx (CVE-2022-25882, CVE-2024-27318)")
    try:
        check_member_name(location, where)
    except BundleError as e:
        raise BundleError("HYB-504", f"{where}: external data location {location!r} escapes the model folder "
                          f"or is not a plain name ({e.message.split(': ', 1)[-1]})",
                          "external data must name a file inside the bundle's model folder "
                          "(CVE-2022-25882, CVE-2024-27318)") from e
    return f"{model_dir}/{location}" if model_dir else location
