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

Who draws from a pool is each backend's own declaration (``Backend.memory_pools``); :func:`pool_scope`
reads it, ``init`` logs it when it reserves an arena, and ``hybrid.utils.memory_summary`` prints it. A
backend that declares nothing (ONNX Runtime, OpenVINO) keeps its own allocators; nothing here pretends
otherwise.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid.config import get_config, pool_sizes
from hybrid.errors import BackendError, ConfigError, first_line
from hybrid.hal.pool import Block, MemoryPool, PoolStats, format_bytes
from hybrid.hal.registry import backend_class, backend_names

__all__ = [
    "POOL_KINDS",
    "Block",
    "MemoryPool",
    "PoolScope",
    "PoolStats",
    "TransferStats",
    "Workspace",
    "arena_allocations",
    "configure_pools",
    "format_bytes",
    "get_pool",
    "pool_kind",
    "pool_scope",
    "pools",
    "record_transfer",
    "snapshot",
    "transfer_stats",
]

logger = logging.getLogger("hybrid")

POOL_KINDS = ("cpu", "pinned", "gpu", "npu")


def pool_kind(device: str) -> str | None:
    """The pool that serves a device name: 'cuda:1' and 'gpu' -> 'gpu', 'npu:0' -> 'npu'; None if unknown."""
    kind = device.strip().lower().partition(":")[0]
    if kind == "cuda":
        kind = "gpu"
    return kind if kind in POOL_KINDS else None


# ---------------------------------------------------------------------------------------------- counters
@dataclass(frozen=True, slots=True)
class TransferStats:
    """Copies into and out of one device's memory, made by :class:`hybrid.Tensor` migrations."""

    transfers_in: int = 0
    bytes_in: int = 0
    transfers_out: int = 0
    bytes_out: int = 0

    @property
    def transfers(self) -> int:
        """Transfers in both directions."""
        return self.transfers_in + self.transfers_out

    @property
    def bytes_moved(self) -> int:
        """Bytes moved in both directions."""
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


# ---------------------------------------------------------------------------------------------- arenas
def _torch_with(kind: str) -> tuple[Any, str] | None:
    """(torch, device name) when torch can reach a device of this pool kind, else None.

    Imports torch only if it is installed; torch_npu only for 'npu'.
    """
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
                          f"{first_line(e)}",
                          "lower the pool size") from e
    with _STATE_LOCK:
        _arena_allocations += 1
    return pool


# what hybrid.Tensor keeps in each pool kind (hal/tensor.py): it is no backend, but it draws from every pool
_TENSOR_USE = {"cpu": "its host copies", "pinned": "staging of its copies to a CUDA device",
               "gpu": "its GPU copies", "npu": "its NPU copies"}


@dataclass(frozen=True, slots=True)
class PoolScope:
    """Who draws from one pool kind, as the backends declare it (``Backend.memory_pools``).

    Attributes:
        kind: 'cpu', 'pinned', 'gpu' or 'npu'.
        drawn: ``(who, what it keeps there)``: ``hybrid.Tensor`` and each backend that declares the kind.
        own: The registered backends that do not draw from it: they allocate with their own library.
    """

    kind: str
    drawn: tuple[tuple[str, str], ...]
    own: tuple[str, ...]

    def describe(self) -> str:
        """One line: who draws from the pool, and who manages its own memory."""
        drawn = ", ".join(f"{who} ({use})" for who, use in self.drawn)
        text = f"drawn from by {drawn}"
        if self.own:
            text += (f"; {', '.join(self.own)} manage their own memory and do not use it "
                     f"(hybrid.utils.memory_summary({self.kind!r}) shows what they report)")
        return text


def pool_scope(kind: str) -> PoolScope:
    """Who draws from pool ``kind``: from each registered backend's ``memory_pools`` (its class; no library)."""
    drawn = [("hybrid.Tensor", _TENSOR_USE[kind])]
    own = []
    for name in backend_names():
        try:
            use = backend_class(name).memory_pools.get(kind)
        except BackendError:  # an unimportable plugin: discovery reports it, it draws from nothing here
            continue
        if use:
            drawn.append((name, use))
        else:
            own.append(name)
    return PoolScope(kind, tuple(drawn), tuple(own))


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
    wanted = {k: v for k, v in pool_sizes(sizes).items() if v > 0}
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
    made: list[MemoryPool] = []
    with _POOLS_LOCK:
        for kind in list(_pools):
            if wanted.get(kind) != _pools[kind].requested:
                del _pools[kind]
        for kind, size in wanted.items():
            if kind in _pools or (kind != "cpu" and found.get(kind) is None):
                continue
            _pools[kind] = _reserve(kind, size, found.get(kind))
            made.append(_pools[kind])
        current = dict(_pools)
    for pool in made:  # the backends' classes are read outside the lock (it may import their modules)
        scope = pool_scope(pool.kind)
        # a warning when some backends do not use the pool: its bytes do nothing for a model they run
        logger.log(logging.WARNING if scope.own else logging.INFO, "memory pool %s: reserved %s on %s; %s",
                   pool.kind, format_bytes(pool.requested), pool.device, scope.describe())
    return current


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


# ---------------------------------------------------------------------------------------------- workspaces
class Workspace:
    """Arrays for one run's intermediates.

    Views into the device's pool when one is configured, plain numpy arrays otherwise. Not thread-safe: make one per run
    (it is cheap).

    The interpreter's hook: ``adopt(value)`` (or ``empty(shape, dtype)`` for a kernel that writes into
    ``out=``) where a step produces an intermediate, ``release(array)`` where liveness says it is dead,
    ``detach(array)`` for a graph output that leaves the run, ``release_all()`` at the end (also on error).

    Args:
        device: The device whose pool serves the arrays ('cpu' for a host interpreter).
    """

    __slots__ = ("_blocks", "pool")

    def __init__(self, device: str = "cpu") -> None:
        self.pool = get_pool(device)
        self._blocks: dict[int, tuple[Block, np.ndarray]] = {}  # id(array) -> (block, array kept alive)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialized array of ``shape`` and ``dtype``, from the pool if there is one.

        Raises:
            RunError: HYB-410 when the pool is exhausted.
        """
        if self.pool is None:
            return np.empty(shape, dtype)
        block, arr = self.pool.empty(shape, dtype)
        self._blocks[id(arr)] = (block, arr)
        return arr

    def adopt(self, value: Any) -> Any:
        """Move a kernel's result into the pool (a copy); non-arrays and runs without a pool pass through."""
        if self.pool is None or type(value) is not np.ndarray or value.dtype.hasobject:
            return value
        out = self.empty(value.shape, value.dtype)
        np.copyto(out, value)
        return out

    def owns(self, value: Any) -> bool:
        """Whether ``value`` is a block this pool handed out."""
        return id(value) in self._blocks and self._blocks[id(value)][1] is value

    def release(self, value: Any) -> None:
        """Give an array from :meth:`empty` or :meth:`adopt` back to the pool; anything else is ignored."""
        if self.owns(value):
            block, _ = self._blocks.pop(id(value))
            block.pool.free(block)

    def detach(self, value: Any) -> Any:
        """A graph output leaving the run: a copy outside the pool, and the pool block given back."""
        if not self.owns(value):
            return value
        out = value.copy()
        self.release(value)
        return out

    def release_all(self) -> None:
        """Give every block still held back to the pool (end of a run, or an error part-way)."""
        blocks, self._blocks = self._blocks, {}
        for block, _ in blocks.values():
            block.pool.free(block)
