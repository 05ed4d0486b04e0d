"""torch helpers for the zoo builders: deterministic training, export to ONNX, the graph tweaks.

Imported only inside :func:`hybrid.zoo.build` (``import hybrid`` never imports torch).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from typing import Any

import onnx

from hybrid.frontends._common import quiet_torch, require_torch

__all__ = ["OPSET", "deterministic", "export", "train"]

OPSET = 17


@contextlib.contextmanager
def deterministic(seed: int) -> Iterator[Any]:
    """Seed torch and train on one thread; yields the torch module.

    On one thread the summation order, hence the weights and the file bytes, do not depend on the
    machine's core count. The caller's RNG state and thread count are restored afterwards.
    """
    torch = require_torch()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield torch
    finally:
        torch.set_num_threads(threads)


def train(module: Any, batch: Callable[[int], tuple[Any, ...]], loss_fn: Callable[..., Any], steps: int,
          lr: float = 3e-3) -> Any:
    """A few Adam steps: ``loss_fn(module, *batch(step))`` is minimized; returns the module in eval mode."""
    torch = require_torch()
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    module.train()
    for step in range(steps):
        opt.zero_grad()
        loss = loss_fn(module, *batch(step))
        loss.backward()
        opt.step()
    return module.eval()


def export(module: Any, args: tuple[Any, ...], inputs: list[str], outputs: list[str],
           dynamic: dict[str, dict[int, str]] | None = None, opset: int = OPSET, **kwargs: Any) -> onnx.ModelProto:
    """Export with torch's TorchScript exporter, the one most published ONNX models came from.

    Its Shape -> Gather -> Concat chains, LSTM ops and named dynamic dims are what users meet.
    """
    torch = require_torch()
    buf = io.BytesIO()
    with quiet_torch(), torch.no_grad():
        torch.onnx.export(module.eval(), args, buf, dynamo=False, opset_version=opset, input_names=inputs,
                          output_names=outputs, dynamic_axes=dynamic or None, do_constant_folding=True, **kwargs)
    return onnx.load_model_from_string(buf.getvalue())
