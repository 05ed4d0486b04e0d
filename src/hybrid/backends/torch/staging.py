"""Moving run inputs and outputs between numpy on the host and torch tensors on the device.

This is the one place the torch backend copies data across the host/device boundary. On CUDA,
inputs go through pinned host staging buffers (one per input and calling thread, kept while the
shape stays the same) and copy to the device asynchronously; the buffers are blocks of the unified
memory pool's 'pinned' arena when ``hybrid.init({'memory_pool': {'pinned': ...}})`` made one, and
plain pinned tensors otherwise. Every copy is counted with ``hybrid.hal.memory.record_transfer``.
On the CPU, ``torch.from_numpy`` shares the caller's memory and nothing is copied.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch

from hybrid.hal import memory

__all__ = ["Stager", "from_numpy", "to_numpy"]

# dtypes numpy lacks natively (ml_dtypes) travel as same-width integers and are viewed back
_VIEWS: dict[np.dtype, tuple[np.dtype, torch.dtype]] = {
    np.dtype(ml_dtypes.bfloat16): (np.dtype(np.int16), torch.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn): (np.dtype(np.uint8), torch.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e4m3fnuz): (np.dtype(np.uint8), torch.float8_e4m3fnuz),
    np.dtype(ml_dtypes.float8_e5m2): (np.dtype(np.uint8), torch.float8_e5m2),
    np.dtype(ml_dtypes.float8_e5m2fnuz): (np.dtype(np.uint8), torch.float8_e5m2fnuz),
}
_BACK: dict[torch.dtype, tuple[torch.dtype, np.dtype]] = {
    t: (torch.int16 if n.itemsize == 2 else torch.uint8, d) for d, (n, t) in _VIEWS.items()
}


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing ``array``'s memory where torch allows it (bfloat16 and float8 included)."""
    if not array.flags.writeable:
        # torch cannot wrap read-only memory without a warning per call; copy instead
        array = array.copy()
    view = _VIEWS.get(array.dtype)
    if view is not None:
        return torch.from_numpy(np.ascontiguousarray(array).view(view[0])).view(view[1])
    return torch.from_numpy(array)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A host numpy array of ``tensor`` (a copy when it lives on a device)."""
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    back = _BACK.get(tensor.dtype)
    if back is not None:
        return tensor.contiguous().view(back[0]).numpy().view(back[1])
    return tensor.numpy()


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Stager:
    """Inputs to the device and outputs back, for one executable.

    Args:
        device: The torch device the module runs on.
        pinned: Stage host->device copies through pinned buffers (CUDA only).
        protected: Storage addresses of the module's constants: an output that aliases one (an
            Identity of a weight) is copied, so that callers can never write into the model.
    """

    def __init__(self, device: torch.device, pinned: bool = True, protected: Sequence[int] = ()) -> None:
        self.device = device
        self.on_cpu = device.type == "cpu"
        self.pinned = pinned and device.type == "cuda"
        self.protected = frozenset(protected)
        self._name = str(device)
        self._local = threading.local()

    def inputs(self, values: Sequence[Any]) -> list[Any]:
        """Convert run inputs (numpy arrays, lists of them for sequences, None) to device tensors."""
        return [self._in(i, v) for i, v in enumerate(values)]

    def _in(self, index: int, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return [self._in(index, v) for v in value]
        if isinstance(value, torch.Tensor):
            return value.to(self.device)
        host = from_numpy(np.asarray(value))
        if self.on_cpu:
            return host
        nbytes = host.numel() * host.element_size()
        memory.record_transfer("cpu", self._name, nbytes)
        if self.pinned and nbytes:
            staged = self._staging(index, host)
            staged.copy_(host)
            return staged.to(self.device, non_blocking=True)
        return host.to(self.device)

    def _staging(self, index: int, host: torch.Tensor) -> torch.Tensor:
        """The pinned buffer for input ``index`` on this thread, (re)made when the shape changes."""
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = {}
        key = (tuple(host.shape), host.dtype)
        held = buffers.get(index)
        if held is not None and held[0] == key:
            return held[1]
        if held is not None and held[2] is not None:
            held[2].pool.free(held[2])
        nbytes = host.numel() * host.element_size()
        pool = memory.get_pool("pinned")
        block = pool.alloc(nbytes) if pool is not None else None
        if block is not None:
            staged = block.torch(np.uint8, nbytes).view(host.dtype).view(host.shape)
        else:
            staged = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
        buffers[index] = (key, staged, block)
        return staged

    def outputs(self, values: Sequence[Any], inputs: Sequence[Any]) -> list[Any]:
        """Convert module outputs to numpy, copying any that alias an input or a constant."""
        guard = self.protected
        if self.on_cpu:
            guard = guard | {_storage(t) for t in _tensors(inputs)}
        return [self._out(v, guard) for v in values]

    def _out(self, value: Any, guard: frozenset[int]) -> Any:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return [self._out(v, guard) for v in value]
        if not isinstance(value, torch.Tensor):
            return np.asarray(value)
        if value.device.type == "cpu":
            if _storage(value) in guard:
                value = value.clone()
            elif not value.is_contiguous():
                value = value.contiguous()
        else:
            memory.record_transfer(self._name, "cpu", value.numel() * value.element_size())
        return to_numpy(value)


def _tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors(v))
    return out
