"""The v2 codec on its own: decoding, encoding, and every check that runs before allocation."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybrid.errors import ServingError
from hybrid.serve.core.protocol import (
    InferRequest,
    Limits,
    RequestedOutput,
    check_json_depth,
    datatype_of,
    encode_response,
    parse_request,
    tensor_metadata,
)

pytestmark = pytest.mark.timeout(60)

LIMITS = Limits(max_body=1 << 20, max_json_depth=8)


def binary_body(header: dict, *chunks: bytes) -> tuple[bytes, int]:
    head = json.dumps(header).encode()
    return head + b"".join(chunks), len(head)


def rejects(body: bytes, header_length: int | None = None, limits: Limits = LIMITS) -> str:
    with pytest.raises(ServingError) as info:
        parse_request(body, header_length, limits)
    assert info.value.code == "HYB-702"
    return info.value.message


@pytest.mark.parametrize("datatype,dtype", [("FP32", np.float32), ("FP64", np.float64), ("FP16", np.float16),
                                            ("INT8", np.int8), ("INT64", np.int64), ("UINT16", np.uint16),
                                            ("BOOL", np.bool_), ("BF16", ml_dtypes.bfloat16)])
def test_binary_round_trip_every_numeric_datatype(datatype, dtype, rng):
    x = (rng.standard_normal((2, 3)) * 10).astype(dtype)
    body, n = binary_body({"inputs": [{"name": "x", "shape": [2, 3], "datatype": datatype,
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "parameters": {"binary_data_output": True}}, x.tobytes())
    req = parse_request(body, n, LIMITS)
    np.testing.assert_array_equal(req.inputs["x"], x)
    assert req.inputs["x"].dtype == np.dtype(dtype) and req.binary_output
    out, json_len = encode_response("m", "1", req, {"y": x})
    head = json.loads(out[:json_len])
    assert head["outputs"][0] == {"name": "y", "datatype": datatype, "shape": [2, 3],
                                  "parameters": {"binary_data_size": x.nbytes}}
    np.testing.assert_array_equal(np.frombuffer(out[json_len:], dtype).reshape(2, 3), x)


def test_json_round_trip_nested_and_flat_data_and_request_id():
    body = json.dumps({"id": "r-7", "inputs": [
        {"name": "a", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4.5]]},
        {"name": "b", "shape": [3], "datatype": "INT32", "data": [1, -2, 3]},
        {"name": "c", "shape": [2], "datatype": "BOOL", "data": [True, False]},
        {"name": "d", "shape": [2], "datatype": "BYTES", "data": ["hé", ""]}]}).encode()
    req = parse_request(body, None, LIMITS)
    assert req.id == "r-7" and req.outputs is None and not req.binary_output
    np.testing.assert_array_equal(req.inputs["a"], np.array([[1, 2], [3, 4.5]], np.float32))
    assert req.inputs["b"].dtype == np.int32 and req.inputs["c"].dtype == np.bool_
    assert list(req.inputs["d"]) == ["hé".encode(), b""]
    out, json_len = encode_response("m", "3", req, {"y": np.array([[0.5, 1]], np.float32),
                                                    "t": np.array([b"ok"], dtype=object)})
    assert json_len is None
    doc = json.loads(out)
    assert doc == {"model_name": "m", "model_version": "3", "id": "r-7", "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.0]},
        {"name": "t", "datatype": "BYTES", "shape": [1], "data": ["ok"]}]}


def test_binary_bytes_elements_are_length_prefixed():
    items = [b"abc", b"", b"\xff\x00"]
    raw = b"".join(len(b).to_bytes(4, "little") + b for b in items)
    body, n = binary_body({"inputs": [{"name": "s", "shape": [3], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": len(raw)}}]}, raw)
    req = parse_request(body, n, LIMITS)
    assert list(req.inputs["s"]) == items
    out, json_len = encode_response("m", "1", InferRequest(None, {}, (RequestedOutput("s", True),), False, None),
                                    {"s": req.inputs["s"]})
    assert out[json_len:] == raw
    with pytest.raises(ServingError, match="not UTF-8"):
        encode_response("m", "1", InferRequest(None, {}, (RequestedOutput("s", False),), False, None),
                        {"s": req.inputs["s"]})


def test_requested_outputs_choose_names_order_and_encoding():
    req = parse_request(json.dumps({"inputs": [], "outputs": [
        {"name": "b", "parameters": {"binary_data": True}}, {"name": "a"}]}).encode(), None, LIMITS)
    out, json_len = encode_response("m", "1", req, {"a": np.ones(2, np.float32), "b": np.zeros(1, np.int64)})
    head = json.loads(out[:json_len])
    assert [o["name"] for o in head["outputs"]] == ["b", "a"]
    assert "data" in head["outputs"][1] and len(out) - json_len == 8
    with pytest.raises(ServingError, match="not an output"):
        encode_response("m", "1", parse_request(b'{"inputs": [], "outputs": [{"name": "zz"}]}', None, LIMITS),
                        {"a": np.ones(1)})


def test_json_outputs_carry_every_datatype_and_the_non_finite_literals():
    outs = {"f": np.float32([[0.1, -2.5e-8], [3.4e38, -0.0]]), "h": np.float16([1.5]),
            "b": ml_dtypes.bfloat16(1.25) * np.ones(2, ml_dtypes.bfloat16), "i": np.array([1, -(2 ** 31)], ">i4"),
            "u": np.array([2 ** 64 - 1], np.uint64), "t": np.array([True, False]), "s": np.array([b"x", b"yz"], object)}
    req = InferRequest(None, {}, tuple(RequestedOutput(k, False) for k in outs), False, None)
    body, json_len = encode_response("m", "1", req, outs)
    assert json_len is None
    got = {o["name"]: o for o in json.loads(body)["outputs"]}
    for name, arr in outs.items():
        assert got[name]["shape"] == list(arr.shape) and got[name]["datatype"] == datatype_of(arr.dtype)
    for name in ("f", "h", "b"):  # each float as the double of its value: the same value read back
        np.testing.assert_array_equal(np.array(got[name]["data"]).astype(outs[name].dtype).reshape(outs[name].shape),
                                      outs[name])
    assert got["f"]["data"][0] == float(np.float32(0.1))  # the double Triton prints, not the shortest float32
    assert got["i"]["data"] == [1, -(2 ** 31)] and got["u"]["data"] == [2 ** 64 - 1]
    assert got["t"]["data"] == [True, False] and got["s"]["data"] == ["x", "yz"]
    outs["f"][0, 1] = np.nan
    outs["h"][0] = -np.inf
    body, _ = encode_response("m", "1", req, outs)
    assert b"NaN" in body and b"-Infinity" in body  # literals, as the request may send them (never null)
    got = {o["name"]: o for o in json.loads(body)["outputs"]}
    assert np.isnan(got["f"]["data"][1]) and got["h"]["data"] == [-np.inf] and got["s"]["data"] == ["x", "yz"]


@pytest.mark.parametrize("shape,expected", [
    ([1 << 40, 1 << 40], "exceeds"),            # each dim beyond what the body can carry
    ([1 << 17, 1 << 17, 1 << 17], "more elements"),  # each dim fits, the product does not
    ([2, -3], "negative"),
    ([2.0, 3], "non-integer"),
    ([True, 3], "non-integer"),
    ("2x3", "list of integers"),
])
def test_bad_shapes_are_refused_before_reading_data(shape, expected):
    body, n = binary_body({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32",
                                       "parameters": {"binary_data_size": 24}}]}, bytes(24))
    assert expected in rejects(body, n)


def test_binary_size_must_match_the_shape_and_the_body():
    x = np.zeros((2, 3), np.float32)
    body, n = binary_body({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 20}}]}, x.tobytes()[:20])
    assert "needs 24" in rejects(body, n)
    body, n = binary_body({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 24}}]}, x.tobytes()[:16])
    assert "runs past" in rejects(body, n)
    body, n = binary_body({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 24}}]}, x.tobytes() + b"junk")
    assert "carries 28 bytes" in rejects(body, n)
    assert "Inference-Header-Content-Length" in rejects(body, len(body) + 1)
    body, n = binary_body({"inputs": [{"name": "c", "shape": [2], "datatype": "BOOL",
                                       "parameters": {"binary_data_size": 2}}]}, b"\x01\x07")
    assert "0 or 1" in rejects(body, n)


@pytest.mark.parametrize("doc,expected", [
    ({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}]}, "needs 3 values"),
    ({"inputs": [{"name": "x", "shape": [2], "datatype": "INT8", "data": [1, 300]}]}, "do not fit"),
    ({"inputs": [{"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2.5]}]}, "do not fit"),
    ({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": ["a", "b"]}]}, "do not fit"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [None]}]}, "do not fit"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}]}, "do not fit"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP99", "data": [1]}]}, "unknown datatype"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}, "neither"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}] * 2}, "twice"),
    ({"inputs": {"x": 1}}, "'inputs' list"),
    ({"inputs": [], "outputs": [{"name": "y", "parameters": {"classification": -3}}]}, "non-negative integer"),
    ({"inputs": [], "outputs": [{"name": "y", "parameters": {"classification": "3"}}]}, "non-negative integer"),
    ({"inputs": [], "outputs": [{"name": "y", "parameters": {"classification": True}}]}, "non-negative integer"),
    ({"inputs": [], "parameters": {"timeout": -5}}, "timeout"),
    ({"inputs": [], "id": 7}, "'id'"),
])
def test_malformed_json_requests_name_the_problem(doc, expected):
    assert expected in rejects(json.dumps(doc).encode())


def test_bad_json_and_deep_nesting_are_refused():
    assert "not valid JSON" in rejects(b'{"inputs": [')
    assert "must be a JSON object" in rejects(b"[1, 2]")
    assert "nests 100000 levels" in rejects(b"[" * 100_000 + b"]" * 100_000)
    check_json_depth(b'{"a": "[[[[[[[[[[[[[[[[[[[[", "b": "\\"[[[[[[[[[[[[[["}', 1)  # brackets inside strings
    with pytest.raises(ServingError):
        check_json_depth(b'{"a": "\\\\", "b": [[[[[[[[[1]]]]]]]]]}', 8)  # an escaped backslash ends no string


def test_client_timeout_is_read_in_microseconds():
    req = parse_request(b'{"inputs": [], "parameters": {"timeout": 250000}}', None, LIMITS)
    assert req.timeout_s == 0.25


def test_metadata_datatypes():
    assert tensor_metadata("x", np.dtype(np.float32), ("N", 3, "?")) == {"name": "x", "datatype": "FP32",
                                                                          "shape": [-1, 3, -1]}
    assert datatype_of(np.dtype(object)) == "BYTES" and datatype_of(np.dtype(">i4")) == "INT32"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512), st.one_of(st.none(), st.integers(-5, 600)))
def test_arbitrary_bytes_only_ever_raise_hyb_702(body, header_length):
    try:
        parse_request(body, header_length, LIMITS)
    except ServingError as e:
        assert e.code == "HYB-702"


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
                    max_leaves=30))
def test_arbitrary_json_documents_only_ever_raise_hyb_702(doc):
    for wrapped in (doc, {"inputs": doc}, {"inputs": [{"name": "x", "shape": doc, "datatype": "FP32", "data": doc}]}):
        try:
            parse_request(json.dumps(wrapped).encode(), None, LIMITS)
        except ServingError as e:
            assert e.code == "HYB-702"
