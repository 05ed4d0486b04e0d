"""The unified memory pool (DESIGN 2.4): one preallocated arena per present device.

``hybrid.init({'memory_pool': {'cpu': '2GB', 'pinned': '1GB', 'gpu': '4GB'}})`` calls
:func:`configure_pools`, which reserves each arena once. Afterwards every :meth:`MemoryPool.alloc`
carves a block out of that arena (best-fit, coalescing on free, see :mod:`hybrid.hal.arena`) and
:meth:`MemoryPool.free` returns it there; nothing goes back to the OS mid-run. A :class:`Block` is a
logical handle: the pool's mapping table turns it into a physical offset, and ``block.array(...)``
(host arenas) or ``block.torch(...)`` (any arena) give views at that offset.

Arenas: 'cpu' is a numpy ``uint8`` buffer; 'pinned' (page-locked host memory that stages copies to a
GPU), 'gpu' and 'npu' are ``torch.empty`` buffers made when torch sees the device. A pool for a device
that is absent is not created: the ``device_fallback`` policy decides between a warning and HYB-307.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid.config import get_config
from hybrid.errors import BackendError, ConfigError, RunError
from hybrid.hal.arena import GRANULE, Arena, Extent

__all__ = [
    "POOL_KINDS",
    "Block",
    "MemoryPool",
    "PoolStats",
    "TransferStats",
    "arena_allocations",
    "configure_pools",
    "format_bytes",
    "get_pool",
    "pool_kind",
    "pools",
    "record_transfer",
    "snapshot",
    "transfer_stats",
]

logger = logging.getLogger("hybrid")

POOL_KINDS = ("cpu", "pinned", "gpu", "npu")
_HOST_KINDS = ("cpu", "pinned")


def format_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``: sizes for humans, powers of 1024 like the config's sizes."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def pool_kind(device: str) -> str | None:
    """The pool that serves a device name: 'cuda:1' and 'gpu' -> 'gpu', 'npu:0' -> 'npu'; None if unknown."""
    kind = device.strip().lower().partition(":")[0]
    if kind == "cuda":
        kind = "gpu"
    return kind if kind in POOL_KINDS else None


# ---------------------------------------------------------------------------------------------- counters
@dataclass(frozen=True, slots=True)
class PoolStats:
    """A snapshot of one pool's counters (what ``memory_summary`` prints and a profiler samples)."""

    device: str
    reserved: int
    allocated: int
    peak: int
    free: int
    largest_free: int
    fragmentation: float
    live_blocks: int
    allocs: int
    frees: int
    failed_allocs: int
    arena_allocations: int


@dataclass(frozen=True, slots=True)
class TransferStats:
    """Copies into and out of one device's memory, made by :class:`hybrid.Tensor` migrations."""

    transfers_in: int = 0
    bytes_in: int = 0
    transfers_out: int = 0
    bytes_out: int = 0

    @property
    def transfers(self) -> int:
        return self.transfers_in + self.transfers_out

    @property
    def bytes_moved(self) -> int:
        return self.bytes_in + self.bytes_out


_STATE_LOCK = threading.Lock()
_transfers: dict[str, TransferStats] = {}
_arena_allocations = 0  # arenas reserved from the OS or driver, in this process, ever


def record_transfer(src: str, dst: str, nbytes: int) -> None:
    """Count one copy of ``nbytes`` from device ``src`` to device ``dst`` (pool kinds or device names)."""
    src_key, dst_key = pool_kind(src) or src, pool_kind(dst) or dst
    with _STATE_LOCK:
        s = _transfers.get(src_key, TransferStats())
        _transfers[src_key] = TransferStats(s.transfers_in, s.bytes_in, s.transfers_out + 1, s.bytes_out + nbytes)
        d = _transfers.get(dst_key, TransferStats())
        _transfers[dst_key] = TransferStats(d.transfers_in + 1, d.bytes_in + nbytes, d.transfers_out, d.bytes_out)


def transfer_stats(device: str) -> TransferStats:
    """Transfers counted so far for a device (its pool kind: 'cuda:0' counts under 'gpu')."""
    with _STATE_LOCK:
        return _transfers.get(pool_kind(device) or device, TransferStats())


def arena_allocations() -> int:
    """How many arenas this process has reserved from the OS or a driver (grows only in configure_pools)."""
    return _arena_allocations


# ---------------------------------------------------------------------------------------------- blocks
class Block:
    """A logical handle to bytes in a pool; the pool's table maps it to a physical offset.

    Attributes:
        pool: The owning pool.
        handle: The logical id (key of the pool's mapping table).
        nbytes: Bytes requested; the reserved extent may be a little larger (granule rounding).
    """

    __slots__ = ("handle", "nbytes", "pool")

    def __init__(self, pool: MemoryPool, handle: int, nbytes: int) -> None:
        self.pool = pool
        self.handle = handle
        self.nbytes = nbytes

    @property
    def alive(self) -> bool:
        return self.handle in self.pool._table

    @property
    def extent(self) -> Extent:
        """The physical ``(offset, size)`` of the block in its arena.

        Raises:
            RunError: HYB-416 when the block was freed.
        """
        ext = self.pool._table.get(self.handle)
        if ext is None:
            raise RunError("HYB-416", f"block #{self.handle} ({self.nbytes} bytes) of the {self.pool.device} pool "
                           "was already freed", "do not use a block after pool.free(block)")
        return ext

    @property
    def offset(self) -> int:
        return self.extent.offset

    @property
    def address(self) -> int:
        """The block's memory address (host or device pointer): equal addresses mean the same bytes."""
        return self.pool._base_address + self.offset

    def _elements(self, dtype: Any, shape: tuple[int, ...] | int | None) -> tuple[np.dtype, tuple[int, ...]]:
        dt = np.dtype(dtype)
        if shape is None:
            shape = (self.nbytes // dt.itemsize,)
        elif isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(d) for d in shape)
        need = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if any(d < 0 for d in shape) or need > self.nbytes:
            raise RunError("HYB-416", f"a {dt} array of shape {shape} needs {need} bytes; block #{self.handle} "
                           f"holds {self.nbytes}", "allocate a block of at least that many bytes")
        return dt, shape

    def array(self, dtype: Any = np.uint8, shape: tuple[int, ...] | int | None = None) -> np.ndarray:
        """A numpy view of the block (host arenas: 'cpu', 'pinned'); no copy, no allocation.

        Args:
            dtype: Element type.
            shape: Array shape; default: as many elements as fit.

        Raises:
            RunError: HYB-416 for a freed block, a shape that does not fit, or a device arena.
        """
        if not self.pool.is_host:
            raise RunError("HYB-416", f"block #{self.handle} lives in {self.pool.device} memory, which numpy "
                           "cannot view", "use block.torch(dtype, shape) for device memory")
        dt, shape = self._elements(dtype, shape)
        start = self.offset
        count = int(np.prod(shape, dtype=np.int64))
        return self.pool._host[start:start + count * dt.itemsize].view(dt).reshape(shape)

    def torch(self, dtype: Any = np.uint8, shape: tuple[int, ...] | int | None = None) -> Any:
        """A torch view of the block (any arena; for 'cpu' it shares the numpy buffer). Imports torch."""
        import torch

        dt, shape = self._elements(dtype, shape)
        if self.pool.is_host and self.pool._torch is None:
            return torch.from_numpy(self.array(dt, shape))
        start = self.offset
        count = int(np.prod(shape, dtype=np.int64))
        tdt = torch.from_numpy(np.empty(0, dt)).dtype
        return self.pool._torch[start:start + count * dt.itemsize].view(tdt).view(shape)

    def __repr__(self) -> str:
        where = f"offset {self.pool._table[self.handle].offset}" if self.alive else "freed"
        return f"<hybrid Block #{self.handle} {self.nbytes} B in {self.pool.device} pool, {where}>"


# ---------------------------------------------------------------------------------------------- pools
class MemoryPool:
    """One device's arena and its allocator. Thread-safe.

    Args:
        kind: 'cpu', 'pinned', 'gpu' or 'npu'.
        device: The device the arena lives on ('cpu', 'cuda:0', 'npu:0').
        capacity: Bytes to reserve.
        host: A numpy ``uint8`` array over the arena, for host memory ('cpu', 'pinned').
        torch_buffer: The torch ``uint8`` tensor that owns the arena ('pinned', 'gpu', 'npu').
    """

    def __init__(self, kind: str, device: str, capacity: int, host: np.ndarray | None = None,
                 torch_buffer: Any = None) -> None:
        self.kind = kind
        self.device = device
        self.requested = capacity
        self._host = host
        self._torch = torch_buffer
        self._base_address = host.ctypes.data if host is not None else torch_buffer.data_ptr()
        self._arena = Arena(capacity, self._base_address)
        self._table: dict[int, Extent] = {}  # logical handle -> physical extent
        self._handles = itertools.count(1)
        self._lock = threading.Lock()
        self._peak = 0
        self._allocs = 0
        self._frees = 0
        self._failed = 0

    @classmethod
    def on_host(cls, capacity: int) -> MemoryPool:
        """A 'cpu' pool over a fresh numpy arena that starts on a cache line."""
        raw = np.empty(capacity + GRANULE, dtype=np.uint8)
        skip = -raw.ctypes.data % GRANULE
        return cls("cpu", "cpu", capacity, host=raw[skip:skip + capacity])

    @property
    def is_host(self) -> bool:
        return self._host is not None

    @property
    def capacity(self) -> int:
        return self._arena.capacity

    def alloc(self, nbytes: int, alignment: int = GRANULE) -> Block:
        """Carve ``nbytes`` out of the arena, best fit, at an address that is a multiple of ``alignment``.

        Raises:
            RunError: HYB-416 for a bad size or alignment, HYB-410 when no free block is large enough
                (the message gives the request and the largest free block).
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise RunError("HYB-416", f"alloc: expected a non-negative byte count, got {nbytes!r}")
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 \
                or alignment & (alignment - 1):
            raise RunError("HYB-416", f"alloc: expected a power-of-two alignment, got {alignment!r}")
        nbytes = int(nbytes)
        with self._lock:
            ext = self._arena.alloc(nbytes, alignment)
            if ext is None:
                self._failed += 1
                largest, free = self._arena.largest_free, self._arena.free_bytes
                raise RunError("HYB-410", f"the {self.kind} pool ({self.device}) cannot hold {format_bytes(nbytes)} "
                               f"({nbytes} bytes): largest free block {format_bytes(largest)} ({largest} bytes), "
                               f"{format_bytes(free)} free of {format_bytes(self.capacity)}",
                               f"raise hybrid.init({{'memory_pool': {{'{self.kind}': ...}}}}) or free blocks")
            handle = next(self._handles)
            self._table[handle] = ext
            self._allocs += 1
            self._peak = max(self._peak, self._arena.used_bytes)
        return Block(self, handle, nbytes)

    def free(self, block: Block) -> None:
        """Return a block to the arena (merged with free neighbours).

        Raises:
            RunError: HYB-416 for a block of another pool or one already freed.
        """
        if not isinstance(block, Block) or block.pool is not self:
            owner = block.pool.device if isinstance(block, Block) else type(block).__name__
            raise RunError("HYB-416", f"free: block does not belong to the {self.kind} pool ({self.device}); "
                           f"it is from {owner}", "free a block with the pool that allocated it")
        with self._lock:
            ext = self._table.pop(block.handle, None)
            if ext is None:
                raise RunError("HYB-416", f"free: block #{block.handle} of the {self.kind} pool was already freed",
                               "free each block once")
            self._arena.free(ext.offset)
            self._frees += 1

    def empty(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> tuple[Block, np.ndarray]:
        """Allocate a block for an array and return it with its numpy view (host arenas)."""
        dt = np.dtype(dtype)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        block = self.alloc(int(np.prod(dims, dtype=np.int64)) * dt.itemsize)
        try:
            return block, block.array(dt, dims)
        except Exception:
            self.free(block)
            raise

    def stats(self) -> PoolStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            a = self._arena
            return PoolStats(self.device, a.capacity, a.used_bytes, self._peak, a.free_bytes, a.largest_free,
                             a.fragmentation(), len(self._table), self._allocs, self._frees, self._failed, 1)

    def check(self) -> None:
        """Assert the allocator's invariants (tests, debugging): extents tile the arena without overlap,
        free neighbours are merged, the mapping table matches the allocator."""
        with self._lock:
            a = self._arena
            used = a.used_extents()
            free = a.free_extents()
            assert sorted((e.offset, e.size) for e in self._table.values()) == [(e.offset, e.size) for e in used]
            pos = 0
            prev_free = False
            for ext, is_free in sorted([(e, True) for e in free] + [(e, False) for e in used],
                                       key=lambda t: t[0].offset):
                assert ext.offset == pos and ext.size > 0, f"gap or overlap at {pos}: {ext}"
                assert not (is_free and prev_free), f"unmerged free neighbours at {ext.offset}"
                pos, prev_free = ext.end, is_free
            assert pos == a.capacity, f"extents end at {pos}, arena has {a.capacity}"

    def __repr__(self) -> str:
        return (f"<hybrid MemoryPool {self.kind} on {self.device}: {format_bytes(self._arena.used_bytes)} of "
                f"{format_bytes(self.capacity)} allocated>")


# ---------------------------------------------------------------------------------------------- arenas
def _torch_with(kind: str) -> tuple[Any, str] | None:
    """(torch, device name) when torch can reach a device of this pool kind, else None. Imports torch
    only if it is installed; torch_npu only for 'npu'."""
    if importlib.util.find_spec("torch") is None:
        return None
    if kind == "npu":
        if importlib.util.find_spec("torch_npu") is None:
            return None
        import torch
        import torch_npu  # noqa: F401 - registers torch.npu

        return (torch, "npu:0") if torch.npu.is_available() else None
    import torch

    return (torch, "cuda:0") if torch.cuda.is_available() else None


def _reserve(kind: str, capacity: int, found: tuple[Any, str] | None) -> MemoryPool:
    """Reserve one arena from the OS or driver."""
    global _arena_allocations
    try:
        if kind == "cpu":
            pool = MemoryPool.on_host(capacity)
        else:
            assert found is not None
            torch, device = found
            if kind == "pinned":
                buf = torch.empty(capacity, dtype=torch.uint8, pin_memory=True)
                pool = MemoryPool("pinned", "cpu", capacity, host=buf.numpy(), torch_buffer=buf)
            else:
                buf = torch.empty(capacity, dtype=torch.uint8, device=device)
                pool = MemoryPool(kind, device, capacity, torch_buffer=buf)
    except (MemoryError, RuntimeError) as e:
        raise ConfigError("HYB-102", f"memory_pool.{kind}: could not reserve {format_bytes(capacity)}: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}",
                          "lower the pool size") from e
    with _STATE_LOCK:
        _arena_allocations += 1
    return pool


def _present_devices() -> str:
    from hybrid.hal.target import devices

    return ", ".join(d.name for d in devices()) or "none"


_POOLS_LOCK = threading.Lock()
_pools: dict[str, MemoryPool] = {}


def configure_pools(sizes: Mapping[str, int]) -> dict[str, MemoryPool]:
    """Make the pools match ``sizes`` (pool kind -> bytes); called by ``hybrid.init``.

    A pool whose size is unchanged is kept as it is (its live blocks stay valid); a kind left out or
    sized 0 loses its pool. An arena for an absent device is not made: with ``device_fallback='warn'``
    a warning says so, with ``'error'`` nothing changes and HYB-307 is raised.

    Raises:
        ConfigError: HYB-101 for an unknown kind, HYB-102 when an arena cannot be reserved.
        BackendError: HYB-307 for an absent device under ``device_fallback='error'``.
    """
    for kind in sizes:
        if kind not in POOL_KINDS:
            raise ConfigError("HYB-101", f"unknown configuration key 'memory_pool.{kind}'; valid keys: "
                              f"{', '.join(POOL_KINDS)}", "check the spelling of the key")
    wanted = {k: int(v) for k, v in sizes.items() if int(v) > 0}
    found: dict[str, tuple[Any, str] | None] = {}
    for kind in wanted:
        if kind == "cpu":
            continue
        found[kind] = _torch_with("gpu" if kind == "pinned" else kind)
        if found[kind] is None:
            need = {"pinned": "a CUDA GPU (pinned memory stages copies to it)", "gpu": "a CUDA GPU seen by torch",
                    "npu": "an Ascend NPU seen by torch_npu"}[kind]
            message = (f"memory_pool.{kind}: needs {need}, which is not present (devices: {_present_devices()}); "
                       f"no {kind} arena is made")
            if get_config().device_fallback == "error":
                raise BackendError("HYB-307", message + " and device_fallback is 'error'",
                                   "drop that pool from memory_pool or set device_fallback='warn'")
            logger.warning(message)
    with _POOLS_LOCK:
        for kind in list(_pools):
            if wanted.get(kind) != _pools[kind].requested:
                del _pools[kind]
        for kind, size in wanted.items():
            if kind in _pools or (kind != "cpu" and found.get(kind) is None):
                continue
            _pools[kind] = _reserve(kind, size, found.get(kind))
            logger.info("memory pool %s: reserved %s on %s", kind, format_bytes(size), _pools[kind].device)
        return dict(_pools)


def get_pool(device: str = "cpu") -> MemoryPool | None:
    """The pool that serves ``device`` ('cpu', 'pinned', 'gpu', 'cuda:0', 'npu'), or None if none is configured."""
    kind = pool_kind(device)
    with _POOLS_LOCK:
        return _pools.get(kind) if kind else None


def pools() -> dict[str, MemoryPool]:
    """Every configured pool by kind."""
    with _POOLS_LOCK:
        return dict(_pools)


def snapshot() -> dict[str, PoolStats]:
    """Counters of every pool, for a profiler's counter tracks."""
    return {kind: pool.stats() for kind, pool in pools().items()}
