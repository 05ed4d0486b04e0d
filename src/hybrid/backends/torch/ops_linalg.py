"""Matrix lowerings: Gemm, MatMul, Einsum, the softmax family, Attention and RotaryEmbedding."""

from __future__ import annotations

import math

import torch
from onnx_ir import DataType

from hybrid.backends.torch.lowering import COMMON, FLOATS, lowering, torch_dtype

NUMERIC = COMMON - {DataType.BOOL}


def _matmul(a, b):
    if a.is_floating_point() or a.device.type == "cpu":
        return torch.matmul(a, b)
    # integer matmul has no CUDA kernel: exact in float64 for the sizes ONNX tests use
    return torch.matmul(a.to(torch.float64), b.to(torch.float64)).to(a.dtype)


@lowering("MatMul", dtypes=NUMERIC)
def matmul(a, b):
    """ONNX MatMul with numpy broadcasting; integer matmul on CUDA goes through float64, which has a kernel."""
    return _matmul(a, b)


@lowering("Gemm", dtypes=NUMERIC)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """ONNX Gemm: ``alpha * A' @ B' + beta * C``, each of A and B transposed when ``transA``/``transB`` ask."""
    a = a.T if transA else a
    b = b.T if transB else b
    y = _matmul(a, b)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return y.to(a.dtype)


@lowering("Einsum", dtypes=NUMERIC)
def einsum(*xs, equation):
    """ONNX Einsum: ``torch.einsum`` on the same ``equation``."""
    return torch.einsum(equation, *xs)


# ------------------------------------------------------------------ softmax family
def _coerced(fn, x, axis):
    """Opsets before 13: flatten to 2-D at ``axis``, apply along dim 1, restore the shape."""
    axis = axis + x.dim() if axis < 0 else axis
    lead = math.prod(x.shape[:axis])
    return fn(x.reshape(lead, -1), 1).reshape(x.shape)


def _hardmax(x, dim):
    """ONNX Hardmax along ``dim``: 1 at the first maximum, 0 elsewhere."""
    idx = torch.argmax(x, dim=dim, keepdim=True)  # first maximal index, as ONNX asks
    return torch.zeros_like(x).scatter(dim, idx, 1)


def _make_softmax_like(stem, fn):
    """The two ONNX definitions of a softmax-like op, named ``{stem}_2d`` and ``{stem}``.

    Before opset 13 the input is coerced to 2-D at ``axis`` (default 1) and ``fn`` runs along the rows;
    from 13 ``fn`` runs along ``axis`` (default -1).
    """

    def coerced(x, *, axis=1):
        return _coerced(fn, x, axis)

    def along_axis(x, *, axis=-1):
        return fn(x, axis)

    coerced.__name__ = coerced.__qualname__ = f"{stem}_2d"
    along_axis.__name__ = along_axis.__qualname__ = stem
    return coerced, along_axis


for _op, _stem, _fn in (("Softmax", "softmax", torch.softmax), ("LogSoftmax", "log_softmax", torch.log_softmax),
                        ("Hardmax", "hardmax", _hardmax)):
    _before_13, _since_13 = _make_softmax_like(_stem, _fn)
    lowering(_op, dtypes=FLOATS)(_before_13)
    lowering(_op, since=13, dtypes=FLOATS)(_since_13)


# ------------------------------------------------------------------ attention
def _heads(t, n):
    b, s, hidden = t.shape
    return t.reshape(b, s, n, hidden // n).transpose(1, 2)


def _allowed_bias(allowed, dtype, device):
    zero = torch.zeros((), dtype=dtype, device=device)
    bias = torch.where(allowed, zero, torch.full((), -math.inf, dtype=dtype, device=device))
    return bias.unsqueeze(1) if bias.dim() == 3 else bias  # per-batch: (batch, 1, q, kv)


def _diff(q_len, kv_len, offset, device):
    """Query position (shifted by ``offset``, an int or one per batch) minus key position."""
    i = torch.arange(q_len, device=device).reshape(q_len, 1)
    j = torch.arange(kv_len, device=device).reshape(1, kv_len)
    if isinstance(offset, torch.Tensor):
        return i + offset.reshape(-1, 1, 1).to(device) - j
    return i + offset - j


def _causal_bias(q_len, kv_len, offset, dtype, device):
    return _allowed_bias(_diff(q_len, kv_len, offset, device) >= 0, dtype, device)


def _window_bias(q_len, kv_len, offset, left, right, dtype, device):
    diff = _diff(q_len, kv_len, offset, device)
    allowed = torch.ones_like(diff, dtype=torch.bool)
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    return _allowed_bias(allowed, dtype, device)


@lowering("Attention", since=23, dtypes=FLOATS | {DataType.BOOL, DataType.INT64}, n_outputs=True)
def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None,
              softcap=0.0, softmax_precision=None, left_window_size=-1, right_window_size=-1, n_outputs=1):
    """ONNX Attention (opset 23), step by step as the ONNX reference does it.

    It takes 3-D or 4-D Q/K/V, a past key/value cache, bool or additive masks, causal and sliding-window
    masking, grouped-query heads and softcap. Rows whose keys are all masked give zeros, not NaN. The
    outputs are the result, the present key/value and the ``qk_matmul_output_mode`` scores.
    """
    # follows the ONNX reference step by step (scale split over Q and K, bias, softcap, guard)
    three_d = q.dim() == 3
    if three_d:
        q, k, v = _heads(q, q_num_heads), _heads(k, kv_num_heads), _heads(v, kv_num_heads)
    dtype = q.dtype
    if scale is None:
        scale = 1 / math.sqrt(q.shape[3])
    root = torch.tensor(math.sqrt(scale), dtype=dtype, device=q.device)
    if past_key is not None:
        k = torch.cat([past_key, k], dim=2)
    if past_value is not None:
        v = torch.cat([past_value, v], dim=2)
    present_key, present_value = k, v
    q_len, kv_len = q.shape[2], k.shape[2]
    bias = torch.zeros((q_len, kv_len), dtype=dtype, device=q.device)
    if attn_mask is not None:
        pad = kv_len - attn_mask.shape[-1]
        if pad > 0:
            fill = False if attn_mask.dtype == torch.bool else -math.inf
            attn_mask = torch.nn.functional.pad(attn_mask, [0, pad], value=fill)
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.where(attn_mask, torch.zeros((), dtype=dtype, device=q.device),
                                    torch.full((), -math.inf, dtype=dtype, device=q.device))
    if past_key is None and nonpad_kv_seqlen is not None:
        offset = nonpad_kv_seqlen.to(torch.int64).reshape(-1) - q_len  # external cache: one per batch
    else:
        offset = past_key.shape[2] if past_key is not None else 0
    if is_causal:
        base = bias if attn_mask is None else attn_mask + bias
        bias = base + _causal_bias(q_len, kv_len, offset, dtype, q.device)
    elif attn_mask is not None:
        bias = bias + attn_mask
    if left_window_size >= 0 or right_window_size >= 0:
        bias = bias + _window_bias(q_len, kv_len, offset, left_window_size, right_window_size, dtype, q.device)
    if nonpad_kv_seqlen is not None:
        keys = torch.arange(kv_len, device=q.device).reshape(1, kv_len)
        padded = keys < nonpad_kv_seqlen.to(q.device).reshape(-1, 1)
        bias = bias + _allowed_bias(padded, dtype, q.device).reshape(-1, 1, 1, kv_len)
    heads_q = q.shape[1]
    heads_k = k.shape[1]
    if heads_q != heads_k and heads_q % heads_k == 0:
        k = k.repeat_interleave(heads_q // heads_k, dim=1)
        v = v.repeat_interleave(heads_q // heads_k, dim=1)
    scores = torch.matmul(q * root, (k * root).transpose(-1, -2))
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    qk_out = scores
    with_bias = scores + bias
    if qk_matmul_output_mode == 2:
        qk_out = with_bias
    work = with_bias.to(torch_dtype(softmax_precision)) if softmax_precision is not None else with_bias
    row_max = work.amax(dim=-1, keepdim=True)
    masked_rows = torch.isneginf(row_max)
    probs = torch.exp(work - torch.where(masked_rows, torch.zeros_like(row_max), row_max))
    total = probs.sum(dim=-1, keepdim=True)
    probs = probs / torch.where(total == 0, torch.ones_like(total), total)
    all_masked = torch.isneginf(bias.amax(dim=-1, keepdim=True))
    probs = torch.where(all_masked, torch.zeros((), dtype=probs.dtype, device=q.device), probs)
    if qk_matmul_output_mode == 3:
        qk_out = probs
    y = torch.matmul(probs.to(dtype), v)
    if three_d:
        y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    outs = (y, present_key, present_value, qk_out.to(dtype))
    return outs[0] if n_outputs == 1 else outs[:n_outputs]


@lowering("RotaryEmbedding", since=23, dtypes=FLOATS | {DataType.INT64})
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                     rotary_embedding_dim=0):
    """ONNX RotaryEmbedding (opset 23): rotates the first ``rotary_embedding_dim`` channels of each head.

    The pairs are interleaved or split in halves; ``position_ids`` pick the rows of the cos/sin caches.
    """
    shape = x.shape
    t = x.transpose(1, 2) if x.dim() == 4 else x.reshape(shape[0], shape[1], num_heads, -1)
    dim = rotary_embedding_dim or t.shape[3]
    rot, rest = t[..., :dim], t[..., dim:]
    if position_ids is not None:
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    cos, sin = cos_cache.unsqueeze(2), sin_cache.unsqueeze(2)
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot.chunk(2, dim=-1)
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rot = torch.stack([real, imag], dim=-1).reshape(rot.shape)
    else:
        rot = torch.cat([real, imag], dim=-1)
    out = torch.cat([rot, rest], dim=-1)
    return out.reshape(shape) if x.dim() == 3 else out.transpose(1, 2)


@lowering("Det", dtypes=FLOATS)
def det(x):
    """ONNX Det: the determinant of each square matrix in the last two dims."""
    return torch.linalg.det(x)
