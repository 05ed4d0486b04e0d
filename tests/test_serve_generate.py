"""Triton's generate extension (hybrid.serve.http.generate): a model called with its inputs as named JSON fields.

What must hold on any machine: the answers equal the model's outputs for the same inputs, the shapes the values
take, the refusals and their codes; ``tests/test_serve_vs_triton.py`` compares the answers with the real Triton's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tests._serve_support import error_of, request, serving, stateful_repo, tiny_expected, tiny_model

pytestmark = pytest.mark.timeout(120)

X = [1.0, -2.0, 3.5, 0.25]


def _models(root: Path) -> list[str]:
    text_in = helper.make_tensor_value_info("t", TensorProto.STRING, ["N", 2])
    text_out = helper.make_tensor_value_info("u", TensorProto.STRING, ["N", 2])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["t"], ["u"])], "text",
                                                  [text_in], [text_out]),
                                opset_imports=[helper.make_opsetid("", 17)], ir_version=8), root / "text.onnx")
    d = helper.make_tensor_value_info("d", TensorProto.INT64, ["N", "L"])
    e = helper.make_tensor_value_info("e", TensorProto.INT64, ["N", "L"])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Add", ["d", "d"], ["e"])], "dyn", [d], [e]),
                                opset_imports=[helper.make_opsetid("", 17)], ir_version=8), root / "dyn.onnx")
    return [f"tiny={tiny_model(root / 'tiny.onnx')}", f"text={root / 'text.onnx'}", f"dyn={root / 'dyn.onnx'}"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    with serving([*_models(root), stateful_repo(root / "stateful")]) as srv:
        yield srv


def _post(server, path: str, doc) -> tuple[int, dict[str, str], bytes]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return request(server.url, "POST", path, body, {"Content-Type": "application/json"})


def test_inputs_by_name_answer_outputs_by_name(server):
    status, headers, body = _post(server, "/v2/models/tiny/generate", {"x": X, "scale": 2, "id": "r1",
                                                                       "unrelated": "ignored"})
    assert status == 200 and headers["content-type"] == "application/json"
    answer = json.loads(body)
    expected = tiny_expected(np.array([X], np.float32), np.array([[2.0]], np.float32))
    assert answer.keys() == {"model_name", "model_version", "id", "y", "s"}
    assert (answer["model_name"], answer["model_version"], answer["id"]) == ("tiny", "1", "r1")
    np.testing.assert_allclose(answer["y"], expected["y"].reshape(-1), rtol=1e-6)  # a flat list of one row
    assert answer["s"] == pytest.approx(float(expected["s"][0, 0]))  # one value: the value itself
    status, _, body = _post(server, "/v2/models/text/versions/1/generate", {"t": ["ab", "é"]})
    assert status == 200 and json.loads(body)["u"] == ["ab", "é"]
    for values, expected_e in (([1, 2, 3], [2, 4, 6]), (5, 10), ([], [])):  # a dynamic dimension takes the count
        status, _, body = _post(server, "/v2/models/dyn/generate", {"d": values})
        assert status == 200 and json.loads(body)["e"] == expected_e, values


def test_generate_stream_answers_one_server_sent_event(server):
    status, headers, body = _post(server, "/v2/models/tiny/generate_stream", {"x": X, "scale": [1]})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert body.startswith(b"data: ") and body.endswith(b"\n\n") and body.count(b"data: ") == 1
    answer = json.loads(body[len(b"data: "):])
    np.testing.assert_allclose(answer["y"], tiny_expected(np.array([X], np.float32),
                                                          np.ones((1, 1), np.float32))["y"].reshape(-1), rtol=1e-6)
    status, headers, body = _post(server, "/v2/models/tiny/generate_stream", {"x": [1], "scale": [1]})
    assert status == 400 and error_of(body) == "HYB-702"  # refused before the stream starts: plain JSON


@pytest.mark.parametrize(("model", "doc", "status", "says"), [
    ("tiny", {"x": [X], "scale": [1]}, 400, "can not convert input 'x' to tensor with proper shape"),
    ("tiny", {"x": X[:3], "scale": [1]}, 400, "do not take 3 value(s)"),
    ("text", {"t": "ab"}, 400, "do not take 1 value(s)"),
    ("text", {"t": [1, 2]}, 400, "BYTES data in JSON must be strings"),
    ("dyn", {"d": [1.5, 2]}, 400, "do not fit datatype INT64"),
    ("tiny", {"x": X}, 400, "missing input 'scale'"),
    ("tiny", [X], 400, "a JSON object of the model's inputs"),
    ("tiny", b"{not json", 400, "not valid JSON"),
    ("tiny", {"x": X, "scale": [1], "id": 7}, 400, "'id' must be a string"),
    ("tiny", {"x": X, "scale": [1], "parameters": {"timeout": -1}}, 400, "'parameters.timeout'"),
    ("absent", {"x": X}, 404, "no model named 'absent'"),
])
def test_bad_generate_requests_are_refused(server, model, doc, status, says):
    got, _, body = _post(server, f"/v2/models/{model}/generate", doc)
    assert got == status and says in json.loads(body)["error"], body


def test_a_stateful_model_takes_its_sequence_in_parameters(server):
    answers = []
    for k, params in enumerate(({"sequence_id": 5, "sequence_start": True}, {"sequence_id": 5},
                                {"sequence_id": 5, "sequence_end": True})):
        status, _, body = _post(server, "/v2/models/seq/generate", {"x": [1.0 + k, 2.0], "parameters": params})
        assert status == 200, body
        answers.append(json.loads(body))
    status, _, body = _post(server, "/v2/models/seq/generate", {"x": [1.0, 2.0]})  # no sequence: as infer refuses
    assert status == 400 and b"correlation ID" in body
    assert [a["y"] for a in answers] == [[1.0, 2.0], [3.0, 4.0], [6.0, 6.0]]  # y = x + the state the server keeps
