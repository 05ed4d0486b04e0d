"""``@hybrid.jit``: trace a torch callable once per input signature, then run the compiled model.

The first call with a new signature (the dtypes and shapes of the tensor arguments, the values of the
other arguments) exports the callable, optimizes and compiles the model, and caches it; the batch
dimension is exported as dynamic, so a new batch size is a cache hit. After ``cache_size_limit``
traces the function warns once and sends every new signature to one build whose dimensions are all
dynamic (as ``torch.compile`` falls back to dynamic shapes), instead of tracing without end.

Torch tensors in give torch tensors out (on the device of the first input); numpy arrays in give
numpy arrays out.

The export bakes the weights in: when a parameter or buffer the callable reads changes (in place, or
its ``.data`` replaced; see ``_weights``), the next call drops every compiled model and traces again,
saying so at INFO.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid.errors import HybridError, ModelError
from hybrid.frontends._common import require_torch, unflatten
from hybrid.frontends._weights import WeightWatch
from hybrid.ir.signature import TensorSpec

__all__ = ["JitCacheInfo", "JitFunction", "jit"]

logger = logging.getLogger("hybrid")

_MEMO_LIMIT = 1024  # exact call signatures remembered for the fast path


@dataclass(frozen=True, slots=True)
class JitCacheInfo:
    """Counters of one jitted function.

    Attributes:
        traces: Exports made (one per new signature, plus the dynamic build if it was made).
        hits: Calls served by a model already compiled.
        entries: Compiled models in the cache.
        dynamic: Whether the all-dynamic build exists (the recompile limit was reached).
    """

    traces: int
    hits: int
    entries: int
    dynamic: bool


@dataclass(frozen=True, slots=True)
class _Entry:
    compiled: Any  # hybrid.CompiledModel
    inputs: tuple[TensorSpec, ...]
    consts: tuple[Any, ...]
    template: Any

    def accepts(self, shapes: tuple[tuple[int, ...], ...], dtypes: tuple[np.dtype, ...],
                consts: tuple[Any, ...]) -> bool:
        if consts != self.consts or len(shapes) != len(self.inputs):
            return False
        for spec, shape, dtype in zip(self.inputs, shapes, dtypes):
            if spec.dtype != dtype or spec.shape is None or len(spec.shape) != len(shape):
                return False
            if any(isinstance(d, int) and d != s for d, s in zip(spec.shape, shape)):
                return False
        return True


def jit(fn: Callable[..., Any] | None = None, *, target: str = "auto", precision: str = "fp32",
        config: Mapping[str, Any] | None = None, dynamic_batch: bool = True, cache_size_limit: int = 8,
        optimize: str | None = "O2", opset_version: int | None = None) -> Any:
    """Compile a torch callable through hybrid on its first call per input signature (DESIGN 2.5).

    Use as ``@hybrid.jit`` or ``@hybrid.jit(target='auto')`` on a function that calls torch
    modules, or wrap a module: ``fast = hybrid.jit(net)``.

    Args:
        fn: The callable. Tensor (or array) arguments become model inputs; other arguments are
            constants of the trace and part of the cache key.
        target: Where to compile ('auto', 'cpu', 'onnxruntime', 'openvino:cpu', ...).
        precision: 'fp32', 'fp16' or 'bf16', as in ``hybrid.compile``.
        config: Backend options, as in ``hybrid.compile``.
        dynamic_batch: Export dimension 0 of every input as dynamic (one trace serves all batch sizes).
        cache_size_limit: Traces before the function switches to its all-dynamic build.
        optimize: The ``hybrid.optimize`` level applied before compiling (None: none).
        opset_version: Passed to the exporter (None: torch's default, dynamo exporter).

    Returns:
        A :class:`JitFunction` (or a decorator making one when ``fn`` is None).
    """
    if cache_size_limit < 1:
        raise ModelError("HYB-210", f"cache_size_limit: expected an int >= 1, got {cache_size_limit!r}")
    options = dict(target=target, precision=precision, config=dict(config or {}), dynamic_batch=dynamic_batch,
                   cache_size_limit=cache_size_limit, optimize=optimize, opset_version=opset_version)
    if fn is None:
        return lambda f: JitFunction(f, **options)
    return JitFunction(fn, **options)


class JitFunction:
    """A torch callable compiled by hybrid per input signature; call it like the original."""

    def __init__(self, fn: Callable[..., Any], *, target: str, precision: str, config: dict[str, Any],
                 dynamic_batch: bool, cache_size_limit: int, optimize: str | None,
                 opset_version: int | None) -> None:
        self.fn = fn
        self.target: str = target
        self.precision: str = precision
        self.config: dict[str, Any] = config
        self.dynamic_batch = dynamic_batch
        self.cache_size_limit = cache_size_limit
        self.optimize_level = optimize
        self.opset_version = opset_version
        self._entries: list[_Entry] = []
        self._dynamic: list[_Entry] = []
        self._memo: dict[tuple[Any, ...], _Entry] = {}
        self._lock = threading.Lock()
        self._traces = 0
        self._hits = 0
        self._warned = False
        self._watch: WeightWatch | None = None  # made at the first trace (it needs torch)
        functools.update_wrapper(self, fn, updated=())  # name and docstring; not a module's __dict__

    # ------------------------------------------------------------------ calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the compiled model that fits these arguments, tracing and compiling a new one when none does.

        Outputs come back in the structure the function returns; when any argument is a torch tensor, they
        are torch tensors on the first such argument's device.
        """
        call = _Call.of(args, kwargs)
        if self._watch is not None:
            changed = self._watch.changed()
            if changed:
                self._drop_stale(changed)
        entry = self._memo.get(call.key)
        if entry is None:
            entry = self._find_or_trace(call)
        else:
            self._hits += 1
        feeds = dict(zip((s.name for s in entry.inputs), call.arrays))
        outs = list(entry.compiled.run(feeds).values())
        if call.torch_device is not None:
            torch = require_torch()
            outs = [torch.from_numpy(np.ascontiguousarray(o)).to(call.torch_device) for o in outs]
        return unflatten(entry.template, outs)

    def _find_or_trace(self, call: _Call) -> _Entry:
        with self._lock:
            for entry in (*self._entries, *self._dynamic):
                if entry.accepts(call.shapes, call.dtypes, call.consts):
                    self._hits += 1
                    self._remember(call, entry)
                    return entry
            if len(self._entries) >= self.cache_size_limit:
                entry = self._dynamic_build(call)
                if entry is not None:
                    return entry
            entry = self._trace(call, all_dynamic=False)
            self._entries.append(entry)
            self._remember(call, entry)
            return entry

    def _drop_stale(self, changed: list[str]) -> None:
        with self._lock:
            if self._watch is None or not self._watch.changed():
                return  # another thread dropped them first
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            logger.info("hybrid.jit(%s): %s changed since the trace (in place or new data); tracing again",
                        getattr(self.fn, "__name__", type(self.fn).__name__), shown)
            # not closed: a call in another thread may still be running one; they go with their last reference
            self._clear(close=False)

    def _remember(self, call: _Call, entry: _Entry) -> None:
        if len(self._memo) < _MEMO_LIMIT:
            self._memo[call.key] = entry

    def _dynamic_build(self, call: _Call) -> _Entry | None:
        if not self._warned:
            self._warned = True
            msg = (f"hybrid.jit({getattr(self.fn, '__name__', 'fn')}): {self.cache_size_limit} signatures traced "
                   f"(cache_size_limit); new signatures now run on a build with every dimension dynamic")
            warnings.warn(msg, RuntimeWarning, stacklevel=4)
            logger.warning(msg)
        try:
            entry = self._trace(call, all_dynamic=True)
        except HybridError as e:
            logger.warning("the all-dynamic build failed (%s); tracing this signature on its own", e.message)
            return None
        self._dynamic.append(entry)
        self._remember(call, entry)
        return entry

    # ------------------------------------------------------------------ tracing
    def _trace(self, call: _Call, *, all_dynamic: bool) -> _Entry:
        from hybrid.frontends.torch import export_module

        torch = require_torch()
        module = _CallModule.build(torch, self.fn, call)
        examples = [torch.from_numpy(np.ascontiguousarray(a)) for a in call.arrays]
        names = call.input_names(self.fn)
        axes = {}
        if self.dynamic_batch and not all_dynamic:
            first = next((a.shape[0] for a in call.arrays if a.ndim), None)
            axes = {n: {0: "batch" if a.shape[0] == first else f"{n}_batch"}
                    for n, a in zip(names, call.arrays) if a.ndim}
        kwargs = dict(opset_version=self.opset_version, input_names=names,
                      name=getattr(self.fn, "__name__", type(self.fn).__name__))
        try:
            result = export_module(module, examples, dynamic_axes=axes, all_dynamic=all_dynamic,
                                   exporter="dynamo" if all_dynamic else "auto", **kwargs)
        except HybridError:
            if not axes:
                raise
            logger.info("export with a dynamic batch failed; exporting %s with static shapes", kwargs["name"])
            result = export_module(module, examples, **kwargs)
        self._traces += 1
        if self._watch is None:
            self._watch = WeightWatch(self.fn, torch)
        self._watch.snapshot()  # the weights this export baked in
        model = _optimize(result.model, self.optimize_level)
        from hybrid.runtime.compiler import compile_model

        compiled = compile_model(model, self.target, self.precision, self.config)
        logger.info("hybrid.jit traced %s for %s on %s:%s", kwargs["name"], compiled.signature, compiled.backend,
                    compiled.device)
        return _Entry(compiled, compiled.signature.inputs, call.consts, result.output_template)

    # ------------------------------------------------------------------ introspection
    def cache_info(self) -> JitCacheInfo:
        """Traces made, cache hits, compiled entries, and whether the all-dynamic build exists."""
        return JitCacheInfo(self._traces, self._hits, len(self._entries) + len(self._dynamic), bool(self._dynamic))

    def compiled_for(self, *args: Any, **kwargs: Any) -> Any:
        """The ``hybrid.CompiledModel`` that serves these arguments (traces it if needed)."""
        call = _Call.of(args, kwargs)
        return (self._memo.get(call.key) or self._find_or_trace(call)).compiled

    def cache_clear(self) -> None:
        """Drop every compiled model (the next call traces again)."""
        with self._lock:
            self._clear(close=True)

    def _clear(self, *, close: bool) -> None:
        if close:
            for entry in (*self._entries, *self._dynamic):
                entry.compiled.close()
        self._entries.clear()
        self._dynamic.clear()
        self._memo.clear()
        self._warned = False

    def __repr__(self) -> str:
        return f"<hybrid.jit {getattr(self.fn, '__name__', self.fn)!r} target={self.target!r} {self.cache_info()}>"


def _optimize(model: Any, level: str | None) -> Any:
    """Run ``hybrid.optimize`` when the passes package provides it (the one place jit optimizes)."""
    if level is None:
        return model
    try:
        from hybrid.passes import optimize
    except ImportError:
        logger.debug("hybrid.optimize is not available; compiling the exported graph as it is")
        return model
    return optimize(model, level=level)


# ------------------------------------------------------------------ one call's arguments
@dataclass(frozen=True, slots=True)
class _Call:
    """The arguments of one call: tensors as numpy arrays, the rest as constants, and the cache key."""

    arrays: tuple[np.ndarray, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    consts: tuple[Any, ...]
    layout: tuple[Any, ...]  # per argument: ('t', index) or ('c', value); then kwarg names
    kw_names: tuple[str, ...]
    torch_device: Any
    key: tuple[Any, ...]

    @classmethod
    def of(cls, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> _Call:
        arrays: list[np.ndarray] = []
        consts: list[Any] = []
        layout: list[Any] = []
        device = None
        for i, value in enumerate((*args, *(kwargs[k] for k in sorted(kwargs)))):
            where = f"argument {i}" if i < len(args) else f"argument {sorted(kwargs)[i - len(args)]!r}"
            if isinstance(value, np.ndarray):
                arrays.append(value)
                layout.append(("t", len(arrays) - 1))
            elif type(value).__module__.startswith("torch") and hasattr(value, "detach"):
                if device is None:
                    device = value.device
                arrays.append(value.detach().cpu().numpy())
                layout.append(("t", len(arrays) - 1))
            else:
                try:
                    hash(value)
                except TypeError as e:
                    raise ModelError("HYB-210", f"hybrid.jit {where}: expected a tensor, an array or a hashable "
                                     f"constant, got {type(value).__name__}",
                                     "pass tensors as separate arguments") from e
                consts.append(value)
                layout.append(("c", value))
        shapes = tuple(a.shape for a in arrays)
        dtypes = tuple(a.dtype for a in arrays)
        kw_names = tuple(sorted(kwargs))
        key = (shapes, tuple(d.str for d in dtypes), tuple(layout_key(x) for x in layout), kw_names,
               device is not None)
        return cls(tuple(arrays), shapes, dtypes, tuple(consts), tuple(layout), kw_names, device, key)

    def input_names(self, fn: Callable[..., Any]) -> list[str]:
        """Model input names: the callable's parameter names where they can be read, else input_N."""
        target = fn.forward if hasattr(fn, "forward") else fn
        try:
            params = [p.name for p in inspect.signature(target).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            params = []
        n_pos = len(self.layout) - len(self.kw_names)
        names = []
        for i, slot in enumerate(self.layout):
            if slot[0] != "t":
                continue
            name = (params[i] if i < len(params) else f"input_{i}") if i < n_pos else self.kw_names[i - n_pos]
            names.append(name)
        if len(set(names)) != len(names):
            names = [f"input_{i}" for i in range(len(names))]
        return names


def layout_key(slot: tuple[str, Any]) -> tuple[str, Any]:
    return slot if slot[0] == "c" else ("t",)


class _CallModule:
    """Builds the ``torch.nn.Module`` the exporter needs around a plain callable."""

    @staticmethod
    def build(torch: Any, fn: Callable[..., Any], call: _Call) -> Any:
        layout, kw_names = call.layout, call.kw_names
        n_pos = len(layout) - len(kw_names)

        class JitCall(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                if isinstance(fn, torch.nn.Module):
                    self.fn = fn  # a submodule, so that export errors name its path
                else:
                    self._fn = fn

            def forward(self, *tensors: Any) -> Any:
                values = [tensors[s[1]] if s[0] == "t" else s[1] for s in layout]
                target = self.fn if "fn" in self._modules else self._fn
                return target(*values[:n_pos], **dict(zip(kw_names, values[n_pos:])))

        return JitCall().eval()
