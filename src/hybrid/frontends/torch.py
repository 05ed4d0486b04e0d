"""``hybrid.export``: a ``torch.nn.Module`` (or an ONNX model) to a :class:`hybrid.Model`.

torch has two ONNX exporters. The dynamo one (``torch.export`` + onnxscript) is the default and
covers the most models, but it emits opset 18 and newer only; the TorchScript-based one (deprecated
by torch, still shipped) reaches opsets 7..20. ``exporter='auto'`` picks TorchScript when the
requested opset is below 18 (or onnxscript is missing) and dynamo otherwise, and falls back to the
other exporter when the first one fails, saying so in the log. A dynamo model is converted to an
older opset asked for with ONNX's version converter (``_opset``); when that cannot be done, an
explicit ``exporter='dynamo'`` is refused (HYB-210) and a fallback warns which opset it wrote.
"""

from __future__ import annotations

import inspect
import io
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from hybrid.errors import HybridError, ModelError, first_line
from hybrid.frontends._common import describe_module, failing_module_path, flatten_outputs, quiet_torch, require_torch
from hybrid.frontends._opset import honour_opset
from hybrid.ir import Model

__all__ = ["DYNAMO_MIN_OPSET", "ExportResult", "export", "export_module"]

logger = logging.getLogger("hybrid")

DYNAMO_MIN_OPSET = 18  # the lowest opset torchlib (the dynamo exporter's op library) implements
EXPORTERS = ("auto", "dynamo", "torchscript")


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What :func:`export_module` produced.

    Attributes:
        model: The exported model.
        exporter: 'dynamo' or 'torchscript': the exporter that succeeded.
        output_template: The module's output tree with markers where the flat ONNX outputs go
            (see ``hybrid.frontends._common.unflatten``).
    """

    model: Model
    exporter: str
    output_template: Any


def export(model: Any, input_shape: Any = None, opset_version: int | None = None,
           dynamic_axes: Mapping[str, Any] | None = None, *, input_names: Sequence[str] | None = None,
           output_names: Sequence[str] | None = None, exporter: str = "auto",
           name: str | None = None) -> Model:
    """Export a torch module to a hybrid model (DESIGN 2.6).

    ``hybrid.export(net, input_shape=(1, 3, 224, 224), opset_version=11, dynamic_axes={'input': {0: 'batch'}})``

    Args:
        model: A ``torch.nn.Module`` (exported in eval mode), or an ONNX path, bytes or ModelProto
            (loaded as they are; the other arguments must then be left out).
        input_shape: One shape (a float32 input of random values), or a list with one entry per
            input, each a shape or an example tensor/array (use examples for integer inputs such
            as token ids).
        opset_version: ONNX opset to emit; None lets torch choose (20 with torch 2.13).
        dynamic_axes: ``{input_or_output_name: {axis: 'name'}}`` or ``{name: [axes]}``, as in
            ``torch.onnx.export``.
        input_names: Graph input names. Default: 'input' for a one-input module, else the names of
            the module's ``forward`` parameters.
        output_names: Graph output names. Default: 'output' for one output, else the keys and
            positions of what ``forward`` returns ('last_hidden_state', 'output_1', ...).
        exporter: 'auto', 'dynamo' or 'torchscript' (see the module docstring).
        name: The model's name (default: the module's class name).

    Raises:
        ModelError: HYB-206 when torch fails (torch's message and the failing module path),
            HYB-207 when torch is missing, HYB-210 for arguments it cannot use.
    """
    if not _is_torch_module(model):
        if any(v is not None for v in (input_shape, opset_version, dynamic_axes, input_names, output_names)):
            raise ModelError("HYB-210", f"export arguments were given for a {type(model).__name__}, which is "
                             "not a torch.nn.Module", "load ONNX models with hybrid.Model.load(path)")
        return Model.load(model)
    return export_module(model, input_shape, opset_version=opset_version, dynamic_axes=dynamic_axes,
                         input_names=input_names, output_names=output_names, exporter=exporter,
                         name=name).model


def _is_torch_module(obj: Any) -> bool:
    # checked without importing torch, so that exporting an ONNX file never needs it
    return any(f"{c.__module__}.{c.__qualname__}" == "torch.nn.modules.module.Module" for c in type(obj).__mro__)


def export_module(module: Any, input_shape: Any, *, opset_version: int | None = None,
                  dynamic_axes: Mapping[str, Any] | None = None, input_names: Sequence[str] | None = None,
                  output_names: Sequence[str] | None = None, exporter: str = "auto",
                  name: str | None = None, all_dynamic: bool = False) -> ExportResult:
    """Export ``module`` and return the model with what the frontends need to call it back.

    ``all_dynamic=True`` (dynamo only) makes every input dimension dynamic where the module allows
    it (``torch.export.Dim.AUTO``); ``hybrid.jit`` uses it for its catch-all build.
    """
    torch = require_torch()
    if exporter not in EXPORTERS:
        raise ModelError("HYB-210", f"exporter: expected one of {list(EXPORTERS)}, got {exporter!r}")
    if opset_version is not None and not isinstance(opset_version, int):
        raise ModelError("HYB-210", f"opset_version: expected an int, got {opset_version!r}")
    args = _example_args(module, input_shape, torch)
    in_names = _input_names(module, len(args), input_names)
    was_training = module.training
    module.eval()  # exported in eval mode (dropout off, BatchNorm statistics); restored below
    try:
        with torch.no_grad():
            try:
                eager = module(*args)
            except Exception as e:
                raise _export_error("running the module on the example inputs", e, module, torch) from e
        leaf_names, template = flatten_outputs(eager, torch)
        out_names = _output_names(leaf_names, output_names)
        axes = _check_dynamic_axes(dynamic_axes, in_names, out_names)
        order = _exporter_order(exporter, opset_version)
        proto, which = _run_exporters(order, module, args, in_names, out_names, opset_version, axes, all_dynamic,
                                      torch)
    finally:
        module.train(was_training)
    model_name = name or type(module).__name__
    metadata = {"hybrid.exporter": which, "hybrid.source": f"torch {torch.__version__}"}
    if which == "dynamo":
        feed = {n: a.detach().cpu().numpy() for n, a in zip(in_names, args)}
        outcome = honour_opset(proto, opset_version, feed, strict=exporter == "dynamo", name=model_name)
        proto = outcome.model
        if outcome.reason:
            metadata["hybrid.opset_requested"] = str(opset_version)
    proto.graph.name = proto.graph.name or model_name
    _set_metadata(proto, metadata)
    logger.info("exported %s with the %s exporter (opset %s)", model_name, which, _opset(proto))
    return ExportResult(Model(proto=proto, name=model_name), which, template)


def _run_exporters(order: tuple[str, ...], module: Any, args: tuple[Any, ...], ins: list[str], outs: list[str],
                   opset: int | None, axes: dict[str, dict[int, str]], all_dynamic: bool,
                   torch: Any) -> tuple[onnx.ModelProto, str]:
    """Try the exporters in order; return the first model and which exporter made it, or raise HYB-206."""
    failures: list[tuple[str, BaseException]] = []
    for which in order:
        try:
            with quiet_torch():
                if which == "dynamo":
                    proto = _dynamo(module, args, ins, outs, opset, axes, all_dynamic, torch)
                else:
                    proto = _torchscript(module, args, ins, outs, opset, axes, torch)
        except Exception as e:
            failures.append((which, e))
            if which != order[-1]:
                logger.warning("the %s exporter failed on %s (%s); trying the %s exporter", which,
                               type(module).__name__, _first_line(e), order[len(failures)])
            continue
        if failures:
            logger.warning("exported %s with the %s exporter after the %s exporter failed", type(module).__name__,
                           which, failures[0][0])
        return proto, which
    which, err = failures[0]
    extra = "" if len(failures) == 1 else f"; the {failures[1][0]} exporter failed too: {_first_line(failures[1][1])}"
    raise _export_error(f"torch.onnx.export ({which} exporter)", err, module, torch, extra) from err


# ------------------------------------------------------------------ arguments
def _example_args(module: Any, input_shape: Any, torch: Any) -> tuple[Any, ...]:
    if input_shape is None:
        raise ModelError("HYB-210", f"exporting {type(module).__name__} needs example inputs: input_shape=None",
                         "pass input_shape=(1, 3, 224, 224) or a list of shapes or example tensors")
    entries = [input_shape] if _is_shape(input_shape) or _is_tensor_like(input_shape) else input_shape
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ModelError("HYB-210", f"input_shape: expected a shape, a tensor or a non-empty list of them, got "
                         f"{input_shape!r}", "e.g. input_shape=(1, 3, 224, 224)")
    gen = torch.Generator().manual_seed(0)
    args = []
    for i, entry in enumerate(entries):
        if _is_shape(entry):
            args.append(torch.randn(*entry, generator=gen))
        elif isinstance(entry, torch.Tensor):
            args.append(entry.detach())
        elif _is_tensor_like(entry):
            import numpy as np

            args.append(torch.from_numpy(np.ascontiguousarray(entry)))
        else:
            raise ModelError("HYB-210", f"input_shape[{i}]: expected a shape (tuple of ints) or an example "
                             f"tensor, got {type(entry).__name__} {entry!r}"[:300],
                             "pass example tensors for integer inputs, shapes for float32 ones")
    return tuple(args)


def _is_shape(obj: Any) -> bool:
    # torch.Size is a tuple
    return isinstance(obj, (tuple, list)) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in obj)


def _is_tensor_like(obj: Any) -> bool:
    return hasattr(obj, "shape") and hasattr(obj, "dtype")


def _input_names(module: Any, n: int, given: Sequence[str] | None) -> list[str]:
    if given is not None:
        names = [str(x) for x in given]
        if len(names) != n or len(set(names)) != n:
            raise ModelError("HYB-210", f"input_names: expected {n} distinct names (one per example input), "
                             f"got {names}", "give one name per entry of input_shape")
        return names
    if n == 1:
        return ["input"]
    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) >= n:
        return [p.name for p in params[:n]]
    return [f"input_{i}" for i in range(n)]


def _output_names(leaves: list[str], given: Sequence[str] | None) -> list[str]:
    if given is not None:
        names = [str(x) for x in given]
        if len(names) != len(leaves) or len(set(names)) != len(names):
            raise ModelError("HYB-210", f"output_names: expected {len(leaves)} distinct names (the module "
                             f"returns {len(leaves)} tensors: {leaves}), got {names}")
        return names
    if len(leaves) == 1:
        return ["output"]
    return leaves if len(set(leaves)) == len(leaves) else [f"output_{i}" for i in range(len(leaves))]


def _check_dynamic_axes(axes: Mapping[str, Any] | None, ins: list[str], outs: list[str]) -> dict[str, dict[int, str]]:
    if axes is None:
        return {}
    if not isinstance(axes, Mapping):
        raise ModelError("HYB-210", f"dynamic_axes: expected a mapping name -> {{axis: 'name'}}, got {axes!r}")
    out: dict[str, dict[int, str]] = {}
    for key, spec in axes.items():
        if key not in ins and key not in outs:
            raise ModelError("HYB-210", f"dynamic_axes names {key!r}, which is not an input or output; inputs: "
                             f"{ins}, outputs: {outs}", "use the names given by input_names/output_names")
        if isinstance(spec, Mapping):
            out[key] = {int(a): str(n) for a, n in spec.items()}
        elif isinstance(spec, (list, tuple)):
            out[key] = {int(a): f"{key}_dynamic_axes_{int(a) + 1}" for a in spec}
        else:
            raise ModelError("HYB-210", f"dynamic_axes[{key!r}]: expected {{axis: 'name'}} or a list of axes, "
                             f"got {spec!r}")
    return out


def _exporter_order(exporter: str, opset: int | None) -> tuple[str, ...]:
    if exporter == "dynamo":
        _require_onnxscript()
        return ("dynamo",)
    if exporter == "torchscript":
        return ("torchscript",)
    try:
        _require_onnxscript()
    except ModelError:
        logger.info("onnxscript is not installed; exporting with the TorchScript exporter")
        return ("torchscript",)
    if opset is not None and opset < DYNAMO_MIN_OPSET:
        # the dynamo exporter as the fallback: models the TorchScript tracer cannot run (transformers 5's
        # BERT) still export, at the requested opset when it converts down, else with a warning
        return ("torchscript", "dynamo")
    return ("dynamo", "torchscript")


def _require_onnxscript() -> None:
    try:
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ModelError("HYB-207", f"the dynamo exporter needs onnxscript, which is not installed ({e})",
                         "pip install 'pyasc[torch]' (brings onnxscript), or exporter='torchscript'") from e


# ------------------------------------------------------------------ the two exporters
def _dynamo(module: Any, args: tuple[Any, ...], ins: list[str], outs: list[str], opset: int | None,
            axes: dict[str, dict[int, str]], all_dynamic: bool, torch: Any) -> onnx.ModelProto:
    if all_dynamic:
        shapes: tuple[Any, ...] | None = tuple({d: torch.export.Dim.AUTO for d in range(a.dim())} for a in args)
    elif any(n in axes for n in ins):
        shapes = tuple(dict(axes.get(n, {})) or None for n in ins)
    else:
        shapes = None
    if shapes is not None and _takes_var_positional(module):
        shapes = (shapes,)  # forward(*tensors): torch.export sees one tuple argument
    program = torch.onnx.export(module, args, dynamo=True, verbose=False, opset_version=opset, input_names=ins,
                                output_names=outs, dynamic_shapes=shapes, external_data=False)
    import onnx_ir as ir

    return ir.serde.serialize_model(program.model)


def _takes_var_positional(module: Any) -> bool:
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].kind is inspect.Parameter.VAR_POSITIONAL


def _torchscript(module: Any, args: tuple[Any, ...], ins: list[str], outs: list[str], opset: int | None,
                 axes: dict[str, dict[int, str]], torch: Any) -> onnx.ModelProto:
    buf = io.BytesIO()
    torch.onnx.export(module, args, buf, dynamo=False, opset_version=opset, input_names=ins, output_names=outs,
                      dynamic_axes=axes or None, do_constant_folding=True)
    return onnx.load_model_from_string(buf.getvalue())


# ------------------------------------------------------------------ errors and metadata
def _first_line(e: BaseException) -> str:
    # the dynamo exporter wraps the real error in a long report; its "Exception summary" names it
    text = str(e)
    if "## Exception summary" in text:
        summary = text.split("## Exception summary", 1)[1].strip().splitlines()
        lines = [ln.strip() for ln in summary if ln.strip() and not ln.startswith(("(Refer", "⬆"))]
        text = " <- ".join(lines[:2]) if lines else text
    return first_line(RuntimeError(text) if text.strip() else e, 600)


def _export_error(what: str, err: BaseException, module: Any, torch: Any, extra: str = "") -> HybridError:
    if isinstance(err, HybridError):
        return err
    where = describe_module(failing_module_path(err, module, torch), module)
    return ModelError("HYB-206", f"{what} failed in {where}: {_first_line(err)}{extra}",
                      "fix or replace that module's forward for export (no data-dependent Python control flow, "
                      "ops with an ONNX translation), or try exporter='torchscript' / 'dynamo'")


def _set_metadata(proto: onnx.ModelProto, values: dict[str, str]) -> None:
    existing = {p.key: p for p in proto.metadata_props}
    for key, value in values.items():
        prop = existing.get(key) or proto.metadata_props.add()
        prop.key, prop.value = key, value


def _opset(proto: onnx.ModelProto) -> int:
    return next((i.version for i in proto.opset_import if i.domain in ("", "ai.onnx")), 0)
