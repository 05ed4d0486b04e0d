"""``ReferenceBackend``: the numpy backend that is always there (priority 90, device 'cpu')."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from hybrid.backends.reference import registry
from hybrid.backends.reference.conv_algorithms import ALGORITHMS
from hybrid.backends.reference.fallback import onnx_reference_has
from hybrid.backends.reference.interpreter import Program, compile_graph
from hybrid.backends.reference.parallel import set_threads
from hybrid.errors import BackendError, HybridError
from hybrid.hal.backend import Backend, Executable, Option, ProbedDevice

__all__ = ["ReferenceBackend", "ReferenceExecutable"]


class ReferenceExecutable(Executable):
    """A compiled :class:`Program` behind the Executable contract.

    With ``threads`` (and threadpoolctl installed), numpy's BLAS runs single-threaded while this
    model runs and hybrid splits the big GEMMs over ``threads`` worker threads itself
    (:mod:`parallel`); BLAS gets its previous setting back after each run. Without, numpy's BLAS
    threads as it likes.
    """

    def __init__(self, program: Program, threads: int | None = None) -> None:
        self.program = program
        self.input_names = list(program.input_names)
        self.output_names = list(program.output_names)
        self._run = program.run
        self._blas = _blas_controllers() if threads else []
        self._threads = threads or 1

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Run the program on feeds by input name; return the outputs in order."""
        inputs = [feeds.get(n) for n in self.input_names]
        if not self._blas:
            return self._run(inputs)
        _hold_blas(self._blas)
        outer = set_threads(self._threads)
        try:
            return self._run(inputs)
        finally:
            set_threads(outer)
            _release_blas(self._blas)


# BLAS thread counts are process-wide: the first run to start saves them and holds BLAS to one thread,
# the last run to finish puts them back (runs may overlap in several threads)
_HOLD_LOCK = threading.Lock()
_held = 0
_saved: list[int] = []


def _hold_blas(libs: list[Any]) -> None:
    global _held, _saved
    with _HOLD_LOCK:
        if _held == 0:
            _saved = [lib.num_threads for lib in libs]
            for lib in libs:
                lib.set_num_threads(1)
        _held += 1


def _release_blas(libs: list[Any]) -> None:
    global _held
    with _HOLD_LOCK:
        _held -= 1
        if _held == 0:
            for lib, n in zip(libs, _saved):
                lib.set_num_threads(n)


@functools.lru_cache(maxsize=1)
def _blas_controllers_cached() -> tuple[Any, ...]:
    from threadpoolctl import ThreadpoolController

    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


def _threadpoolctl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("threadpoolctl") is not None


def _blas_controllers() -> list[Any]:
    """Threadpoolctl's handles on the BLAS libraries numpy loaded (found once per process).

    Raises:
        BackendError: HYB-306 when threadpoolctl is not installed.
    """
    try:
        return list(_blas_controllers_cached())
    except ImportError as e:
        raise BackendError("HYB-306", "backend 'reference' option 'num_threads' needs threadpoolctl, which is "
                           "not installed", "pip install threadpoolctl, or leave num_threads unset") from e


def _model_ir(model: Any) -> ir.Model:
    """The model's onnx-ir graph with model-local functions inlined (kernels see primitive ops)."""
    proto = model.to_onnx()
    if len(proto.functions):
        import onnx.inliner

        return ir.serde.deserialize_model(onnx.inliner.inline_local_functions(proto))
    return model.ir


class ReferenceBackend(Backend):
    """Pure numpy kernels with an ``onnx.reference`` fallback per node: runs anything, anywhere."""

    name = "reference"
    priority = 90
    exact_and_complete = True  # the fallback: the defining kernels of every op (hybrid.hal.is_fallback)
    install_hint = "the reference backend needs only numpy and onnx"
    memory_pools = {"cpu": "interpreter intermediates, freed after their last use"}
    own_allocator = "numpy's allocator"
    options = {
        "conv_algorithm": Option((str,), "auto", ("auto", *ALGORITHMS),
                                 doc="Conv algorithm: 'auto' picks per shape (docs/reference-backend.md)"),
        "fuse": Option((bool,), True, doc="fold BatchNormalization and per-channel Mul/Add into Conv weights (the "
                                          "optimizer's rules), and a following Add and Relu into the Conv kernel"),
        "fold_constants": Option((bool,), True, doc="evaluate constant nodes once at compile time"),
        "num_threads": Option((int,), None, doc="threads for the big GEMMs (default: all cores); BLAS itself "
                                               "runs single-threaded while the model runs"),
    }

    def _probe(self) -> list[ProbedDevice]:
        return [ProbedDevice("cpu", "cpu", 0, "numpy", (("numpy", np.__version__),))]

    def version(self) -> str:
        """The versions of numpy and onnx (the kernels' libraries)."""
        return f"numpy {np.__version__}, onnx {onnx.__version__}"

    def supports(self, node: ir.Node, device: str = "cpu") -> bool:
        """Answer from the kernel table (hand kernels, custom ops, onnx.reference); runs nothing."""
        if device.partition(":")[0] != "cpu":
            return False
        version = node.version
        if version is None:
            graph = node.graph
            opsets = graph.opset_imports if graph is not None else {}
            version = opsets.get(node.domain, onnx.defs.onnx_opset_version() if node.domain in ("", "ai.onnx")
                                 else 1)
        return _supports(node.domain, node.op_type, version)

    def _compile(self, model: Any, device: str, options: dict[str, Any]) -> Executable:
        if device.partition(":")[0] != "cpu":
            raise BackendError("HYB-303", f"the reference backend runs on 'cpu', not {device!r}",
                               "use target='reference' or 'reference:cpu'")
        opts = {k: spec.default for k, spec in self.options.items()} | options
        threads = opts["num_threads"]
        if threads is not None and threads < 1:
            raise BackendError("HYB-306", f"backend 'reference' option 'num_threads': expected an int >= 1, got "
                               f"{threads}", "leave it unset to use every core")
        if threads is None:
            # every core, when BLAS can be held to one thread; else leave numpy's BLAS threading alone
            threads = (os.cpu_count() or 1) if _threadpoolctl_available() else None
        m = _model_ir(model)
        if opts["fuse"]:  # Conv + BN / per-channel Mul, Add: the graph optimizer's own rows, on a copy
            from hybrid.passes.fuse import fold_into_weights  # (at first compile: import hybrid stays light)

            m = fold_into_weights(m, fold_constants=opts["fold_constants"])
        opsets = dict(m.opset_imports)
        opsets.setdefault("", onnx.defs.onnx_opset_version())
        try:
            program = compile_graph(m.graph, opsets, opts, fold=opts["fold_constants"])
        except HybridError:
            raise
        except Exception as e:
            raise BackendError("HYB-304", f"reference backend could not compile {model.name!r}: "
                               f"{type(e).__name__}: {str(e).strip()[:300]}",
                               "report the model; try another target meanwhile") from e
        return ReferenceExecutable(program, threads)


@functools.lru_cache(maxsize=4096)
def _supports_cached(domain: str, op_type: str, version: int) -> bool:
    return onnx_reference_has(domain, op_type, version)


def _supports(domain: str, op_type: str, version: int) -> bool:
    # custom ops can be registered at any time, so only the onnx.reference answer is cached
    if registry.find_kernel(domain, op_type, version) is not None:
        return True
    return _supports_cached(domain, op_type, version)
