"""One KServe v2 tensor codec (issue 53): HTTP and gRPC decode the same tensor alike, and refuse it alike.

The HTTP binary extension (:func:`hybrid.serve.core.protocol.parse_request`) and gRPC's ``raw_input_contents``
(:func:`hybrid.serve.grpc.server.decode_inputs`, over the hand-written wire reader
:func:`hybrid.serve.grpc.wire.read_infer_request`) carry the same bytes; both decode them through
:mod:`hybrid.serve.tensors`, so a bad tensor gets the same HybridError code, message and hint on both, and a good
one the same array (empty BYTES elements included).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from hybrid.errors import HybridError
from hybrid.serve.core.protocol import Limits, parse_request
from hybrid.serve.grpc.server import decode_inputs
from hybrid.serve.grpc.wire import read_infer_request
from hybrid.serve.tensors import binary_of

LIMITS = Limits(max_body=1 << 16)


def _bytes(*elements: bytes) -> bytes:
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


def _http(datatype: str, shape: list[Any], raw: bytes) -> np.ndarray:
    head = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return parse_request(head + raw, len(head), LIMITS).inputs["x"]


def _grpc(datatype: str, shape: list[Any], raw: bytes) -> np.ndarray:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    received = read_infer_request(request.SerializeToString())  # the server's own reader: views of the bytes
    return decode_inputs(received.message, LIMITS, raw=received.raw)["x"]


GOOD = [
    ("FP32", [2, 3], np.arange(6, dtype="<f4").tobytes()),
    ("INT64", [], np.array(7, "<i8").tobytes()),
    ("BOOL", [4], bytes([0, 1, 1, 0])),
    ("UINT8", [0, 3], b""),
    ("BYTES", [3], _bytes(b"", b"", b"")),  # only the length prefixes: the codec's fast path
    ("BYTES", [1, 3], _bytes(b"", b"ab", b"")),
    ("BYTES", [0], b""),
]


@pytest.mark.parametrize(("datatype", "shape", "raw"), GOOD)
def test_both_transports_decode_a_good_tensor_alike(datatype: str, shape: list[int], raw: bytes) -> None:
    over_http, over_grpc = _http(datatype, shape, raw), _grpc(datatype, shape, raw)
    assert over_http.dtype == over_grpc.dtype
    assert over_http.shape == over_grpc.shape == tuple(shape)
    assert over_http.tolist() == over_grpc.tolist()
    assert binary_of(over_http, datatype) == raw  # and it goes back to the same bytes


BAD = [
    ("FP32", [2, 2], b"\0" * 12, "needs 16"),
    ("BOOL", [2], bytes([0, 2]), "BOOL data must be bytes 0 or 1"),
    ("BYTES", [3], _bytes(b"a", b"b"), "cannot hold the 3 BYTES elements"),
    ("BYTES", [2], b"\0\0\0\0\3\0\0\0", "declares 3 bytes past the end"),  # prefixes only, one not empty
    ("BYTES", [1], _bytes(b"ab")[:-1], "declares 2 bytes past the end"),
    ("BYTES", [1], _bytes(b"ab") + b"zz", "its 1 BYTES elements use 6"),
    ("BYTES", [2], _bytes(b"abc") + b"\0\0", "ends inside element 1 of 2"),
    ("FP32", [2, -1], b"", "negative dimension -1"),
    ("INT8", [1 << 40], b"", "can carry"),
    ("FP8", [1], b"\0", "unknown datatype 'FP8'"),
]


@pytest.mark.parametrize(("datatype", "shape", "raw", "says"), BAD)
def test_both_transports_refuse_a_bad_tensor_alike(datatype: str, shape: list[int], raw: bytes, says: str) -> None:
    with pytest.raises(HybridError) as over_http:
        _http(datatype, shape, raw)
    with pytest.raises(HybridError) as over_grpc:
        _grpc(datatype, shape, raw)
    assert over_http.value.code == over_grpc.value.code == "HYB-702"
    assert over_http.value.message == over_grpc.value.message
    assert over_http.value.hint == over_grpc.value.hint
    assert says in over_http.value.message
    assert "input 'x'" in over_http.value.message


def test_typed_contents_and_json_data_refuse_out_of_range_values_alike() -> None:
    doc = json.dumps({"inputs": [{"name": "x", "datatype": "INT8", "shape": [2], "data": [1, 300]}]}).encode()
    with pytest.raises(HybridError) as over_http:
        parse_request(doc, None, LIMITS)
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="INT8", shape=[2]).contents.int_contents.extend([1, 300])
    with pytest.raises(HybridError) as over_grpc:
        decode_inputs(request, LIMITS)
    for error, field in ((over_http.value, "'data'"), (over_grpc.value, "int_contents")):
        assert error.code == "HYB-702"
        assert f"input 'x': {field} holds int64 values that do not fit datatype INT8" in error.message
    assert over_http.value.hint == over_grpc.value.hint
