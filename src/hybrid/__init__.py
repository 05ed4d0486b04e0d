"""PyASC (`hybrid`): deploy a model once, run it on any accelerator the machine has.

The public API is re-exported here lazily: ``import hybrid`` imports no backend library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hybrid._version import __version__
from hybrid.errors import HybridError

if TYPE_CHECKING:  # pragma: no cover
    from hybrid.api import devices, init, set_backend  # noqa: F401
    from hybrid.config import set_log_level  # noqa: F401
    from hybrid.hal import Device  # noqa: F401
    from hybrid.ir import Model, Signature, TensorSpec  # noqa: F401
    from hybrid.runtime.compiled import CompiledModel  # noqa: F401

# public name -> "module:attribute"; resolved on first access (PEP 562)
_LAZY = {
    "Model": "hybrid.ir:Model",
    "Signature": "hybrid.ir:Signature",
    "TensorSpec": "hybrid.ir:TensorSpec",
    "Device": "hybrid.hal:Device",
    "CompiledModel": "hybrid.runtime.compiled:CompiledModel",
    "compile": "hybrid.runtime.compiler:compile_model",
    "devices": "hybrid.api:devices",
    "init": "hybrid.api:init",
    "set_backend": "hybrid.api:set_backend",
    "set_log_level": "hybrid.config:set_log_level",
    "load": "hybrid.bundle:load",
    "optimize": "hybrid.passes:optimize",
    "make_batch_dynamic": "hybrid.passes:make_batch_dynamic",
    "quantize": "hybrid.passes.quantize:quantize",
    "export": "hybrid.frontends.torch:export",
    "jit": "hybrid.frontends.jit:jit",
    "custom_op": "hybrid.backends.reference:custom_op",
    "Pipeline": "hybrid.runtime.pipeline:Pipeline",
    "StreamContext": "hybrid.runtime.stream:StreamContext",
    "dynamic_batch": "hybrid.runtime.batching:dynamic_batch",
    "Tensor": "hybrid.hal.tensor:Tensor",
    "profile": "hybrid.runtime.profiler:profile",
    "utils": "hybrid.utils",
    "vision": "hybrid.vision",
}

__all__ = ["HybridError", "__version__", *_LAZY]


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
