"""The KServe v2 / Open Inference Protocol codec: JSON tensors and the binary tensor data extension.

A request body is JSON, or (binary extension) a JSON header of ``Inference-Header-Content-Length`` bytes
followed by the raw bytes of every input that declares ``parameters.binary_data_size``, in input order.
Everything a client sends is checked before anything is allocated for it: the JSON nesting depth before
parsing, each shape (integers, no negative dims, an element count bounded by what the body can carry)
before its data is read, the byte size of binary data against the shape (a BYTES element takes at least
its 4-byte length), every input against the model (``precheck``) before any data is decoded, and the
values of JSON data against the shape: a flat row-major list or lists nested exactly as the shape, of
strict JSON (no ``NaN``/``Infinity`` literals unless the request sets ``parameters.allow_non_finite``).
A failure is a :class:`~hybrid.errors.ServingError` HYB-702 naming the tensor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import orjson

from hybrid.errors import ServingError
from hybrid.serve.tensors import (
    RAW,
    binary_of,
    bytes_array,
    check_raw_size,
    datatype_of,
    dtype_for,
    from_raw,
    shape_of,
    values_as,
)
from hybrid.serve.triton.classification import CLASSIFICATION, class_count, top_classes
from hybrid.serve.triton.sequences import SequenceFlags, sequence_flags
from hybrid.serve.triton.shared_memory import BYTE_SIZE, OFFSET, REGION, SharedMemoryRegions, Span, regions_for, span_of

__all__ = [
    "ALLOW_NON_FINITE",
    "InferRequest",
    "Limits",
    "Precheck",
    "RequestedOutput",
    "check_head",
    "check_json_depth",
    "encode_response",
    "json_values",
    "parse_request",
    "placeholder",
    "request_fields",
    "tensor_from_json",
    "tensor_metadata",
]

_HINT = "see the KServe v2 inference request format; tritonclient.http builds valid requests"
_DATA = "'data'"  # where a tensor's values came from, in the error texts
# the request parameter that lets JSON tensor data carry the non-standard literals NaN, Infinity, -Infinity
ALLOW_NON_FINITE = "allow_non_finite"


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may carry.

    Attributes:
        max_body: Most bytes of a request body, after decompression.
        max_json_depth: Deepest nesting of JSON arrays and objects.
    """

    max_body: int = 64 << 20
    max_json_depth: int = 64


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """One entry of a request's ``outputs``.

    Attributes:
        name: The output's name.
        binary: Whether it comes back as binary data.
        classes: How many top classes it is answered as (the classification extension); 0: its values.
        span: Where it is written instead (the system shared memory extension), if anywhere.
    """

    name: str
    binary: bool
    classes: int = 0
    span: Span | None = None


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A decoded inference request.

    Attributes:
        id: The client's request id, echoed in the response.
        inputs: Input name -> array, in request order.
        outputs: The outputs asked for, or None for all of them.
        binary_output: Default for outputs not listed: binary when the client set ``binary_data_output``.
        timeout_s: The client's own timeout (``parameters.timeout``, microseconds on the wire), if any.
        sequence: Its sequence (``parameters.sequence_id``, ``sequence_start``, ``sequence_end``), if any.
        priority: Its priority (``parameters.priority``; 0: the model's default level).
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: tuple[RequestedOutput, ...] | None
    binary_output: bool
    timeout_s: float | None
    sequence: SequenceFlags | None = None
    priority: int = 0


def _bad(message: str, hint: str | None = _HINT) -> ServingError:
    return ServingError("HYB-702", message, hint)


def tensor_metadata(name: str, dtype: np.dtype | None, shape: Sequence[int | str] | None) -> dict[str, Any]:
    """``{"name", "datatype", "shape"}`` for model metadata; symbolic or unknown dims are -1."""
    dims = [] if shape is None else [d if isinstance(d, int) else -1 for d in shape]
    return {"name": name, "datatype": datatype_of(dtype), "shape": dims}


# ------------------------------------------------------------------------------------------------ checks
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN = (ord("["), ord("{"))
_CLOSE = (ord("]"), ord("}"))


def check_json_depth(data: bytes, limit: int) -> None:
    """Raise HYB-702 when JSON text nests arrays/objects deeper than ``limit``, without parsing it.

    Only quotes and brackets are looked at (vectorized), so a 64 MiB body of numbers costs a few passes.
    """
    if data.count(b"[") + data.count(b"{") <= limit:  # no nesting can be deeper than all the brackets
        return
    raw = np.frombuffer(data, dtype=np.uint8)
    interesting = np.flatnonzero((raw == _QUOTE) | (raw == _OPEN[0]) | (raw == _OPEN[1])
                                 | (raw == _CLOSE[0]) | (raw == _CLOSE[1]))
    if interesting.size == 0:
        return
    chars = raw[interesting]
    quote = chars == _QUOTE
    escaped = quote & (interesting > 0) & (raw[np.maximum(interesting - 1, 0)] == _BACKSLASH)
    for k in np.flatnonzero(escaped):  # a quote after an odd run of backslashes is inside a string
        pos = int(interesting[k])
        run = 0
        while pos - run - 1 >= 0 and raw[pos - run - 1] == _BACKSLASH:
            run += 1
        if run % 2:
            quote[k] = False
    in_string = (np.cumsum(quote) - quote) % 2 == 1
    step = np.where((chars == _OPEN[0]) | (chars == _OPEN[1]), 1, np.where(quote, 0, -1))
    step[in_string | quote] = 0
    depth = int(np.cumsum(step).max())
    if depth > limit:
        raise _bad(f"JSON nests {depth} levels deep; at most {limit} are allowed",
                   "send tensor data as a flat list in row-major order")


def _element_count(name: str, shape: Any, datatype: str, limits: Limits) -> tuple[tuple[int, ...], int]:
    """Validate a JSON shape and return it with its element count, refusing counts the body cannot carry."""
    if not isinstance(shape, list):
        raise _bad(f"input {name!r}: 'shape' must be a list of integers, got {type(shape).__name__}")
    return shape_of(name, shape, datatype, limits.max_body)


def _flatten(name: str, data: Any, shape: tuple[int, ...]) -> list[Any]:
    """The values of ``data`` in row-major order: a flat list, or lists nested exactly as ``shape``."""
    if not isinstance(data, list):
        raise _bad(f"input {name!r}: 'data' must be a list, got {type(data).__name__}")
    if not any(isinstance(v, list) for v in data):
        return data
    if not shape:
        raise _bad(f"input {name!r}: 'data' of a scalar (shape []) must be a flat list of one value")
    rows: list[Any] = [data]
    for depth, dim in enumerate(shape):
        for row in rows:
            if not isinstance(row, list) or len(row) != dim:
                found = f"a list of {len(row)}" if isinstance(row, list) else f"a {type(row).__name__}"
                raise _bad(f"input {name!r}: nested 'data' does not follow shape {list(shape)}: level {depth} "
                           f"needs lists of {dim} entries, found {found}",
                           "send 'data' as a flat row-major list, or nested exactly as the shape")
        rows = list(chain.from_iterable(rows))
    if any(isinstance(v, list) for v in rows):
        raise _bad(f"input {name!r}: nested 'data' is deeper than shape {list(shape)}",
                   "send 'data' as a flat row-major list, or nested exactly as the shape")
    return rows


def _from_json(name: str, datatype: str, dtype: np.dtype, shape: tuple[int, ...], count: int,
               data: Any) -> np.ndarray:
    if datatype != "BYTES" and isinstance(data, list) and data:  # numbers, flat or nested as the shape: in C
        try:
            found = np.array(data)
        except (ValueError, OverflowError, TypeError):
            found = None  # ragged, or too large: the checks below say what is wrong
        if found is not None and found.size == count and found.shape in ((count,), shape):
            return values_as(name, datatype, found, _DATA).reshape(shape)
    flat = _flatten(name, data, shape)
    if len(flat) != count:
        raise _bad(f"input {name!r}: shape {list(shape)} needs {count} values, 'data' has {len(flat)}")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise _bad(f"input {name!r}: BYTES data in JSON must be strings")
        return bytes_array((v.encode("utf-8") for v in flat), count).reshape(shape)
    try:
        found = np.array(flat) if flat else np.zeros(0, dtype)
    except (ValueError, OverflowError) as e:
        raise _bad(f"input {name!r}: 'data' is not a list of numbers: {e}") from e
    return values_as(name, datatype, found, _DATA).reshape(shape)


def tensor_from_json(name: str, datatype: str, dtype: np.dtype, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """Input ``name`` from JSON values (a flat list, or nested as ``shape``), checked as an inference request's.

    Raises:
        ServingError: HYB-702 for a count that does not fill ``shape`` or values that do not fit ``datatype``.
    """
    return _from_json(name, datatype, dtype, shape, math.prod(shape), data)


def placeholder(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only array of ``dtype`` and ``shape`` that allocates nothing.

    With these a request's inputs can be checked against the model (names, datatypes, ranks, dims) before any
    of their data is decoded.
    """
    return np.broadcast_to(np.zeros((), dtype), shape)


# ------------------------------------------------------------------------------------------------ parsing
def _header(body: bytes, header_length: int | None, limits: Limits,
            parsed: dict[str, Any] | None = None) -> tuple[dict[str, Any], memoryview]:
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        if not 0 < header_length <= len(body):
            raise _bad(f"Inference-Header-Content-Length is {header_length}, the body has {len(body)} bytes")
        view = memoryview(body)
        header, binary = view[:header_length], view[header_length:]
        if parsed is not None:
            return parsed, binary
        header = bytes(header)
    check_json_depth(header, limits.max_json_depth)
    constants: list[str] = []

    def constant(literal: str) -> float:  # NaN, Infinity, -Infinity: not JSON; refused unless allowed
        if not constants:
            constants.append(literal)
        return float(literal)

    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError:  # not strict JSON: the json module's message, or the literals NaN, Infinity
        try:
            doc = json.loads(header, parse_constant=constant)
        except (ValueError, RecursionError) as e:
            raise _bad(f"the request is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise _bad(f"the request must be a JSON object, got {type(doc).__name__}")
    if constants:
        params = doc.get("parameters")
        if not (isinstance(params, dict) and params.get(ALLOW_NON_FINITE) is True):
            raise _bad(f"the request holds the literal {constants[0]}, which strict JSON does not have",
                       f"send finite numbers, the binary tensor extension, or set the request's "
                       f"'parameters.{ALLOW_NON_FINITE}' to true to accept NaN, Infinity and -Infinity")
    return doc, binary


def _parameters(where: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{where}: 'parameters' must be an object, got {type(value).__name__}")
    return value


def _outputs(doc: dict[str, Any], binary_default: bool) -> tuple[RequestedOutput, ...] | None:
    outputs = doc.get("outputs")
    if outputs is None:
        return None
    if not isinstance(outputs, list):
        raise _bad(f"'outputs' must be a list, got {type(outputs).__name__}")
    found: list[RequestedOutput] = []
    for out in outputs:
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise _bad("each entry of 'outputs' must be an object with a string 'name'")
        params = _parameters(f"output {out['name']!r}", out.get("parameters"))
        classes = class_count(out["name"], params[CLASSIFICATION]) if CLASSIFICATION in params else 0
        span = None
        if REGION in params:
            other = CLASSIFICATION if classes else "binary_data" if params.get("binary_data") is True else None
            if other:  # tritonclient sends binary_data false with a region
                raise _bad(f"output {out['name']!r} sets both '{REGION}' and '{other}'",
                           f"an output written to shared memory takes neither {CLASSIFICATION} nor binary_data")
            span = span_of(f"output {out['name']!r}", params[REGION], params.get(BYTE_SIZE), params.get(OFFSET))
        binary = params.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise _bad(f"output {out['name']!r}: 'binary_data' must be true or false")
        if any(o.name == out["name"] for o in found):
            raise _bad(f"output {out['name']!r} is requested twice")
        found.append(RequestedOutput(out["name"], binary, classes, span))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class _Declared:
    """One input as its JSON header declares it, checked, before its data is decoded."""

    name: str
    datatype: str
    dtype: np.dtype
    shape: tuple[int, ...]
    count: int
    data: Any  # the JSON 'data' list, or None for binary data
    offset: int  # binary: where its bytes start in the binary part
    size: int  # binary: its binary_data_size
    span: Span | None = None  # in a shared memory region instead


def _declared_inputs(inputs: Any, binary_size: int | None, limits: Limits) -> list[_Declared]:
    """Check every input's name, datatype, shape and byte size; decode nothing.

    ``binary_size`` is the length of the binary part; None when it is not known yet (its checks are skipped).
    """
    if not isinstance(inputs, list):
        raise _bad("the request needs an 'inputs' list")
    found: list[_Declared] = []
    names: set[str] = set()
    offset = 0
    for spec in inputs:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _bad("each entry of 'inputs' must be an object with a string 'name'")
        name = spec["name"]
        if name in names:
            raise _bad(f"input {name!r} appears twice")
        names.add(name)
        datatype = spec.get("datatype")
        dtype = dtype_for(name, datatype)
        shape, count = _element_count(name, spec.get("shape"), datatype, limits)
        params = _parameters(f"input {name!r}", spec.get("parameters"))
        if REGION in params:
            if "data" in spec or "binary_data_size" in params:
                raise _bad(f"input {name!r} sets more than one of 'data', 'parameters.binary_data_size' and "
                           f"'parameters.{REGION}'")
            span = span_of(f"input {name!r}", params[REGION], params.get(BYTE_SIZE), params.get(OFFSET))
            check_raw_size(name, datatype, shape, count, span.byte_size, BYTE_SIZE)
            found.append(_Declared(name, datatype, dtype, shape, count, None, 0, span.byte_size, span))
            continue
        size = params.get("binary_data_size")
        if size is None:
            if "data" not in spec:
                raise _bad(f"input {name!r} has neither 'data' nor 'parameters.binary_data_size'")
            found.append(_Declared(name, datatype, dtype, shape, count, spec["data"], 0, 0))
            continue
        if "data" in spec:
            raise _bad(f"input {name!r} has both 'data' and 'parameters.binary_data_size'")
        if type(size) is not int or size < 0:
            raise _bad(f"input {name!r}: binary_data_size must be a non-negative integer, got {size!r}")
        if binary_size is not None and offset + size > binary_size:
            raise _bad(f"input {name!r}: binary_data_size {size} runs past the {binary_size} bytes of binary "
                       "data after the JSON header", "set Inference-Header-Content-Length to the JSON size")
        check_raw_size(name, datatype, shape, count, size, RAW)
        found.append(_Declared(name, datatype, dtype, shape, count, None, offset, size))
        offset += size
    if binary_size is not None and offset != binary_size:
        raise _bad(f"the body carries {binary_size} bytes of binary data, the inputs declare {offset}")
    return found


# checks a request's inputs against the model before their data is decoded: given input name ->
# placeholder array (right dtype and shape, no data), it raises a HybridError for what the model refuses
Precheck = Callable[[Mapping[str, np.ndarray]], object]


def check_head(header: bytes, binary_size: int | None, limits: Limits,
               precheck: Precheck | None = None) -> dict[str, Any]:
    """Check a binary-extension request from its JSON header alone, before its binary data is read.

    The server calls it as soon as the first ``Inference-Header-Content-Length`` bytes of a body have
    arrived, so a request whose declared inputs cannot be served is refused without reading (or holding)
    the rest. :func:`parse_request` then checks the rest on the whole body, given the parsed header.

    Args:
        header: The JSON header.
        binary_size: Bytes of binary data that follow it, when the body's length is known; else None.
        limits: Size and nesting limits.
        precheck: As for :func:`parse_request`.

    Returns:
        The parsed header, for :func:`parse_request` (``header=``).

    Raises:
        ServingError: HYB-702 naming what is malformed; ``precheck``'s errors propagate.
    """
    doc, _ = _header(header, None, limits)
    declared = _declared_inputs(doc.get("inputs"), binary_size, limits)
    if precheck is not None:
        precheck({d.name: placeholder(d.dtype, d.shape) for d in declared})
    return doc


def request_fields(doc: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any], float | None,
                                                      SequenceFlags | None, int]:
    """A request's own fields, checked: its ``id``, ``parameters``, timeout, sequence and priority.

    The timeout is the client's (``parameters.timeout``, microseconds on the wire) in seconds; the sequence is
    ``parameters.sequence_id``, ``sequence_start`` and ``sequence_end``; the priority is ``parameters.priority``
    (Triton's schedule-policy extension; 0 when absent).

    Raises:
        ServingError: HYB-702 for an ``id`` that is not a string, ``parameters`` that are not an object, a timeout
            that is not a positive integer, a priority that is not an unsigned integer, or bad sequence
            parameters.
    """
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _bad(f"'id' must be a string, got {type(request_id).__name__}")
    params = _parameters("request", doc.get("parameters"))
    timeout = params.get("timeout")
    if timeout is not None and (type(timeout) is not int or timeout <= 0):
        raise _bad(f"'parameters.timeout' must be a positive integer of microseconds, got {timeout!r}")
    priority = params.get("priority", 0)
    if type(priority) is not int or priority < 0:
        raise _bad(f"'parameters.priority' must be an unsigned integer (1 is the highest level, 0 the model's "
                   f"default), got {priority!r}")
    sequence = sequence_flags(params.get("sequence_id"), params.get("sequence_start"), params.get("sequence_end"))
    return request_id, params, None if timeout is None else timeout / 1e6, sequence, priority


def parse_request(body: bytes, header_length: int | None, limits: Limits,
                  precheck: Precheck | None = None, header: dict[str, Any] | None = None,
                  shared_memory: SharedMemoryRegions | None = None) -> InferRequest:
    """Decode and check an inference request body (already decompressed and within ``limits.max_body``).

    The work is proportional to what the request declares, and checked before it is done: every input's
    shape, datatype and byte size are checked against the body (and against the model with ``precheck``)
    before any tensor data is decoded or allocated.

    Args:
        body: The request body.
        header_length: ``Inference-Header-Content-Length`` when the binary extension is used, else None.
        limits: Size and nesting limits.
        precheck: Checks the declared inputs against the model (e.g. ``InputValidator.feeds``), given
            :func:`placeholder` arrays; its errors propagate.
        header: The JSON header of a binary-extension body as :func:`check_head` returned it: not parsed again.
        shared_memory: The server's registered regions, for inputs and outputs that name one (the system
            shared memory extension; an input is then copied out of its region).

    Raises:
        ServingError: HYB-702 naming what is malformed; HYB-711 / HYB-712 for a shared memory span that is
            not inside a registered region.
    """
    doc, binary = _header(body, header_length, limits, header)
    request_id, params, timeout_s, sequence, priority = request_fields(doc)
    binary_output = params.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise _bad("'parameters.binary_data_output' must be true or false")
    declared = _declared_inputs(doc.get("inputs"), len(binary), limits)
    outputs = _outputs(doc, binary_output)
    if precheck is not None:
        precheck({d.name: placeholder(d.dtype, d.shape) for d in declared})
    arrays: dict[str, np.ndarray] = {}
    for d in declared:
        if d.data is not None:
            arrays[d.name] = _from_json(d.name, d.datatype, d.dtype, d.shape, d.count, d.data)
        elif d.span is not None:
            tensor = f"input {d.name!r}"
            data = regions_for(shared_memory, tensor).read(d.span.region, d.span.offset, d.span.byte_size, tensor)
            arrays[d.name] = from_raw(d.name, d.datatype, d.shape, d.count, data, BYTE_SIZE)
        else:
            arrays[d.name] = from_raw(d.name, d.datatype, d.shape, d.count, binary[d.offset:d.offset + d.size],
                                      RAW)
    for out in outputs or ():  # an output's region is checked before the model runs
        if out.span is not None:
            regions_for(shared_memory, f"output {out.name!r}").check(out.span, f"output {out.name!r}")
    return InferRequest(request_id, arrays, outputs, binary_output, timeout_s, sequence, priority)


# ------------------------------------------------------------------------------------------------ encoding
def json_values(name: str, arr: np.ndarray, datatype: str) -> np.ndarray | list[Any]:
    """An output's JSON ``data``: a flat array that orjson writes in C, or a list.

    Floats go out as doubles (the values Triton prints); a list holds BYTES as strings, or floats that are not
    all finite (only the json module writes the literals NaN and Infinity).
    """
    if datatype != "BYTES":
        flat = arr.reshape(-1)
        if flat.dtype.kind == "f" or datatype == "BF16":
            flat = flat.astype(np.float64)
            return flat if bool(np.isfinite(flat).all()) else flat.tolist()
        return np.ascontiguousarray(flat, flat.dtype.newbyteorder("="))
    try:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in arr.reshape(-1)]
    except UnicodeDecodeError as e:
        raise _bad(f"output {name!r} holds bytes that are not UTF-8 and cannot travel as JSON",
                   "request it with parameters.binary_data = true") from e


def encode_response(model_name: str, model_version: str, request: InferRequest,
                    outputs: Mapping[str, np.ndarray], *, batched: bool = False,
                    labels: Mapping[str, Sequence[str]] | None = None,
                    shared_memory: SharedMemoryRegions | None = None) -> tuple[bytes, int | None]:
    """Encode the outputs a request asked for.

    Args:
        model_name: The model's name, echoed.
        model_version: The model's version, echoed.
        request: The decoded request (its ids and the outputs it asks for).
        outputs: The model's outputs by name.
        batched: Whether the model batches (``max_batch_size > 0``): the classification extension then
            classifies row by row (:func:`hybrid.serve.triton.classification.top_classes`).
        labels: Class labels by output name (``label_filename`` in ``config.pbtxt``).
        shared_memory: The server's registered regions: an output the request puts in one is written there,
            and its entry carries no data (as Triton answers).

    Returns:
        The body and, when some outputs travel as binary data, the JSON header's length (the value of
        ``Inference-Header-Content-Length``); None for a plain JSON body.

    Raises:
        ServingError: HYB-702 when the request names an output the model does not have, or asks for the top
            classes of an output that is not numeric; HYB-711 / HYB-712 for an output whose shared memory
            region cannot hold it.
    """
    wanted = request.outputs
    if wanted is None:
        wanted = tuple(RequestedOutput(name, request.binary_output) for name in outputs)
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for out in wanted:
        if out.name not in outputs:
            raise _bad(f"output {out.name!r} is not an output of {model_name!r}; it has: {', '.join(outputs)}",
                       "request one of the model's outputs, or omit 'outputs' for all of them")
        arr = np.asarray(outputs[out.name])
        if out.classes:
            arr = top_classes(out.name, arr, out.classes, batched=batched, labels=(labels or {}).get(out.name, ()))
        datatype = datatype_of(arr.dtype)
        entry: dict[str, Any] = {"name": out.name, "datatype": datatype, "shape": list(arr.shape)}
        if out.span is not None:
            tensor = f"output {out.name!r}"
            regions_for(shared_memory, tensor).write(out.span.region, out.span.offset, out.span.byte_size,
                                                  binary_of(arr, datatype), tensor)
        elif out.binary:
            raw = binary_of(arr, datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = json_values(out.name, arr, datatype)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    if all(not isinstance(e.get("data"), list) or e["datatype"] == "BYTES" for e in entries):
        header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    else:  # non-finite floats: NaN and Infinity literals (orjson would write null)
        for e in entries:
            if isinstance(e.get("data"), np.ndarray):
                e["data"] = e["data"].tolist()
        header = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
