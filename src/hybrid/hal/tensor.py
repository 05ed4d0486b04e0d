"""``hybrid.Tensor``: an array that knows which devices hold a current copy of it (DESIGN 2.4).

A tensor keeps one copy per device it has been used on. Asking for it on another device
(``t.data('cuda:0')``, or passing it to a model there) copies it on first use and keeps that copy
until the source changes (``t.update(...)`` or ``t[...] = ...``): the article's "page fault" at tensor
granularity. Copies live in the device's memory pool when one is configured; host-to-GPU copies are
staged through the pinned pool when there is one. Every copy is counted in the pool's transfer
counters (``hybrid.utils.memory_summary``).

Host views handed out are read-only (writes go through the tensor so that stale copies are dropped)
and keep their memory alive on their own: a view outlives the tensor safely.

Device copies use torch (``torch.cuda``; ``torch_npu`` for 'npu'); that path is written against the
torch API and is unverified on this project's CPU-only machines.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import numpy as np

from hybrid.errors import BackendError
from hybrid.hal.device import parse_device
from hybrid.hal.memory import Block, get_pool, record_transfer
from hybrid.hal.target import apply_device_fallback

__all__ = ["Tensor"]

logger = logging.getLogger("hybrid")
_warned: set[str] = set()


def _canonical(device: str) -> str:
    parsed = parse_device(device) if isinstance(device, str) else None
    if parsed is None or parsed[0] == "mps":
        raise BackendError("HYB-301", f"Tensor: expected a device such as 'cpu', 'cuda:0' or 'npu:0', got "
                           f"{device!r}", "use a device name from hybrid.devices()")
    kind, index = parsed
    if kind == "cpu":
        return "cpu"
    return f"{'npu' if kind == 'npu' else 'cuda'}:{index or 0}"


def _torch_for(device: str) -> Any:
    """Torch when it can reach ``device`` ('cuda:N', 'npu:N'), else None."""
    try:
        import torch
    except ImportError:
        return None
    kind, _, index = device.partition(":")
    if kind == "npu":
        try:
            import torch_npu  # noqa: F401 - registers torch.npu
        except ImportError:
            return None
        backend = torch.npu
    else:
        backend = torch.cuda
    return torch if backend.is_available() and int(index) < backend.device_count() else None


def _resolve(device: str) -> str:
    """The device a copy will really live on, after the device_fallback policy."""
    name = _canonical(device)
    if name == "cpu" or _torch_for(name) is not None:
        return name
    apply_device_fallback(f"Tensor: device {name!r}", "is not reachable (hybrid.Tensor moves data with torch, "
                          "which does not see it)", warned=_warned)
    return "cpu"


class _Copy:
    """One device's copy: the array or torch tensor, and the pool block under it (freed with the copy)."""

    __slots__ = ("__weakref__", "value")

    def __init__(self, value: Any, block: Block | None) -> None:
        self.value = value
        if block is not None:
            weakref.finalize(self, block.pool.free, block).atexit = False


class _View:
    """Exposes a host copy to numpy read-only while holding the copy (and so its block) alive."""

    __slots__ = ("_copy",)

    def __init__(self, copy: _Copy) -> None:
        self._copy = copy

    @property
    def __array_interface__(self) -> dict[str, Any]:
        face = dict(self._copy.value.__array_interface__)
        face["data"] = (face["data"][0], True)
        return face


def _host_copy(arr: np.ndarray) -> _Copy:
    pool = get_pool("cpu")
    if pool is None:
        return _Copy(np.array(arr, copy=True, order="C"), None)
    block, view = pool.empty(arr.shape, arr.dtype)
    np.copyto(view, arr)
    return _Copy(view, block)


def _to_device(arr: np.ndarray, device: str) -> _Copy:
    """Host -> device through the pinned pool (when configured) into the device pool (when configured)."""
    torch = _torch_for(device)
    src = torch.from_numpy(np.ascontiguousarray(arr))
    pinned = get_pool("pinned") if device.startswith("cuda") else None
    stage_block = None
    if pinned is not None:
        stage_block = pinned.alloc(arr.nbytes)
        staged = stage_block.torch(arr.dtype, arr.shape)
        staged.copy_(src)
        src = staged
    pool = get_pool(device)
    block = pool.alloc(arr.nbytes) if pool is not None else None
    if block is not None:
        out = block.torch(arr.dtype, arr.shape)
        out.copy_(src, non_blocking=stage_block is not None)
    else:
        out = src.to(device, non_blocking=stage_block is not None)
    if stage_block is not None:  # the staging block may be reused only once the copy is done
        (torch.npu if device.startswith("npu") else torch.cuda).current_stream(device).synchronize()
        pinned.free(stage_block)
    return _Copy(out, block)


def _to_host(value: Any) -> _Copy:
    """Device (torch tensor) -> host, into the cpu pool when configured."""
    import torch

    pool = get_pool("cpu")
    if pool is None:
        return _Copy(value.detach().cpu().numpy(), None)
    dt = value.detach().cpu()[:0].numpy().dtype
    block, view = pool.empty(tuple(value.shape), dt)
    torch.from_numpy(view).copy_(value)
    return _Copy(view, block)


class Tensor:
    """An array with per-device copies, migrated on first use and dropped when the source changes.

    Args:
        data: An array-like (copied, as ``torch.tensor`` does), a torch tensor (its device becomes the
            source) or another Tensor (its current data).
        device: Where the source copy lives: 'cpu' (default), 'cuda:0', 'npu:0'. An absent device
            follows the ``device_fallback`` policy.

    Raises:
        BackendError: HYB-301 for a bad device name; HYB-307 for an absent device under 'error'.
    """

    def __init__(self, data: Any, device: str = "cpu") -> None:
        self._lock = threading.RLock()
        self._copies: dict[str, _Copy] = {}
        self._source = "cpu"
        self._version = 0
        self._set(data, device)

    # ------------------------------------------------------------------ writing
    def _set(self, data: Any, device: str) -> None:
        if isinstance(data, Tensor):
            data = data.numpy()
        if type(data).__module__.startswith("torch") and hasattr(data, "device"):
            native = str(data.device) if data.device.type != "cpu" else "cpu"
            if native != "cpu":
                self._shape, self._dtype = tuple(data.shape), data.detach().cpu()[:0].numpy().dtype
                self._copies = {native: _Copy(data.detach().clone(), None)}
                self._source = native
                return
            data = data.detach().numpy()
        arr = np.asarray(data)
        self._shape, self._dtype = arr.shape, arr.dtype
        target = _resolve(device)
        host = _host_copy(arr)
        self._copies = {"cpu": host}
        self._source = "cpu"
        if target != "cpu":
            self._copies[target] = _to_device(host.value, target)
            record_transfer("cpu", target, host.value.nbytes)
            self._source = target

    def update(self, data: Any, device: str | None = None) -> None:
        """Replace the content (same or new shape); every other device's copy becomes stale and is dropped."""
        with self._lock:
            self._set(data, device or self._source)
            self._version += 1

    def __setitem__(self, index: Any, value: Any) -> None:
        """Write into the host copy (fetching it first); copies elsewhere are dropped."""
        with self._lock:
            host = self._copy_on("cpu")  # always memory this tensor made, never the caller's array
            host.value[index] = value
            self._copies = {"cpu": host}
            self._source = "cpu"
            self._version += 1

    # ------------------------------------------------------------------ reading
    def _copy_on(self, device: str) -> _Copy:
        copy = self._copies.get(device)
        if copy is not None:
            return copy
        nbytes = self.nbytes
        if device == "cpu":
            copy = _to_host(self._copies[self._source].value)
            record_transfer(self._source, "cpu", nbytes)
        else:
            host = self._copy_on("cpu")
            copy = _to_device(host.value, device)
            record_transfer("cpu", device, nbytes)
        self._copies[device] = copy
        return copy

    def data(self, device: str = "cpu") -> Any:
        """The data on ``device``: a read-only numpy array on the host, a torch tensor elsewhere.

        The first call for a device copies the data there; later calls reuse that copy until the
        tensor changes. An absent device follows the ``device_fallback`` policy (warn: the host copy).
        """
        target = _resolve(device)
        with self._lock:
            copy = self._copy_on(target)
        if target == "cpu":
            return np.asarray(_View(copy))
        return copy.value

    def to(self, device: str) -> Tensor:
        """Make the data resident on ``device`` now (instead of on first use); returns self."""
        self.data(device)
        return self

    def numpy(self) -> np.ndarray:
        """The host data as a read-only numpy array (valid even after the tensor is gone)."""
        return self.data("cpu")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def release(self) -> None:
        """Drop every copy except the source now; pool blocks return once no view uses them."""
        with self._lock:
            self._copies = {self._source: self._copies[self._source]}

    # ------------------------------------------------------------------ facts
    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape."""
        return tuple(self._shape)

    @property
    def dtype(self) -> np.dtype:
        """The tensor's numpy dtype."""
        return self._dtype

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data in bytes."""
        return int(np.prod(self._shape, dtype=np.int64)) * self._dtype.itemsize

    @property
    def device(self) -> str:
        """The device that holds the newest data (the source of every other copy)."""
        return self._source

    @property
    def resident(self) -> tuple[str, ...]:
        """The devices holding a current copy."""
        with self._lock:
            return tuple(self._copies)

    @property
    def version(self) -> int:
        """Incremented on every write; copies are current for the version they were made at."""
        return self._version

    def __len__(self) -> int:
        return self._shape[0]

    def __repr__(self) -> str:
        return (f"hybrid.Tensor(shape={self.shape}, dtype={self.dtype}, device={self._source!r}, "
                f"resident={list(self.resident)})")
