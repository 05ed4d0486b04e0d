"""Sequence and optional lowerings: values are Python lists of tensors (or None) in the graph."""

from __future__ import annotations

import torch

from hybrid.backends.torch.lowering import ALL, ints, lowering, torch_dtype


def _pos(index, n):
    i = ints(index)[0]
    return i + n if i < 0 else i


@lowering("SequenceConstruct", dtypes=ALL)
def sequence_construct(*xs):
    """ONNX SequenceConstruct: a list of the inputs, in order."""
    return list(xs)


@lowering("SequenceEmpty", dtypes=ALL)
def sequence_empty(*, dtype=1):
    """ONNX SequenceEmpty: an empty list; ``dtype`` is only checked to have a torch dtype."""
    torch_dtype(dtype)
    return []


@lowering("SequenceAt", host_inputs=(1,), dtypes=ALL)
def sequence_at(seq, index):
    """ONNX SequenceAt: the tensor at ``index`` (negative counts from the end)."""
    return seq[_pos(index, len(seq))]


@lowering("SequenceInsert", host_inputs=(2,), dtypes=ALL)
def sequence_insert(seq, x, index=None):
    """ONNX SequenceInsert: a new list with ``x`` at ``index``, or appended when ``index`` is absent."""
    out = list(seq)
    out.insert(len(out) if index is None else _pos(index, len(out)), x)
    return out


@lowering("SequenceErase", host_inputs=(1,), dtypes=ALL)
def sequence_erase(seq, index=None):
    """ONNX SequenceErase: a new list without the tensor at ``index``, or without the last one."""
    out = list(seq)
    del out[-1 if index is None else _pos(index, len(out))]
    return out


@lowering("SequenceLength", dtypes=ALL)
def sequence_length(seq):
    """ONNX SequenceLength: the number of tensors as an int64 scalar."""
    return torch.tensor(len(seq), dtype=torch.int64)


@lowering("SplitToSequence", host_inputs=(1,), dtypes=ALL)
def split_to_sequence(x, split=None, *, axis=0, keepdims=1):
    """ONNX SplitToSequence: ``x`` split along ``axis`` into a list.

    Without ``split`` the parts have size 1 (squeezed unless ``keepdims``); a scalar ``split`` is a
    chunk size and a 1-D one lists the part sizes.
    """
    axis = axis + x.dim() if axis < 0 else axis
    if split is None:
        parts = list(torch.split(x, 1, dim=axis))
        return [p.squeeze(axis) for p in parts] if not keepdims else parts
    sizes = ints(split)
    if (isinstance(split, torch.Tensor) and split.dim() == 0) or (len(sizes) == 1 and not isinstance(split, list)):
        return list(torch.split(x, sizes[0], dim=axis))
    return list(torch.split(x, sizes, dim=axis))


@lowering("ConcatFromSequence", dtypes=ALL)
def concat_from_sequence(seq, *, axis, new_axis=0):
    """ONNX ConcatFromSequence: concatenates the tensors along ``axis``, or with ``new_axis`` stacks them on it."""
    return torch.stack(seq, dim=axis) if new_axis else torch.cat(seq, dim=axis)


@lowering("Optional", dtypes=ALL)
def optional(x=None, *, type=None):
    """ONNX Optional: the input itself, or None for an empty optional."""
    return x


@lowering("OptionalHasElement", dtypes=ALL)
def optional_has_element(x=None):
    """ONNX OptionalHasElement: a bool scalar, true when the input is present."""
    return torch.tensor(x is not None)


@lowering("OptionalGetElement", dtypes=ALL)
def optional_get_element(x):
    """ONNX OptionalGetElement: the input itself."""
    return x
