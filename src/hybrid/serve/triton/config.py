"""Triton's model configuration: ``config.pbtxt`` read and checked, and the configuration a model reports.

A Triton-layout repository may hold ``repo/<model>/config.pbtxt``. It is parsed with protobuf's text
format into Triton's own ``ModelConfig`` message (the generated module that ships with tritonclient), and
the fields that have a meaning here become serving settings:

=================================================  ===============================================
``max_batch_size: 0``                              no batching (``max_batch`` 0)
``max_batch_size: N`` without ``dynamic_batching`` requests carry their own batch (up to N rows); no
                                                   dynamic batching, as in Triton
``dynamic_batching``                               ``max_batch`` = the largest ``preferred_batch_size``,
                                                   else ``max_batch_size``
``max_queue_delay_microseconds``                   ``batch_timeout``
``default_queue_policy.max_queue_size``            ``max_queue``; 0 or unset (or no ``dynamic_batching``):
                                                   no bound, as in Triton (the config endpoint says so too)
``default_queue_policy``'s timeout fields          ``default_timeout_microseconds``: the longest wait in the
                                                   queue, then (``timeout_action: REJECT``) HYB-714, 503 /
                                                   UNAVAILABLE "Request timeout expired", or (``DELAY``) a
                                                   place behind the requests still in time; a request's own
                                                   ``timeout`` lowers it where ``allow_timeout_override`` is
                                                   set and is otherwise ignored, as in Triton
                                                   (:class:`hybrid.serve.triton.schedule.QueuePolicy`)
``priority_levels``, ``default_priority_level``,   a queue per level, the highest (1) batched first; a
``priority_queue_policy``                          request's ``priority`` parameter picks its level (0 or out
                                                   of range: the default); each level's policy bounds it
                                                   (:func:`schedule_policy`)
``instance_group[*].count``                        ``concurrency`` (their sum)
``version_policy``                                 the versions served (:func:`policy_versions`): ``latest``
                                                   N (Triton's default, N = 1), ``all``, ``specific``; the
                                                   others are neither loaded nor listed, as in Triton
``input`` / ``output``: name, data_type, dims      checked against the model (HYB-707 naming the mismatch)
``model_warmup``                                   run before the model is ready (:mod:`hybrid.serve.core.warmup`)
``output[*].label_filename``                       the labels of the classification extension
                                                   (:mod:`hybrid.serve.triton.classification`)
``sequence_batching``                              stateful models: controls, implicit state, a
                                                   sequence's requests in order (:mod:`hybrid.serve.triton.sequences`);
                                                   ``max_batch`` = ``max_batch_size``, ``batch_timeout`` = the
                                                   strategy's ``max_queue_delay_microseconds``
=================================================  ===============================================

Every other field that is set is listed in one warning at startup (see :func:`unmapped_fields`): nothing
in a configuration is ignored silently. A field protobuf does not know is a parse error (HYB-707).
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as mc

from hybrid.errors import ServingError
from hybrid.serve.tensors import datatype_of
from hybrid.serve.triton.schedule import QueuePolicy, SchedulePolicy

if TYPE_CHECKING:
    from hybrid.ir.signature import Signature, TensorSpec
    from hybrid.serve.core.model import ServedModel

__all__ = [
    "FILE_PARAMETER",
    "PBTXT",
    "LoadRequest",
    "check_signature",
    "config_from_json",
    "config_json",
    "label_files",
    "load_request",
    "model_config",
    "policy_versions",
    "read_pbtxt",
    "schedule_policy",
    "settings_of",
    "unmapped_fields",
]

logger = logging.getLogger("hybrid.serve")

PBTXT = "config.pbtxt"
_PBTXT_MAX = 256 << 10

# v2 datatype <-> model_config DataType (Triton's TYPE_STRING is the protocol's BYTES)
_TYPE_OF = {name: mc.DataType.Value(f"TYPE_{'STRING' if name == 'BYTES' else name}")
            for name in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                         "FP16", "FP32", "FP64", "BF16", "BYTES")}
_NAME_OF = {v: k for k, v in _TYPE_OF.items()}

# dotted field paths that mean something here (the rest is reported by unmapped_fields)
_MAPPED = {
    "name", "platform", "backend", "max_batch_size",
    "input", "input.name", "input.data_type", "input.dims",
    "output", "output.name", "output.data_type", "output.dims", "output.label_filename",
    "dynamic_batching", "dynamic_batching.preferred_batch_size", "dynamic_batching.max_queue_delay_microseconds",
    "dynamic_batching.default_queue_policy", "dynamic_batching.default_queue_policy.max_queue_size",
    "dynamic_batching.default_queue_policy.default_timeout_microseconds",
    "dynamic_batching.default_queue_policy.allow_timeout_override",
    "dynamic_batching.default_queue_policy.timeout_action",
    "dynamic_batching.priority_levels", "dynamic_batching.default_priority_level",
    "dynamic_batching.priority_queue_policy", "dynamic_batching.priority_queue_policy.key",
    "dynamic_batching.priority_queue_policy.value", "dynamic_batching.priority_queue_policy.value.max_queue_size",
    "dynamic_batching.priority_queue_policy.value.default_timeout_microseconds",
    "dynamic_batching.priority_queue_policy.value.allow_timeout_override",
    "dynamic_batching.priority_queue_policy.value.timeout_action",
    "instance_group", "instance_group.count", "instance_group.name",
    "version_policy", "version_policy.latest", "version_policy.latest.num_versions", "version_policy.all",
    "version_policy.specific", "version_policy.specific.versions",
    # run before the model is ready (hybrid.serve.core.warmup)
    "model_warmup", "model_warmup.name", "model_warmup.batch_size", "model_warmup.count", "model_warmup.inputs",
    "model_warmup.inputs.key", "model_warmup.inputs.value", "model_warmup.inputs.value.data_type",
    "model_warmup.inputs.value.dims", "model_warmup.inputs.value.zero_data", "model_warmup.inputs.value.random_data",
    "model_warmup.inputs.value.input_data_file",
    # stateful models (hybrid.serve.triton.sequences); a strategy's other fields are reported as not applied
    "sequence_batching", "sequence_batching.max_sequence_idle_microseconds", "sequence_batching.direct",
    "sequence_batching.direct.max_queue_delay_microseconds", "sequence_batching.oldest",
    "sequence_batching.oldest.max_queue_delay_microseconds", "sequence_batching.control_input",
    "sequence_batching.control_input.name", "sequence_batching.control_input.control",
    "sequence_batching.control_input.control.kind", "sequence_batching.control_input.control.int32_false_true",
    "sequence_batching.control_input.control.fp32_false_true",
    "sequence_batching.control_input.control.bool_false_true", "sequence_batching.control_input.control.data_type",
    "sequence_batching.state", "sequence_batching.state.input_name", "sequence_batching.state.output_name",
    "sequence_batching.state.data_type", "sequence_batching.state.dims", "sequence_batching.state.initial_state",
    "sequence_batching.state.initial_state.data_type", "sequence_batching.state.initial_state.dims",
    "sequence_batching.state.initial_state.zero_data", "sequence_batching.state.initial_state.data_file",
    "sequence_batching.state.initial_state.name",
    # answers kept by inputs (hybrid.serve.triton.response_cache), where the server has a cache
    "response_cache", "response_cache.enable",
}


def _error(message: str, hint: str | None = None) -> ServingError:
    return ServingError("HYB-707", message, hint or "fix config.pbtxt (Triton's model_config.proto) or remove it")


def read_pbtxt(path: str | Path) -> mc.ModelConfig:
    """Parse a ``config.pbtxt`` into Triton's ``ModelConfig``.

    Raises:
        ServingError: HYB-707 for a file too large or text protobuf cannot parse (an unknown field name, a
            bad value), naming the path and protobuf's line:column.
    """
    path = Path(path)
    if path.stat().st_size > _PBTXT_MAX:
        raise _error(f"{path} is larger than {_PBTXT_MAX} bytes")
    try:
        return text_format.Parse(path.read_text(encoding="utf-8"), mc.ModelConfig())
    except (text_format.ParseError, UnicodeDecodeError) as e:
        raise _error(f"{path} is not a valid Triton model configuration: {e}") from e


def config_from_json(text: Any, name: str) -> mc.ModelConfig:
    """The ``ModelConfig`` a load request carries (Triton's ``config`` load parameter: the configuration as JSON).

    It stands for the model's ``config.pbtxt`` for that load.

    Raises:
        ServingError: HYB-702 for a value that is not a string, JSON protobuf cannot parse into a ``ModelConfig``
            (an unknown field, a bad value), or a name other than ``name`` (Triton 2.51 answers these 500).
    """
    if not isinstance(text, str):
        raise ServingError("HYB-702", f"the load parameter 'config' must be the model configuration as a JSON "
                           f"string, got {type(text).__name__}",
                           "tritonclient: load_model(name, config=json.dumps(cfg))")
    if len(text) > _PBTXT_MAX:
        raise ServingError("HYB-702", f"the load parameter 'config' is larger than {_PBTXT_MAX} bytes")
    try:
        config = json_format.Parse(text, mc.ModelConfig())
    except (json_format.ParseError, RecursionError) as e:
        raise ServingError("HYB-702", f"the load parameter 'config' is not a Triton model configuration: {e}",
                           "send the JSON GET /v2/models/{m}/config answers, changed") from e
    if config.name and config.name != name:
        raise ServingError("HYB-702", f"the load parameter 'config' names model {config.name!r}, not {name!r}",
                           "leave the name out, or give the model's")
    return config


FILE_PARAMETER = "file:"
"""The prefix of a load parameter that carries a model file (``file:1/model.onnx``), as Triton names them."""
_FILE_DEPTH = 8


@dataclass(frozen=True)
class LoadRequest:
    """What a repository load request carries besides the model's name (Triton's load parameters).

    Attributes:
        config: The ``config`` parameter: a ``ModelConfig`` as JSON standing for the folder's ``config.pbtxt``
            for this load; None without one.
        files: The model files it carries (``file:<path>`` parameters): the path inside the model's folder
            (``1/model.onnx``) -> the file's bytes. With files the model is loaded from them alone, in a folder of
            their own, as Triton does with override files; empty: from the served repositories.
    """

    config: Any = None
    files: Mapping[str, bytes] = dataclass_field(default_factory=dict)


def _file_path(key: str) -> str:
    path = key[len(FILE_PARAMETER):]
    parts = path.split("/")
    if (not path or "\\" in path or "\x00" in path or len(parts) > _FILE_DEPTH
            or any(part in ("", ".", "..") for part in parts)):
        raise ServingError("HYB-702", f"load parameter {key!r}: expected file:<path> with a relative path inside the "
                           f"model's folder (no '..', no leading '/', at most {_FILE_DEPTH} levels)",
                           "e.g. file:1/model.onnx")
    if path == PBTXT:
        raise ServingError("HYB-702", f"load parameter {key!r}: the configuration of a load goes in its 'config' "
                           "parameter (the model configuration as JSON)",
                           "tritonclient: load_model(name, config=json.dumps(cfg), files={...})")
    return path


def _file_bytes(key: str, value: Any) -> bytes:
    if isinstance(value, bytes):  # gRPC: bytes_param
        return value
    if isinstance(value, str):  # HTTP: the bytes in base64
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ServingError("HYB-702", f"load parameter {key!r} is not base64: {e}",
                               "over HTTP a file's bytes are sent in base64 (tritonclient.http does it)") from e
    raise ServingError("HYB-702", f"load parameter {key!r} must be the file's bytes (base64 over HTTP), got "
                       f"{type(value).__name__}")


def load_request(parameters: Mapping[str, Any]) -> LoadRequest:
    """The ``config`` and model files of a load request's parameters.

    Raises:
        ServingError: HYB-702 for another parameter, a file path outside the model's folder, a file that is not
            base64 (HTTP) or bytes (gRPC), ``config.pbtxt`` as a file, or files without a ``config`` (Triton
            requires one with them; 2.51 answers 500).
    """
    other = sorted(k for k in parameters if k != "config" and not k.startswith(FILE_PARAMETER))
    if other:
        raise ServingError("HYB-702", f"load parameter(s) {', '.join(map(repr, other))} are not supported; a load "
                           "takes 'config' (the model configuration as JSON) and 'file:<path>' (model files)",
                           "tritonclient: load_model(name, config=..., files=...)")
    files = {_file_path(k): _file_bytes(k, v) for k, v in parameters.items() if k.startswith(FILE_PARAMETER)}
    config = parameters.get("config")
    if files and config is None:
        raise ServingError("HYB-702", "a load with model files needs its 'config' parameter too (as in Triton): "
                           "the files stand for the model's folder, config.pbtxt included",
                           "tritonclient: load_model(name, config=json.dumps(cfg), files={'file:1/model.onnx': ...})")
    return LoadRequest(config, files)


def label_files(config: mc.ModelConfig) -> dict[str, str]:
    """The label file each output names (``label_filename``, relative to the model's folder), by output name."""
    return {out.name: out.label_filename for out in config.output if out.label_filename}


def _walk(msg: Message, prefix: str = "") -> Iterator[str]:
    for field, value in msg.ListFields():
        path = f"{prefix}{field.name}"
        yield path
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        # protobuf >= 5.28 has is_repeated; older ones only the label
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        items = value if repeated else [value]
        for item in items:
            yield from _walk(item, f"{path}.")


def unmapped_fields(config: mc.ModelConfig) -> list[str]:
    """The fields set in ``config`` that pyasc does not apply (dotted paths, sorted, each once)."""
    found = sorted(set(_walk(config)) - _MAPPED)
    # report the outermost unmapped field only: 'optimization' rather than every field below it
    return [p for p in found if not any(p.startswith(f"{q}.") for q in found)]


def settings_of(config: mc.ModelConfig, where: str) -> tuple[dict[str, Any], list[str]]:
    """The serving settings (BatchSettings field -> value) a configuration asks for, and notes.

    The notes are for the fields applied differently from Triton (listed with the unmapped ones at startup).

    Raises:
        ServingError: HYB-707 for values that contradict each other (a preferred batch size above
            max_batch_size, a negative size).
    """
    notes: list[str] = []
    settings: dict[str, Any] = {}
    if config.max_batch_size < 0:
        raise _error(f"{where}: max_batch_size must be >= 0, got {config.max_batch_size}")
    if config.max_batch_size == 0:
        settings["max_batch"] = 0
        if config.HasField("dynamic_batching"):
            notes.append("dynamic_batching (max_batch_size is 0: no batching)")
    elif config.HasField("sequence_batching"):  # requests of different sequences batch together
        sb = config.sequence_batching
        strategy = sb.oldest if sb.HasField("oldest") else sb.direct
        settings["max_batch"] = config.max_batch_size
        settings["batch_timeout"] = strategy.max_queue_delay_microseconds / 1e6
    elif not config.HasField("dynamic_batching"):
        settings["max_batch"] = 0  # Triton: without dynamic_batching every request runs as it came
    else:
        db = config.dynamic_batching
        preferred = list(db.preferred_batch_size)
        if any(p < 1 or p > config.max_batch_size for p in preferred):
            raise _error(f"{where}: preferred_batch_size {preferred} must lie in 1..max_batch_size "
                         f"({config.max_batch_size})")
        settings["max_batch"] = max(preferred) if preferred else config.max_batch_size
        if len(preferred) > 1:
            notes.append(f"dynamic_batching.preferred_batch_size (only the largest, {max(preferred)}, is used)")
        settings["batch_timeout"] = db.max_queue_delay_microseconds / 1e6
    # Triton queues without a bound unless the queue policy sets one; pyasc's own default (256) is for models
    # served without a configuration, and a configuration that says nothing means what it means to Triton
    # (with priority levels each level has a bound of its own: schedule_policy)
    db = config.dynamic_batching
    size = db.default_queue_policy.max_queue_size if config.HasField("dynamic_batching") else 0
    settings["max_queue"] = int(size) if size > 0 and not db.priority_levels else None
    if len(config.instance_group):
        settings["concurrency"] = sum(max(1, g.count) for g in config.instance_group)
    return settings, notes


def policy_versions(config: mc.ModelConfig, found: Sequence[int], where: str) -> list[int]:
    """The versions of ``found`` (the folder's) that the configuration's ``version_policy`` serves, ascending.

    Triton's default with no policy is the latest one.

    Raises:
        ServingError: HYB-707 for ``latest`` with no versions, or ``specific`` versions the folder does not hold.
    """
    numbers = sorted(found)
    choice = config.version_policy.WhichOneof("policy_choice") if config.HasField("version_policy") else None
    if choice == "all":
        return numbers
    if choice == "specific":
        wanted = sorted(set(config.version_policy.specific.versions))
        missing = [v for v in wanted if v not in numbers]
        if missing or not wanted:
            raise _error(f"{where}: version_policy names versions {missing or wanted} that the folder does not hold "
                         f"(it holds {numbers})", "list version folders that exist, or use latest / all")
        return wanted
    count = config.version_policy.latest.num_versions if choice == "latest" else 1
    if count < 1:
        raise _error(f"{where}: version_policy latest needs num_versions >= 1, got {count}")
    return numbers[-count:]


def _queue_policy(policy: mc.ModelQueuePolicy, per_level: bool) -> QueuePolicy:
    size = int(policy.max_queue_size) if per_level and policy.max_queue_size > 0 else None
    timeout = policy.default_timeout_microseconds / 1e6 if policy.default_timeout_microseconds else None
    return QueuePolicy(timeout, policy.allow_timeout_override, policy.timeout_action == mc.ModelQueuePolicy.DELAY,
                       size)


def schedule_policy(config: mc.ModelConfig, where: str = "config.pbtxt") -> SchedulePolicy:
    """The priority levels and queue policies of a configuration's dynamic batcher (none without one).

    A model without ``priority_levels`` has one level, bounded by its ``max_queue`` setting (from
    ``default_queue_policy.max_queue_size``, :func:`settings_of`); with levels each level is bounded by its own
    policy's ``max_queue_size``, as in Triton.

    Raises:
        ServingError: HYB-707 for a ``default_priority_level`` or a ``priority_queue_policy`` level outside
            1..``priority_levels``, as Triton refuses to load them.
    """
    if not config.HasField("dynamic_batching") or config.max_batch_size == 0:
        return SchedulePolicy()
    db = config.dynamic_batching
    levels = int(db.priority_levels)
    if not levels:
        return SchedulePolicy(_queue_policy(db.default_queue_policy, False))
    if not 1 <= db.default_priority_level <= levels:
        raise _error(f"{where}: default priority level must be in range [1, {levels}], got "
                     f"{db.default_priority_level}", "set dynamic_batching.default_priority_level to one of the levels")
    wrong = sorted(k for k in db.priority_queue_policy if not 1 <= k <= levels)
    if wrong:
        raise _error(f"{where}: priority queue policy must have priority level in range [1, {levels}], got {wrong}",
                     "key priority_queue_policy by levels 1..priority_levels")
    return SchedulePolicy(_queue_policy(db.default_queue_policy, True), levels, int(db.default_priority_level),
                          {int(k): _queue_policy(v, True) for k, v in db.priority_queue_policy.items()})


def _dims(spec: TensorSpec) -> list[int | str] | None:
    return None if spec.shape is None else list(spec.shape)


def _check_tensors(kind: str, wanted: Any, specs: tuple[TensorSpec, ...], batched: bool, where: str) -> None:
    by_name = {s.name: s for s in specs}
    for t in wanted:
        spec = by_name.get(t.name)
        if spec is None:
            raise _error(f"{where}: {kind} {t.name!r} is not an {kind} of the model; the model's {kind}s: "
                         f"{', '.join(by_name)}")
        if t.data_type != mc.TYPE_INVALID:
            have = datatype_of(spec.dtype)
            if _NAME_OF.get(t.data_type) != have:
                raise _error(f"{where}: {kind} {t.name!r} is {mc.DataType.Name(t.data_type)} in config.pbtxt, "
                             f"the model's is {have} (TYPE_{'STRING' if have == 'BYTES' else have})")
        shape = _dims(spec)
        if shape is None:
            continue
        if batched:  # the first dim is symbolic (checked by check_signature)
            shape = shape[1:]
        dims = list(t.dims)
        bad = len(dims) != len(shape) or any(d != -1 and isinstance(s, int) and d != s for d, s in zip(dims, shape))
        if bad:
            batch = " after the batch dimension" if batched else ""
            raise _error(f"{where}: {kind} {t.name!r} has dims {dims} in config.pbtxt, the model's are "
                         f"{shape}{batch}", "write the model's dims (-1 for a variable one)")


def check_signature(config: mc.ModelConfig, signature: Signature, where: str) -> None:
    """Check the inputs and outputs of ``config`` against the model (names, data types, dims).

    With ``max_batch_size > 0`` dims exclude the batch dimension, which the model must have as its
    (symbolic) first dimension. Empty ``input``/``output`` lists are filled in from the model (as Triton's
    auto-complete does); a given ``input`` list must name every input of the model.

    Raises:
        ServingError: HYB-707 naming the tensor and the mismatch.
    """
    batched = config.max_batch_size > 0
    if batched:
        for spec in (*signature.inputs, *signature.outputs):
            if spec.shape is not None and (not spec.shape or isinstance(spec.shape[0], int)):
                raise _error(f"{where}: max_batch_size > 0 needs a batch dimension, but {spec.name!r} has shape "
                             f"{list(spec.shape)}", "set max_batch_size: 0, or export the model with a symbolic "
                             "first dimension (hybrid.make_batch_dynamic)")
    _check_tensors("input", config.input, signature.inputs, batched, where)
    _check_tensors("output", config.output, signature.outputs, batched, where)
    if len(config.input):
        sb = config.sequence_batching  # the inputs the server feeds a stateful model are not listed
        fed = {c.name for c in sb.control_input} | {st.input_name for st in sb.state}
        missing = [n for n in signature.input_names if n not in {t.name for t in config.input} | fed]
        if missing:
            raise _error(f"{where}: config.pbtxt lists no input {', '.join(map(repr, missing))} of the model")


def _tensor(message: Any, spec: TensorSpec, batched: bool) -> None:
    message.name = spec.name
    message.data_type = _TYPE_OF[datatype_of(spec.dtype)]
    shape = [] if spec.shape is None else list(spec.shape)[1 if batched else 0:]
    message.dims.extend(d if isinstance(d, int) else -1 for d in shape)


def model_config(model: ServedModel) -> mc.ModelConfig:
    """The Triton ``ModelConfig`` of a served model.

    Its ``config.pbtxt`` completed from the model (name, platform, inputs and outputs when absent; the queue
    bound in force, where the command line set one), or one made from the model and its serving settings.
    """
    given: mc.ModelConfig | None = getattr(model, "model_config", None)
    config = mc.ModelConfig()
    if given is not None:
        config.CopyFrom(given)
        if config.HasField("dynamic_batching") and model.settings.max_queue is not None:  # e.g. --max-queue
            config.dynamic_batching.default_queue_policy.max_queue_size = model.settings.max_queue
    else:
        batched = model.batch_symbol is not None and model.settings.max_batch > 0
        config.max_batch_size = model.settings.max_batch if batched else 0
        if model.settings.max_batch > 0:
            config.dynamic_batching.max_queue_delay_microseconds = round(model.settings.batch_timeout * 1e6)
            if model.settings.max_queue is not None:
                config.dynamic_batching.default_queue_policy.max_queue_size = model.settings.max_queue
        group = config.instance_group.add()
        group.count = model.runners  # as many as run now: the concurrency set, else the serving layout's replicas
        device = str(getattr(model.compiled, "device", "cpu"))
        group.kind = mc.ModelInstanceGroup.KIND_CPU if device.startswith("cpu") else mc.ModelInstanceGroup.KIND_GPU
    config.name = model.name
    if given is None:  # a folder without config.pbtxt: pyasc serves every version found
        config.version_policy.all.SetInParent()
    elif not config.HasField("version_policy"):  # Triton's default, which its config endpoint prints too
        config.version_policy.latest.num_versions = 1
    if not config.HasField("optimization"):
        config.optimization.SetInParent()
    config.platform = config.platform or model.platform
    config.backend = config.backend or "pyasc"
    batched = config.max_batch_size > 0
    if not len(config.input):
        for spec in model.signature.inputs:
            _tensor(config.input.add(), spec, batched)
    if not len(config.output):
        for spec in model.signature.outputs:
            _tensor(config.output.add(), spec, batched)
    return config


def config_json(message: Message) -> dict[str, Any]:
    """A protobuf message as the JSON Triton's HTTP API returns.

    Proto field names, defaults printed, 64-bit integers as numbers (protobuf's JSON mapping quotes them;
    older protobuf releases have no option to keep them numbers, so they are turned back here).
    """
    data = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    return _int64_unquoted(message.DESCRIPTOR, data)


_INT64_TYPES = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def _int64_unquoted(descriptor: Any, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (MessageToDict of a message of ``descriptor``) with its 64-bit integer fields as ints."""
    for name, value in data.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            entry = field.message_type
            if entry.GetOptions().map_entry:  # a map: convert its values
                value_field = entry.fields_by_name["value"]
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    data[name] = {k: _int64_unquoted(value_field.message_type, v) for k, v in value.items()}
                elif value_field.type in _INT64_TYPES:
                    data[name] = {k: int(v) for k, v in value.items()}
            elif isinstance(value, list):
                data[name] = [_int64_unquoted(entry, v) for v in value]
            elif isinstance(value, dict):
                data[name] = _int64_unquoted(entry, value)
        elif field.type in _INT64_TYPES:
            data[name] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return data
