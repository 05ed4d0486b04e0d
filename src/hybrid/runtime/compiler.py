"""``hybrid.compile``: resolve a target, pick a backend and device, build a CompiledModel."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hybrid.config import expect_mapping, get_config
from hybrid.errors import BackendError, ConfigError, HybridError, ModelError
from hybrid.hal import Candidate, backend_names, get_backend, resolve_target, split_fallback
from hybrid.ir import Model
from hybrid.runtime.compiled import CompiledModel
from hybrid.runtime.plan import Plan, Segment

__all__ = ["PRECISIONS", "compile_model", "split_config"]

logger = logging.getLogger("hybrid")

PRECISIONS = ("fp32", "fp16", "bf16")
_ZIP_MAGIC = b"PK\x03\x04"  # a .hybrid bundle is a zip archive; a serialized ONNX model never starts so


def _refuse_bundle(source: Any) -> None:
    """Raise HYB-203 naming ``hybrid.load`` when ``source`` is a .hybrid bundle (a file or its bytes).

    Without this the bundle reaches the ONNX parser, whose "the bytes do not parse" does not say what to do. A
    bundle is not compiled here: it carries its own compiled choices, and ``hybrid.load`` may return a task model.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        head, found, path = bytes(source[:4]), "these bytes are", "'model.hybrid'"
    elif isinstance(source, (str, os.PathLike)) and Path(source).is_file():
        with open(source, "rb") as f:
            head = f.read(4)
        found, path = f"{str(source)!r} is", repr(str(source))
    else:
        return
    if head == _ZIP_MAGIC:
        raise ModelError("HYB-203", f"hybrid.compile expects an ONNX model, but {found} a .hybrid bundle (a zip "
                         "archive)", f"load a bundle with hybrid.load({path}, target=...), which compiles it")


def split_config(config: Mapping[str, Any] | None, candidates: list[Candidate]) -> dict[str, dict[str, Any]]:
    """Split ``compile(config=...)`` into options per backend.

    Keys named after a backend hold that backend's options. When the target resolves to one backend,
    other keys are that backend's options too (``compile(m, 'onnxruntime', {'intra_op_num_threads': 2})``).

    Raises:
        ConfigError: HYB-101 for a key that is neither a backend nor an option of the single backend.
    """
    cfg = dict(expect_mapping("config", config or {}))
    names = set(backend_names())
    per_backend: dict[str, dict[str, Any]] = {}
    loose = {k: v for k, v in cfg.items() if k not in names}
    for k, v in cfg.items():
        if k in names:
            per_backend[k] = dict(expect_mapping(f"config.{k}", v))
    single = {c.backend for c in candidates}
    if loose:
        if len(single) != 1:
            raise ConfigError("HYB-101", f"config keys {sorted(loose)} are not backend names; with target "
                              f"resolving to several backends ({', '.join(sorted(single))}) give options "
                              "per backend", "e.g. config={'onnxruntime': {'intra_op_num_threads': 2}}")
        (only,) = single
        per_backend[only] = {**loose, **per_backend.get(only, {})}
    return per_backend


def compile_model(model_or_path: Any, target: str = "auto", precision: str = "fp32",
                  config: Mapping[str, Any] | None = None, *, autotune: bool | None = None,
                  accuracy: Mapping[str, Any] | None = None, sample_inputs: Any = None,
                  shapes: Mapping[str, Any] | None = None) -> CompiledModel:
    """Compile a model for a target (DESIGN 2.3, 2.9).

    With ``target='auto'`` (or ``autotune=True``, or ``precision='auto'``) every candidate that runs
    the whole graph is compiled, checked against the reference backend on sample inputs at the shapes
    users run (``shapes=``, ``sample_inputs=``), and timed; the fastest correct one wins and the
    decision is cached on disk. A model with dynamic input dims and nothing declared starts on the
    first checked candidate by priority and tunes online on real calls, per shape bucket (docs/auto.md).
    When no accelerated backend runs the whole graph, the graph is partitioned across backends. Other
    targets take the first candidate by priority that compiles, and partition only when none does.

    Args:
        model_or_path: A path, bytes, onnx.ModelProto, onnx_ir.Model or hybrid.Model.
        target: 'auto', a device, a backend or 'backend:device'.
        precision: 'fp32', 'fp16', 'bf16', or 'auto' (the fastest precision within ``accuracy``).
        config: Backend options, per backend name or flat for a single-backend target.
        autotune: Time the candidates (default: for 'auto'); False takes the first that passes the check.
        accuracy: Budget for reduced precisions: ``{'min_cosine': 0.995}`` and/or ``{'max_rel_error': x}``
            (default ``{'min_cosine': 0.999}``); the fp32 check's model-level ``'rtol'`` (default 1e-3) and
            per-output rules ``'outputs': {name: {'rtol', 'atol', 'mismatch', 'min_cosine', 'topk'}}``.
        sample_inputs: Inputs for the checks and timings (a dict, a tuple, or one array); generated
            from the signature when not given.
        shapes: The shapes users run, per input: ``{'x': (1, 3, 480, 640)}``, or a range
            ``{'x': {'min': ..., 'opt': ..., 'max': ...}}`` (checked at all three, timed at opt).

    Raises:
        ConfigError: HYB-101/102 for a bad precision or accuracy budget.
        ModelError: 2xx when the model cannot be loaded (HYB-203 for a .hybrid bundle: hybrid.load takes those).
        BackendError: 3xx for an unknown target, a missing backend or a failed compilation.
    """
    _refuse_bundle(model_or_path)
    model = Model.load(model_or_path)
    if precision not in (*PRECISIONS, "auto"):
        raise ConfigError("HYB-102", f"precision: expected one of {(*PRECISIONS, 'auto')}, got {precision!r}")
    if autotune is not None and not isinstance(autotune, bool):
        raise ConfigError("HYB-102", f"autotune: expected True, False or None, got {autotune!r}")
    candidates = resolve_target(target)
    if not candidates:
        raise BackendError("HYB-303", f"target {target!r} matches no available backend on this machine",
                           "run `pyasc devices` to see what is available")
    per_backend = split_config(config, candidates)
    defaults = get_config().backends

    def options_of(cand: Candidate, prec: str) -> dict[str, Any]:
        return {**defaults.get(cand.backend, {}), **per_backend.get(cand.backend, {}),
                **get_backend(cand.backend).precision_options(cand.device, prec)}

    # target='auto' and its search are imported where used: a pinned target does not hold them (issue 55)
    if target.strip().lower() == "auto" or autotune or precision == "auto":
        from hybrid.runtime import auto

        return auto.select(model, target, candidates, options_of, precision, accuracy, autotune, sample_inputs,
                           shapes)
    if accuracy is not None:
        from hybrid.runtime.auto.accuracy import parse_accuracy

        parse_accuracy(accuracy, precision, model.signature.output_names)  # validated, then unused: no check
    if shapes is not None:
        from hybrid.runtime.auto.shapes import normalize_shapes

        normalize_shapes(model.signature, shapes)
    compiled = _first_that_compiles(model, target, candidates, options_of, precision, sample_inputs)
    if not isinstance(model_or_path, Model):  # hybrid's own parse, which nothing else holds: the backend has the model
        model.release_parsed()
        # the onnx-ir graph is a web of reference cycles, freed only by a collection: one of the young generations
        # (it was made by this compile; a few ms), not the next full one, which may be minutes away
        gc.collect(1)
    return compiled


def _first_that_compiles(model: Model, target: str, candidates: list[Candidate],
                         options_of: Callable[[Candidate, str], dict[str, Any]], precision: str,
                         sample_inputs: Any) -> CompiledModel:
    """The first accelerated candidate that compiles the whole graph, else a partition, else the reference.

    In the partition across the candidates the reference backend takes only what none of the others runs.
    """
    errors: list[HybridError] = []
    accelerated, fallback = split_fallback(candidates)
    for k, cand in enumerate(accelerated + fallback):
        if k == len(accelerated) and accelerated and fallback and precision == "fp32":
            try:  # no accelerated backend runs it all: split the graph across them
                from hybrid.runtime import auto

                return auto.partition_compiled(model, target, candidates, options_of, sample_inputs)
            except HybridError as e:
                errors.append(e)
        backend = get_backend(cand.backend)
        try:
            options = options_of(cand, precision)
            executable = backend.compile(model, cand.device, options)
        except HybridError as e:
            if e.code == "HYB-306" or len(candidates) == 1:
                raise
            logger.info("%s could not compile %r: %s; trying the next candidate", cand, model.name, e.message)
            errors.append(e)
            continue
        nodes = tuple(n.name or f"{n.op_type}#{i}" for i, n in enumerate(model.graph))
        reason = "only candidate" if len(candidates) == 1 else "first candidate by priority that compiled"
        ran = executable.precision or precision  # what the backend says it runs (OpenVINO: bf16 for f16)
        plan = Plan((Segment(cand.backend, cand.device, nodes, tuple(model.signature.input_names),
                             tuple(model.signature.output_names), reason, ran),))
        return CompiledModel(model, executable, plan, cand.backend, cand.device, options, target)
    raise BackendError("HYB-304", f"no candidate of target {target!r} could compile {model.name!r}: "
                       + "; ".join(e.message for e in errors), "see the backends' messages above")
