"""A memory pool: one arena, its best-fit allocator, and blocks handed out as views at offsets.

A :class:`Block` is a logical handle: the pool's mapping table turns it into a physical offset, and
``block.array(...)`` (host arenas) or ``block.torch(...)`` (any arena) give views at that offset.
The pools themselves are made and looked up by :mod:`hybrid.hal.memory`.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid.errors import RunError
from hybrid.hal.arena import GRANULE, Arena, Extent

__all__ = ["Block", "MemoryPool", "PoolStats", "format_bytes"]


def format_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``: sizes for humans, powers of 1024 like the config's sizes."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


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
        """Whether the block is still allocated in its pool."""
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
        """The block's byte offset in its arena."""
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
        """Whether the pool's memory is host memory."""
        return self._host is not None

    @property
    def capacity(self) -> int:
        """The pool's size in bytes."""
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
        """Assert the allocator's invariants (tests, debugging).

        Extents tile the arena without overlap, free neighbours are merged, the mapping table matches the allocator.
        """
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
