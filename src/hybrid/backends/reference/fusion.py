"""Compile-time fusions of a Conv (or a BatchNormalization) with the elementwise steps that follow it.

A Conv whose only reader is a BatchNormalization with constant statistics takes the normalization
into its weights (w * a, b * a + shift), and so do Mul and Add by per-channel constants; a following
Add/Sum of another value already computed is added into the Conv's own output buffer; a following
Relu is applied in place. This is the same arithmetic as the separate kernels (folded in float64
first), without extra passes over the activations. A BatchNormalization that stays on its own
(before a Conv, as in DenseNet) applies a following Relu in place. ``fuse=False`` in the backend
options turns it off.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from hybrid.backends.reference.ops_conv import ConvKernel
from hybrid.backends.reference.step import Step

__all__ = ["fuse_steps"]


def _fold_batch_norm(conv: ConvKernel, scale_shift: tuple[np.ndarray, np.ndarray]) -> ConvKernel | None:
    w, b = conv.w, conv.b
    if w is None or w.dtype.kind != "f":
        return None
    a, shift = (np.asarray(v, dtype=np.float64).reshape(-1) for v in scale_shift)
    if a.shape[0] != w.shape[0]:
        return None
    w2 = (w.astype(np.float64) * a.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype)
    b0 = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
    return conv.with_weights(w2, (b0 * a + shift).astype(w.dtype))


def _per_channel(value: object, m: int, ndim: int) -> np.ndarray | None:
    """``value`` as m per-output-channel numbers, if it broadcasts against (N, M, *spatial) that way."""
    if not isinstance(value, np.ndarray) or value.ndim > ndim or value.dtype.kind != "f":
        return None
    dims = (1,) * (ndim - value.ndim) + value.shape
    if dims[0] != 1 or dims[1] not in (1, m) or any(d != 1 for d in dims[2:]):
        return None
    return np.broadcast_to(value.reshape(dims[1]).astype(np.float64), (m,))


def _fold_affine(conv: ConvKernel, step: Step, out: int) -> ConvKernel | None:
    """Fold a Mul or Add by a per-channel constant into the Conv's weights and bias."""
    w = conv.w
    if w is None or len(step.inputs) != 2 or out not in step.inputs:
        return None
    other = step.consts[1 - step.inputs.index(out)] if step.consts else None
    vec = _per_channel(other, w.shape[0], w.ndim)
    if vec is None:
        return None
    b = np.zeros(w.shape[0]) if conv.b is None else conv.b.astype(np.float64)
    if step.op_type == "Mul":
        scaled = w.astype(np.float64) * vec.reshape(-1, *([1] * (w.ndim - 1)))
        return conv.with_weights(scaled.astype(w.dtype), (b * vec).astype(w.dtype))
    return conv.with_weights(w, (b + vec).astype(w.dtype))


def fuse_steps(steps: list[Step], output_slots: list[int]) -> list[Step]:
    """Return the step list with Conv -> [BatchNormalization] -> [Mul/Add by per-channel constants]
    -> [Add|Sum] -> [Relu] chains fused."""
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
        if j is not None and steps[j].op_type == "BatchNormalization" and steps[j].inputs[0] == out:
            scale_shift = getattr(steps[j].run, "scale_shift", None)
            fused = _fold_batch_norm(conv, scale_shift) if scale_shift is not None else None
            if fused is not None:
                conv, out = fused, steps[j].outputs[0]
                removed.add(j)
                j = sole_reader(out, j)
        # per-channel scale and shift by constants (BatchNormalization written as Mul and Add)
        while j is not None and steps[j].op_type in ("Mul", "Add") and steps[j].inputs.count(out) == 1:
            fused = _fold_affine(conv, steps[j], out)
            if fused is None:
                break
            conv, out = fused, steps[j].outputs[0]
            removed.add(j)
            j = sole_reader(out, j)
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
            step.inputs = tuple(inputs)
            step.outputs = (out,)
            step.label = f"{step.label}+fused"
    return [s for i, s in enumerate(steps) if i not in removed]
