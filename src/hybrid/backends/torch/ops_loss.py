"""Loss lowerings: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss."""

from __future__ import annotations

import torch
from onnx_ir import DataType

from hybrid.backends.torch.lowering import FLOATS, lowering

_LOSS_TYPES = FLOATS | {DataType.INT32, DataType.INT64}


def _nll(log_prob, target, weight, reduction, ignore_index):
    n, c = log_prob.shape[:2]
    x = log_prob.reshape(n, c, -1)
    t = target.reshape(n, -1).to(torch.int64)
    valid = torch.ones_like(t, dtype=torch.bool) if ignore_index is None else t != ignore_index
    safe = torch.where(valid, t, torch.zeros_like(t)).clamp(0, c - 1)
    picked = -torch.gather(x, 1, safe.unsqueeze(1)).squeeze(1)
    w = weight[safe] if weight is not None else torch.ones_like(picked)
    w = torch.where(valid, w, torch.zeros_like(w))
    loss = picked * w
    if reduction == "none":
        return loss.reshape(target.shape)
    if reduction == "sum":
        return loss.sum()
    if weight is None and ignore_index is None:
        return loss.mean()
    return loss.sum() / w.sum()


@lowering("NegativeLogLikelihoodLoss", since=12, dtypes=_LOSS_TYPES)
def nll_loss(x, target, weight=None, *, ignore_index=None, reduction="mean"):
    """ONNX NegativeLogLikelihoodLoss: ``-x[n, target]`` times the class weight; ``ignore_index`` targets count 0.

    The ``mean`` reduction divides by the sum of the weights that apply.
    """
    return _nll(x, target, weight, reduction, ignore_index).to(x.dtype)


@lowering("SoftmaxCrossEntropyLoss", since=12, dtypes=_LOSS_TYPES, n_outputs=True)
def softmax_cross_entropy_loss(x, target, weight=None, *, ignore_index=None, reduction="mean", n_outputs=1):
    """ONNX SoftmaxCrossEntropyLoss: the NLL loss of ``log_softmax(x, dim=1)``, which is the optional 2nd output."""
    log_prob = torch.log_softmax(x, dim=1)
    loss = _nll(log_prob, target, weight, reduction, ignore_index).to(x.dtype)
    return loss if n_outputs == 1 else (loss, log_prob)
