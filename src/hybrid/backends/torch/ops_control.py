"""Control-flow lowerings: If, Loop and Scan run their bodies, lowered to submodules.

A body lowering arrives as ``(module, captured)``: the submodule, and the enclosing graph's values
it reads, which are passed after the body's own inputs.
"""

from __future__ import annotations

import torch

from hybrid.backends.torch.lowering import ALL, lowering


def _scalar(value):
    """A host scalar given as a Python value, a list of one, or a tensor."""
    if isinstance(value, torch.Tensor):
        return value.reshape(-1)[0].item()
    if isinstance(value, (list, tuple)):
        return value[0]
    return value


def _call(body, *args):
    module, captured = body
    return list(module(*args, *captured))


@lowering("If", host_inputs=(0,), dtypes=ALL, foldable=False)
def if_(cond, *, then_branch, else_branch):
    """ONNX If: runs ``then_branch`` or ``else_branch`` on the host value of ``cond``."""
    flag = bool(_scalar(cond))
    outs = _call(then_branch if flag else else_branch)
    return outs[0] if len(outs) == 1 else tuple(outs)


@lowering("Loop", host_inputs=(0, 1), dtypes=ALL, foldable=False, n_outputs=True)
def loop(max_trip=None, cond=None, *carried, body, n_outputs=1):
    """ONNX Loop: runs ``body`` while ``cond`` holds and fewer than ``max_trip`` iterations ran.

    Returns the final loop-carried values, then each scan output stacked over the iterations.
    """
    limit = None if max_trip is None else int(_scalar(max_trip))
    keep = True if cond is None else bool(_scalar(cond))
    state = list(carried)
    scans: list[list[torch.Tensor]] = []
    i = 0
    while keep and (limit is None or i < limit):
        outs = _call(body, torch.tensor(i, dtype=torch.int64), torch.tensor(keep), *state)
        keep = bool(outs[0])
        state = outs[1:1 + len(state)]
        extra = outs[1 + len(carried):]
        if not scans:
            scans = [[] for _ in extra]
        for acc, v in zip(scans, extra):
            acc.append(v)
        i += 1
    n_scan = n_outputs - len(carried)
    stacked = [torch.stack(acc) if acc else torch.zeros(0) for acc in scans] or [torch.zeros(0)] * n_scan
    result = state + stacked[:n_scan]
    return result[0] if n_outputs == 1 else tuple(result)


@lowering("Scan", since=9, dtypes=ALL, foldable=False, n_outputs=True)
def scan(*inputs, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None, n_outputs=1):
    """ONNX Scan (opset 9 on): runs ``body`` once per step of the scan inputs, threading the state through.

    Each scan input is read along its axis (reversed where its direction says), and each scan output
    is stacked along its axis in its direction.
    """
    n_state = len(inputs) - num_scan_inputs
    state = list(inputs[:n_state])
    seqs = list(inputs[n_state:])
    in_axes = scan_input_axes or [0] * num_scan_inputs
    in_dirs = scan_input_directions or [0] * num_scan_inputs
    seqs = [s.movedim(a if a >= 0 else a + s.dim(), 0) for s, a in zip(seqs, in_axes)]
    seqs = [s.flip(0) if d else s for s, d in zip(seqs, in_dirs)]
    steps = seqs[0].shape[0] if seqs else 0
    n_scan_out = n_outputs - n_state
    acc: list[list[torch.Tensor]] = [[] for _ in range(n_scan_out)]
    for t in range(steps):
        outs = _call(body, *state, *[s[t] for s in seqs])
        state = outs[:n_state]
        for j in range(n_scan_out):
            acc[j].append(outs[n_state + j])
    out_axes = scan_output_axes or [0] * n_scan_out
    out_dirs = scan_output_directions or [0] * n_scan_out
    stacked = []
    for values, a, d in zip(acc, out_axes, out_dirs):
        if d:
            values = values[::-1]
        y = torch.stack(values)
        stacked.append(y.movedim(0, a if a >= 0 else a + y.dim()))
    result = state + stacked
    return result[0] if n_outputs == 1 else tuple(result)
