"""A served model as ``pyasc bench --url`` reaches it: any KServe v2 / Triton server, through tritonclient.

:class:`RemoteModel` opens the server (``http://HOST:PORT`` or ``grpc://HOST:PORT``), reads the model's
metadata and statistics, and calls it (one client per thread: tritonclient's clients are not shared across
threads). It has the ``submit``/``submit_workers``/``signature`` a LoadGen run needs of a compiled model, so
:func:`hybrid.cli._loadgen.run_scenario` drives a server as it drives ``cm``. :class:`ConcurrencyLoad` and
:class:`RateLoad` are perf_analyzer's two loads: N callers in a closed loop, or requests sent at a rate
(constant or Poisson intervals).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from hybrid.cli._sweep import Record, ServerCounters
from hybrid.errors import ConfigError, RunError, ServingError

__all__ = ["ConcurrencyLoad", "Endpoint", "RateLoad", "RemoteModel", "parse_url", "remote_samples"]

_PORTS = {"http": 8000, "grpc": 8001}
_TIMEOUT_S = 10.0  # a liveness or metadata answer; a server that takes longer is not one to benchmark


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the server listens: protocol ('http' or 'grpc') and HOST:PORT."""

    protocol: str
    address: str

    def __str__(self) -> str:
        return f"{self.protocol}://{self.address}"


def parse_url(url: str) -> Endpoint:
    """``http://HOST[:PORT]`` or ``grpc://HOST[:PORT]`` (ports 8000 / 8001 by default, as Triton's).

    Raises:
        ConfigError: HYB-102 for another scheme, a path, or no host.
    """
    parts = urlsplit(url if "://" in url else f"missing://{url}")
    hint = "--url http://127.0.0.1:8000 (KServe v2 REST) or --url grpc://127.0.0.1:8001 (Triton's gRPC service)"
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in _PORTS or not parts.hostname or parts.path not in ("", "/") or port == -1:
        raise ConfigError("HYB-102", f"--url: expected http://HOST:PORT or grpc://HOST:PORT, got {url!r}", hint)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return Endpoint(parts.scheme, f"{host}:{port or _PORTS[parts.scheme]}")


def _np_dtype(datatype: str) -> Any:
    from tritonclient.utils import triton_to_np_dtype

    dtype = triton_to_np_dtype(datatype)
    if dtype is None:
        raise ConfigError("HYB-102", f"the served model's input datatype {datatype} has no numpy type",
                          "give the inputs with --input NAME=FILE.npy")
    return dtype


class RemoteModel:
    """One model on a v2 server, called through tritonclient (a client per calling thread).

    Args:
        endpoint: Where the server listens.
        name: The model's name.
        version: Its version ('' for the server's choice).

    Raises:
        ServingError: HYB-716 when the server cannot be reached or is not live; HYB-701 when it does not
            serve ``name``.
    """

    def __init__(self, endpoint: Endpoint, name: str, version: str = "") -> None:
        self.endpoint, self.name, self.version = endpoint, name, version
        self._local = threading.local()
        self._clients: list[Any] = []
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_size = 0
        self.submit_workers = 1
        self.outputs: list[str] = []
        self._check()

    def client(self) -> Any:
        """This thread's client."""
        c = getattr(self._local, "client", None)
        if c is None:
            if self.endpoint.protocol == "http":
                import tritonclient.http as module

                c = module.InferenceServerClient(self.endpoint.address, connection_timeout=_TIMEOUT_S,
                                                 network_timeout=300.0)
            else:
                import tritonclient.grpc as module

                c = module.InferenceServerClient(self.endpoint.address)
            self._local.client = c
            with self._lock:
                self._clients.append(c)
        return c

    def _check(self) -> None:
        from tritonclient.utils import InferenceServerException

        kw = {"client_timeout": _TIMEOUT_S} if self.endpoint.protocol == "grpc" else {}
        try:
            live = self.client().is_server_live(**kw)
        except Exception as e:  # refused, unresolved, timed out: tritonclient raises socket and gRPC errors alike
            raise ServingError("HYB-716", f"no KServe v2 server answers at {self.endpoint}: {e}") from e
        if not live:
            raise ServingError("HYB-716", f"the server at {self.endpoint} answers but is not live")
        try:
            meta = self._json(self.client().get_model_metadata(self.name, self.version, **self._as_json()))
        except InferenceServerException as e:
            raise ServingError("HYB-701", f"the server at {self.endpoint} does not serve model {self.name!r}"
                               f"{' version ' + self.version if self.version else ''}: {e.message()}",
                               "--model NAME as the server lists it (GET /v2/models/NAME, or its start-up table)"
                               ) from e
        self.metadata = meta
        self.outputs = [o["name"] for o in meta.get("outputs", [])]
        try:
            config = self._json(self.client().get_model_config(self.name, self.version, **self._as_json()))
            self.config = dict(config.get("config", config))
        except InferenceServerException:  # KServe servers without Triton's model configuration extension
            self.config = {}
        self.max_batch_size = int(self.config.get("max_batch_size", 0))

    def _as_json(self) -> dict[str, Any]:
        return {"as_json": True} if self.endpoint.protocol == "grpc" else {}

    @staticmethod
    def _json(doc: Any) -> dict[str, Any]:
        return dict(doc) if isinstance(doc, Mapping) else {}

    @property
    def inputs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, datatype, shape with -1 for a dynamic dim) of every input, as the metadata states them."""
        return [(i["name"], i["datatype"], tuple(int(d) for d in i["shape"])) for i in self.metadata["inputs"]]

    @property
    def signature(self) -> Any:
        """What LoadGen's Offline needs of a model: each input's shape, a dynamic dim as a name."""
        return SimpleNamespace(inputs=[SimpleNamespace(name=n, shape=tuple("N" if d < 0 else d for d in s))
                                       for n, _, s in self.inputs])

    def statistics(self) -> dict[str, Any] | None:
        """The statistics extension's answer for the model, or None where the server has none."""
        from tritonclient.utils import InferenceServerException

        try:
            return self._json(self.client().get_inference_statistics(self.name, self.version, **self._as_json()))
        except InferenceServerException:
            return None

    def counters(self) -> ServerCounters | None:
        """The model's cumulative counters now (None without the statistics extension)."""
        doc = self.statistics()
        return None if doc is None else ServerCounters.from_stats(doc, self.version)

    def call(self, feeds: Mapping[str, np.ndarray], clock: Callable[[], float] = time.perf_counter
             ) -> tuple[float, float, float, dict[str, np.ndarray]]:
        """One request: (send s, whole latency s, receive s, outputs).

        Send is building the request's tensors, receive reading the answer's; the latency runs from the
        first to the last (perf_analyzer's Client Send and Client Recv, and its latency).
        """
        from tritonclient.utils import InferenceServerException

        c = self.client()
        module = __import__(f"tritonclient.{self.endpoint.protocol}", fromlist=["InferInput"])
        t0 = clock()
        tensors = []
        for name, array in feeds.items():
            t = module.InferInput(name, list(array.shape), _datatype(array))
            t.set_data_from_numpy(array)
            tensors.append(t)
        t1 = clock()
        try:
            result = c.infer(self.name, tensors, model_version=self.version)
        except InferenceServerException as e:  # the server refused the request: say what it said
            raise ServingError("HYB-702", f"{self.endpoint} model {self.name!r} refused a request of "
                               f"{ {k: list(v.shape) for k, v in feeds.items()} }: {e.message()}",
                               "the inputs follow the model's metadata; size its dynamic dims with --shapes") from e
        t2 = clock()
        outputs = {name: result.as_numpy(name) for name in self.outputs}
        t3 = clock()
        return t1 - t0, t3 - t0, t3 - t2, outputs

    def submit(self, feeds: Mapping[str, np.ndarray]) -> concurrent.futures.Future[dict[str, np.ndarray]]:
        """One request on one of ``submit_workers`` threads (LoadGen's system under test completes from it)."""
        with self._lock:
            if self._pool is None or self._pool_size != self.submit_workers:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool = concurrent.futures.ThreadPoolExecutor(self.submit_workers, "pyasc-remote")
                self._pool_size = self.submit_workers
            pool = self._pool
        return pool.submit(lambda: self.call(feeds)[3])

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request, its outputs."""
        return self.call(feeds)[3]

    def close(self) -> None:
        """Stop the submit threads and close every client."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for c in self._clients:
            c.close()
        self._clients.clear()


def _datatype(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(array.dtype)


def remote_samples(model: RemoteModel, shapes: Mapping[str, Sequence[int]] | None, batch: int | None,
                   given: Mapping[str, np.ndarray] | None, count: int = 8, seed: int = 0
                   ) -> list[dict[str, np.ndarray]]:
    """The requests' inputs: the ``--input`` arrays, or ``count`` random samples at the metadata's shapes.

    A dynamic dim takes its size from ``--shapes``; dim 0 of a model the server batches (max_batch_size > 0)
    is ``--batch``, 1 unless given (perf_analyzer's ``-b``).

    Raises:
        RunError: HYB-417 for a dynamic dim no option sizes.
        ConfigError: HYB-102 for --input or --shapes naming inputs the model lacks, or shapes that do not fit.
    """
    declared = {n: (d, s) for n, d, s in model.inputs}
    for what, names in (("--input", given or {}), ("--shapes", shapes or {})):
        unknown = [n for n in names if n not in declared]
        if unknown:
            raise ConfigError("HYB-102", f"{what}: the served model {model.name!r} has no input "
                              f"{', '.join(unknown)}; its inputs: {', '.join(declared)}")
    if given:
        missing = [n for n in declared if n not in given]
        if missing:
            raise ConfigError("HYB-102", f"--input: no array for {', '.join(missing)} of {model.name!r}",
                              "give every input: --input NAME=FILE.npy per input")
        return [{n: np.asarray(given[n]) for n in declared}]
    rng = np.random.default_rng(seed)
    sized: dict[str, tuple[int, ...]] = {}
    for name, (_, shape) in declared.items():
        asked = tuple(int(d) for d in (shapes or {}).get(name, ()))
        if asked:
            if len(asked) != len(shape) or any(d >= 0 and d != a for d, a in zip(shape, asked)):
                raise ConfigError("HYB-102", f"--shapes {name}: {list(asked)} does not fit the served shape "
                                  f"{list(shape)} (-1: any size)")
            sized[name] = asked
            continue
        dims = [d if d >= 0 else (batch or 1) if (i == 0 and model.max_batch_size > 0) else -1
                for i, d in enumerate(shape)]
        if -1 in dims:
            line = ",".join(f"{n}:{'x'.join(str(d) if d >= 0 else 'N' for d in s)}" for n, (_, s) in
                            declared.items())
            raise RunError("HYB-417", f"input {name} of the served model {model.name!r} has a dynamic dim "
                           f"({list(shape)}) and no size was given", f"--shapes {line} with the N replaced")
        sized[name] = tuple(dims)
    out = []
    for _ in range(count):
        sample = {}
        for name, (datatype, _) in declared.items():
            dtype = np.dtype(_np_dtype(datatype)) if datatype != "BYTES" else np.dtype(object)
            shape = sized[name]
            if dtype.kind == "O":
                sample[name] = np.array([str(v).encode() for v in rng.integers(0, 1000, int(np.prod(shape)))],
                                        dtype=object).reshape(shape)
            elif dtype.kind == "f":
                sample[name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind == "b":
                sample[name] = rng.integers(0, 2, shape).astype(bool)
            else:  # integers index tables (token ids, classes): small values stay in range
                sample[name] = rng.integers(0, 2, shape).astype(dtype)
        out.append(sample)
    return out


class _Load:
    """Requests running in the background, completed ones collected as :class:`Record`s."""

    def __init__(self, model: RemoteModel, samples: Sequence[Mapping[str, np.ndarray]],
                 clock: Callable[[], float]) -> None:
        self.model, self.samples, self.clock = model, samples, clock
        self._records: list[Record] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def _one(self, k: int, late: bool = False) -> None:
        start = self.clock()
        try:
            send, latency, recv, _ = self.model.call(self.samples[k % len(self.samples)], self.clock)
            record = Record(start + latency, latency, send, recv, late=late)
        except Exception as e:  # counted as an error of the window; the load goes on, as perf_analyzer's
            with self._lock:
                self.errors.append(e)
            record = Record(self.clock(), 0.0, 0.0, 0.0, ok=False, late=late)
        with self._lock:
            self._records.append(record)

    def take(self) -> list[Record]:
        """The records completed since the last take."""
        with self._lock:
            out, self._records = self._records, []
        return out

    def stop(self) -> None:
        """Stop sending and wait for the requests in flight."""
        self._stop.set()
        for t in self._threads:
            t.join()

    def __enter__(self) -> _Load:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ConcurrencyLoad(_Load):
    """``concurrency`` callers, each sending its next request when its last one answered."""

    def __init__(self, model: RemoteModel, samples: Sequence[Mapping[str, np.ndarray]], concurrency: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(model, samples, clock)
        for i in range(concurrency):
            t = threading.Thread(target=self._loop, args=(i,), daemon=True, name=f"pyasc-bench-{i}")
            self._threads.append(t)
            t.start()

    def _loop(self, i: int) -> None:
        k = i
        while not self._stop.is_set():
            self._one(k)
            k += 1


class RateLoad(_Load):
    """Requests sent at ``rate`` per second, at constant or Poisson (exponential) intervals, by ``threads`` senders.

    A request whose sender was busy past its scheduled time is sent late and counted so (``Record.late``);
    more ``threads`` keep up with a slow server.
    """

    def __init__(self, model: RemoteModel, samples: Sequence[Mapping[str, np.ndarray]], rate: float,
                 distribution: str = "constant", threads: int = 16, clock: Callable[[], float] = time.perf_counter,
                 seed: int = 0) -> None:
        super().__init__(model, samples, clock)
        if distribution not in ("constant", "poisson"):
            raise ConfigError("HYB-102", f"--request-distribution: expected constant or poisson, got "
                              f"{distribution!r}")
        self.rate, self.distribution = rate, distribution
        self._rng = np.random.default_rng(seed)
        self._next = clock()
        self._k = 0
        self._sched = threading.Lock()
        for i in range(threads):
            t = threading.Thread(target=self._loop, daemon=True, name=f"pyasc-bench-{i}")
            self._threads.append(t)
            t.start()

    def _slot(self) -> tuple[float, int]:
        with self._sched:
            at, k = self._next, self._k
            gap = 1 / self.rate if self.distribution == "constant" else float(self._rng.exponential(1 / self.rate))
            self._next += gap
            self._k += 1
        return at, k

    def _loop(self) -> None:
        while not self._stop.is_set():
            at, k = self._slot()
            wait = at - self.clock()
            if wait > 0 and self._stop.wait(wait):
                return
            self._one(k, late=wait < -0.1 / self.rate)
