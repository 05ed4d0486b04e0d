"""A backend for hybrid that fails on purpose, reached through the ``hybrid.backends`` entry point only.

Backend ``faulty`` compiles with ONNX Runtime (through hybrid's own ``onnxruntime`` backend) and then fails in the
one way the environment variable ``HYBRID_FAULT`` names, in every process that loads it (the caller's and hybrid's
check process alike):

- ``compile-exit``: its compile ends the process at once (``os._exit(70)``), as a native library's ``abort``;
- ``compile-segv``: its compile kills the process with SIGSEGV, as a crash in native code;
- ``compile-hang``: its compile never returns;
- ``compile-oom``: its compile runs out of memory (numpy refuses to allocate 1 PiB: ``MemoryError``);
- ``compile-slow:S``: its compile takes S seconds more, then works (a check to kill in mid-flight);
- ``run-raise:N``: each compiled model raises ``RuntimeError`` on every run after its N-th;
- ``run-nan:K``: each compiled model returns NaN for its first output on every K-th run;
- ``run-shape``: its first output loses its last column (a wrong shape);
- anything else (or unset): it works, and answers as ONNX Runtime does.

Its priority (50) puts it after ONNX Runtime, OpenVINO and torch and before the numpy reference: ``target='auto'``
starts a model on a candidate before it and meets this one in its checks and races.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from hybrid.hal import Backend, Executable, ProbedDevice, get_backend

__all__ = ["FaultyBackend", "FaultyExecutable"]

FAULT_ENV = "HYBRID_FAULT"


def fault() -> tuple[str, float]:
    """The fault asked for (``HYBRID_FAULT``) and its number (0 when it takes none)."""
    kind, _, arg = os.environ.get(FAULT_ENV, "").partition(":")
    return kind, float(arg) if arg else 0.0


class FaultyExecutable(Executable):
    """ONNX Runtime's executable, with the run faults."""

    def __init__(self, inner: Executable, kind: str, arg: float) -> None:
        self.inner, self.kind, self.arg = inner, kind, arg
        self.input_names, self.output_names = inner.input_names, inner.output_names
        self.calls = 0
        self._lock = threading.Lock()

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        with self._lock:
            self.calls += 1
            call = self.calls
        if self.kind == "run-raise" and call > self.arg:
            raise RuntimeError(f"faulty: run {call} failed (it fails after {int(self.arg)} runs)")
        outs = list(self.inner.run(feeds))
        if self.kind == "run-nan" and self.arg and call % int(self.arg) == 0:
            outs[0] = np.full_like(np.asarray(outs[0]), np.nan)
        if self.kind == "run-shape":
            outs[0] = np.asarray(outs[0])[..., :-1]
        return outs

    def close(self) -> None:
        self.inner.close()


class FaultyBackend(Backend):
    """ONNX Runtime, failing as ``HYBRID_FAULT`` says (module doc)."""

    name = "faulty"
    priority = 50
    install_hint = "pip install -e tests/plugins/hybrid_faults"

    def _probe(self) -> list[ProbedDevice]:
        import onnxruntime

        return [ProbedDevice("cpu", "cpu", 0, f"onnxruntime {onnxruntime.__version__} (faulty)")]

    def version(self) -> str:
        return "0.1"

    def supports(self, node: Any, device: str = "cpu") -> bool:
        return get_backend("onnxruntime").supports(node, device)

    def _compile(self, model: Any, device: str, options: dict[str, Any]) -> Executable:
        kind, arg = fault()
        if kind == "compile-exit":
            os._exit(70)
        if kind == "compile-segv":
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(60)  # real time: the signal is delivered before this returns
        if kind == "compile-hang":
            threading.Event().wait()
        if kind == "compile-oom":
            np.empty(1 << 50, np.uint8)  # 1 PiB: refused at once (MemoryError), nothing is touched
        if kind == "compile-slow":
            time.sleep(arg)  # real time: a compile as slow as a real one, for the check process's deadline
        return FaultyExecutable(get_backend("onnxruntime").compile(model, "cpu"), kind, arg)
