"""The one KServe v2 tensor codec: datatypes, shape and size bounds, raw bytes to arrays, BYTES both ways.

Both transports decode every tensor a client sends through these functions, so the same bad tensor gets the
same :class:`~hybrid.errors.ServingError` (HYB-702, same text) over HTTP and gRPC, and the same good one the
same array. What differs is only where the bytes come from: the binary part of an HTTP body
(:mod:`hybrid.serve.core.protocol`), a ``raw_input_contents`` entry (:mod:`hybrid.serve.grpc.server`, views of the
received message that :mod:`hybrid.serve.grpc.wire` cut out), a shared memory region, JSON ``data`` or gRPC's
typed ``contents`` (both lists of values, :func:`values_as`).

The wire layout (the binary tensor data extension, and gRPC's raw contents): elements little-endian, row-major;
a BYTES element is its length as a 4-byte little-endian unsigned integer, then its bytes. Every size is
checked against what the request can carry before anything is allocated for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from hybrid.errors import ServingError

__all__ = [
    "DATATYPES",
    "HINT",
    "RAW",
    "bad",
    "binary_of",
    "bytes_array",
    "bytes_elements",
    "check_raw_size",
    "datatype_of",
    "dtype_for",
    "from_raw",
    "shape_of",
    "values_as",
]

# v2 datatype name -> numpy dtype (little-endian on the wire); BYTES elements are length-prefixed
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(bool),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "BYTES": np.dtype(object),
}
_BY_DTYPE = {dt: name for name, dt in DATATYPES.items() if name != "BYTES"}
RAW = "its raw data"
"""Where a tensor's bytes came from in the error texts, for the binary part of an HTTP body and gRPC's raw contents
alike (so both transports word the same error alike); a shared memory region names its byte-size parameter."""
HINT = "see the KServe v2 inference request format; tritonclient (HTTP or gRPC) builds valid requests"
"""The hint of a malformed tensor, whichever transport carried it."""


def bad(message: str, hint: str | None = HINT) -> ServingError:
    """HYB-702, a malformed request, with ``message`` (which names the tensor) and ``hint``."""
    return ServingError("HYB-702", message, hint)


def datatype_of(dtype: np.dtype | None) -> str:
    """The v2 datatype of a numpy dtype ('FP32', ...; strings and objects are 'BYTES')."""
    if dtype is None:
        return "BYTES"
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "BYTES"
    name = _BY_DTYPE.get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)
    if name is None:
        raise bad(f"dtype {dtype} has no KServe v2 datatype", "serve a model with standard numeric types")
    return name


def dtype_for(name: str, datatype: Any) -> np.dtype:
    """The numpy dtype of input ``name``'s v2 ``datatype``.

    Raises:
        ServingError: HYB-702 for a datatype the protocol does not have.
    """
    dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise bad(f"input {name!r}: unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}")
    return dtype


def _least_size(datatype: str, dtype: np.dtype) -> int:
    return 4 if datatype == "BYTES" else dtype.itemsize  # a BYTES element is at least its 4-byte length


def shape_of(name: str, dims: Sequence[Any], datatype: str, max_body: int) -> tuple[tuple[int, ...], int]:
    """Input ``name``'s shape and element count, refusing what a ``max_body``-byte request cannot carry.

    Raises:
        ServingError: HYB-702 for a dimension that is not an integer or is negative, or more elements than
            the request can carry (each at least its datatype's size).
    """
    cap = max_body // max(1, _least_size(datatype, DATATYPES[datatype]))
    count = 1
    for d in dims:
        if type(d) is not int:
            raise bad(f"input {name!r}: shape {list(dims)} has a non-integer dimension {d!r}")
        if d < 0:
            raise bad(f"input {name!r}: shape {list(dims)} has a negative dimension {d}")
        if d > cap:
            raise bad(f"input {name!r}: dimension {d} of shape {list(dims)} exceeds the {cap} elements a "
                      f"{max_body}-byte request can carry", "check the shape")
        count *= d
        if count > cap:
            raise bad(f"input {name!r}: shape {list(dims)} has more elements than the {cap} a "
                      f"{max_body}-byte request can carry", "check the shape")
    return tuple(dims), count


def check_raw_size(name: str, datatype: str, shape: tuple[int, ...], count: int, size: int, field: str) -> None:
    """Refuse ``size`` raw bytes (as ``field`` declares or carries them) that cannot be the shape's data.

    Called before anything is decoded or allocated: a BYTES tensor needs at least each element's length, any
    other exactly its elements.
    """
    if datatype == "BYTES":
        if count * 4 > size:
            raise bad(f"input {name!r}: {field} is {size} bytes, which cannot hold the {count} BYTES elements of "
                      f"shape {list(shape)} (each takes at least its 4-byte length)", "check the shape")
        return
    need = count * DATATYPES[datatype].itemsize
    if size != need:
        raise bad(f"input {name!r}: {field} is {size} bytes, but {datatype} shape {list(shape)} needs {need}")


def bytes_elements(name: str, raw: bytes | memoryview, count: int, field: str) -> np.ndarray:
    """Decode ``count`` length-prefixed BYTES elements that fill ``raw`` exactly: a flat object array of bytes.

    The caller has checked (:func:`check_raw_size`) that ``raw`` can hold ``count`` length prefixes, so the
    array is never larger than the request warrants.
    """
    view = memoryview(raw)
    end = len(view)
    if end == 4 * count:  # only room for the prefixes: every element must be empty (checked vectorized)
        lengths = np.frombuffer(view, "<u4", count)
        if count and lengths.any():
            i = int(np.flatnonzero(lengths)[0])
            raise bad(f"input {name!r}: BYTES element {i} declares {int(lengths[i])} bytes past the end of its data")
        return np.full(count, b"", dtype=object)
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if pos + 4 > end:
            raise bad(f"input {name!r}: BYTES data ends inside element {i} of {count}")
        n = int.from_bytes(view[pos:pos + 4], "little")
        pos += 4
        if pos + n > end:
            raise bad(f"input {name!r}: BYTES element {i} declares {n} bytes past the end of its data")
        out[i] = bytes(view[pos:pos + n])
        pos += n
    if pos != end:
        raise bad(f"input {name!r}: {field} is {end} bytes, but its {count} BYTES elements use {pos}")
    return out


def from_raw(name: str, datatype: str, shape: tuple[int, ...], count: int, raw: bytes | memoryview,
             field: str) -> np.ndarray:
    """Input ``name`` from its raw bytes (``field`` names where they came from, for the error texts).

    A numeric tensor is a view of ``raw`` at any offset (the model's run gives kernels aligned memory); BYTES
    elements are copied out.

    Raises:
        ServingError: HYB-702 for a size that is not the shape's data, BYTES elements that do not fill it
            exactly, or BOOL bytes other than 0 and 1.
    """
    check_raw_size(name, datatype, shape, count, len(raw), field)
    if datatype == "BYTES":
        return bytes_elements(name, raw, count, field).reshape(shape)
    if datatype == "BOOL" and count and np.frombuffer(raw, np.uint8).max() > 1:
        raise bad(f"input {name!r}: BOOL data must be bytes 0 or 1")
    return np.frombuffer(raw, dtype=DATATYPES[datatype], count=count).reshape(shape)


def bytes_array(values: Iterable[bytes], count: int) -> np.ndarray:
    """A flat object array of ``count`` BYTES elements from their values (JSON strings encoded, typed contents)."""
    out = np.empty(count, dtype=object)
    out[:] = list(values)
    return out


def values_as(name: str, datatype: str, found: np.ndarray, field: str) -> np.ndarray:
    """Values given as numbers (JSON ``data``, gRPC's typed ``contents``) as ``datatype``, refused unless they fit.

    Booleans for BOOL, integers within range for the integer types, numbers for the floating ones.

    Raises:
        ServingError: HYB-702 naming ``field`` for values that do not fit.
    """
    dtype = DATATYPES[datatype]
    kind = found.dtype.kind
    if datatype == "BOOL":
        ok = kind == "b"
    elif dtype.kind in "iu":
        ok = kind in "iu" or found.size == 0
        if ok and found.size:
            info = np.iinfo(dtype)
            ok = bool(found.min() >= info.min and found.max() <= info.max)
    else:
        ok = kind in "iuf"
    if not ok:
        raise bad(f"input {name!r}: {field} holds {found.dtype} values that do not fit datatype {datatype}")
    return found.astype(dtype, copy=False)


def binary_of(arr: np.ndarray, datatype: str) -> bytes:
    """A tensor in the KServe v2 binary layout (and gRPC's raw contents).

    Little-endian elements; BYTES elements each prefixed by its 4-byte length (strings as UTF-8).
    """
    if datatype != "BYTES":
        return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
    parts = []
    for v in arr.reshape(-1):
        b = v if isinstance(v, bytes) else str(v).encode("utf-8")
        parts += [len(b).to_bytes(4, "little"), b]
    return b"".join(parts)
