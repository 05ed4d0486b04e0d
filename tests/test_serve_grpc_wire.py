"""ModelInferRequest read with its raw contents left in the received bytes (hybrid.serve.grpc.wire)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from hybrid.serve.grpc.wire import read_infer_request


def _request(**fields) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="cls", model_version="1", id="req-7", **fields)
    request.parameters["priority"].uint64_param = 2
    request.parameters["sequence_id"].string_param = "s"
    x = request.inputs.add(name="x", datatype="FP32", shape=[2, 3])
    x.parameters["binary_data_size"].int64_param = 24
    request.inputs.add(name="t", datatype="BYTES", shape=[1])
    request.outputs.add(name="y").parameters["classification"].int64_param = 2
    return request


def _expected(body: bytes) -> tuple[pb.ModelInferRequest, list[bytes]]:
    """What protobuf reads from ``body``: the message less its raw contents, and the raw contents."""
    whole = pb.ModelInferRequest.FromString(body)
    raw = list(whole.raw_input_contents)
    del whole.raw_input_contents[:]
    return whole, raw


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field on the wire (payloads here are shorter than 128 bytes)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


BODIES = {
    "raw contents last (how protobuf writes them)": _request(raw_input_contents=[
        np.arange(6, dtype=np.float32).tobytes(), b"\x03\x00\x00\x00abc"]).SerializeToString(),
    "an empty raw content": _request(raw_input_contents=[b"", b"\x00\x00\x00\x00"]).SerializeToString(),
    "a large raw content (multi-byte length)": _request(raw_input_contents=[
        np.random.default_rng(0).random(30_000).astype(np.float32).tobytes()]).SerializeToString(),
    "typed contents, no raw": pb.ModelInferRequest(model_name="m", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="INT64", shape=[2], contents=pb.InferTensorContents(int64_contents=[1, -2]))])
    .SerializeToString(),
    "nothing at all": b"",
    "only raw contents": _field(7, b"abcd") + _field(7, b"ef"),
    "raw contents between other fields": (_field(1, b"cls") + _field(7, b"first") + _field(3, b"id-1")
                                          + _field(7, b"second") + _field(2, b"3")),
    "unknown fields of every wire type": (_field(1, b"cls") + bytes([10 << 3 | 0, 0x96, 0x01])
                                          + bytes([11 << 3 | 1]) + b"\x01" * 8 + bytes([12 << 3 | 5]) + b"\x02" * 4
                                          + _field(13, b"zz") + _field(7, b"raw")),
    "an unknown group (read by protobuf whole)": _field(1, b"cls") + bytes([9 << 3 | 3, 9 << 3 | 4]) + _field(7, b"r"),
    "a tag written in two bytes": _field(1, b"cls") + bytes([0x3A | 0x80, 0x00, 3]) + b"xyz",
}


@pytest.mark.parametrize("body", BODIES.values(), ids=list(BODIES))
def test_reads_what_protobuf_reads(body):
    got = read_infer_request(body)
    message, raw = _expected(body)
    assert got.message == message
    assert [bytes(v) for v in got.raw] == raw


def test_raw_contents_are_views_of_the_received_bytes():
    data = np.arange(12, dtype=np.float32)
    body = _request(raw_input_contents=[data.tobytes(), b"\x01\x00\x00\x00z"]).SerializeToString()
    got = read_infer_request(body)
    assert all(view.obj is body and view.readonly for view in got.raw)
    arr = np.frombuffer(got.raw[0], np.float32)
    np.testing.assert_array_equal(arr, data)
    assert not arr.flags.writeable and not arr.flags.owndata


def _mutations(body: bytes):
    """Every truncation of ``body``, and ``body`` with each byte replaced by a few values (varint bits, wire types)."""
    for end in range(len(body)):
        yield body[:end]
    for i in range(len(body)):
        for value in (0x00, 0x07, 0x3A, 0x3B, 0x7F, 0x80, 0xFF):
            yield body[:i] + bytes([value]) + body[i + 1:]


def test_damaged_messages_are_read_or_refused_as_protobuf_does():
    body = (_field(1, b"cls") + _field(7, b"\x00\x01\x02") + _field(3, b"i")
            + _request(raw_input_contents=[b"\x05" * 8]).SerializeToString())
    refused = read = 0
    for damaged in _mutations(body):
        try:
            message, raw = _expected(damaged)
        except DecodeError:
            with pytest.raises(DecodeError):
                read_infer_request(damaged)
            refused += 1
            continue
        got = read_infer_request(damaged)
        assert got.message == message, damaged
        assert [bytes(v) for v in got.raw] == raw, damaged
        read += 1
    assert refused and read  # both kinds were exercised

