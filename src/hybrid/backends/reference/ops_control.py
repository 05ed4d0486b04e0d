"""Control flow: If, Loop and Scan run their subgraphs through hybrid's own interpreter.

Each subgraph is compiled once at compile time into a Program whose inputs are its formal inputs
followed by the outer-scope values it reads; the node receives those outer values after its own
inputs (the interpreter appends them, so liveness keeps them alive until the node has run).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hybrid.backends.reference.registry import NodeContext, prepared

__all__: list[str] = []


def _binder(program: Any, n_formal: int, captures: tuple[str, ...]):
    """Positions, in the node's trailing captured values, of what ``program`` reads from outside."""
    where = {name: i for i, name in enumerate(captures)}
    return [where[name] for name in program.input_names[n_formal:]]


@prepared("If", since=1)
def _if(ctx: NodeContext):
    assert ctx.compile_graph is not None
    then_p = ctx.compile_graph(ctx.attrs["then_branch"])
    else_p = ctx.compile_graph(ctx.attrs["else_branch"])
    then_b = _binder(then_p, 0, ctx.captures)
    else_b = _binder(else_p, 0, ctx.captures)

    def run(cond, *outer):
        if np.asarray(cond).size != 1:
            raise ValueError(f"If expects a one-element condition, got shape {list(np.shape(cond))}")
        prog, bind = (then_p, then_b) if bool(np.asarray(cond).reshape(-1)[0]) else (else_p, else_b)
        return tuple(prog.run([outer[i] for i in bind]))

    return run


@prepared("Loop", since=1)
def _loop(ctx: NodeContext):
    assert ctx.compile_graph is not None
    body = ctx.compile_graph(ctx.attrs["body"])
    n_own = len(ctx.present)
    n_carried = n_own - 2
    n_formal = 2 + n_carried
    bind = _binder(body, n_formal, ctx.captures)

    def run(*args):
        max_trip, cond = args[0], args[1]
        carried = list(args[2:n_own])
        outer = args[n_own:]
        extra = [outer[i] for i in bind]
        limit = None if max_trip is None else int(np.asarray(max_trip).reshape(-1)[0])
        keep_going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        scans: list[list[Any]] | None = None
        i = 0
        while keep_going and (limit is None or i < limit):
            outs = body.run([np.array(i, dtype=np.int64), np.array(keep_going), *carried, *extra])
            keep_going = bool(np.asarray(outs[0]).reshape(-1)[0])
            carried = list(outs[1:1 + n_carried])
            if scans is None:
                scans = [[] for _ in outs[1 + n_carried:]]
            for acc, v in zip(scans, outs[1 + n_carried:]):
                acc.append(v)
            i += 1
        n_scan = len(body.output_names) - 1 - n_carried
        results: list[Any] = list(carried)
        for j in range(n_scan):
            values = scans[j] if scans else []
            if values and isinstance(values[0], np.ndarray):
                results.append(np.stack(values))
            elif values:
                results.append(values)
            else:
                results.append(np.array([], dtype=np.float32))
        return tuple(results)

    return run


def _scan_body(ctx: NodeContext) -> tuple[Any, int, int]:
    """A Scan's body compiled, how many scan inputs it declares, and how many inputs the node has itself."""
    assert ctx.compile_graph is not None
    return ctx.compile_graph(ctx.attrs["body"]), ctx.attrs["num_scan_inputs"], len(ctx.present)


@prepared("Scan", since=9)
def _scan(ctx: NodeContext):
    attrs = ctx.attrs
    body, n_scan_in, n_own = _scan_body(ctx)
    n_state = n_own - n_scan_in
    bind = _binder(body, n_own, ctx.captures)
    n_scan_out = len(body.output_names) - n_state
    in_axes = list(attrs.get("scan_input_axes") or [0] * n_scan_in)
    in_dirs = list(attrs.get("scan_input_directions") or [0] * n_scan_in)
    out_axes = list(attrs.get("scan_output_axes") or [0] * n_scan_out)
    out_dirs = list(attrs.get("scan_output_directions") or [0] * n_scan_out)

    def run(*args):
        state = list(args[:n_state])
        scan_in = [np.moveaxis(x, a % x.ndim, 0) for x, a in zip(args[n_state:n_own], in_axes)]
        extra = [args[n_own:][i] for i in bind]
        steps = scan_in[0].shape[0] if scan_in else 0
        collected: list[list[np.ndarray]] = [[] for _ in range(n_scan_out)]
        for t in range(steps):
            slices = [x[steps - 1 - t] if d else x[t] for x, d in zip(scan_in, in_dirs)]
            outs = body.run([*state, *slices, *extra])
            state = list(outs[:n_state])
            for acc, v in zip(collected, outs[n_state:]):
                acc.append(v)
        results = list(state)
        for acc, axis, direction in zip(collected, out_axes, out_dirs):
            stacked = np.stack(acc[::-1] if direction else acc)
            results.append(np.moveaxis(stacked, 0, axis % stacked.ndim))
        return tuple(results)

    return run


@prepared("Scan", since=8)
def _scan_v8(ctx: NodeContext):
    """Scan-8: a leading optional ``sequence_lens`` input and a batch axis on every input."""
    attrs = ctx.attrs
    if set(attrs) - {"body", "num_scan_inputs", "directions"}:
        return None
    body, n_scan_in, n_own = _scan_body(ctx)
    n_state = n_own - 1 - n_scan_in
    bind = _binder(body, n_state + n_scan_in, ctx.captures)
    dirs = list(attrs.get("directions") or [0] * n_scan_in)

    def run(seq_lens, *args):
        extra = [args[n_own - 1:][i] for i in bind]
        states = args[:n_state]
        scans = args[n_state:n_own - 1]
        batch = (states[0] if states else scans[0]).shape[0]
        finals: list[list[np.ndarray]] = [[] for _ in range(n_state)]
        outputs: list[list[np.ndarray]] | None = None
        for b in range(batch):
            length = scans[0].shape[1] if seq_lens is None else int(seq_lens[b])
            state = [s[b] for s in states]
            per_step: list[list[np.ndarray]] = []
            for t in range(length):
                slices = [x[b, length - 1 - t] if d else x[b, t] for x, d in zip(scans, dirs)]
                outs = body.run([*state, *slices, *extra])
                state = list(outs[:n_state])
                per_step.append(list(outs[n_state:]))
            for acc, v in zip(finals, state):
                acc.append(v)
            if outputs is None:
                outputs = [[] for _ in range(len(body.output_names) - n_state)]
            for j, acc in enumerate(outputs):
                acc.append(np.stack([step[j] for step in per_step]))
        return tuple([np.stack(f) for f in finals] + [np.stack(o) for o in (outputs or [])])

    return run
