"""A served model: one compiled model, its request checks, and its dynamic batcher.

Requests are validated one by one (names, dtypes, ranks, static dims) before they queue, so a bad
request fails alone. When the model's inputs and outputs share a symbolic first dimension, the batcher
concatenates the requests of a batch along it (grouped by their other dims), runs the model once per
group, and splits the outputs back by each request's own row count. Models with a static batch run each
request of a batch in turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from hybrid.config import ConfigSection
from hybrid.errors import ConfigError, HybridError, RunError, ServingError
from hybrid.runtime.batching import Batcher
from hybrid.runtime.validate import InputValidator

if TYPE_CHECKING:
    from hybrid.runtime.compiled import CompiledModel

__all__ = ["BatchSettings", "ServedModel"]

logger = logging.getLogger("hybrid.serve")


class BatchSettings(ConfigSection):
    """How a model takes requests (checked on construction: HYB-101/102).

    Attributes:
        max_batch: Most requests run in one call of the model; 0 turns batching off (each request runs
            on its own, concurrently, in the server's thread pool).
        batch_timeout: Longest time in seconds a request waits for its batch to fill.
        max_queue: Most requests waiting at once; more get HTTP 503 (HYB-705). None: unbounded.
        request_timeout: Longest time in seconds a request may take in the server; None: no limit.
        concurrency: Batches that may run at the same time.
    """

    max_batch: int = Field(default=8, ge=0, description="an int >= 0", examples=[8])
    batch_timeout: float = Field(default=0.005, ge=0, description="seconds >= 0", examples=[0.005])
    max_queue: int | None = Field(default=256, ge=1, description="an int >= 1 or null", examples=[256])
    request_timeout: float | None = Field(default=60.0, gt=0, description="seconds > 0 or null", examples=[60.0])
    concurrency: int = Field(default=1, ge=1, description="an int >= 1", examples=[1])

    def merged(self, overrides: Mapping[str, Any], where: str) -> BatchSettings:
        """A copy with ``overrides`` applied (keys as the attribute names), checked.

        Raises:
            ConfigError: HYB-101 for an unknown key, HYB-102 for a bad value; the message names ``where``.
        """
        try:
            return BatchSettings.model_validate({**self.model_dump(), **dict(overrides)})
        except ConfigError as e:
            raise ConfigError(e.code, f"{where}: {e.message}", e.hint) from None


# callback(model, batch_size, queue_waits_s, run_s) after every batch the model runs
BatchObserver = Callable[["ServedModel", int, list[float], float], None]


class _Item:
    __slots__ = ("enqueued", "feeds")

    def __init__(self, feeds: dict[str, np.ndarray]) -> None:
        self.feeds = feeds
        self.enqueued = time.monotonic()


def _batch_symbol(compiled: CompiledModel) -> str | None:
    """The symbolic first dim shared by every input and output, or None when the model cannot batch."""
    sig = compiled.signature
    specs = [*sig.inputs, *sig.outputs]
    if not sig.inputs or any(s.kind != "tensor" or not s.shape for s in specs):
        return None
    firsts = {s.shape[0] for s in specs}
    if len(firsts) != 1:
        return None
    (first,) = firsts
    return first if isinstance(first, str) else None


class ServedModel:
    """One model version behind the HTTP API.

    Args:
        name: The model's name on the server.
        version: Its version string ('1', '2', ...).
        compiled: The compiled model that runs the requests.
        settings: Batching and queue settings.
        platform: What the model was loaded from ('onnx' or 'hybrid'), reported in metadata.
        observer: Called after each batch (the server's metrics).
    """

    def __init__(self, name: str, version: str, compiled: CompiledModel, settings: BatchSettings,
                 platform: str = "onnx", observer: BatchObserver | None = None) -> None:
        self.name = name
        self.version = version
        self.compiled = compiled
        self.settings = settings
        self.platform = platform
        self.signature = compiled.signature
        self.batch_symbol = _batch_symbol(compiled)
        self.observer = observer
        self.model_config: Any = None  # Triton's ModelConfig from the folder's config.pbtxt (triton_config)
        self._validator = InputValidator(self.signature)
        self._output_names = self.signature.output_names
        self._in_flight = 0  # unbatched mode's queue
        self._closed = False
        self._batcher: Batcher | None = None
        if settings.max_batch > 0:
            self._batcher = Batcher(self._run_batch, max_batch=settings.max_batch, timeout=settings.batch_timeout,
                                    max_queue=settings.max_queue, max_concurrent_batches=settings.concurrency,
                                    name=f"{name}:{version}")
        if settings.max_batch > 1 and self.batch_symbol is None:
            logger.warning("model %s:%s has no symbolic batch dimension shared by its inputs and outputs; its "
                           "batches run request by request", name, version)

    @property
    def queued(self) -> int:
        """Requests waiting now."""
        return self._batcher.stats().queued if self._batcher else self._in_flight

    @property
    def ready(self) -> bool:
        return not self._closed

    async def infer(self, feeds: Mapping[str, np.ndarray], timeout: float | None = None) -> dict[str, np.ndarray]:
        """Validate one request's inputs, run it (in a batch when batching is on), return its outputs.

        Args:
            feeds: Input name -> array.
            timeout: The client's own timeout in seconds; the shorter of it and ``request_timeout`` applies.

        Raises:
            RunError: HYB-401..407 for inputs that do not fit the model, HYB-411 on timeout, HYB-408 when
                the backend fails.
            ServingError: HYB-705 when the queue is full, HYB-706 when the model is shutting down.
        """
        checked = self._validator.feeds(feeds)
        limits = [t for t in (timeout, self.settings.request_timeout) if t is not None]
        limit = min(limits) if limits else None
        if self._closed:
            raise self._closing_error()
        if self._batcher is None:
            return await self._infer_alone(checked, limit)
        try:
            return await self._batcher.acall(_Item(checked), timeout=limit)
        except RunError as e:
            if e.code == "HYB-412":
                raise ServingError("HYB-705", f"model {self.name!r} version {self.version}: "
                                   f"{self.settings.max_queue} requests already queued", "retry later") from e
            if e.code == "HYB-415":
                raise self._closing_error() from e
            raise

    async def _infer_alone(self, feeds: dict[str, np.ndarray], limit: float | None) -> dict[str, np.ndarray]:
        cap = self.settings.max_queue
        if cap is not None and self._in_flight >= cap:
            raise ServingError("HYB-705", f"model {self.name!r} version {self.version}: {cap} requests already "
                               "in flight", "retry later")
        self._in_flight += 1  # only the event loop thread touches the counter
        enqueued = time.monotonic()
        try:
            task = asyncio.get_running_loop().run_in_executor(None, self._run_alone, feeds, enqueued)
            try:
                return await asyncio.wait_for(task, limit)
            except TimeoutError:
                raise RunError("HYB-411", f"model {self.name!r}: no result within {limit} s",
                               "raise the request timeout") from None
        finally:
            self._in_flight -= 1

    def _run_alone(self, feeds: dict[str, np.ndarray], enqueued: float) -> dict[str, np.ndarray]:
        t0 = time.monotonic()
        out = self.compiled.run(feeds)
        if self.observer is not None:
            self.observer(self, 1, [t0 - enqueued], time.monotonic() - t0)
        return out

    # ---------------------------------------------------------------------------------------- batching
    def _run_batch(self, items: list[_Item]) -> list[dict[str, np.ndarray] | Exception]:
        t0 = time.monotonic()
        results: list[dict[str, np.ndarray] | Exception] = [None] * len(items)  # type: ignore[list-item]
        for idx in self._groups(items):
            group = [items[i] for i in idx]
            try:
                outs = self._run_group(group)
            except Exception as e:
                outs = self._isolate(group, e)
            for i, out in zip(idx, outs):
                results[i] = out
        if self.observer is not None:
            self.observer(self, len(items), [t0 - it.enqueued for it in items], time.monotonic() - t0)
        return results

    def _isolate(self, group: list[_Item], error: Exception) -> list[dict[str, np.ndarray] | Exception]:
        """After a joined run failed: run each request alone, so only the requests that fail on their own
        get an error (one bad request must not fail the requests it was batched with)."""
        if len(group) == 1:
            return [self._error_for_one(error, 1)]
        logger.warning("model %s:%s failed on a batch of %d (%s); running its requests one by one", self.name,
                       self.version, len(group), str(error).splitlines()[0][:200] if str(error) else type(error))
        outs: list[dict[str, np.ndarray] | Exception] = []
        for item in group:
            try:
                outs.append(self.compiled.run(item.feeds))
            except Exception as e:
                outs.append(self._error_for_one(e, 1))
        return outs

    def _error_for_one(self, e: Exception, size: int) -> Exception:
        """A fresh error per caller (tracebacks never mix across threads), chained to the batch's own."""
        if isinstance(e, HybridError):
            err = type(e)(e.code, e.message, e.hint)
        else:
            first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            err = RunError("HYB-408", f"model {self.name!r} failed on a batch of {size}: {first}")
        err.__cause__ = e
        return err

    def _groups(self, items: list[_Item]) -> list[list[int]]:
        """Indices of the requests that can be concatenated together (same inputs and inner shapes)."""
        if self.batch_symbol is None:
            return [[i] for i in range(len(items))]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, item in enumerate(items):
            key = tuple((k, v.dtype.str, v.shape[1:]) for k, v in sorted(item.feeds.items()))
            groups.setdefault(key, []).append(i)
        return list(groups.values())

    def _run_group(self, group: list[_Item]) -> list[dict[str, np.ndarray]]:
        if len(group) == 1:
            return [self.compiled.run(group[0].feeds)]
        rows = [len(next(iter(it.feeds.values()))) for it in group]
        names = list(group[0].feeds)
        joined = {k: np.concatenate([it.feeds[k] for it in group], axis=0) for k in names}
        outs = self.compiled.run(joined)
        total = sum(rows)
        if any(np.ndim(v) == 0 or len(v) != total for v in outs.values()):
            # the graph does not keep rows independent after all: fall back to one run per request
            logger.warning("model %s:%s returned outputs without the batch of %d rows; running requests one "
                           "by one", self.name, self.version, total)
            return [self.compiled.run(it.feeds) for it in group]
        bounds = np.cumsum(rows)[:-1]
        parts = {k: np.split(v, bounds, axis=0) for k, v in outs.items()}
        return [{k: parts[k][j] for k in self._output_names} for j in range(len(group))]

    # ---------------------------------------------------------------------------------------- lifecycle
    def _closing_error(self) -> ServingError:
        return ServingError("HYB-706", f"model {self.name!r} version {self.version} is shutting down",
                            "send the request to another replica")

    def drain(self, timeout: float | None = None) -> None:
        """Refuse new requests; run every queued one now (without waiting for batches to fill), then stop."""
        self._closed = True
        if self._batcher is not None:
            self._batcher.close(wait=True, timeout=timeout)

    def close(self) -> None:
        """Drain, then release the backend's resources."""
        self.drain()
        self.compiled.close()

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The v2 model metadata document."""
        from hybrid.serve.protocol import tensor_metadata

        sig = self.signature
        return {
            "name": self.name,
            "versions": versions,
            "platform": self.platform,
            "inputs": [tensor_metadata(s.name, s.dtype, s.shape) for s in sig.inputs],
            "outputs": [tensor_metadata(s.name, s.dtype, s.shape) for s in sig.outputs],
        }

    def __repr__(self) -> str:
        return f"<hybrid.serve model {self.name}:{self.version} {self.signature} max_batch={self.settings.max_batch}>"
