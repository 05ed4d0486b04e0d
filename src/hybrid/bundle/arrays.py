"""Calibration data in a bundle: an uncompressed ``.npz`` written and read without pickle.

An ``.npz`` is itself a zip of ``.npy`` files, so reading one from an untrusted bundle goes through the
same archive checks as the bundle, and every ``.npy`` header is checked before an array is built:
object dtypes (which numpy stores with pickle) are refused, and the shape the header declares must
match the bytes present exactly (a forged shape would otherwise make numpy allocate what it says).
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from hybrid.bundle.safety import Limits, check_archive, read_member
from hybrid.errors import BundleError

__all__ = ["read_npz", "write_npz"]

_NPY_MAGIC = b"\x93NUMPY"


def write_npz(arrays: Mapping[str, Any]) -> tuple[bytes, dict[str, str]]:
    """Serialize named arrays as an uncompressed npz (no object arrays: they would need pickle).

    Model input names may hold any character ('gpu_0/data_0', 'input:0'), so the arrays are stored
    under plain keys ``a0, a1, ...``; the returned mapping (name -> key) goes into the manifest.

    Raises:
        BundleError: HYB-504 when an array has an object dtype.
    """
    clean: dict[str, np.ndarray] = {}
    keys: dict[str, str] = {}
    for i, (name, value) in enumerate(arrays.items()):
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            raise BundleError("HYB-504", f"calibration array {name!r} has dtype object, which needs pickle",
                              "pass numeric arrays (numpy.float32, int64, ...)")
        keys[str(name)] = f"a{i}"
        clean[f"a{i}"] = arr
    buf = io.BytesIO()
    np.savez(buf, **clean)
    return buf.getvalue(), keys


def _parse_npy(data: bytes, where: str) -> np.ndarray:
    if not data.startswith(_NPY_MAGIC) or len(data) < 10:
        raise BundleError("HYB-501", f"{where}: not a .npy array (bad magic)", "rebuild the calibration data")
    fp = io.BytesIO(data)
    try:
        major, _minor = np.lib.format.read_magic(fp)
        if major == 1:
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
        elif major in (2, 3):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f"unknown .npy format version {major}")
    except (ValueError, TypeError, SyntaxError, KeyError, OverflowError, UnicodeDecodeError,
            MemoryError) as e:  # numpy parses the header dict with ast.literal_eval
        raise BundleError("HYB-501", f"{where}: .npy header does not parse: {e}",
                          "rebuild the calibration data") from e
    if dtype.hasobject:
        raise BundleError("HYB-504", f"{where}: array dtype {dtype} holds Python objects (pickle)",
                          "bundles never load pickle; store numeric arrays")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise BundleError("HYB-501", f"{where}: .npy header shape {shape!r} is not a tuple of sizes",
                          "rebuild the calibration data")
    offset = fp.tell()
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow for forged huge shapes
    if expected != len(data) - offset:
        raise BundleError("HYB-505", f"{where}: header declares shape {shape} of {dtype} ({expected} bytes), "
                          f"the array holds {len(data) - offset}", "the sizes are forged or the data truncated")
    arr = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset)
    return arr.reshape(shape, order="F" if fortran else "C")


def read_npz(data: bytes, where: str, limits: Limits | None = None) -> dict[str, np.ndarray]:
    """Parse an npz from untrusted bytes without pickle; arrays are read-only views of ``data``.

    Raises:
        BundleError: 5xx for an unsafe archive, a pickled or forged array, or bytes that do not parse.
    """
    fp = io.BytesIO(data)
    try:
        zf = zipfile.ZipFile(fp)
    except Exception as e:  # zipfile raises many types on hostile bytes; all mean "not an npz"
        raise BundleError("HYB-501", f"{where}: not an npz archive ({type(e).__name__}: {e})",
                          "rebuild the calibration data") from e
    with zf:
        try:
            check_archive(zf, fp, len(data), limits or Limits(), where)
        except BundleError:
            raise
        except Exception as e:  # struct.error and friends from hostile headers
            raise BundleError("HYB-501", f"{where}: npz structure is broken ({type(e).__name__}: {e})",
                              "rebuild the calibration data") from e
        out: dict[str, np.ndarray] = {}
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                raise BundleError("HYB-501", f"{where}: member {info.filename!r} is not a .npy array",
                                  "an npz holds only .npy members")
            raw, _ = read_member(zf, info, where)
            out[info.filename[:-4]] = _parse_npy(raw, f"{where}:{info.filename}")
    return out
