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
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hybrid.errors import BundleError, ServingError
from hybrid.serve.repository import ModelSource

__all__ = ["CACHE_ENV", "MAX_INLINE", "ModelPackage", "cache_dir", "materialize", "pack"]

logger = logging.getLogger("hybrid.serve")

CACHE_ENV = "PYASC_RAY_CACHE"
MAX_INLINE = 1 << 30  # bytes of all models carried in the init arguments (Serve keeps them in its checkpoint)


@dataclass(frozen=True, slots=True)
class ModelPackage:
    """One model version and its file's bytes, as the deployment carries it.

    Attributes:
        source: The discovered version (its ``path`` is the driver's, for messages only).
        suffix: The file's suffix ('.hybrid' or '.onnx'): how the replica loads it.
        sha256: Hex digest of ``data``.
        data: The file's bytes.
    """

    source: ModelSource
    suffix: str
    sha256: str
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:  # never the bytes
        return (f"ModelPackage({self.source.name}:{self.source.version}, {self.size} bytes, "
                f"sha256={self.sha256[:12]}...)")


def pack(sources: Sequence[ModelSource], max_inline: int = MAX_INLINE) -> list[ModelPackage]:
    """Read every source's file and digest it.

    Raises:
        ServingError: HYB-707 when a file cannot be read or the models together exceed ``max_inline``.
    """
    packages: list[ModelPackage] = []
    total = 0
    for source in sources:
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
        packages.append(ModelPackage(source, path.suffix, hashlib.sha256(data).hexdigest(), data))
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


def materialize(package: ModelPackage, folder: Path | None = None) -> ModelSource:
    """Check a package's bytes, put them in this node's cache (once), return the source to load.

    Args:
        package: What the deployment carried.
        folder: The cache folder (default :func:`cache_dir`).

    Raises:
        BundleError: HYB-503 when the bytes do not match the digest taken on the driver.
    """
    where = f"model {package.source.name!r} version {package.source.version}"
    if hashlib.sha256(package.data).hexdigest() != package.sha256:
        raise BundleError("HYB-503", f"{where}: the bytes that arrived do not match the SHA-256 taken on the "
                          f"driver ({package.sha256})", "redeploy the application")
    root = folder or cache_dir()
    target = root / f"{package.sha256}{package.suffix}"
    if target.is_file() and _digest_of(target) == package.sha256:
        logger.info("%s: using the cached file %s", where, target)
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
