"""Small ONNX image models with known answers, for the vision tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def constant_detector(rows: np.ndarray, fmt: str, size: tuple[int, int] = (64, 64),
                      batch: int | str = "N") -> onnx.ModelProto:
    """A "detector" whose output is ``rows`` for every image of the batch.

    Args:
        rows: (boxes, fields) predictions in the yolov5 layout (cx, cy, w, h, obj, classes...) for
            'yolov5', or (cx, cy, w, h, classes...) for 'yolov8' (transposed into [4 + C, boxes]).
        fmt: 'yolov5' or 'yolov8'.
        size: Input (height, width).
        batch: The batch dimension (a name: dynamic).
    """
    pred = np.asarray(rows, np.float32)[None]
    if fmt == "yolov8":
        pred = pred.transpose(0, 2, 1)
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, 3, *size])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, *pred.shape[1:]])
    inits = [numpy_helper.from_array(pred, "pred"), numpy_helper.from_array(np.array(pred.shape[1:], np.int64), "rest")]
    nodes = [helper.make_node("Shape", ["images"], ["shape"], start=0, end=1),
             helper.make_node("Concat", ["shape", "rest"], ["target"], axis=0),
             helper.make_node("Expand", ["pred", "target"], ["output"])]
    graph = helper.make_graph(nodes, "constant_detector", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mean_color_classifier(size: tuple[int, int] = (16, 16), batch: int | str = "N",
                          layout: str = "NCHW") -> onnx.ModelProto:
    """Logits = 10 x the mean of each channel: the top class of an image is its dominant channel."""
    shape = [batch, 3, *size] if layout == "NCHW" else [batch, *size, 3]
    axes = [2, 3] if layout == "NCHW" else [1, 2]
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3])
    nodes = [helper.make_node("ReduceMean", ["input"], ["mean"], axes=axes, keepdims=0),
             helper.make_node("Mul", ["mean", "ten"], ["logits"])]
    graph = helper.make_graph(nodes, "mean_color", [x], [y], [numpy_helper.from_array(np.float32(10), "ten")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def identity_image(size: tuple[int, int], dtype: int = TensorProto.FLOAT, layout: str = "NCHW",
                   batch: int | str = "N") -> onnx.ModelProto:
    """Returns its input: shows exactly what preprocessing produced."""
    shape = [batch, 3, *size] if layout == "NCHW" else [batch, *size, 3]
    x = helper.make_tensor_value_info("input", dtype, shape)
    y = helper.make_tensor_value_info("output", dtype, shape)
    graph = helper.make_graph([helper.make_node("Identity", ["input"], ["output"])], "identity", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
