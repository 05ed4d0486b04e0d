"""Triton's generate extension: a model called with plain JSON, its inputs and outputs as named fields.

``POST /v2/models/{m}[/versions/{v}]/generate`` takes a JSON object whose fields name the model's inputs, each a
flat list of the values of one request row (or a single value), and answers ``{"model_name", "model_version",
"id" (where the request had one), <output>: values}``, each output a flat list of its values or, where it holds
one, that value. ``generate_stream`` answers the same as one server-sent event (``data: {...}``): the models
pyasc serves answer once per request. As Triton 2.51 does (``tests/test_serve_vs_triton.py`` compares them):

- a field that is not an input is ignored, but ``id`` (the request id) and ``parameters`` (the request's
  parameters: ``sequence_id``, ``sequence_start``, ``sequence_end``, ``timeout``);
- an input's values fill its dimensions without the batch (one row: the batch dimension is 1 where the model
  batches); a dynamic dimension takes what the values leave; a nested list, or a count that does not fit, is
  refused ("can not convert input ... to tensor with proper shape");
- a missing input is refused as an inference request missing it is.

Deliberate differences: values of the wrong type, a body that is not a JSON object, and an input with more than
one dynamic dimension (no single shape fits) are a 400 ``HYB-702`` (Triton answers 500 to the first two).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from hybrid.errors import ServingError
from hybrid.serve.core.protocol import json_values, request_fields, tensor_from_json
from hybrid.serve.core.state import Decoded, ServerState, infer
from hybrid.serve.http.infer import read_body
from hybrid.serve.tensors import datatype_of

if TYPE_CHECKING:
    from hybrid.serve.core.model import ServedModel

__all__ = ["GenerateDecoded", "add_generate_routes", "generate", "generate_inputs"]

_HINT = 'e.g. {"text_input": "...", "parameters": {"sequence_id": 7}}: one field per input, its values in a flat list'


def _bad(message: str, hint: str = _HINT) -> ServingError:
    return ServingError("HYB-702", message, hint)


def _shape(model: ServedModel, name: str, dims: tuple[int | str, ...], count: int) -> tuple[int, ...]:
    """The shape ``count`` values of input ``name`` take: its dimensions without the batch, one row of it."""
    known = math.prod(d for d in dims if isinstance(d, int))
    dynamic = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if len(dynamic) > 1:
        raise _bad(f"input {name!r} has {len(dynamic)} dynamic dimensions {_dims(dims)}: no one shape fits a flat "
                   "list of values", "send it to /v2/models/{m}/infer with its shape")
    fits = known > 0 and count % known == 0 if dynamic else known == count
    if not fits:
        raise _bad(f"The schema can not convert input {name!r} to tensor with proper shape: its dimensions "
                   f"{_dims(dims)} do not take {count} value(s)")
    row = tuple(count // known if not isinstance(d, int) else d for d in dims)
    return ((1,) if model.max_batch_size > 0 else ()) + row


def _dims(dims: tuple[int | str, ...]) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in dims]


@dataclass(slots=True, kw_only=True)
class GenerateDecoded(Decoded[bytes]):
    """A generate request, decoded: its id, for its answer.

    Attributes:
        request_id: The client's ``id``, echoed in the answer.
    """

    request_id: str | None

    def encode(self, model: ServedModel, outputs: Mapping[str, np.ndarray]) -> bytes:
        """The answer's JSON: the model's name and version, the id, each output flat (or its one value) by name."""
        answer: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
        if self.request_id is not None:
            answer["id"] = self.request_id
        for name in model.signature.output_names:
            if name in outputs:
                answer[name] = _value(name, outputs[name])
        return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


def generate_inputs(model: ServedModel, doc: Any) -> tuple[dict[str, np.ndarray], GenerateDecoded, str | None]:
    """The input arrays, the decoded request and the request id of a generate request's JSON ``doc``.

    Raises:
        ServingError: HYB-702 for a body that is not an object, a bad ``id`` or ``parameters``, or an input
            whose values do not fill its dimensions or do not fit its datatype.
    """
    if not isinstance(doc, dict):
        raise _bad(f"a generate request is a JSON object of the model's inputs by name, got {type(doc).__name__}")
    request_id, _, timeout_s, sequence, priority = request_fields(doc)
    arrays: dict[str, np.ndarray] = {}
    batched = model.max_batch_size > 0
    for spec in model.signature.inputs:
        if spec.name not in doc or spec.shape is None:
            continue  # a missing input: the model's check names it, as for an inference request
        value = doc[spec.name]
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, (list, dict)) for v in values):
            raise _bad(f"The schema can not convert input {spec.name!r} to tensor with proper shape: its values "
                       "must be a flat list (or one value)")
        dims = tuple(spec.shape[1:] if batched else spec.shape)
        shape = _shape(model, spec.name, dims, len(values))
        dtype = np.dtype(object) if spec.dtype is None else spec.dtype
        arrays[spec.name] = tensor_from_json(spec.name, datatype_of(dtype), dtype, shape, values)
    return arrays, GenerateDecoded(arrays, timeout_s, sequence, priority=priority, request_id=request_id), request_id


def _value(name: str, array: np.ndarray) -> Any:
    """An output as a generate answer carries it: its values flat, or the one value it holds.

    The values are an inference answer's JSON ``data`` (:func:`hybrid.serve.core.protocol.json_values`).
    """
    values = json_values(name, array, datatype_of(array.dtype))
    items = values.tolist() if isinstance(values, np.ndarray) else values
    return items[0] if len(items) == 1 else items


async def generate(state: ServerState, model_name: str, version: str | None, body: bytes) -> bytes:
    """Run one generate request; the answer's JSON.

    Raises:
        HybridError: HYB-702 for a malformed request (:func:`generate_inputs`), and what inference raises.
    """
    model = state.model(model_name, version)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise _bad(f"the request is not valid JSON: {e}") from e
    _, decoded, _ = generate_inputs(model, doc)
    return await infer(state, model, lambda: decoded)


def add_generate_routes(app: FastAPI, state: ServerState) -> None:
    """Add ``/v2/models/{m}[/versions/{v}]/generate`` and ``.../generate_stream`` to ``app``."""
    limit = state.options.limits.max_body

    async def body_of(request: Request) -> bytes:
        return await read_body(request, limit)  # as an inference request's: compressed or not, never past --max-body

    @app.post("/v2/models/{model_name}/generate")
    @app.post("/v2/models/{model_name}/versions/{model_version}/generate")
    async def generate_route(request: Request, model_name: str, model_version: str | None = None) -> Response:
        answer = await generate(state, model_name, model_version, await body_of(request))
        return Response(answer, media_type="application/json")

    @app.post("/v2/models/{model_name}/generate_stream")
    @app.post("/v2/models/{model_name}/versions/{model_version}/generate_stream")
    async def generate_stream_route(request: Request, model_name: str,
                                    model_version: str | None = None) -> StreamingResponse:
        answer = await generate(state, model_name, model_version, await body_of(request))  # errors: plain JSON

        async def events() -> Any:
            yield b"data: " + answer + b"\n\n"

        return StreamingResponse(events(), media_type="text/event-stream; charset=utf-8")
