"""Models that travel with a Ray Serve deployment: packed on the driver, checked and cached on each node.

A replica may start on any node, long after the driver that deployed it has gone (``pyasc serve --ray``
restarted replicas, ``serve deploy config.yaml``), so it cannot read the driver's path. Each model version
is therefore packed into a :class:`ModelPackage` holding the file's bytes and their SHA-256, and the
packages are the deployment's init arguments. Serve's controller keeps init arguments (serialized into
its checkpoint in the GCS) for the application's life and hands them to every replica it starts; unlike
object references passed to ``.bind()`` they do not die with the driver, and unlike a local
``working_dir`` they have no 100 MiB cap (:data:`MAX_INLINE` bounds them).

On arrival a replica checks the bytes against the digest (HYB-503 when they differ) and writes them once
per node into a cache folder keyed by the digest (``$PYASC_RAY_CACHE``, else
``<tmp>/pyasc-ray-models``): later replicas on that node, and replicas restarted there, use the cached
file after checking its digest again. A ``.hybrid`` bundle also checks its own member hashes when loaded.

Larger models, or files the nodes can read anyway, travel by URI instead (:func:`package_uri`:
``file://``, ``http(s)://``, or any scheme fsspec knows): the package carries the URI and the digest, and
each node reads the file once into its cache and checks it (HYB-503 when it changed since the deployment).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from hybrid.errors import BundleError, ServingError
from hybrid.serve.core.repository import ModelSource

__all__ = ["CACHE_ENV", "MAX_INLINE", "ModelPackage", "cache_dir", "is_uri", "materialize", "pack", "package_uri"]

logger = logging.getLogger("hybrid.serve")

CACHE_ENV = "PYASC_RAY_CACHE"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")  # the server's model-name rule
MAX_INLINE = 1 << 30  # bytes of all models carried in the init arguments (Serve keeps them in its checkpoint)


@dataclass(frozen=True, slots=True)
class ModelPackage:
    """One model version and its file's bytes, or the URI every node reads them from.

    Attributes:
        source: The discovered version (its ``path`` is the driver's or the URI, for messages only).
        suffix: The file's suffix ('.hybrid' or '.onnx'): how the replica loads it.
        sha256: Hex digest of the file's bytes.
        data: The file's bytes, or None when the nodes read them from ``uri``.
        uri: Where the nodes read the file when ``data`` is None.
        nbytes: The file's size.
    """

    source: ModelSource
    suffix: str
    sha256: str
    data: bytes | None
    uri: str | None = None
    nbytes: int = 0

    @property
    def size(self) -> int:
        """The file's size in bytes."""
        return len(self.data) if self.data is not None else self.nbytes

    def __repr__(self) -> str:  # never the bytes
        where = f", from {self.uri}" if self.uri else ""
        return (f"ModelPackage({self.source.name}:{self.source.version}, {self.size} bytes{where}, "
                f"sha256={self.sha256[:12]}...)")


def pack(sources: Sequence[ModelSource], max_inline: int = MAX_INLINE) -> list[ModelPackage]:
    """Read every source's file and digest it.

    Raises:
        ServingError: HYB-707 when a file cannot be read, the models together exceed ``max_inline``, or a model
            has sequence batching (its state would not follow its sequence from replica to replica).
    """
    packages: list[ModelPackage] = []
    total = 0
    for source in sources:
        if source.config is not None and source.config.HasField("sequence_batching"):
            raise ServingError("HYB-707", f"model {source.name!r} version {source.version} has sequence batching: "
                               "a sequence's state lives in the process that served its last request, and Ray "
                               "routes each call to any replica", "serve stateful models without --ray")
        path = Path(source.path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ServingError("HYB-707", f"cannot read model {source.name!r} version {source.version} from "
                               f"{path}: {e.strerror or e}", "check the file and its permissions") from e
        total += len(data)
        if total > max_inline:
            raise ServingError("HYB-707", f"the models add up to more than {max_inline} bytes (at "
                               f"{source.name!r} version {source.version}), more than a deployment carries "
                               "in its init arguments", "serve fewer models per application, or put the "
                               "repository on a file system every node mounts and deploy from there")
        if path.suffix == ".onnx":
            _refuse_external_data(source, data)
        packages.append(ModelPackage(source, path.suffix, hashlib.sha256(data).hexdigest(), data, nbytes=len(data)))
    return packages


def _refuse_external_data(source: ModelSource, data: bytes) -> None:
    """An ONNX file whose weights lie in other files cannot travel as one file."""
    import onnx

    model = onnx.load_from_string(data)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        raise ServingError("HYB-707", f"model {source.name!r} version {source.version} ({source.path}) keeps "
                           "its weights in external data files, which a Ray deployment does not carry",
                           "package it as a bundle (pyasc bundle create model.onnx -o model.hybrid): a bundle "
                           "holds its external data")


def cache_dir() -> Path:
    """This node's cache folder for shipped models (``$PYASC_RAY_CACHE``, else ``<tmp>/pyasc-ray-models``)."""
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "pyasc-ray-models")


def _digest_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_uri(model: str | Path) -> bool:
    """Whether a served model is named by a URI (``scheme://...``, optionally ``NAME=`` before it)."""
    return isinstance(model, str) and "://" in model


def _open_uri(uri: str) -> BinaryIO:
    scheme = uri.partition("://")[0].lower()
    try:
        if scheme in ("file", "http", "https"):
            return urllib.request.urlopen(uri, timeout=60)  # file, http(s) only: checked above
        try:
            import fsspec
        except ImportError as e:
            raise ServingError("HYB-707", f"{uri}: reading {scheme}:// needs fsspec (and its {scheme} driver)",
                               "pip install fsspec s3fs (or gcsfs, adlfs...), or use http(s):// or file://") from e
        return fsspec.open(uri, "rb").open()
    except OSError as e:
        raise ServingError("HYB-707", f"cannot read the model at {uri}: {e}", "check the URI and that every node "
                           "can reach it") from e


def _fetch(uri: str, folder: Path, suffix: str) -> tuple[Path, str, int]:
    """Stream ``uri`` into a temp file in ``folder``; return it, its SHA-256 and size."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".incoming-", suffix=suffix)
    digest, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out, _open_uri(uri) as src:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp), digest.hexdigest(), size


def package_uri(model: str, folder: Path | None = None) -> ModelPackage:
    """A package whose nodes read the file from a URI, given as ``[NAME=]URI[#sha256=HEX]``.

    Schemes: ``file://``, ``http(s)://``, or any that fsspec knows (``s3://``, ``gs://``...). The model is served
    as version 1 under NAME (default: the file's stem). Without the digest the driver reads the file once to
    take it.

    Raises:
        ServingError: HYB-707 for a bad name or suffix, or a URI that cannot be read.
    """
    from urllib.parse import urlsplit

    name, sep, uri = model.partition("=")
    if not sep or "://" in name:
        name, uri = "", model
    uri, _, fragment = uri.partition("#")
    suffix = Path(urlsplit(uri).path).suffix
    name = name or Path(urlsplit(uri).path).stem
    if suffix not in (".hybrid", ".onnx") or not _NAME_RE.fullmatch(name):
        raise ServingError("HYB-707", f"{model}: expected [NAME=]URI of a .hybrid or .onnx file (NAME: letters, "
                           "digits, '_', '-', '.')", "e.g. resnet=s3://bucket/models/resnet.hybrid")
    sha256 = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else ""
    size = 0
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        tmp, sha256, size = _fetch(uri, folder or cache_dir(), suffix)
        tmp.unlink()
    return ModelPackage(ModelSource(name, "1", uri), suffix, sha256, None, uri, size)


def materialize(package: ModelPackage, folder: Path | None = None) -> ModelSource:
    """Check a package's bytes (or read them from its URI) into this node's cache once; the source to load.

    Args:
        package: What the deployment carried.
        folder: The cache folder (default :func:`cache_dir`).

    Raises:
        BundleError: HYB-503 when the bytes do not match the digest taken on the driver.
        ServingError: HYB-707 when the URI cannot be read.
    """
    where = f"model {package.source.name!r} version {package.source.version}"
    mismatch = (f"{where}: the bytes that arrived do not match the SHA-256 taken on the driver "
                f"({package.sha256})")
    if package.data is not None and hashlib.sha256(package.data).hexdigest() != package.sha256:
        raise BundleError("HYB-503", mismatch, "redeploy the application")
    root = folder or cache_dir()
    target = root / f"{package.sha256}{package.suffix}"
    if target.is_file() and _digest_of(target) == package.sha256:
        logger.info("%s: using the cached file %s", where, target)
    elif package.data is None:
        tmp, digest, size = _fetch(str(package.uri), root, package.suffix)
        if digest != package.sha256:
            tmp.unlink()
            raise BundleError("HYB-503", f"{mismatch}; read from {package.uri}",
                              "the file at the URI changed since the deployment: redeploy it")
        os.replace(tmp, target)
        logger.info("%s: %d bytes read from %s, checked and cached at %s", where, size, package.uri, target)
    else:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".incoming-", suffix=package.suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(package.data)
            os.replace(tmp, target)  # atomic: a concurrent replica on this node sees the old file or this one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        logger.info("%s: %d bytes checked (sha256 %s) and cached at %s", where, package.size,
                    package.sha256[:12], target)
    return dataclasses.replace(package.source, path=str(target))
