"""Helpers shared by the torch frontends: importing torch, output trees, failing module paths."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

from hybrid.errors import ModelError

__all__ = ["OutputLeaf", "failing_module_path", "flatten_outputs", "quiet_torch", "require_torch", "unflatten"]


def require_torch() -> Any:
    """Import and return torch, or raise HYB-207 saying how to install it."""
    try:
        import torch
    except ImportError as e:
        raise ModelError("HYB-207", f"this operation needs torch, which is not installed ({e})",
                         "pip install 'pyasc[torch]'") from e
    return torch


# ------------------------------------------------------------------ output trees
# An output tree is what the torch callable returned: a tensor, or tuples/lists/dicts (ModelOutput is a
# dict) of them. ONNX flattens it; the template below puts the flat outputs back in place.
class OutputLeaf:
    """Marks where a flat output goes in the template tree."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def flatten_outputs(obj: Any, torch: Any) -> tuple[list[str], Any]:
    """Flatten a torch output tree the way the exporters do.

    Returns:
        The names of the tensor leaves (dict keys and positions joined with '.'), and a template
        with :class:`OutputLeaf` markers in their place (non-tensor leaves stay as they are; ``None``
        values of dicts are dropped, as torch's pytree does for ModelOutput).
    """
    names: list[str] = []

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            names.append(path or "output")
            return OutputLeaf(len(names) - 1)
        if isinstance(node, Mapping):
            out = {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items() if v is not None}
            try:
                return type(node)(out)
            except TypeError:
                return out
        if isinstance(node, (tuple, list)):
            items = [walk(v, f"{path}.{i}" if path else f"output_{i}") for i, v in enumerate(node)]
            if hasattr(node, "_fields"):  # namedtuple
                return type(node)(*items)
            return type(node)(items)
        return node

    template = walk(obj, "")
    return names, template


def unflatten(template: Any, values: list[Any]) -> Any:
    """Put flat outputs back into the template made by :func:`flatten_outputs`."""
    if isinstance(template, OutputLeaf):
        return values[template.index]
    if isinstance(template, Mapping):
        out = {k: unflatten(v, values) for k, v in template.items()}
        try:
            return type(template)(out)
        except TypeError:
            return out
    if isinstance(template, (tuple, list)):
        items = [unflatten(v, values) for v in template]
        if hasattr(template, "_fields"):
            return type(template)(*items)
        return type(template)(items)
    return template


# ------------------------------------------------------------------ failing module path
def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _frames(exc: BaseException) -> Iterator[FrameType]:
    for e in _exception_chain(exc):
        tb = e.__traceback__
        while tb is not None:
            yield tb.tb_frame
            tb = tb.tb_next


def failing_module_path(exc: BaseException, module: Any, torch: Any) -> str | None:
    """Find the qualified name of the submodule where an export failed, or None.

    Three places say it, depending on where torch failed: a ``forward`` frame of one of the model's
    modules in the traceback (tracing ran the Python code), the FX node being translated
    (``nn_module_stack``, dynamo exporter), or the TorchScript node being converted (its scope name).
    The innermost one wins.
    """
    names = {id(m): n for n, m in module.named_modules()} if isinstance(module, torch.nn.Module) else {}
    found: str | None = None
    for frame in _frames(exc):
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "forward" and id(owner) in names:
            found = names[id(owner)]
            continue
        node = frame.f_locals.get("node")
        if isinstance(node, torch.fx.Node):
            stack = node.meta.get("nn_module_stack") or {}
            if stack:
                found = _strip_export_prefix(list(stack.values())[-1][0])
        elif isinstance(node, torch._C.Node):
            scope = node.scopeName()
            if scope:
                found = scope.rsplit("::", 1)[-1]
    return found


def _strip_export_prefix(path: str) -> str:
    # torch.export names submodules like "L['self'].block.1" or "block.1" depending on the strategy
    if path.startswith("L['self']"):
        path = path[len("L['self']"):].lstrip(".")
    return path


def describe_module(path: str | None, module: Any) -> str:
    """``"module 'block.1' (Bad3)"`` or ``"the root module (Net)"`` for error messages."""
    if path is None:
        return f"{type(module).__name__} (module path unknown)"
    if path == "":
        return f"the root module ({type(module).__name__})"
    try:
        sub = module.get_submodule(path)
        return f"module {path!r} ({type(sub).__name__})"
    except (AttributeError, TypeError):
        return f"module {path!r}"


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence the exporters' progress lines and deprecation chatter for the duration of an export.

    hybrid reports what matters (which exporter ran, failures) through its own logger.
    """
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript", "onnx_ir")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)
            try:
                from torch.jit import TracerWarning

                warnings.simplefilter("ignore", TracerWarning)
            except ImportError:  # pragma: no cover - torch without jit
                pass
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
