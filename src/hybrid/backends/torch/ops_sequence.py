"""Sequence and optional lowerings: values are Python lists of tensors (or None) in the graph."""

from __future__ import annotations

import torch

from hybrid.backends.torch.lowering import ALL, ints, lowering, torch_dtype


def _pos(index, n):
    i = ints(index)[0]
    return i + n if i < 0 else i


@lowering("SequenceConstruct", dtypes=ALL)
def sequence_construct(*xs):
    return list(xs)


@lowering("SequenceEmpty", dtypes=ALL)
def sequence_empty(*, dtype=1):
    torch_dtype(dtype)
    return []


@lowering("SequenceAt", host_inputs=(1,), dtypes=ALL)
def sequence_at(seq, index):
    return seq[_pos(index, len(seq))]


@lowering("SequenceInsert", host_inputs=(2,), dtypes=ALL)
def sequence_insert(seq, x, index=None):
    out = list(seq)
    out.insert(len(out) if index is None else _pos(index, len(out)), x)
    return out


@lowering("SequenceErase", host_inputs=(1,), dtypes=ALL)
def sequence_erase(seq, index=None):
    out = list(seq)
    del out[-1 if index is None else _pos(index, len(out))]
    return out


@lowering("SequenceLength", dtypes=ALL)
def sequence_length(seq):
    return torch.tensor(len(seq), dtype=torch.int64)


@lowering("SplitToSequence", host_inputs=(1,), dtypes=ALL)
def split_to_sequence(x, split=None, *, axis=0, keepdims=1):
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
    return torch.stack(seq, dim=axis) if new_axis else torch.cat(seq, dim=axis)


@lowering("Optional", dtypes=ALL)
def optional(x=None, *, type=None):
    return x


@lowering("OptionalHasElement", dtypes=ALL)
def optional_has_element(x=None):
    return torch.tensor(x is not None)


@lowering("OptionalGetElement", dtypes=ALL)
def optional_get_element(x):
    return x
