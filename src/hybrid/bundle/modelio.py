"""The model inside a bundle: ``model/model.onnx`` plus external data for large weights.

External data is resolved from bundle members in memory and never from the file system, so a
``location`` such as ``../../etc/passwd`` or ``/etc/shadow`` (CVE-2022-25882, CVE-2024-27318) can
only fail, and offsets and lengths are checked against the member they point into (forged sizes).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import external_data_helper

from hybrid.bundle.safety import external_data_member
from hybrid.errors import BundleError, HybridError
from hybrid.ir import Model

__all__ = ["MODEL_DIR", "MODEL_PATH", "parse_model_bytes", "resolve_external_data", "split_external_data"]

MODEL_DIR = "model"
MODEL_PATH = f"{MODEL_DIR}/model.onnx"
DATA_NAME = "model.onnx.data"
_ALIGN = 64


def _external_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in external_data_helper._get_all_tensors(proto) if external_data_helper.uses_external_data(t)]


def split_external_data(model: Model, min_model_bytes: int, min_tensor_bytes: int) -> tuple[bytes, bytes | None]:
    """Serialize ``model``.

    When its weights exceed ``min_model_bytes``, move every tensor of at least ``min_tensor_bytes`` into one external
    data blob (aligned offsets). Returns (model bytes, blob).
    """
    proto = model.to_onnx()
    tensors = [t for t in external_data_helper._get_all_tensors(proto)
               if t.HasField("raw_data") and not t.HasField("data_location")]
    if sum(len(t.raw_data) for t in tensors) < min_model_bytes:
        return model.to_bytes(), None
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    blob = bytearray()
    for t in external_data_helper._get_all_tensors(copy):
        if not t.HasField("raw_data") or t.HasField("data_location") or len(t.raw_data) < min_tensor_bytes:
            continue
        blob.extend(b"\0" * (-len(blob) % _ALIGN))
        offset = len(blob)
        blob.extend(t.raw_data)
        external_data_helper.set_external_data(t, DATA_NAME, offset, len(t.raw_data))
        t.data_location = onnx.TensorProto.EXTERNAL
        t.ClearField("raw_data")
    return copy.SerializeToString(), bytes(blob)


def parse_model_bytes(data: bytes, where: str) -> onnx.ModelProto:
    """Parse a ModelProto from bundle bytes (BundleError HYB-501 when they do not parse)."""
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError, RuntimeError, RecursionError on hostile bytes
        raise BundleError("HYB-501", f"{where}: not a serialized ONNX model ({type(e).__name__})",
                          "the bundle is damaged; rebuild it") from e
    if not proto.HasField("graph"):
        raise BundleError("HYB-501", f"{where}: the ONNX model has no graph", "the bundle is damaged; rebuild it")
    return proto


def resolve_external_data(proto: onnx.ModelProto, model_dir: str, read: Callable[[str], bytes], where: str,
                          allowed: set[str]) -> list[str]:
    """Fill every external tensor of ``proto`` from bundle members; return the members used.

    Args:
        proto: Parsed model, modified in place.
        model_dir: The folder locations are relative to ('model').
        read: Returns a member's hash-checked bytes.
        where: For messages.
        allowed: Members the manifest declares as this model's external data.

    Raises:
        BundleError: HYB-504 for an unsafe location, HYB-507 for an undeclared member, HYB-505 for an
            offset/length outside the member.
    """
    used: dict[str, bytes] = {}
    for tensor in _external_tensors(proto):
        try:
            info = external_data_helper.ExternalDataInfo(tensor)
        except (ValueError, TypeError) as e:
            raise BundleError("HYB-502", f"{where}: tensor {tensor.name!r} has malformed external data ({e})",
                              "the bundle is damaged; rebuild it") from e
        member = external_data_member(info.location, model_dir, f"{where}: tensor {tensor.name!r}")
        if member not in allowed:
            raise BundleError("HYB-507", f"{where}: tensor {tensor.name!r} points to {member!r}, which the "
                              "manifest does not declare as external data", "the bundle is damaged; rebuild it")
        if member not in used:
            used[member] = read(member)
        data = used[member]
        offset = info.offset or 0
        length = info.length if info.length is not None else len(data) - offset
        if offset < 0 or length < 0 or offset + length > len(data):
            raise BundleError("HYB-505", f"{where}: tensor {tensor.name!r} asks for bytes {offset}..{offset + length}"
                              f" of {member!r}, which has {len(data)}", "the sizes are forged or the data truncated")
        tensor.raw_data = data[offset:offset + length]
        del tensor.external_data[:]
        tensor.ClearField("data_location")
    return list(used)


def model_from_proto(proto: onnx.ModelProto, name: str, where: str) -> Model:
    """Wrap a resolved proto as a hybrid Model and read its signature (BundleError if unusable)."""
    try:
        model = Model.load(proto)
        _ = model.signature  # deserializes the graph: a broken graph fails here, not at first run
    except HybridError as e:
        raise BundleError("HYB-501", f"{where}: the bundled model is not usable: {e.message}",
                          "the bundle is damaged; rebuild it") from e
    except Exception as e:  # onnx-ir raises plain exceptions on graphs that break ONNX's rules
        raise BundleError("HYB-501", f"{where}: the bundled model is not a valid ONNX graph "
                          f"({type(e).__name__}: {str(e)[:200]})", "the bundle is damaged; rebuild it") from e
    model.name = name
    return model
