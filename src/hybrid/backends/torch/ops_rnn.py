"""Recurrent lowerings: RNN, GRU and LSTM, step by step over the sequence (ONNX gate layouts).

Activations come from the node's ``activations`` attribute (ONNX defaults otherwise); ``clip`` and
``sequence_lens`` are honoured: past a sequence's length its outputs are zero and its state holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from onnx_ir import DataType

from hybrid.backends.torch.lowering import FLOATS, lowering

_TYPES = FLOATS | {DataType.INT32}


def _activation(name: str, alpha: float | None, beta: float | None):
    key = name.lower()
    if key == "sigmoid":
        return torch.sigmoid
    if key == "tanh":
        return torch.tanh
    if key == "relu":
        return torch.relu
    if key == "leakyrelu":
        return lambda x: F.leaky_relu(x, 0.01 if alpha is None else alpha)
    if key == "thresholdedrelu":
        return lambda x: torch.where(x > (1.0 if alpha is None else alpha), x, torch.zeros_like(x))
    if key == "scaledtanh":
        return lambda x: (1.0 if alpha is None else alpha) * torch.tanh((1.0 if beta is None else beta) * x)
    if key == "hardsigmoid":
        return lambda x: torch.clamp((0.2 if alpha is None else alpha) * x + (0.5 if beta is None else beta), 0, 1)
    if key == "elu":
        return lambda x: F.elu(x, 1.0 if alpha is None else alpha)
    if key == "softsign":
        return F.softsign
    if key == "softplus":
        return F.softplus
    if key == "affine":
        return lambda x: (1.0 if alpha is None else alpha) * x + (0.0 if beta is None else beta)
    raise ValueError(f"unknown recurrent activation {name!r}")


_TAKES_ALPHA = {"leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu", "affine"}
_TAKES_BETA = {"scaledtanh", "hardsigmoid", "affine"}


def _activations(names, alphas, betas, per_direction: int, directions: int, defaults):
    """One list of activation functions per direction, consuming alpha/beta in order."""
    names = list(names) if names else list(defaults) * directions
    alphas, betas = list(alphas or []), list(betas or [])
    fns = []
    for name in names:
        key = name.lower()
        a = alphas.pop(0) if key in _TAKES_ALPHA and alphas else None
        b = betas.pop(0) if key in _TAKES_BETA and betas else None
        fns.append(_activation(name, a, b))
    return [fns[d * per_direction:(d + 1) * per_direction] for d in range(directions)]


def _check_activations(node):
    attr = node.attributes.get("activations")
    try:
        for name in (attr.value if attr is not None else []):
            _activation(name, None, None)
    except ValueError as e:
        return str(e)
    return None


def _run(cell, x, h0, c0, lens, reverse):
    """Run ``cell(x_t, h, c) -> (h, c)`` over time; returns Y (T, B, H), last h, last c."""
    steps = x.shape[0]
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    h, c = h0, c0
    ys = [None] * steps
    for t in order:
        nh, nc = cell(x[t], h, c)
        if lens is not None:
            live = (t < lens).reshape(-1, 1)
            nh = torch.where(live, nh, h)
            nc = torch.where(live, nc, c) if nc is not None else None
            ys[t] = torch.where(live, nh, torch.zeros_like(nh))
        else:
            ys[t] = nh
        h, c = nh, nc
    return torch.stack(ys), h, c


def _recurrent(x, w, r, b, lens, h0, c0, *, direction, layout, hidden, gates, n_outputs, make_cell):
    if layout:
        x = x.transpose(0, 1)
        h0 = h0.transpose(0, 1) if h0 is not None else None
        c0 = c0.transpose(0, 1) if c0 is not None else None
    directions = w.shape[0]
    batch = x.shape[1]
    if b is None:
        b = torch.zeros(directions, 2 * gates * hidden, dtype=x.dtype, device=x.device)
    if h0 is None:
        h0 = torch.zeros(directions, batch, hidden, dtype=x.dtype, device=x.device)
    if c0 is None:
        c0 = torch.zeros(directions, batch, hidden, dtype=x.dtype, device=x.device)
    lens = lens.to(x.device) if lens is not None else None
    ys, hs, cs = [], [], []
    for d in range(directions):
        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        cell = make_cell(d, w[d], r[d], b[d])
        y, h, c = _run(cell, x, h0[d], c0[d], lens, reverse)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    y = torch.stack(ys, dim=1)  # (T, D, B, H)
    y_h, y_c = torch.stack(hs), torch.stack(cs)
    if layout:
        y = y.permute(2, 0, 1, 3)
        y_h, y_c = y_h.transpose(0, 1), y_c.transpose(0, 1)
    outs = (y, y_h, y_c)
    return outs[0] if n_outputs == 1 else outs[:n_outputs]


def _clipped(clip):
    return (lambda v: torch.clamp(v, -clip, clip)) if clip is not None else (lambda v: v)


@lowering("RNN", since=7, dtypes=_TYPES, check=_check_activations, n_outputs=True)
def rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, n_outputs=1):
    """ONNX RNN: ``h = f(x W^T + h R^T + Wb + Rb)`` per step, ``f`` Tanh by default; outputs Y and Y_h."""
    hidden = r.shape[-1]
    fns = _activations(activations, activation_alpha, activation_beta, 1, w.shape[0], ["Tanh"])
    cut = _clipped(clip)

    def make_cell(d, wd, rd, bd):
        bias = bd[:hidden] + bd[hidden:]
        f = fns[d][0]
        return lambda xt, h, c: (f(cut(xt @ wd.T + h @ rd.T + bias)), c)

    return _recurrent(x, w, r, b, sequence_lens, initial_h, None, direction=direction, layout=layout, hidden=hidden,
                      gates=1, n_outputs=min(n_outputs, 2), make_cell=make_cell)


@lowering("GRU", since=7, dtypes=_TYPES, check=_check_activations, n_outputs=True)
def gru(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, linear_before_reset=0,
        n_outputs=1):
    """ONNX GRU with gates z, r, h (ONNX order); ``linear_before_reset`` applies the reset gate after ``h R_h^T``."""
    hidden = r.shape[-1]
    fns = _activations(activations, activation_alpha, activation_beta, 2, w.shape[0], ["Sigmoid", "Tanh"])
    cut = _clipped(clip)

    def make_cell(d, wd, rd, bd):
        f, g = fns[d]
        wz, wr, wh = wd.split(hidden)
        rz, rr, rh = rd.split(hidden)
        wbz, wbr, wbh, rbz, rbr, rbh = bd.split(hidden)

        def cell(xt, h, c):
            z = f(cut(xt @ wz.T + h @ rz.T + wbz + rbz))
            rg = f(cut(xt @ wr.T + h @ rr.T + wbr + rbr))
            if linear_before_reset:
                cand = g(cut(xt @ wh.T + rg * (h @ rh.T + rbh) + wbh))
            else:
                cand = g(cut(xt @ wh.T + (rg * h) @ rh.T + rbh + wbh))
            return (1 - z) * cand + z * h, c

        return cell

    return _recurrent(x, w, r, b, sequence_lens, initial_h, None, direction=direction, layout=layout, hidden=hidden,
                      gates=3, n_outputs=min(n_outputs, 2), make_cell=make_cell)


@lowering("LSTM", since=7, dtypes=_TYPES, check=_check_activations, n_outputs=True)
def lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *, activation_alpha=None,
         activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, input_forget=0,
         layout=0, n_outputs=1):
    """ONNX LSTM with gates i, o, f, c (ONNX order), optional peepholes ``p`` and coupled ``input_forget``.

    Outputs are Y, Y_h and Y_c.
    """
    hidden = r.shape[-1]
    directions = w.shape[0]
    fns = _activations(activations, activation_alpha, activation_beta, 3, directions, ["Sigmoid", "Tanh", "Tanh"])
    cut = _clipped(clip)
    if p is None:
        p = torch.zeros(directions, 3 * hidden, dtype=x.dtype, device=x.device)

    def make_cell(d, wd, rd, bd):
        f, g, hfn = fns[d]
        bias = bd[:4 * hidden] + bd[4 * hidden:]
        pi, po, pf = p[d].split(hidden)

        def cell(xt, h, c):
            gi, go, gf, gc = (xt @ wd.T + h @ rd.T + bias).split(hidden, dim=-1)
            i = f(cut(gi + pi * c))
            fg = 1 - i if input_forget else f(cut(gf + pf * c))
            cand = g(cut(gc))
            nc = fg * c + i * cand
            o = f(cut(go + po * nc))
            return o * hfn(nc), nc

        return cell

    return _recurrent(x, w, r, b, sequence_lens, initial_h, initial_c, direction=direction, layout=layout,
                      hidden=hidden, gates=4, n_outputs=n_outputs, make_cell=make_cell)
