"""Transpose cancellation and the NCHW -> NHWC interface conversion.

``cancel_transposes`` is a rule table: a Transpose that keeps the axis order disappears, two Transposes
in a row become one (or none), and a Transpose pair around an element-wise unary operator cancels.

``convert_layout`` serves platform profiles that feed images channels-last (NHWC on Ascend, for
example). ONNX's Conv is channels-first only, so a standard model cannot compute in NHWC; what changes is
the interface: each rank-4 input that feeds a channels-first operator is declared ``[N, H, W, C]`` and
transposed once inside the graph, and each rank-4 output produced by that part of the graph is
transposed back to ``[N, H, W, C]``. Backends that prefer NHWC absorb the boundary transposes; inputs
that are already consumed through ``Transpose(perm=[0, 3, 1, 2])`` are left alone. The model records
``hybrid.layout = NHWC`` in its metadata.

The conversion changes the model's public contract: the inputs keep their names but take channels-last
arrays, so callers that send NCHW arrays get a shape error. It runs only when asked for
(``hybrid.optimize(level='O3', config={'layout': 'NHWC'})``, ``pyasc bundle create --layout nhwc``);
:func:`channels_last_candidates` says which inputs it would convert, without converting them.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from hybrid.passes.base import HybridPass, PassResult
from hybrid.passes.rewrite import Context, Rewrite, Rule, RuleRewritePass, rank_of

__all__ = ["TRANSPOSE_RULES", "ConvertLayout", "cancel_transposes", "channels_last_candidates"]

TO_NCHW = (0, 3, 1, 2)
TO_NHWC = (0, 2, 3, 1)
LAYOUT_KEY = "hybrid.layout"

# element-wise operators of one tensor input: they commute with any transpose
_UNARY = frozenset({
    "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus",
    "Softsign", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Floor", "Ceil", "Round", "Sign",
    "Not", "Cast", "Sin", "Cos", "Gelu", "Mish", "IsNaN", "IsInf",
})
# operators that read axis 1 as channels
_CHANNELS_FIRST = frozenset({
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
    "GlobalLpPool", "BatchNormalization", "InstanceNormalization", "LRN", "DepthToSpace", "SpaceToDepth",
    "MaxRoiPool", "RoiAlign", "DeformConv", "QLinearConv", "ConvInteger",
})
# operators the search for a channels-first consumer looks through (input normalization, mostly)
_PASS_THROUGH = _UNARY | {"Add", "Sub", "Mul", "Div", "Identity"}


def _perm(node: ir.Node, ctx_rank: int | None) -> tuple[int, ...] | None:
    attr = node.attributes.get("perm")
    if attr is not None:
        return tuple(attr.as_ints())
    return None if ctx_rank is None else tuple(reversed(range(ctx_rank)))


def _identity_perm(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    node = match[0]
    perm = _perm(node, rank_of(node.inputs[0]))
    if perm is None or perm != tuple(range(len(perm))):
        return None
    return ctx.identity(node.inputs[0], node)


def _compose(ctx: Context, first: ir.Node, second: ir.Node) -> tuple[int, ...] | None:
    inner = _perm(first, rank_of(first.inputs[0]))
    outer = _perm(second, None if inner is None else len(inner))
    if inner is None or outer is None or len(inner) != len(outer):
        return None
    return tuple(inner[i] for i in outer)


def _transpose_transpose(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    first, second = match
    perm = _compose(ctx, first, second)
    if perm is None:
        return None
    if perm == tuple(range(len(perm))):
        return ctx.identity(first.inputs[0], second)
    node = ctx.node("Transpose", [first.inputs[0]], like=second, attributes={"perm": list(perm)})
    return Rewrite([node], node.outputs)


def _transpose_around_unary(ctx: Context, match: Sequence[ir.Node]) -> Rewrite | None:
    first, unary, second = match
    if len(unary.inputs) != 1:  # Clip-like extra operands would need transposing too
        return None
    perm = _compose(ctx, first, second)
    if perm is None or perm != tuple(range(len(perm))):
        return None
    node = ctx.node(unary.op_type, [first.inputs[0]], like=second, attributes=unary.attributes.values())
    return Rewrite([node], node.outputs)


TRANSPOSE_RULES: tuple[Rule, ...] = (
    (("Transpose", _UNARY, "Transpose"), _transpose_around_unary),
    (("Transpose", "Transpose"), _transpose_transpose),
    (("Transpose",), _identity_perm),
)


def cancel_transposes() -> RuleRewritePass:
    """The transpose rule table as one pass."""
    return RuleRewritePass("cancel_transposes", TRANSPOSE_RULES)


def _feeds_channels_first(value: ir.Value, depth: int = 4) -> bool:
    for use in value.uses():
        op = use.node.op_type
        if op in _CHANNELS_FIRST:
            return True
        if depth and op in _PASS_THROUGH and any(_feeds_channels_first(o, depth - 1) for o in use.node.outputs):
            return True
    return False


def _already_nhwc(value: ir.Value) -> bool:
    uses = value.uses()
    return bool(uses) and all(
        u.node.op_type == "Transpose" and _perm(u.node, 4) == TO_NCHW for u in uses)


def _from_channels_first(value: ir.Value, depth: int = 4) -> bool:
    producer = value.producer()
    if producer is None or depth < 0:
        return False
    if producer.op_type in _CHANNELS_FIRST:
        return True
    return producer.op_type in _PASS_THROUGH and any(
        v is not None and _from_channels_first(v, depth - 1) for v in producer.inputs)


def _convertible_inputs(graph: ir.Graph) -> list[ir.Value]:
    return [v for v in graph.inputs
            if v.shape is not None and len(v.shape) == 4 and v.const_value is None and not _already_nhwc(v)
            and _feeds_channels_first(v)]


def channels_last_candidates(model: ir.Model) -> list[str]:
    """The inputs the NHWC conversion would make channels-last (none once the model is converted)."""
    if model.metadata_props.get(LAYOUT_KEY) == "NHWC":
        return []
    return [v.name or "" for v in _convertible_inputs(model.graph)]


class ConvertLayout(HybridPass):
    """Give a channels-first model a channels-last (NHWC) interface.

    Args:
        layout: 'NHWC' converts; 'NCHW' (the ONNX default) leaves the model as it is.
    """

    name = "convert_layout"

    def __init__(self, layout: str = "NHWC") -> None:
        super().__init__()
        self.layout = layout

    def call(self, model: ir.Model) -> PassResult:
        """Convert the model to the configured layout (NHWC) once."""
        if self.layout != "NHWC" or model.metadata_props.get(LAYOUT_KEY) == "NHWC":
            return PassResult(model, False)  # converting twice would transpose the inputs back
        graph = model.graph
        ctx = Context.of(model)
        modified = False
        for value in _convertible_inputs(graph):
            self._convert_input(ctx, graph, value)
            modified = True
        for index, value in enumerate(list(graph.outputs)):
            if (value.shape is None or len(value.shape) != 4 or _produced_by_nhwc_transpose(value)
                    or not _from_channels_first(value)):
                continue
            self._convert_output(ctx, graph, index, value)
            modified = True
        if modified:
            model.metadata_props[LAYOUT_KEY] = "NHWC"
        return PassResult(model, modified)

    @staticmethod
    def _convert_input(ctx: Context, graph: ir.Graph, value: ir.Value) -> None:
        # the new NHWC value takes over the input's name; the old value becomes the transposed tensor
        nhwc = ir.Value(name=value.name, type=value.type, shape=_permuted(value.shape, TO_NHWC))
        value.name = ctx.fresh(f"{nhwc.name}_nchw")
        node = ir.Node("", "Transpose", [nhwc], attributes=[ir.AttrInt64s("perm", list(TO_NCHW))],
                       outputs=[ir.Value(name=ctx.fresh(f"{nhwc.name}_to_nchw"))], name=ctx.fresh("to_nchw"))
        value.replace_all_uses_with(node.outputs[0])
        node.outputs[0].shape, node.outputs[0].type = value.shape, value.type
        graph.inputs[graph.inputs.index(value)] = nhwc
        if len(graph):
            graph.insert_before(graph.node(0), node)
        else:
            graph.append(node)

    @staticmethod
    def _convert_output(ctx: Context, graph: ir.Graph, index: int, value: ir.Value) -> None:
        name = value.name
        value.name = ctx.fresh(f"{name}_nchw")
        node = ir.Node("", "Transpose", [value], attributes=[ir.AttrInt64s("perm", list(TO_NHWC))],
                       outputs=[ir.Value(name=name, type=value.type, shape=_permuted(value.shape, TO_NHWC))],
                       name=ctx.fresh("to_nhwc"))
        graph.outputs[index] = node.outputs[0]
        graph.insert_after(value.producer(), node)


def _produced_by_nhwc_transpose(value: ir.Value) -> bool:
    producer = value.producer()
    return producer is not None and producer.op_type == "Transpose" and _perm(producer, 4) == TO_NHWC


def _permuted(shape: ir.Shape | None, perm: tuple[int, ...]) -> ir.Shape | None:
    if shape is None:
        return None
    dims = list(shape)
    return ir.Shape([dims[i] for i in perm])

