"""The HTTP extensions Triton's clients call, beside the core v2 routes of :mod:`hybrid.serve.app`.

=======================================================  ===========================================================
``GET /v2/models/{m}[/versions/{v}]/config``             model configuration: Triton's ``ModelConfig`` as JSON
``GET /v2/models[/{m}[/versions/{v}]]/stats``            statistics: ``{"model_stats": [ModelStatistics...]}``,
                                                         each with pyasc's ``"pyasc"`` report beside Triton's fields
``POST /v2/repository/index``                            ``[{"name", "version", "state"[, "reason"]}...]``
``POST /v2/repository/models/{m}/load`` / ``unload``     model control (HYB-709 unless the server allows it)
``GET /v2/systemsharedmemory[/region/{r}]/status``       ``[{"name", "key", "offset", "byte_size"}...]``
``POST /v2/systemsharedmemory/region/{r}/register``      ``{"key", "offset", "byte_size"}``: map a region
``POST /v2/systemsharedmemory[/region/{r}]/unregister``  drop one region, or all (an unknown one: nothing)
``GET /v2/logging`` / ``POST /v2/logging``               the log settings (``hybrid.serve.triton.log_settings``)
``GET`` / ``POST /v2[/models/{m}]/trace/setting``         the trace settings of the server or a model
                                                         (``hybrid.serve.observe.trace``)
=======================================================  ===========================================================

The JSON documents are the protobuf messages of Triton's own definitions (from tritonclient) printed with
their field names and 64-bit integers as numbers, the shapes Triton's HTTP server returns.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from hybrid.errors import ServingError
from hybrid.serve.core.state import EXTENSIONS, selected_models, statistics_of
from hybrid.serve.http.infer import read_body
from hybrid.serve.triton.config import config_json, load_request, model_config

if TYPE_CHECKING:
    import numpy as np

    from hybrid.serve.core.model import ServedModel
    from hybrid.serve.core.state import ServerState

__all__ = ["EXTENSIONS", "add_triton_routes", "request_rows", "selected_models"]

_CONTROL_BODY_MAX = 64 << 10


def request_rows(model: ServedModel, inputs: dict[str, np.ndarray]) -> int:
    """How many inferences a request holds, as Triton counts them: its batch rows when the model batches."""
    if model.batch_symbol is None or not inputs:
        return 1
    first = next(iter(inputs.values()))
    return int(first.shape[0]) if first.ndim else 1


async def _control_body(request: Request, limit: int = _CONTROL_BODY_MAX) -> dict[str, Any]:
    try:
        body = await read_body(request, limit)  # never held past the limit, compressed or not
    except ServingError as e:
        if e.code != "HYB-704":
            raise
        raise ServingError("HYB-704", f"a repository, shared memory, logging or trace request body is limited to "
                                      f"{limit} bytes", "a load that carries model files may be as large as "
                                      "--max-body") from e
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ServingError("HYB-702", f"the request is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ServingError("HYB-702", f"the request must be a JSON object, got {type(doc).__name__}")
    return doc


def add_triton_routes(app: FastAPI, state: ServerState) -> None:
    """Add the routes (before the core ones, so ``/v2/models/stats`` is not taken for a model name)."""
    registry, metrics = state.registry, state.metrics
    registry.observer = metrics.observe_batch  # the models a load adds report their batches too
    registry.on_load = metrics.loaded  # and have Triton's metrics from 0 at once, as Triton lists a model it loads

    control = state.check_model_control

    @app.get("/v2/models/stats")
    @app.get("/v2/models/{model_name}/stats")
    @app.get("/v2/models/{model_name}/versions/{model_version}/stats")
    async def statistics(model_name: str | None = None, model_version: str | None = None) -> dict[str, Any]:
        models = selected_models(registry, model_name, model_version)
        # beside Triton's fields: where each model runs, its precision and accuracy, its tuning (ServedModel.report)
        return {"model_stats": [{**config_json(stat), "pyasc": m.report()}
                                for m, stat in zip(models, statistics_of(state, models), strict=True)]}

    @app.get("/v2/models/{model_name}/config")
    @app.get("/v2/models/{model_name}/versions/{model_version}/config")
    async def configuration(model_name: str, model_version: str | None = None) -> dict[str, Any]:
        return config_json(model_config(registry.get(model_name, model_version)))

    # the system shared memory extension (hybrid.serve.triton.shared_memory): answers as Triton's, an empty 200
    @app.get("/v2/systemsharedmemory/status")
    @app.get("/v2/systemsharedmemory/region/{region_name}/status")
    async def shared_memory_status(region_name: str | None = None) -> list[dict[str, Any]]:
        return [r.as_dict() for r in state.regions().status(region_name)]

    @app.post("/v2/systemsharedmemory/region/{region_name}/register")
    async def shared_memory_register(request: Request, region_name: str) -> Response:
        doc = await _control_body(request)
        state.regions().register(region_name, doc.get("key"), doc.get("offset", 0), doc.get("byte_size"))
        return Response()

    @app.post("/v2/systemsharedmemory/unregister")
    @app.post("/v2/systemsharedmemory/region/{region_name}/unregister")
    async def shared_memory_unregister(request: Request, region_name: str | None = None) -> Response:
        await _control_body(request)
        state.regions().unregister(region_name)
        return Response()

    # the logging extension (hybrid.serve.triton.log_settings): every setting, after any change
    @app.get("/v2/logging")
    async def log_settings() -> dict[str, Any]:
        return state.log_control().current()

    @app.post("/v2/logging")
    async def update_log_settings(request: Request) -> dict[str, Any]:
        return state.log_control().update(await _control_body(request))

    # the trace extension (hybrid.serve.observe.trace): every setting, after any change
    @app.get("/v2/trace/setting")
    @app.get("/v2/models/{model_name}/trace/setting")
    async def trace_settings(model_name: str | None = None) -> dict[str, Any]:
        tracer = state.trace_control()
        if model_name is not None:
            registry.get(model_name)
        return tracer.settings(model_name)

    @app.post("/v2/trace/setting")
    @app.post("/v2/models/{model_name}/trace/setting")
    async def update_trace_settings(request: Request, model_name: str | None = None) -> dict[str, Any]:
        tracer = state.trace_control()
        if model_name is not None:
            registry.get(model_name)
        return tracer.update(model_name, await _control_body(request))

    @app.post("/v2/repository/index")
    async def repository_index(request: Request) -> list[dict[str, Any]]:
        doc = await _control_body(request)
        ready_only = doc.get("ready", False)
        if not isinstance(ready_only, bool):
            raise ServingError("HYB-702", f"'ready' must be true or false, got {ready_only!r}")
        entries = await run_in_threadpool(registry.index)
        return [{"name": e.name, "version": e.version, "state": e.state, **({"reason": e.reason} if e.reason else {})}
                for e in entries if not ready_only or e.state == "READY"]  # no empty reason, as Triton writes it

    @app.post("/v2/repository/models/{model_name}/load")
    async def load(request: Request, model_name: str) -> dict[str, Any]:
        control()
        doc = await _control_body(request, state.options.limits.max_body)  # it may carry the model's files
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise ServingError("HYB-702", f"'parameters' must be an object, got {type(params).__name__}")
        wanted = load_request(params)
        await run_in_threadpool(registry.load, model_name, wanted.config, wanted.files)
        return {}

    @app.post("/v2/repository/models/{model_name}/unload")
    async def unload(request: Request, model_name: str) -> dict[str, Any]:
        control()
        await _control_body(request)
        await run_in_threadpool(registry.unload, model_name)
        return {}
