"""Triton's classification extension: an output answered as its top K classes, with the labels of
config.pbtxt's ``label_filename``; over HTTP (JSON and binary) and gRPC, through unmodified tritonclient.
The differential test against the real Triton is in test_serve_vs_triton.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tests._serve_support import serving, tiny_expected, tiny_model

from hybrid.errors import ServingError
from hybrid.serve import build_registry
from hybrid.serve.triton.classification import class_count, top_classes

tg = pytest.importorskip("tritonclient.grpc")
import tritonclient.http as th  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def strings(arr: np.ndarray) -> list:
    """The elements as str (tritonclient gives JSON BYTES as str, binary ones as bytes)."""
    return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b, otypes=[object])(arr).tolist()


# ------------------------------------------------------------------------------------------------ top_classes
def test_each_row_of_a_batch_is_classified_descending_with_ties_in_index_order():
    arr = np.array([[0.5, 2.0, -1.0, 2.0], [3.0, 1.0, 1.0, 0.0]], np.float32)
    got = top_classes("y", arr, 3, batched=True)
    assert got.shape == (2, 3) and got.dtype == object
    assert strings(got) == [["2.000000:1", "2.000000:3", "0.500000:0"], ["3.000000:0", "1.000000:1", "1.000000:2"]]


def test_without_batching_the_whole_tensor_is_classified_flattened():
    arr = np.array([[0.5, 2.0], [3.0, -1.0]], np.float32)
    assert strings(top_classes("y", arr, 3, batched=False)) == ["3.000000:2", "2.000000:1", "0.500000:0"]


def test_k_beyond_the_classes_gives_every_class_and_each_row_keeps_its_rest():
    arr = np.arange(12, dtype=np.float64).reshape(2, 2, 3)  # rows of 6 elements
    got = top_classes("y", arr, 10, batched=True)
    assert got.shape == (2, 6)
    assert strings(got)[1][0] == "11.000000:5" and strings(got)[1][-1] == "6.000000:0"


def test_labels_name_the_classes_they_have_and_integers_print_as_integers():
    arr = np.array([[3, -7, 3, 9]], np.int32)
    got = top_classes("b", arr, 4, batched=True, labels=("cat", "dog", "eel"))
    assert strings(got) == [["9:3", "3:0:cat", "3:2:eel", "-7:1:dog"]]
    big = np.array([[np.iinfo(np.uint64).max, 1]], np.uint64)
    assert strings(top_classes("b", big, 1, batched=True)) == [[f"{np.iinfo(np.uint64).max}:0"]]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_every_floating_type_prints_its_values_as_c_s_percent_f(dtype):
    arr = np.array([[0.25, -1.5]], dtype)
    assert strings(top_classes("y", arr, 2, batched=True)) == [["0.250000:0", "-1.500000:1"]]


@pytest.mark.parametrize("arr", [np.array([[True, False]]), np.array([[b"a", b"b"]], dtype=object)])
def test_outputs_that_are_not_numbers_cannot_be_classified(arr):
    with pytest.raises(ServingError) as info:
        top_classes("u", arr, 1, batched=True)
    assert info.value.code == "HYB-702" and "needs numbers" in info.value.message


@pytest.mark.parametrize("value", [-1, "2", 2.5, True, None])
def test_the_class_count_is_a_non_negative_integer(value):
    with pytest.raises(ServingError) as info:
        class_count("y", value)
    assert info.value.code == "HYB-702" and "non-negative integer" in info.value.message
    assert class_count("y", 0) == 0 and class_count("y", 3) == 3


# ------------------------------------------------------------------------------------------------ the server
TINY_PBTXT = """max_batch_size: 8
dynamic_batching { }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "scale" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" },
         { name: "s" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def labelled_repo(root, labels: bytes | None = b"cat\ndog\n", pbtxt: str = TINY_PBTXT):
    (root / "repo" / "tiny" / "1").mkdir(parents=True)
    tiny_model(root / "repo" / "tiny" / "1" / "model.onnx")
    (root / "repo" / "tiny" / "config.pbtxt").write_text(pbtxt)
    if labels is not None:
        (root / "repo" / "tiny" / "labels.txt").write_bytes(labels)
    return root / "repo"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving([labelled_repo(tmp_path_factory.mktemp("classification"))]) as srv:
        yield srv


X = np.array([[1, 2, 3, 4], [-1, 0.5, 2, -3]], np.float32)
SCALE = np.full((2, 1), 0.5, np.float32)


def expected_classes(k: int) -> list[list[str]]:
    y = tiny_expected(X, SCALE)["y"]
    labels = ("cat", "dog")
    out = []
    for row in y:
        order = sorted(range(3), key=lambda i: (-row[i], i))[:k]
        out.append([f"{float(row[i]):f}:{i}" + (f":{labels[i]}" if i < 2 else "") for i in order])
    return out


def inputs(module):
    ins = [module.InferInput("x", list(X.shape), "FP32"), module.InferInput("scale", list(SCALE.shape), "FP32")]
    ins[0].set_data_from_numpy(X)
    ins[1].set_data_from_numpy(SCALE)
    return ins


def test_the_server_lists_the_extension(server):
    client = th.InferenceServerClient(server.url.removeprefix("http://"))
    assert "classification" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("binary", [False, True])
def test_http_answers_the_top_classes_with_their_labels(server, binary):
    client = th.InferenceServerClient(server.url.removeprefix("http://"))
    result = client.infer("tiny", inputs(th), outputs=[th.InferRequestedOutput("y", binary_data=binary, class_count=2),
                                                        th.InferRequestedOutput("s", binary_data=binary)])
    (y,) = [o for o in result.get_response()["outputs"] if o["name"] == "y"]
    assert y["datatype"] == "BYTES" and y["shape"] == [2, 2]
    assert strings(result.as_numpy("y")) == expected_classes(2)
    np.testing.assert_allclose(result.as_numpy("s"), tiny_expected(X, SCALE)["s"], rtol=1e-6)  # untouched


def test_grpc_answers_the_top_classes_and_k_0_asks_for_the_values(server):
    client = tg.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer("tiny", inputs(tg), outputs=[tg.InferRequestedOutput("y", class_count=5)])
        assert strings(result.as_numpy("y")) == expected_classes(3)
        plain = client.infer("tiny", inputs(tg), outputs=[tg.InferRequestedOutput("y", class_count=0)])
        np.testing.assert_allclose(plain.as_numpy("y"), tiny_expected(X, SCALE)["y"], rtol=1e-6)
        wrong = tg.InferRequestedOutput("y")
        wrong._output.parameters["classification"].string_param = "2"  # tritonclient sends an int64_param
        with pytest.raises(InferenceServerException) as info:
            client.infer("tiny", inputs(tg), outputs=[wrong])
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "int64_param" in info.value.message()
    finally:
        client.close()


def test_a_label_file_that_is_missing_or_outside_the_model_folder_is_a_repository_error(tmp_path):
    with pytest.raises(ServingError) as info:
        build_registry([labelled_repo(tmp_path / "a", labels=None)], target="onnxruntime")
    assert info.value.code == "HYB-707" and "labels.txt" in info.value.message
    (tmp_path / "secret.txt").write_text("x\n")
    outside = labelled_repo(tmp_path / "b", pbtxt=TINY_PBTXT.replace("labels.txt", "../../../secret.txt"))
    with pytest.raises(ServingError) as info:
        build_registry([outside], target="onnxruntime")
    assert info.value.code == "HYB-707" and "outside" in info.value.message
    with pytest.raises(ServingError) as info:
        build_registry([labelled_repo(tmp_path / "c", labels=b"\xff\xfe")], target="onnxruntime")
    assert info.value.code == "HYB-707" and "UTF-8" in info.value.message
