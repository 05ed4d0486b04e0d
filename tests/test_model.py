"""hybrid.Model: loading from every source, signatures, saving, external data safety."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import external_data_helper
from tests._models import matmul_add, two_inputs

import hybrid
from hybrid.errors import ModelError


def test_load_from_every_source(tmp_path):
    proto = matmul_add()
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    sources = [str(path), path, proto.SerializeToString(), proto, ir.serde.deserialize_model(proto)]
    for src in sources:
        m = hybrid.Model.load(src)
        assert m.signature.input_names == ["x"] and m.signature.output_names == ["y"]
    m = hybrid.Model.load(path)
    assert hybrid.Model.load(m) is m
    assert m.name == "m" and m.opset == 17


def test_signature_has_symbolic_dims_and_dtypes():
    sig = hybrid.Model.load(two_inputs()).signature
    a, _b, k = sig.inputs
    assert a.shape == ("N", 3) and a.dtype == np.float32 and a.kind == "tensor"
    assert k.shape == (2,) and k.dtype == np.int64
    assert sig.output_names == ["z", "kk"]
    assert "a: float32[Nx3]" in str(sig)


def test_initializer_backed_inputs_are_not_in_the_signature(light):
    sig = hybrid.Model.load(light.light_model_path("squeezenet")).signature
    assert sig.input_names == ["data_0"]
    assert sig.inputs[0].shape == (1, 3, 224, 224)


def test_to_onnx_and_save_round_trip(tmp_path):
    m = hybrid.Model.load(matmul_add())
    out = tmp_path / "sub" / "copy.onnx"
    m.save(out)
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]
    again = hybrid.Model.load(out)
    assert again.sha256 == m.sha256
    onnx.checker.check_model(again.to_onnx())
    ir_only = hybrid.Model(ir.serde.deserialize_model(matmul_add()))
    assert ir_only.to_onnx().graph.node[0].op_type == "MatMul"


def test_missing_file_garbage_and_wrong_type(tmp_path):
    with pytest.raises(ModelError) as e:
        hybrid.Model.load(tmp_path / "nope.onnx")
    assert e.value.code == "HYB-201" and "nope.onnx" in e.value.message
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xffnot a model at all" * 10)
    with pytest.raises(ModelError) as e:
        hybrid.Model.load(bad)
    assert e.value.code == "HYB-202" and "bad.onnx" in e.value.message
    with pytest.raises(ModelError) as e:
        hybrid.Model.load(b"")
    assert e.value.code == "HYB-202"
    with pytest.raises(ModelError) as e:
        hybrid.Model.load(12345)
    assert e.value.code == "HYB-203" and "int" in e.value.message


def _with_external(tmp_path, location: str):
    proto = matmul_add()
    external_data_helper.convert_model_to_external_data(proto, all_tensors_to_one_file=True,
                                                        location="weights.bin", size_threshold=0)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    onnx.save(proto, model_dir / "m.onnx")  # writes weights.bin next to it
    for t in proto.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = location
    (model_dir / "m.onnx").write_bytes(proto.SerializeToString())
    return model_dir


def test_external_data_inside_the_folder_loads(tmp_path):
    model_dir = _with_external(tmp_path, "weights.bin")
    m = hybrid.Model.load(model_dir / "m.onnx")
    cm = hybrid.compile(m, target="onnxruntime")
    x = np.ones((2, 4), np.float32)
    ref = hybrid.compile(matmul_add(), target="onnxruntime")(x)
    np.testing.assert_array_equal(cm(x), ref)


@pytest.mark.parametrize("location", ["/etc/passwd", "../secret.bin", "sub/../../secret.bin"])
def test_external_data_traversal_is_refused(tmp_path, location):
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 64)
    model_dir = _with_external(tmp_path, location)
    with pytest.raises(ModelError) as e:
        hybrid.Model.load(model_dir / "m.onnx")
    assert e.value.code == "HYB-204" and location in e.value.message


def test_external_data_symlink_escape_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 64)
    model_dir = _with_external(tmp_path, "link.bin")
    os.symlink(tmp_path / "secret.bin", model_dir / "link.bin")
    with pytest.raises(ModelError) as e:
        hybrid.Model.load(model_dir / "m.onnx")
    assert e.value.code == "HYB-204" and "link.bin" in e.value.message


def test_external_data_missing_or_short_file(tmp_path):
    model_dir = _with_external(tmp_path, "weights.bin")
    (model_dir / "weights.bin").write_bytes(b"\x00" * 4)
    with pytest.raises(ModelError) as e:
        hybrid.Model.load(model_dir / "m.onnx")
    assert e.value.code == "HYB-205" and "weights.bin" in e.value.message
    (model_dir / "weights.bin").unlink()
    with pytest.raises(ModelError) as e:
        hybrid.Model.load(model_dir / "m.onnx")
    assert e.value.code == "HYB-205"
    with pytest.raises(ModelError) as e:
        hybrid.Model.load((model_dir / "m.onnx").read_bytes())  # bytes without a base_dir
    assert e.value.code == "HYB-205" and "no folder" in e.value.message and "base_dir" in e.value.hint
