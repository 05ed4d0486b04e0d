"""Zoo builders whose point is the graph: ``If``, ``Loop``, external data, a legacy IR-3 file.

The ``If`` model wraps torch-exported parts in an ``If`` built with ``onnx.helper``; the ``Loop`` model is
built with ``onnx.helper`` alone (weights from a seeded generator). Imports torch at module level;
:mod:`hybrid.zoo` imports this module only inside ``build``.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from hybrid.zoo import _data
from hybrid.zoo._torch import deterministic, export, train
from hybrid.zoo._vision import conv_bn

__all__ = ["IF_THRESHOLD", "LOOP_MAX_ITERS", "LOOP_TOL", "build_external_data", "build_if_model",
           "build_legacy_ir3", "build_loop_model", "loop_weights"]

IF_THRESHOLD = 0.45  # mean pixel value above which the 'day' branch runs
LOOP_MAX_ITERS = 24
LOOP_TOL = 1e-3
LOOP_DIM = 32


class ShapeClassifier(nn.Module):
    """A VGG-style classifier of :func:`hybrid.zoo._data.shape_images` (5 classes).

    Conv + max-pool per width, one more conv, global average pooling.
    """

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), head: bool = True) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for cin, cout in zip((3, *widths), widths):
            layers += [conv_bn(cin, cout, act=nn.ReLU), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers, conv_bn(widths[-1], widths[-1], act=nn.ReLU))
        self.fc = nn.Linear(widths[-1], _data.SHAPE_CLASSES) if head else None

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(self.embed(x)), -1)


def _cls_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.nll_loss(torch.log(model(x).clamp(min=1e-8)), y)


def _shape_batch(rng: np.random.Generator, n: int, size: int):
    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        img, labels, _ = _data.shape_images(rng, n, size)
        return torch.from_numpy(img), torch.from_numpy(labels)

    return batch


# ------------------------------------------------------------------ If
class _DayNight(nn.Module):
    """A shared backbone and two heads: a linear one for day images, a two-layer one for night images."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = ShapeClassifier(head=False)
        self.day = nn.Sequential(nn.Linear(64, _data.SHAPE_CLASSES), nn.Softmax(-1))
        self.night = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, _data.SHAPE_CLASSES), nn.Softmax(-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.backbone.embed(x)
        night = (x.mean((1, 2, 3)) <= IF_THRESHOLD)[:, None]
        return torch.where(night, self.night(f), self.day(f))


def _as_branch(proto: onnx.ModelProto, prefix: str, outer: str, out_name: str, unsqueeze: bool = False
               ) -> onnx.GraphProto:
    """Turn a one-input exported graph into an If branch.

    Its input becomes the outer-scope value ``outer`` and every other name gets ``prefix`` (subgraph
    names must not shadow outer ones). ``unsqueeze`` adds a middle axis to the output
    ([N, 5] -> [N, 1, 5]), so the two branches differ in rank.
    """
    g = proto.graph
    (inp,) = g.input
    (out,) = g.output

    def rename(name: str) -> str:
        return outer if name == inp.name else (name and prefix + name)

    for node in g.node:
        node.input[:] = [rename(n) for n in node.input]
        node.output[:] = [rename(n) for n in node.output]
        node.name = prefix + node.name
    for init in g.initializer:
        init.name = prefix + init.name
    nodes, result, shape = list(g.node), prefix + out.name, ["batch", _data.SHAPE_CLASSES]
    if unsqueeze:
        axes = numpy_helper.from_array(np.array([1], np.int64), prefix + "axes")
        nodes.append(helper.make_node("Constant", [], [axes.name], name=prefix + "axes", value=axes))
        nodes.append(helper.make_node("Unsqueeze", [result, axes.name], [result + "_3d"], name=prefix + "unsqueeze"))
        result, shape = result + "_3d", ["batch", 1, _data.SHAPE_CLASSES]
    out_vi = helper.make_tensor_value_info(result, TensorProto.FLOAT, shape)
    return helper.make_graph(nodes, out_name, [], [out_vi], list(g.initializer))


def build_if_model() -> onnx.ModelProto:
    with deterministic(6):
        rng = np.random.default_rng(6)
        model = _DayNight()
        train(model, _shape_batch(rng, 16, 48), _cls_loss, steps=150, lr=5e-3)
        x = torch.rand(1, 3, 64, 64)
        backbone = export(_Embed(model.backbone), (x,), ["x"], ["feat"],
                          {"x": {0: "batch", 2: "height", 3: "width"}, "feat": {0: "batch"}})
        f = torch.rand(1, 64)
        day = export(model.day, (f,), ["f"], ["probs"], {"f": {0: "batch"}, "probs": {0: "batch"}})
        night = export(model.night, (f,), ["f"], ["probs"], {"f": {0: "batch"}, "probs": {0: "batch"}})
    g = backbone.graph
    cond_nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean_pixel"], name="if/mean", keepdims=0),
        helper.make_node("Constant", [], ["threshold"], name="if/threshold",
                         value=numpy_helper.from_array(np.array(IF_THRESHOLD, np.float32))),
        helper.make_node("Greater", ["mean_pixel", "threshold"], ["is_day"], name="if/is_day"),
        # the branches answer [N, 5] and [N, 1, 5]: the If's output has no static rank
        helper.make_node("If", ["is_day"], ["head_out"], name="if/day_or_night",
                         then_branch=_as_branch(day, "day/", "feat", "day_head"),
                         else_branch=_as_branch(night, "night/", "feat", "night_head", unsqueeze=True)),
        helper.make_node("Constant", [], ["out_shape"], name="if/out_shape",
                         value=numpy_helper.from_array(np.array([-1, _data.SHAPE_CLASSES], np.int64))),
        helper.make_node("Reshape", ["head_out", "out_shape"], ["probs"], name="if/flatten"),
    ]
    out = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", _data.SHAPE_CLASSES])
    graph = helper.make_graph([*g.node, *cond_nodes], "if_model", list(g.input), [out], list(g.initializer))
    return helper.make_model(graph, opset_imports=list(backbone.opset_import), ir_version=backbone.ir_version,
                             producer_name=backbone.producer_name, producer_version=backbone.producer_version)


class _Embed(nn.Module):
    def __init__(self, net: ShapeClassifier) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.embed(x)


# ------------------------------------------------------------------ Loop
def loop_weights() -> dict[str, np.ndarray]:
    """The loop model's weights (seeded).

    A is scaled to spectral norm 0.6, so the refinement contracts and stops after a number of steps
    that depends on the input.
    """
    rng = np.random.default_rng(7)
    d = LOOP_DIM
    a = rng.normal(0.0, 1.0, (d, d))
    a *= 0.6 / np.linalg.norm(a, 2)
    return {"B0": rng.normal(0.0, 1.0 / np.sqrt(d), (d, d)), "A": a,
            "U": rng.normal(0.0, 1.5 / np.sqrt(d), (d, d)), "b": rng.normal(0.0, 0.1, d),
            "C": rng.normal(0.0, 2.0 / np.sqrt(d), (d, 10)), "d": rng.normal(0.0, 0.1, 10)}


def build_loop_model() -> onnx.ModelProto:
    """Damped fixed-point refinement ``h <- h + 0.5 * (tanh(h A + x U + b) - h)`` in an ONNX ``Loop``.

    The loop stops when the largest update falls under ``LOOP_TOL`` (at most ``LOOP_MAX_ITERS`` steps).
    The outputs are the class probabilities of the fixed point, the update size per step (a scan
    output, one row per step run) and the number of steps.
    """
    w = {k: v.astype(np.float32) for k, v in loop_weights().items()}
    f32 = TensorProto.FLOAT
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "A"], ["hA"]),
            helper.make_node("MatMul", ["x", "U"], ["xU"]),
            helper.make_node("Add", ["hA", "xU"], ["pre0"]),
            helper.make_node("Add", ["pre0", "b"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["target"]),
            helper.make_node("Sub", ["target", "h_in"], ["step"]),
            helper.make_node("Mul", ["step", "half"], ["update"]),
            helper.make_node("Add", ["h_in", "update"], ["h_out"]),
            helper.make_node("Abs", ["update"], ["abs_update"]),
            helper.make_node("ReduceMax", ["abs_update"], ["delta"], keepdims=0),
            helper.make_node("Greater", ["delta", "tol"], ["cond_out"]),
        ],
        "refine_step",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", f32, ["batch", LOOP_DIM])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", f32, ["batch", LOOP_DIM]),
         helper.make_tensor_value_info("delta", f32, [])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
         numpy_helper.from_array(np.array(LOOP_TOL, np.float32), "tol")],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "B0"], ["x_B0"]),
        helper.make_node("Tanh", ["x_B0"], ["h0"]),
        helper.make_node("Loop", ["max_iters", "keep_going", "h0"], ["h_final", "deltas"], body=body),
        helper.make_node("MatMul", ["h_final", "C"], ["logits0"]),
        helper.make_node("Add", ["logits0", "d"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("Shape", ["deltas"], ["iterations"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits += [numpy_helper.from_array(np.array(LOOP_MAX_ITERS, np.int64), "max_iters"),
              numpy_helper.from_array(np.array(True), "keep_going")]
    graph = helper.make_graph(nodes, "loop_model", [helper.make_tensor_value_info("x", f32, ["batch", LOOP_DIM])],
                              [helper.make_tensor_value_info("probs", f32, ["batch", 10]),
                               helper.make_tensor_value_info("deltas", f32, ["steps"]),
                               helper.make_tensor_value_info("iterations", TensorProto.INT64, [1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                             producer_name="hybrid.zoo")


def loop_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The loop model in numpy (float64): the probabilities and the per-step update sizes."""
    w = loop_weights()
    h = np.tanh(x @ w["B0"])
    deltas = []
    for _ in range(LOOP_MAX_ITERS):
        update = 0.5 * (np.tanh(h @ w["A"] + x @ w["U"] + w["b"]) - h)
        h = h + update
        deltas.append(np.abs(update).max())
        if deltas[-1] <= LOOP_TOL:
            break
    logits = h @ w["C"] + w["d"]
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True), np.array(deltas)


# ------------------------------------------------------------------ external data
def build_external_data() -> onnx.ModelProto:
    """A wider shape classifier (about 2.1 MB of weights), for the external-data path.

    ``hybrid.zoo.build`` saves it with every initializer in one external data file beside the .onnx.
    """
    with deterministic(9):
        rng = np.random.default_rng(9)
        model = ShapeClassifier(widths=(16, 32, 96, 192))
        train(model, _shape_batch(rng, 16, 48), _cls_loss, steps=60, lr=5e-3)
        return export(model, (torch.rand(1, 3, 96, 96),), ["x"], ["probs"], {"x": {0: "batch"}, "probs": {0: "batch"}})


# ------------------------------------------------------------------ legacy IR 3
LEGACY_DECLARED_CLASSES = 10  # what the file claims; the model computes SHAPE_CLASSES (5)


def build_legacy_ir3() -> onnx.ModelProto:
    """A 2018-style file: opset 8, IR version 3, initializers repeated as graph inputs, static shapes.

    Its output is declared ``[1, 10]`` while the graph computes ``[1, 5]``.
    """
    with deterministic(10):
        rng = np.random.default_rng(10)
        model = ShapeClassifier(widths=(16, 32, 48))
        train(model, _shape_batch(rng, 16, 32), _cls_loss, steps=100, lr=1e-2)
        proto = export(model, (torch.rand(1, 3, 32, 32),), ["x"], ["probs"], opset=8,
                       keep_initializers_as_inputs=True)
    proto.ir_version = 3
    proto.graph.output[0].type.tensor_type.shape.dim[1].dim_value = LEGACY_DECLARED_CLASSES
    return proto
