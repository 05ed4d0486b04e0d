"""Make a static-batch model accept any batch size, or say precisely which node prevents it.

Models exported at batch 1 carry the batch twice: in the input shapes, and in constants such as the target
shape of a ``Reshape`` (``[1, 2048]`` before the classifier). The pass declares the inputs' first
dimension symbolic (``N``), forgets the intermediate shape annotations that carry the old batch, and then
repeats: infer shapes with the symbolic batch; rewrite each constant-target Reshape whose input carries
``N`` and whose target pins the batch (``[1, 2048]`` -> ``[0, 2048]``, "copy dimension 0"). A Reshape
that folds the batch into other dimensions (``[B * C, ...]``) cannot be rewritten and raises HYB-209
naming it. At the end every output that had the batch must carry ``N``. If one has a fixed batch
instead, shapes are inferred statically at two batch sizes and HYB-209 names the first node whose input
follows the batch while its output does not (a Reshape to a constant that merges batch and heads behind a
Transpose, a Concat with a ``[1, C]`` constant, ...).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from hybrid.errors import ModelError
from hybrid.ir import Model
from hybrid.passes.base import HybridPass, PassManager, PassResult, working_copy
from hybrid.passes.fold import NormalizeInitializers
from hybrid.passes.rewrite import Context, const_array

__all__ = ["MakeBatchDynamic", "make_batch_dynamic"]

logger = logging.getLogger("hybrid.passes")

_REDUCING = ("Reduce", "ArgMax", "ArgMin")
_HINT = "export the model with a dynamic batch axis (hybrid.export(..., dynamic_axes={'input': {0: 'batch'}}))"


def _infer(model: ir.Model) -> None:
    """Infer shapes afresh: ONNX keeps an existing static annotation over an inferred symbolic one."""
    for node in model.graph:
        for out in node.outputs:
            out.shape = None
    ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)


def _first_dim(value: ir.Value | None) -> int | ir.SymbolicDim | None:
    if value is None or value.shape is None or len(value.shape) == 0:
        return None
    return value.shape[0]


def _fail(message: str) -> ModelError:
    return ModelError("HYB-209", message, _HINT)


class MakeBatchDynamic(HybridPass):
    """Declare dimension 0 of every input symbolic and rewrite the constants that pin it.

    Args:
        dim_name: The name of the symbolic batch dimension.
    """

    name = "make_batch_dynamic"

    def __init__(self, dim_name: str = "N") -> None:
        super().__init__()
        self.dim_name = dim_name

    def call(self, model: ir.Model) -> PassResult:
        """Make the batch dimension of the inputs and outputs symbolic."""
        graph = model.graph
        NormalizeInitializers()(model)  # Reshape targets listed as inputs (IR < 4) are constants to hybrid
        inputs = list(graph.inputs)
        batch = self._static_batch(inputs)
        symbol = ir.SymbolicDim(self.dim_name)
        if batch is None and all(_first_dim(v) == symbol for v in inputs):
            _infer(model)
            if not self._pinning(model, symbol):
                return PassResult(model, False)  # already dynamic under this name, nothing pins it
        before = {v: v.shape for v in graph.outputs}
        with_batch = [v for v in graph.outputs
                      if _first_dim(v) is not None and (batch is None or _first_dim(v) in (batch, symbol)
                                                        or not isinstance(_first_dim(v), int))]
        for value in inputs:
            value.shape = ir.Shape([symbol, *list(value.shape)[1:]])
        ctx = Context.of(model)
        rewritten: dict[tuple[int, ...], ir.Value] = {}
        for _ in range(len(graph) + 1):
            _infer(model)
            pinning = self._pinning(model, symbol)
            if not pinning:
                break
            for node, target in pinning:
                self._rewrite(ctx, node, target, batch, rewritten)
        for value in graph.outputs:
            if value.shape is None and before[value] is not None:  # ONNX cannot infer it (a custom op)
                dims = list(before[value])
                value.shape = ir.Shape([symbol, *dims[1:]] if value in with_batch else dims)
        for value in with_batch:
            if not isinstance(_first_dim(value), int):
                continue  # N, or a symbol ONNX could not relate to N (a Reshape to -1): not pinned
            found = _where_pinned(model, value, batch)
            if found is None:
                continue  # not computed from the inputs, or only reductions over the batch drop it
            node, carrier, (a, shape_a), (b, shape_b), out = found
            shapes = (f"has shape {list(shape_a)} at batch {a} and {list(shape_b)} at batch {b}"
                      if shape_a is not None else "depends on the batch")
            raise _fail(f"cannot make the batch of output {value.name!r} dynamic: node {node.name!r} "
                        f"({node.op_type}) gives {list(out)} at batch {a} and cannot follow batch {b}: its input "
                        f"{carrier!r} {shapes}, but a constant shape or operand of the node stays the same")
        return PassResult(model, True)

    @staticmethod
    def _static_batch(inputs: list[ir.Value]) -> int | None:
        if not inputs:
            raise _fail("cannot make the batch dynamic: the model has no inputs")
        sizes: dict[str, int] = {}
        for value in inputs:
            if value.shape is None or len(value.shape) == 0:
                raise _fail(f"cannot make the batch dynamic: input {value.name!r} has "
                            f"{'no known shape' if value.shape is None else 'rank 0'}, expected a batch "
                            "dimension first")
            if isinstance(value.shape[0], int):
                sizes[value.name or "?"] = value.shape[0]
        if len(set(sizes.values())) > 1:
            found = ", ".join(f"{k}={v}" for k, v in sizes.items())
            raise _fail(f"cannot make the batch dynamic: the inputs disagree on dimension 0 ({found}), "
                        "expected one batch size")
        return next(iter(sizes.values()), None)

    @staticmethod
    def _pinning(model: ir.Model, symbol: ir.SymbolicDim) -> list[tuple[ir.Node, np.ndarray]]:
        """Reshapes whose input carries the batch and whose constant target fixes dimension 0."""
        found = []
        for node in model.graph:
            if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
                continue
            target = const_array(node.inputs[1])
            if target is None or target.ndim != 1 or target.size == 0 or _first_dim(node.inputs[0]) != symbol:
                continue
            allowzero = "allowzero" in node.attributes and node.attributes["allowzero"].as_int() == 1
            if int(target[0]) == -1 or (int(target[0]) == 0 and not allowzero):
                continue  # already follows the input's batch (-1 only if the rest is fixed: checked later)
            found.append((node, target))
        return found

    def _rewrite(self, ctx: Context, node: ir.Node, target: np.ndarray, batch: int | None,
                 rewritten: dict[tuple[int, ...], ir.Value]) -> None:
        data = node.inputs[0]
        assert data is not None and data.shape is not None
        rest = list(data.shape)[1:]
        first = int(target[0])
        keeps_rest = (all(isinstance(d, int) for d in rest) and -1 not in target[1:].tolist()
                      and 0 not in target[1:].tolist() and int(np.prod(rest)) == int(np.prod(target[1:])))
        if not ((batch is not None and first == batch) or (batch is None and first > 0 and keeps_rest)):
            raise _fail(f"cannot make the batch dynamic: node {node.name!r} (Reshape) reshapes a tensor of "
                        f"shape {list(data.shape)} to the constant shape {target.tolist()}, which folds the batch "
                        "into other dimensions; expected its first entry to be the batch size")
        allowzero = "allowzero" in node.attributes and node.attributes["allowzero"].as_int() == 1
        new_target = target.copy()
        if not allowzero:
            new_target[0] = 0  # copy dimension 0 of the input: the batch, whatever it is
        elif -1 not in target.tolist():
            new_target[0] = -1
        else:
            raise _fail(f"cannot make the batch dynamic: node {node.name!r} (Reshape, allowzero=1) has the "
                        f"constant shape {target.tolist()} with a -1 already; the batch cannot be inferred too")
        key = tuple(int(d) for d in new_target)
        shape = rewritten.get(key)
        if shape is None:
            shape = rewritten[key] = ctx.initializer(new_target.astype(np.int64), f"{node.inputs[1].name}_dynamic")
        node.replace_input_with(1, shape)
        logger.debug("make_batch_dynamic: %s target %s -> %s", node.name, target.tolist(), key)


def _static_shapes(model: ir.Model, batch: int) -> dict[str, tuple[int, ...]]:
    """Value name -> static shape, inferred with dimension 0 of every input set to ``batch``."""
    proto = ir.serde.serialize_model(model)
    for info in proto.graph.input:
        dims = info.type.tensor_type.shape.dim
        if len(dims):
            dims[0].dim_value = batch
    del proto.graph.value_info[:]
    for info in proto.graph.output:
        info.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    shapes = {t.name: tuple(t.dims) for t in inferred.graph.initializer}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tensor = info.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[info.name] = tuple(d.dim_value for d in tensor.shape.dim)
    return shapes


def _where_pinned(model: ir.Model, output: ir.Value, batch: int | None) -> tuple | None:
    """The first node above ``output`` whose input shape follows the batch but whose output does not.

    Static inference at two batch sizes finds it even where symbolic inference loses track of the batch
    (a transposed attention layout, for example).
    """
    a, b = (batch, batch + 1) if batch else (1, 2)
    first, second = _static_shapes(model, a), _static_shapes(model, b)
    ancestors: set[int] = set()
    stack = [output.producer()]
    while stack:
        node = stack.pop()
        if node is None or id(node) in ancestors:
            continue
        ancestors.add(id(node))
        stack.extend(v.producer() for v in node.inputs if v is not None)
    data = {v.name for v in model.graph.inputs}  # values computed from the inputs' data, not their shapes
    for node in model.graph:
        skipped = node.op_type in ("Shape", "Size") or node.op_type.startswith(_REDUCING)
        inputs = [v.name for v in node.inputs if v is not None]
        outputs = [o.name for o in node.outputs if o.name]
        if not skipped and any(i in data for i in inputs):
            data.update(outputs)
        if skipped or id(node) not in ancestors or not outputs or not all(o in first for o in outputs):
            continue  # a shape read or a reduction over the batch drops it legitimately
        # the output stays the same, or ONNX finds the inputs incompatible at the other batch size...
        if not all(second.get(o) in (first[o], None) for o in outputs):
            continue
        # ...while an input follows the batch, or is batch data whose shape ONNX cannot infer
        for name in inputs:
            if (name in first and name in second and first[name] != second[name]) or (
                    name in data and name not in first and name not in second):
                return node, name, (a, first.get(name)), (b, second.get(name)), first[outputs[0]]
    return None


def make_batch_dynamic(model: Any, name: str = "N") -> Model:
    """Return a copy of ``model`` whose inputs and outputs take any batch size in dimension 0.

    Args:
        model: Anything ``hybrid.Model.load`` takes.
        name: The symbolic name of the batch dimension.

    Returns:
        A new ``hybrid.Model``; the input is not modified.

    Raises:
        ModelError: HYB-209 naming the node that pins the batch when it cannot be rewritten.
    """
    source = Model.load(model)
    copy = working_copy(source.ir)
    PassManager([MakeBatchDynamic(name)], max_iterations=1)(copy)
    return Model(copy, base_dir=source.base_dir, name=source.name)
