"""Kernel-level epilogues: a Conv (or a BatchNormalization) takes the elementwise steps that follow it.

A following Add/Sum of another value already computed is added into the Conv's own output buffer; a
following Relu is applied in place; a BatchNormalization that stays on its own (before a Conv, as in
DenseNet) applies a following Relu in place. No extra passes over the activations, and the same
arithmetic as the separate kernels. Folding constants into the weights (Conv + BatchNormalization,
per-channel Mul and Add) is not done here: it is a graph rewrite, the rows of
:data:`hybrid.passes.fuse.WEIGHT_FOLDING_RULES`, which the backend applies before compiling.
``fuse=False`` in the backend options turns both off.
"""

from __future__ import annotations

from collections import Counter

from hybrid.backends.reference.ops_conv import ConvKernel
from hybrid.backends.reference.step import Step

__all__ = ["fuse_steps"]


def fuse_steps(steps: list[Step], output_slots: list[int]) -> list[Step]:
    """Return the step list with the kernel-level epilogues fused.

    Conv -> [Add|Sum] -> [Relu] (the Add into the Conv's output buffer, the Relu in place) and BatchNormalization ->
    Relu.
    """
    readers = Counter(s for step in steps for s in step.inputs)
    readers.update(output_slots)
    produced_at = {s: i for i, step in enumerate(steps) for s in step.outputs}
    removed: set[int] = set()

    def sole_reader(slot: int, after: int) -> int | None:
        if readers[slot] != 1:
            return None
        for j in range(after + 1, len(steps)):
            if j not in removed and slot in steps[j].inputs:
                return j
        return None

    for i, step in enumerate(steps):
        if i not in removed and step.op_type == "BatchNormalization" and hasattr(step.run, "relu"):
            j = sole_reader(step.outputs[0], i)
            if j is not None and steps[j].op_type == "Relu" and not step.run.relu:
                step.run.relu = True  # each node has its own kernel object
                step.outputs = steps[j].outputs
                step.label = f"{step.label}+fused"
                removed.add(j)
            continue
        if i in removed or step.op_type != "Conv" or not isinstance(step.run, ConvKernel) or step.run.w is None:
            continue
        conv = step.run
        if conv.relu or conv.residual:
            continue
        out = step.outputs[0]
        inputs = [step.inputs[0]]  # the kernel holds its constant weights; W and B need not be passed
        j = sole_reader(out, i)
        if j is not None and steps[j].op_type in ("Add", "Sum") and len(steps[j].inputs) == 2:
            other = [s for s in steps[j].inputs if s != out]
            # the other operand must exist when the Conv runs
            if len(other) == 1 and produced_at.get(other[0], -1) < i:
                conv = conv.with_weights(conv.w, conv.b)
                conv.residual = True
                inputs = [inputs[0], 0, 0, other[0]]
                removed.add(j)
                out = steps[j].outputs[0]
                j = sole_reader(out, j)
        if j is not None and steps[j].op_type == "Relu":
            conv = conv.with_weights(conv.w, conv.b)
            conv.relu = True
            removed.add(j)
            out = steps[j].outputs[0]
        if conv is not step.run:
            step.run = conv
            step.outputs = (out,)
            step.label = f"{step.label}+fused"
        step.inputs = tuple(inputs)  # its weights need not stay among the constants: the kernel holds them
    return [s for i, s in enumerate(steps) if i not in removed]
