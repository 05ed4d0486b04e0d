"""Triton's response cache: a model's answer to inputs it has seen, given again without running the model.

A server started with ``--cache-config local,size=BYTES`` (Triton's spelling) keeps one cache of that many bytes
for every model whose ``config.pbtxt`` has ``response_cache { enable: true }``; other models, and models with
sequence batching (their answers depend on the sequence's state), are never cached. A request's key is a 128-bit
XXH3 hash (not a cryptographic one: about 3 us for a 110 KB image, where BLAKE2b took 110 us of every request's
time) of its model, version and every input's name, datatype, shape and bytes, seeded with a random number drawn
when the cache is made: the seed never leaves the process, so keys cannot be computed outside it to craft two
requests with one key. The value is the model's outputs, copied. The least recently used answers are dropped to
stay within the size; an answer larger than the whole cache is not kept. Statistics count as Triton's do
(:mod:`hybrid.serve.observe.statistics`): a hit is a success with a ``cache_hit`` (its lookup time) and no compute; a
miss a ``cache_miss`` (lookup and insertion time) beside the usual compute. The cache counts its own lookups, hits,
misses, evictions and their times (:class:`CacheCounts`), which ``/metrics`` exposes as Triton's ``nv_cache_*`` gauges.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from hybrid.errors import ConfigError

__all__ = ["CacheCounts", "ResponseCache", "cache_size"]

_HINT = "e.g. --cache-config local,size=104857600 (100 MiB), as Triton takes it"


def cache_size(options: Sequence[str]) -> int:
    """The cache size in bytes of ``--cache-config`` values (``local,size=N``); 0 without any.

    Raises:
        ConfigError: HYB-102 for a cache other than ``local``, another key, or a size that is not a positive
            integer.
    """
    size = 0
    for option in options:
        kind, _, setting = option.partition(",")
        key, equals, value = setting.partition("=")
        if kind.strip() != "local" or key.strip() != "size" or not equals:
            raise ConfigError("HYB-102", f"--cache-config {option!r}: expected local,size=BYTES (pyasc has Triton's "
                              "local cache; not redis)", _HINT)
        try:
            size = int(value.strip())
        except ValueError:
            size = -1
        if size <= 0:
            raise ConfigError("HYB-102", f"--cache-config {option!r}: the size must be a positive number of bytes",
                              _HINT)
    return size


def _nbytes(array: np.ndarray) -> int:
    if array.dtype.kind == "O":
        return int(array.size) * 8 + sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in array.reshape(-1))
    return int(array.nbytes)


@dataclass(frozen=True)
class CacheCounts:
    """What the cache did since it was made (Triton's ``nv_cache_*`` gauges).

    Attributes:
        utilization: Bytes kept over the capacity, 0..1.
        entries: Answers kept now.
        lookups: Lookups, hits and misses.
        hits: Lookups that found an answer.
        misses: Lookups that found none.
        evictions: Answers dropped to make room for others.
        lookup_us: Time spent in lookups (the key's hash included), microseconds.
        insertion_us: Time spent keeping answers, microseconds.
    """

    utilization: float
    entries: int
    lookups: int
    hits: int
    misses: int
    evictions: int
    lookup_us: int
    insertion_us: int


class ResponseCache:
    """Answers by request, least recently used dropped first; thread-safe.

    Args:
        capacity: Most bytes of outputs kept.
        clock: Seconds, for the lookup and insertion times (``time.perf_counter``; tests inject their own).
    """

    def __init__(self, capacity: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self.capacity = capacity
        self.used = 0
        self._clock = clock
        self._seed = secrets.randbits(64)  # the keys' (see the module's notes)
        self._entries: OrderedDict[bytes, tuple[dict[str, np.ndarray], int]] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0
        self._lookup_s = self._insertion_s = 0.0

    def key(self, model: str, version: str, inputs: Mapping[str, np.ndarray]) -> bytes:
        """The key of a request: its model, version and inputs (names, datatypes, shapes, bytes)."""
        digest = xxhash.xxh3_128(seed=self._seed)
        digest.update(f"{model}\0{version}\0".encode())
        for name in sorted(inputs):
            array = np.asarray(inputs[name])
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            if array.dtype.kind == "O":  # strings: each with its length, so that ("ab", "c") != ("a", "bc")
                for value in array.reshape(-1):
                    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
                    digest.update(len(data).to_bytes(8, "little"))
                    digest.update(data)
            else:
                digest.update(np.ascontiguousarray(array).data)
        return digest.digest()

    def lookup(self, model: str, version: str,
               inputs: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, np.ndarray] | None, float]:
        """A request's key, the answer kept for it (or None) and the seconds both took (counted as lookup time)."""
        t0 = self._clock()
        key = self.key(model, version, inputs)
        found = self.get(key)
        seconds = self._clock() - t0
        with self._lock:
            self._lookup_s += seconds
        return key, found, seconds

    def insert(self, key: bytes, outputs: Mapping[str, np.ndarray]) -> float:
        """:meth:`put` ``outputs`` for ``key``; the seconds it took (counted as insertion time)."""
        t0 = self._clock()
        self.put(key, outputs)
        seconds = self._clock() - t0
        with self._lock:
            self._insertion_s += seconds
        return seconds

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        """The answer kept for ``key`` (now the most recently used), or None; counted as a hit or a miss."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._hits += 1
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: bytes, outputs: Mapping[str, np.ndarray]) -> bool:
        """Keep a copy of ``outputs`` for ``key``, dropping the least recently used answers to make room.

        Returns:
            Whether it was kept (an answer larger than the whole cache is not).
        """
        kept = {}
        for name, value in outputs.items():
            copy = np.array(value, copy=True)
            copy.flags.writeable = False  # every later hit shares it
            kept[name] = copy
        size = sum(_nbytes(v) for v in kept.values())
        if size > self.capacity:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.used -= old[1]
            while self._entries and self.used + size > self.capacity:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.used -= dropped
                self._evictions += 1
            self._entries[key] = (kept, size)
            self.used += size
        return True

    def counts(self) -> CacheCounts:
        """A consistent copy of what the cache did, taken under its lock."""
        with self._lock:
            return CacheCounts(utilization=self.used / self.capacity, entries=len(self._entries),
                               lookups=self._hits + self._misses, hits=self._hits, misses=self._misses,
                               evictions=self._evictions, lookup_us=round(self._lookup_s * 1e6),
                               insertion_us=round(self._insertion_s * 1e6))

    def __len__(self) -> int:
        return len(self._entries)
