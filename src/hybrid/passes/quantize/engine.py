"""Applying one quantization scheme, with a set of nodes kept in float.

int8 goes through ``onnxruntime.quantization`` (quantize_dynamic, and quantize_static with a
calibration reader whose ranges are cached after the first run, so the sensitivity analysis
re-quantizes without re-calibrating); fp16 through ``onnxruntime.transformers.float16``; bf16 stores
weights as bfloat16 with a Cast to float32 in front of their users (half the size, runs on every
backend; bf16 compute is the backend's business: ``compile(..., precision='bf16')``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from hybrid.errors import QuantizationError
from hybrid.passes.quantize.config import QuantConfig, auto_activation
from hybrid.passes.quantize.data import Feed, progress
from hybrid.passes.quantize.opset import failure_hint, fit_opset

__all__ = ["DYNAMIC_OP_TYPES", "Engine"]

logger = logging.getLogger("hybrid")

# ConvInteger (dynamic Conv) is slower than fp32 Conv on ORT's CPU provider: dynamic mode leaves Conv
# alone unless op_types asks for it
DYNAMIC_OP_TYPES = ("MatMul", "Attention", "LSTM")
# the ops whose precision is worth measuring one by one: they carry weights or do the heavy math
_LAYER_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM", "GRU", "Gather"})
_FP_SENSITIVE_OPS = frozenset({"Softmax", "LayerNormalization", "Exp", "Pow", "ReduceMean", "ReduceSum", "Div",
                               "Sqrt", "Erf", "Gelu", "Tanh", "Sigmoid"})
_BF16_MIN_ELEMENTS = 16  # small tensors (shapes, scalars, biases of tiny layers) are not worth a Cast


class Engine:
    """Quantizes one prepared model with a config, any number of times, keeping chosen nodes in float."""

    def __init__(self, model: onnx.ModelProto, cfg: QuantConfig, calibration: Sequence[Feed], workdir: str,
                 check_feed: Feed | None = None) -> None:
        """Fit the model's opset to the mode (``opset.fit_opset``, checked on ``check_feed``) and pre-process it.

        ``self.cfg`` is the config the quantizations use (per-channel off after an opset fallback) and
        ``self.opset_note`` says what was done to the opset.
        """
        fit = fit_opset(model, cfg, check_feed)
        if fit.note:
            logger.info("quantize: %s", fit.note)
        cfg = fit.cfg
        self.cfg = cfg
        self.opset_note = fit.note
        self.workdir = Path(workdir)
        self.calibration = list(calibration)
        self.proto = _named_nodes(_prepare(fit.model, cfg, self.workdir) if cfg.preprocess else fit.model)
        self.source = self.workdir / "float.onnx"
        onnx.save_model(self.proto, str(self.source), save_as_external_data=self.proto.ByteSize() > 1_800_000_000)
        self.method = "minmax" if cfg.calibration_method == "auto" else cfg.calibration_method
        self.activation = auto_activation(cfg)
        self.extra: dict[str, Any] = dict(cfg.extra_options)
        self._runs = 0

    # ------------------------------------------------------------------ what can be kept in float
    def candidates(self) -> list[str]:
        """Nodes the sensitivity analysis measures, in graph order."""
        inits = {t.name for t in self.proto.graph.initializer}
        ops = set(self.cfg.op_types) if self.cfg.op_types else None
        excluded = set(self.cfg.nodes_to_exclude)
        out = []
        for node in self.proto.graph.node:
            if node.name in excluded:
                continue
            has_weight = any(i in inits for i in node.input)
            mode = self.cfg.quant_mode
            if mode == "dynamic":  # MatMuls of two activations (attention) are quantized too
                ok = node.op_type in (ops or DYNAMIC_OP_TYPES)
            elif mode == "static":
                ok = node.op_type in _LAYER_OPS and (ops is None or node.op_type in ops)
                ok = ok and (node.op_type != "Gather" or has_weight)
            elif mode == "fp16":
                ok = node.op_type in _LAYER_OPS or node.op_type in _FP_SENSITIVE_OPS
            else:
                ok = has_weight and node.op_type in _LAYER_OPS
            if ok:
                out.append(node.name)
        return out

    # ------------------------------------------------------------------ quantizing
    def run(self, *, exclude: Iterable[str] = (), only: Sequence[str] | None = None, method: str | None = None,
            extra: dict[str, Any] | None = None, activation: str | None = None) -> bytes:
        """Quantize; nodes in ``exclude`` stay float; with ``only``, just those nodes are quantized.

        ``method``, ``extra`` and ``activation`` (static mode) override the calibration method, the extra
        options and the activation dtype (``self.method``, ``self.extra``, ``self.activation``) for this
        run; each method calibrates once, then its ranges are reused from a cache file.

        Raises:
            QuantizationError: HYB-606 with the quantizer's message when it fails.
        """
        excluded = sorted(set(self.cfg.nodes_to_exclude) | set(exclude))
        mode = self.cfg.quant_mode
        try:
            if mode == "fp16":
                return self._fp16(excluded, only)
            if mode == "bf16":
                return _bf16(self.proto, excluded, only)
            out = self.workdir / f"quantized_{self._runs}.onnx"
            self._runs += 1
            # the percentile calibrator prints; hybrid reports through its own logger
            with contextlib.redirect_stdout(io.StringIO()):
                if mode == "dynamic":
                    self._dynamic(out, excluded, only)
                else:
                    self._static(out, excluded, only, method or self.method,
                                 self.extra if extra is None else extra, activation or self.activation)
            data = _load_bytes(out)
            _remove_model(out)
            return data
        except QuantizationError:
            raise
        except Exception as e:
            first = str(e).strip().splitlines()[0][:400] if str(e).strip() else type(e).__name__
            raise QuantizationError("HYB-606", f"{mode} quantization failed: {type(e).__name__}: {first}",
                                    failure_hint(first, "exclude the node it names with nodes_to_exclude, or try "
                                                 "another quant_mode")) from e

    def _dtype(self, name: str) -> Any:
        from onnxruntime.quantization import QuantType

        return QuantType.QInt8 if name == "int8" else QuantType.QUInt8

    def _dynamic(self, out: Path, excluded: list[str], only: Sequence[str] | None) -> None:
        from onnxruntime.quantization import quantize_dynamic

        quantize_dynamic(str(self.source), str(out), op_types_to_quantize=list(self.cfg.op_types or DYNAMIC_OP_TYPES),
                         per_channel=self.cfg.per_channel, reduce_range=self.cfg.reduce_range,
                         weight_type=self._dtype(self.cfg.weight_dtype), nodes_to_quantize=list(only or []) or None,
                         nodes_to_exclude=excluded, extra_options=dict(self.cfg.extra_options))

    def _static(self, out: Path, excluded: list[str], only: Sequence[str] | None, method_name: str,
                extra: dict[str, Any], activation: str) -> None:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

        method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                  "percentile": CalibrationMethod.Percentile}[method_name]
        cache = self.workdir / f"calibration-{method_name}.json"
        fmt = QuantFormat.QDQ if self.cfg.quant_format == "qdq" else QuantFormat.QOperator
        reader = None if cache.is_file() else _Reader(self.calibration, self.cfg.progress)
        with reader or contextlib.nullcontext():
            quantize_static(str(self.source), str(out), reader, quant_format=fmt,
                            op_types_to_quantize=list(self.cfg.op_types) if self.cfg.op_types else None,
                            per_channel=self.cfg.per_channel, reduce_range=self.cfg.reduce_range,
                            activation_type=self._dtype(activation),
                            weight_type=self._dtype(self.cfg.weight_dtype),
                            nodes_to_quantize=list(only or []) or None, nodes_to_exclude=excluded,
                            calibrate_method=method, extra_options=dict(extra),
                            calibration_cache_path=str(cache))

    def _fp16(self, excluded: list[str], only: Sequence[str] | None) -> bytes:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        block = list(excluded)
        if only is not None:
            keep = set(only)
            block += [n.name for n in self.proto.graph.node if n.name not in keep]
        copy = onnx.ModelProto()
        copy.CopyFrom(self.proto)
        with contextlib.redirect_stdout(io.StringIO()):
            converted = convert_float_to_float16(copy, keep_io_types=True, node_block_list=block or None)
        # the converter appends its input Casts at the end of the node list; ONNX requires
        # topological order (ORT and OpenVINO sort, hybrid's reference backend runs nodes as listed)
        import onnx_ir as ir

        graph = ir.serde.deserialize_model(converted)
        graph.graph.sort()
        return ir.serde.serialize_model(graph).SerializeToString()


class _Reader:
    """``onnxruntime.quantization.CalibrationDataReader`` over checked samples, with a progress bar."""

    def __init__(self, samples: Sequence[Feed], show: bool | None) -> None:
        self._samples = samples
        self._show = show
        self._iter = iter(samples)
        self._bar: Any = None
        self._ctx: Any = None

    def __enter__(self) -> _Reader:
        self._ctx = progress("calibrating", len(self._samples), self._show)
        self._bar = self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)

    def get_next(self) -> Feed | None:
        sample = next(self._iter, None)
        if sample is not None and self._bar is not None:
            self._bar.advance()
        return sample

    def rewind(self) -> None:
        self._iter = iter(self._samples)

    def __iter__(self):  # CalibrationDataReader protocol (newer ORT iterates readers)
        return self

    def __next__(self) -> Feed:
        sample = self.get_next()
        if sample is None:
            raise StopIteration
        return sample


# ------------------------------------------------------------------ helpers
def _prepare(model: onnx.ModelProto, cfg: QuantConfig, workdir: Path) -> onnx.ModelProto:
    """ORT's recommended pre-processing; a model it cannot process is quantized as it is.

    Shape inference, and basic graph optimizations such as folding BatchNorm into Conv.
    """
    if cfg.quant_mode in ("fp16", "bf16"):
        return model
    from onnxruntime.quantization import quant_pre_process

    src, dst = workdir / "input.onnx", workdir / "prepared.onnx"
    onnx.save_model(model, str(src))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)
        return onnx.load_model(str(dst))
    except Exception as e:  # pre-processing is an optimization, never a reason to fail
        logger.info("quantization pre-processing skipped: %s", str(e).splitlines()[0][:200] if str(e) else e)
        return model
    finally:
        _remove_model(src)


def _named_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    # the quantizers select nodes by name; give every unnamed node a unique one
    seen = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in seen:
                name += "_"
            node.name = name
            seen.add(name)
    return model


def _load_bytes(path: Path) -> bytes:
    model = onnx.load_model(str(path))  # pulls in external data if the quantizer wrote any
    return model.SerializeToString()


def _remove_model(path: Path) -> None:
    for p in (path, Path(f"{path}.data")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _bf16(model: onnx.ModelProto, excluded: Sequence[str], only: Sequence[str] | None) -> bytes:
    import ml_dtypes

    float_inits = {t.name: t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    keep = set(excluded)
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            if name in float_inits:
                users.setdefault(name, []).append(node)
    chosen = set(only) if only is not None else None
    convert = []
    for name, nodes in users.items():
        if any(n.name in keep for n in nodes) or (chosen is not None and not any(n.name in chosen for n in nodes)):
            continue
        if int(np.prod(float_inits[name].dims)) >= _BF16_MIN_ELEMENTS:
            convert.append(name)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    casts = []
    for name in convert:
        tensor = inits[name]
        value = numpy_helper.to_array(tensor).astype(ml_dtypes.bfloat16)
        stored = numpy_helper.from_array(value, f"{name}__bf16")
        tensor.CopyFrom(stored)
        casts.append(onnx.helper.make_node("Cast", [stored.name], [name], name=f"{name}__to_float",
                                           to=onnx.TensorProto.FLOAT))
    nodes = list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend(casts + nodes)
    return out.SerializeToString()


def workdir() -> tempfile.TemporaryDirectory:
    """A scratch folder for the quantizer's files (removed when the quantization ends)."""
    return tempfile.TemporaryDirectory(prefix="hybrid-quantize-")
