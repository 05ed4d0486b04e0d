"""Tensors and streams of the frameworks users call hybrid with (torch), seen from the runtime.

A user may pass torch tensors as inputs and run work on a CUDA stream; the runtime handles both through
these two functions, so it imports no framework itself (the HAL is the one layer that does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["DeviceStream", "device_stream", "host_array", "is_framework_tensor"]


def is_framework_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (on any device)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def host_array(value: Any) -> np.ndarray:
    """``value`` as a numpy array on the host, without copying when it already lives there.

    A torch tensor is detached (and copied from its device); anything else goes through ``numpy.asarray``.
    """
    if is_framework_tensor(value):
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
    return np.asarray(value)


class DeviceStream:
    """A torch CUDA stream.

    Work issued inside :meth:`issuing` is ordered on it, and ``record`` returns an event that waits for that work
    (written against torch's API; unverified on this project's CPU-only machines).
    """

    def __init__(self, torch: Any, device: str) -> None:
        self._torch = torch
        self._stream = torch.cuda.Stream(device=device)

    @contextlib.contextmanager
    def issuing(self) -> Iterator[None]:
        """Issue the torch kernels of the block on this stream."""
        with self._torch.cuda.stream(self._stream):
            yield

    def record(self) -> Any:
        """An event that completes when the work issued so far on this stream has (``event.synchronize()``)."""
        event = self._torch.cuda.Event()
        event.record(self._stream)
        return event

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """``fn(*args, **kwargs)`` issued on this stream, and the event that marks its end."""
        with self.issuing():
            value = fn(*args, **kwargs)
            return value, self.record()

    def synchronize(self) -> None:
        """Wait for everything issued on this stream."""
        self._stream.synchronize()


def device_stream(device: str) -> DeviceStream | None:
    """A :class:`DeviceStream` on a CUDA ``device`` when torch can reach it.

    None elsewhere (the caller's thread order is then the only order there is).
    """
    if not device.startswith("cuda"):
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return DeviceStream(torch, device)
