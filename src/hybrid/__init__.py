"""PyASC (`hybrid`): deploy a model once, run it on any accelerator the machine has.

The public API is re-exported here lazily: ``import hybrid`` imports no backend library (nor numpy or
onnx); each name below is imported on first access (PEP 562). The ``TYPE_CHECKING`` block names every
one of them with its real type, so a type checker sees ``hybrid.compile`` as the function it is, not
``Any``; tests/test_typing.py keeps that block and ``_LAZY`` the same.
"""

from __future__ import annotations

import builtins
import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from hybrid import providers as _providers
from hybrid._version import __version__
from hybrid.errors import (
    BackendError,
    BundleError,
    ConfigError,
    HybridError,
    ModelError,
    QuantizationError,
    RunError,
    ServingError,
)

if TYPE_CHECKING:  # pragma: no cover - what the type checker sees; at run time _LAZY resolves each name
    from hybrid import utils, vision
    from hybrid.api import devices, init, profile, set_backend
    from hybrid.backends.reference import custom_op
    from hybrid.bundle import load, load_task
    from hybrid.config import RuntimeConfig, set_log_level
    from hybrid.frontends.jit import JitFunction, jit
    from hybrid.frontends.torch import export
    from hybrid.hal import Device
    from hybrid.hal.tensor import Tensor
    from hybrid.ir import Model, Signature, TensorSpec
    from hybrid.passes import make_batch_dynamic, optimize
    from hybrid.passes.quantize import quantize
    from hybrid.runtime.compiled import CompiledModel
    from hybrid.runtime.compiler import compile_model as compile
    from hybrid.runtime.plan import Placement, Plan, Segment
    from hybrid.runtime.profiler import OpStat, ProfileReport
    from hybrid.runtime.traffic.batching import Batcher, BatchStats, RequestFuture, dynamic_batch
    from hybrid.runtime.traffic.pipeline import Pipeline, StageStats
    from hybrid.runtime.traffic.stream import StreamContext, StreamResult
    from hybrid.vision.tasks import TaskModel

# ---------------------------------------------------------------- sympy, deferred inside onnx-ir
# onnx-ir >= 1.1 imports SymPy (about 32 MB of memory, 0.3 s) when it is imported, for the arithmetic of symbolic
# dims, which hybrid never does: a process that pins ONNX Runtime would hold a fifth more memory than the runtime
# itself for it (issue 55). onnx-ir's core module is therefore executed with an ``__import__`` of its own that gives
# it a stand-in for ``sympy`` (and its package a stand-in for ``_symbolic_shapes``, which reads SymPy at import):
# the real module is imported on the first attribute read, so symbolic arithmetic still works. Nothing else sees
# the stand-ins: ``sys.modules`` never holds them, so every other ``import sympy``, in any thread, is the real one.
class _Deferred(types.ModuleType):
    """Stands in for module ``name`` inside onnx-ir; the real one is imported when an attribute is first read."""

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self.__name__), attr)


_SYMPY = _Deferred("sympy")


def _import_for_onnx_ir(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (),
                        level: int = 0) -> Any:
    if name == "sympy" and not fromlist and level == 0 and "sympy" not in sys.modules:
        return _SYMPY
    return builtins.__import__(name, globals, locals, fromlist, level)


class _OnnxIrCoreLoader:
    """Executes onnx-ir's core module with :func:`_import_for_onnx_ir`; anything else is the real loader's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._loader, attr)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        package = sys.modules.get("onnx_ir")
        if package is not None and "onnx_ir._symbolic_shapes" not in sys.modules:
            package._symbolic_shapes = _Deferred("onnx_ir._symbolic_shapes")  # type: ignore[attr-defined]
        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _import_for_onnx_ir}
        self._loader.exec_module(module)


class _DeferSympyInOnnxIr:
    """A one-shot meta path finder: it wraps the loader of ``onnx_ir._core`` when SymPy is not imported yet."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "onnx_ir._core":
            return None
        sys.meta_path.remove(self)
        if "sympy" in sys.modules:  # already paid for (torch imports it): nothing to spare
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _OnnxIrCoreLoader(spec.loader)
        return spec


if "onnx_ir._core" not in sys.modules:
    sys.meta_path.insert(0, _DeferSympyInOnnxIr())


# ---------------------------------------------------------------- providers against the layer flow
# Constant folding (passes) evaluates nodes with the reference backend's kernels, and CompiledModel.save (runtime)
# writes a bundle: both call up the layers, so each calls through hybrid.providers, and the facade, which Python runs
# before any module of hybrid, installs the providers here; each imports its module on its first call.
def _evaluate_node(node: Any, inputs: list[Any]) -> list[Any]:
    from hybrid.backends.reference.evaluate import evaluate_node

    return list(evaluate_node(node, inputs))


def _save_bundle(cm: Any, path: str) -> None:
    from hybrid.bundle import save_bundle

    save_bundle(cm, path)


_providers.install(evaluator=_evaluate_node, writer=_save_bundle)


# public name -> "module:attribute" (or "module" for a subpackage); resolved on first access
_LAZY = {
    # the IR and its signature
    "Model": "hybrid.ir:Model",
    "Signature": "hybrid.ir:Signature",
    "TensorSpec": "hybrid.ir:TensorSpec",
    # process-wide setup and discovery
    "Device": "hybrid.hal:Device",
    "devices": "hybrid.api:devices",
    "init": "hybrid.api:init",
    "RuntimeConfig": "hybrid.config:RuntimeConfig",
    "set_backend": "hybrid.api:set_backend",
    "set_log_level": "hybrid.config:set_log_level",
    # model in, compiled model out
    "export": "hybrid.frontends.torch:export",
    "optimize": "hybrid.passes:optimize",
    "make_batch_dynamic": "hybrid.passes:make_batch_dynamic",
    "quantize": "hybrid.passes.quantize:quantize",
    "compile": "hybrid.runtime.compiler:compile_model",
    "load": "hybrid.bundle:load",
    "load_task": "hybrid.bundle:load_task",
    "CompiledModel": "hybrid.runtime.compiled:CompiledModel",
    "TaskModel": "hybrid.vision.tasks:TaskModel",
    "Plan": "hybrid.runtime.plan:Plan",
    "Segment": "hybrid.runtime.plan:Segment",
    "Placement": "hybrid.runtime.plan:Placement",
    "custom_op": "hybrid.backends.reference:custom_op",
    "jit": "hybrid.frontends.jit:jit",
    "JitFunction": "hybrid.frontends.jit:JitFunction",
    # running: memory, streams, pipelines, batching, profiling
    "Tensor": "hybrid.hal.tensor:Tensor",
    "StreamContext": "hybrid.runtime.traffic.stream:StreamContext",
    "StreamResult": "hybrid.runtime.traffic.stream:StreamResult",
    "Pipeline": "hybrid.runtime.traffic.pipeline:Pipeline",
    "StageStats": "hybrid.runtime.traffic.pipeline:StageStats",
    "dynamic_batch": "hybrid.runtime.traffic.batching:dynamic_batch",
    "Batcher": "hybrid.runtime.traffic.batching:Batcher",
    "BatchStats": "hybrid.runtime.traffic.batching:BatchStats",
    "RequestFuture": "hybrid.runtime.traffic.batching:RequestFuture",
    "profile": "hybrid.api:profile",
    "ProfileReport": "hybrid.runtime.profiler:ProfileReport",
    "OpStat": "hybrid.runtime.profiler:OpStat",
    # subpackages
    "utils": "hybrid.utils",
    "vision": "hybrid.vision",
}

# written out (not built from _LAZY) so that type checkers and linters can read it; tests/test_typing.py
# checks that it is exactly the eager names plus _LAZY
__all__ = [
    "BackendError",
    "BatchStats",
    "Batcher",
    "BundleError",
    "CompiledModel",
    "ConfigError",
    "Device",
    "HybridError",
    "JitFunction",
    "Model",
    "ModelError",
    "OpStat",
    "Pipeline",
    "Placement",
    "Plan",
    "ProfileReport",
    "QuantizationError",
    "RequestFuture",
    "RunError",
    "RuntimeConfig",
    "Segment",
    "ServingError",
    "Signature",
    "StageStats",
    "StreamContext",
    "StreamResult",
    "TaskModel",
    "Tensor",
    "TensorSpec",
    "__version__",
    "compile",
    "custom_op",
    "devices",
    "dynamic_batch",
    "export",
    "init",
    "jit",
    "load",
    "load_task",
    "make_batch_dynamic",
    "optimize",
    "profile",
    "quantize",
    "set_backend",
    "set_log_level",
    "utils",
    "vision",
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'hybrid' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = importlib.import_module(module)
    if attr:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
