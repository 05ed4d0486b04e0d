"""passes/quantize/groups.py on hand-built graphs: which ops form a group, and how float regions grow."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hybrid.passes.quantize.groups import group_nodes, neighbours, smooth


def _conv(name: str, x: str, y: str, c: int = 4) -> tuple[onnx.NodeProto, onnx.TensorProto]:
    w = numpy_helper.from_array(np.ones((c, c, 1, 1), np.float32), f"{name}_w")
    return helper.make_node("Conv", [x, w.name], [y], name=name), w


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], out: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _se_block() -> onnx.ModelProto:
    """conv0 -> HardSwish as x*HardSigmoid(x) -> SE (pool, conv, relu, conv, sigmoid, mul) -> conv3 -> Add(residual)."""
    c0, w0 = _conv("conv0", "x", "a")
    c1, w1 = _conv("conv1", "p", "q")
    c2, w2 = _conv("conv2", "r", "s")
    c3, w3 = _conv("conv3", "m", "y")
    nodes = [c0, helper.make_node("HardSigmoid", ["a"], ["hs"], name="hsig"),
             helper.make_node("Mul", ["a", "hs"], ["h"], name="hswish"),
             helper.make_node("GlobalAveragePool", ["h"], ["p"], name="pool"), c1,
             helper.make_node("Relu", ["q"], ["r"], name="relu"), c2,
             helper.make_node("Sigmoid", ["s"], ["g"], name="gate"),
             helper.make_node("Mul", ["h", "g"], ["m"], name="excite"), c3,
             helper.make_node("Add", ["y", "x"], ["out"], name="add")]
    return _model(nodes, [w0, w1, w2, w3], "out")


def test_gates_join_their_conv_and_se_blocks_are_one_group():
    model = _se_block()
    groups = group_nodes(model, [n.name for n in model.graph.node])
    by_label = {g.label: g for g in groups}
    assert set(by_label) == {"conv0", "conv1", "conv3", "add"}
    assert by_label["conv0"].nodes == ("conv0", "hsig", "hswish") and by_label["conv0"].kind != "se"
    assert by_label["conv1"].kind == "se"
    assert set(by_label["conv1"].nodes) == {"pool", "conv1", "relu", "conv2", "gate", "excite"}
    assert by_label["add"].nodes == ("add",)


def test_only_quantized_nodes_are_grouped():
    model = _se_block()
    groups = group_nodes(model, ["conv0", "conv3", "add"])  # e.g. ops the quantizer left alone
    assert [g.nodes for g in groups] == [("conv0",), ("conv3",), ("add",)]


def test_float_regions_absorb_int8_islands_and_lone_adds():
    model = _se_block()
    groups = group_nodes(model, [n.name for n in model.graph.node])
    links = neighbours(model, groups)
    assert links["conv1"] == {"conv0", "conv3"}
    # conv1 (SE) alone between float conv0 and conv3: an int8 island, kept float too
    assert smooth(groups, links, {"conv0", "conv3"}) >= {"conv0", "conv1", "conv3", "add"}
    # the Add has no weights: next to a float conv3 it goes float as well
    assert "add" in smooth(groups, links, {"conv3"})
    # a weighted group with an int8 neighbour stays int8
    assert smooth(groups, links, {"conv0"}) == {"conv0"}
