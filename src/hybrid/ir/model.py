"""``hybrid.Model``: an ONNX model held with onnx-ir, plus what hybrid needs to know about it.

A Model is immutable from the outside: passes build a new Model from a new onnx-ir graph. The
serialized form is computed once and cached, and a model loaded from a ModelProto keeps that proto
so that running an unmodified model never pays for a round trip through the IR.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import onnx
import onnx_ir as ir
from onnx import external_data_helper

from hybrid.errors import ModelError
from hybrid.ir.checker import check_graph
from hybrid.ir.signature import Signature, signature_of

__all__ = ["Model", "atomic_write_bytes"]

ModelSource = Any  # str | os.PathLike | bytes | onnx.ModelProto | onnx_ir.Model | Model


class Model:
    """An ONNX model in hybrid's IR.

    Build one with :meth:`Model.load`. ``model.ir`` is the onnx-ir model (for passes),
    ``model.signature`` its inputs and outputs, ``model.to_onnx()`` the standard ModelProto.
    """

    __slots__ = ("_bytes", "_ir", "_proto", "_sha256", "_signature", "base_dir", "metadata", "name")

    def __init__(self, ir_model: ir.Model | None = None, *, proto: onnx.ModelProto | None = None,
                 base_dir: str | None = None, name: str | None = None) -> None:
        if ir_model is None and proto is None:
            raise ValueError("Model needs an onnx_ir.Model or a ModelProto")
        self._ir = ir_model
        self._proto = proto
        self._bytes: bytes | None = None
        self._signature: Signature | None = None
        self._sha256: str | None = None
        self.base_dir = base_dir
        self.name = name or "model"
        # what passes learned about the model, e.g. metadata['quantization_report'] (not serialized)
        self.metadata: dict[str, Any] = {}

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(cls, source: ModelSource, *, base_dir: str | os.PathLike | None = None) -> Model:
        """Load a model from a path, bytes, an ``onnx.ModelProto``, an ``onnx_ir.Model`` or a Model.

        External data is read only from files inside the model's folder (``base_dir`` for bytes and
        protos): absolute paths, ``..`` and symbolic links that leave the folder are refused.

        Raises:
            ModelError: HYB-201 (no such file), HYB-202 (not an ONNX model), HYB-203 (unsupported
                source type), HYB-204 (unsafe external data), HYB-205 (missing external data file).
        """
        if isinstance(source, Model):
            return source
        if isinstance(source, ir.Model):
            return cls(source, base_dir=_opt_str(base_dir), name=source.graph.name or None)
        if isinstance(source, onnx.ModelProto):
            base = _opt_str(base_dir)
            if _external_tensors(source):
                source = _copy_with_external_data(source, base, "<ModelProto>")
            return cls(proto=source, base_dir=base, name=source.graph.name or None)
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            proto = _parse(data, "<bytes>")
            base = _opt_str(base_dir)
            model = cls(proto=proto, base_dir=base, name=proto.graph.name or None)
            if _external_tensors(proto):
                _load_external(proto, base, "<bytes>")
            else:
                model._bytes = data  # already serialized: compiling never re-serializes it
            return model
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            if not path.is_file():
                raise ModelError("HYB-201", f"model file {str(path)!r} not found",
                                 "check the path; hybrid.Model.load takes an .onnx file")
            data = path.read_bytes()
            proto = _parse(data, str(path))
            base = str(Path(base_dir) if base_dir else path.resolve().parent)
            model = cls(proto=proto, base_dir=base, name=path.stem)
            if _external_tensors(proto):
                _load_external(proto, base, str(path))
            else:
                model._bytes = data  # already serialized: compiling never re-serializes it
            return model
        raise ModelError("HYB-203", f"expected a path, bytes, onnx.ModelProto, onnx_ir.Model or "
                         f"hybrid.Model, got {type(source).__name__}",
                         "export torch modules with hybrid.export(module, input_shape=...)")

    # ----------------------------------------------------------------- views
    @property
    def ir(self) -> ir.Model:
        """The onnx-ir model. Treat it as read-only; passes copy it before editing."""
        if self._ir is None:
            self._ir = ir.serde.deserialize_model(self.to_onnx())
        return self._ir

    @property
    def graph(self) -> ir.Graph:
        """The main graph of :attr:`ir` (read-only, as :attr:`ir` is)."""
        return self.ir.graph

    @property
    def signature(self) -> Signature:
        """Inputs (without initializer-backed ones) and outputs, with symbolic dims."""
        if self._signature is None:
            self._signature = signature_of(self.ir.graph)
        return self._signature

    @property
    def opset(self) -> int:
        """The default-domain opset version the model imports."""
        if self._proto is not None:
            for imp in self._proto.opset_import:
                if imp.domain in ("", "ai.onnx"):
                    return imp.version
            return 1
        return self.ir.opset_imports.get("", 1)

    def to_onnx(self) -> onnx.ModelProto:
        """Return the model as a standard ``onnx.ModelProto`` (shared, do not mutate)."""
        if self._proto is None:
            if self._ir is not None:
                self._proto = ir.serde.serialize_model(self._ir)
            else:  # released after a compile (release_parsed): the bytes are the model
                assert self._bytes is not None
                self._proto = onnx.ModelProto.FromString(self._bytes)
        return self._proto

    def to_bytes(self) -> bytes:
        """Return the serialized ModelProto (cached)."""
        if self._bytes is None:
            self._bytes = self.to_onnx().SerializeToString()
        return self._bytes

    def release_parsed(self) -> None:
        """Drop the parsed forms (the ModelProto, the onnx-ir model) and keep the serialized bytes.

        Once a backend has compiled the model it holds its own copy of the weights (ONNX Runtime keeps these very
        bytes), so a parsed copy would be one more: 90 MB for a MiniLM (issue 55). What needs them later parses
        the bytes again. A model that was never serialized keeps them.
        """
        if self._bytes is not None:
            self._proto = self._ir = None

    @property
    def sha256(self) -> str:
        """Hex sha256 of the serialized model: the model's identity in caches."""
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self.to_bytes()).hexdigest()
        return self._sha256

    def save(self, path: str | os.PathLike) -> None:
        """Write the model as an .onnx file, atomically (temp file, then rename)."""
        atomic_write_bytes(Path(path), self.to_bytes())

    def __repr__(self) -> str:
        return f"<hybrid.Model {self.name!r} opset={self.opset} {self.signature}>"


# ------------------------------------------------------------------ helpers
def _umask() -> int:
    """The process's umask: from /proc on Linux (no side effect), else by setting it and putting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` only when the block ends without an error.

    It is written to a temp file in the same folder, synced, then renamed over ``path``; on an error the
    temp file is removed and ``path`` is untouched.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_file`)."""
    with atomic_file(path) as f:
        f.write(data)


def _opt_str(p: str | os.PathLike | None) -> str | None:
    return None if p is None else str(Path(p).resolve())


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError and sometimes RuntimeError
        raise ModelError("HYB-202", f"{where}: expected a serialized ONNX ModelProto, the bytes do not "
                         f"parse ({e})", "check that the file is an .onnx model and not truncated") from e
    if not proto.HasField("graph"):
        raise ModelError("HYB-202", f"{where}: expected an ONNX ModelProto with a graph, found none",
                         "check that the file is an .onnx model")
    check_graph(proto, data, where)
    return proto


def _external_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in external_data_helper._get_all_tensors(proto)
            if external_data_helper.uses_external_data(t)]


def safe_external_path(base_dir: str, location: str, where: str) -> Path:
    """Resolve an external-data location inside ``base_dir`` or raise HYB-204."""
    loc = Path(location)
    if loc.is_absolute() or location.startswith(("/", "\\")) or ".." in loc.parts or ":" in location:
        raise ModelError("HYB-204", f"{where}: external data location {location!r} leaves the model "
                         f"folder (absolute path or '..')",
                         "keep external data files next to the model with a plain relative name")
    base = Path(base_dir).resolve()
    full = (base / loc).resolve()
    if base != full and base not in full.parents:
        raise ModelError("HYB-204", f"{where}: external data location {location!r} resolves to "
                         f"{str(full)!r}, outside the model folder {str(base)!r} (symbolic link?)",
                         "replace the link with the data file itself")
    if not full.is_file():
        raise ModelError("HYB-205", f"{where}: external data file {location!r} not found in {str(base)!r}",
                         "copy the data file next to the model")
    return full


def _load_external(proto: onnx.ModelProto, base_dir: str | None, where: str) -> None:
    if base_dir is None:
        raise ModelError("HYB-205", f"{where}: the model stores tensors as external data but no folder "
                         "to read them from was given", "pass base_dir=... or load the model from its path")
    for tensor in _external_tensors(proto):
        info = external_data_helper.ExternalDataInfo(tensor)
        full = safe_external_path(base_dir, info.location, where)
        size = full.stat().st_size
        offset = info.offset or 0
        length = info.length if info.length is not None else size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise ModelError("HYB-205", f"{where}: external data for {tensor.name!r} asks for bytes "
                             f"{offset}..{offset + length} of {info.location!r}, which has {size}",
                             "the data file is truncated or does not belong to this model")
        with open(full, "rb") as f:
            f.seek(offset)
            tensor.raw_data = f.read(length)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def _copy_with_external_data(proto: onnx.ModelProto, base_dir: str | None, where: str) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    _load_external(copy, base_dir, where)
    return copy
