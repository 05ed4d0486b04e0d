"""Triton's system shared memory extension: tensors passed through POSIX shared memory instead of the body.

A client on the same machine creates a shared memory object (``shm_open``; tritonclient's
``tritonclient.utils.shared_memory.create_shared_memory_region``), registers a region of it with the server
under a name (its key, an offset into it and a byte size), then names that region in an inference request:

- an input with ``parameters`` ``shared_memory_region``, ``shared_memory_byte_size`` and optionally
  ``shared_memory_offset`` (into the region) carries no data: the server copies it out of the region as the
  request is decoded (one memory copy; nothing later reads the client's object);
- an output with the same parameters is written into the region, and its entry in the answer has no data.

:class:`SharedMemoryRegions` holds the regions of one server (HTTP and gRPC register into the same one).
Each region maps the object's first ``offset + byte_size`` bytes, shared and writable, once, at register.
Unregistering drops the mapping. Every read and write first checks that the object still holds the region: a
client may truncate its object, and touching pages past its end would kill the server (SIGBUS). That is why a
read returns a copy rather than a view for the model's run: only that copy and the output's write, microseconds
each, touch the client's pages, each right after that check, and no view of a mapping outlives the call.

The keys are shared memory object names (``/name``, as ``shm_open`` takes them): on Linux the files of
``/dev/shm``. Errors:

- HYB-711 (400, gRPC INVALID_ARGUMENT): a register request that is malformed, an object that cannot be
  opened or is smaller than the region, a tensor past the end of its region, an output region too small;
- HYB-712 (404, NOT_FOUND): a region that is not registered;
- HYB-713 (400, gRPC ALREADY_EXISTS): a name already registered.

As in Triton, any client that may call the server may register any object the server's user can open;
serve with ``--auth-token`` where the port is reachable by others.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybrid.errors import ServingError

__all__ = ["BYTE_SIZE", "OFFSET", "REGION", "SHM_ROOT", "Region", "SharedMemoryRegions", "Span", "regions_for",
           "span_of"]

SHM_ROOT = Path("/dev/shm")
"""Where ``shm_open`` keeps its objects (Linux, glibc and musl)."""

_REGISTER_HINT = ("create the object first (tritonclient.utils.shared_memory.create_shared_memory_region), then "
                  "register its key with an offset and a byte size that lie inside it")


def _error(message: str, hint: str | None = _REGISTER_HINT) -> ServingError:
    return ServingError("HYB-711", message, hint)


REGION, BYTE_SIZE, OFFSET = "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"
"""The parameters that put a tensor of a request in a registered region (gRPC and HTTP alike)."""


@dataclass(frozen=True, slots=True)
class Span:
    """Where one tensor of a request lies: ``byte_size`` bytes at ``offset`` into the registered region ``region``."""

    region: str
    offset: int
    byte_size: int


def span_of(tensor: str, region: Any, byte_size: Any, offset: Any) -> Span:
    """The span a tensor's parameters give (values as the transport decoded them; None where absent).

    A missing byte size is 0 (the tensor's size check then names what it needs, as Triton's does).

    Raises:
        ServingError: HYB-702 for a region that is not a string, or a size or offset that is not a
            non-negative integer.
    """
    if not isinstance(region, str) or not region:
        raise ServingError("HYB-702", f"{tensor}: '{REGION}' must be the name of a registered region, got "
                                      f"{region!r}")
    for what, value in ((BYTE_SIZE, byte_size), (OFFSET, offset)):
        if value is not None and (type(value) is not int or value < 0):
            raise ServingError("HYB-702", f"{tensor}: '{what}' must be a non-negative integer, got {value!r}")
    return Span(region, offset or 0, byte_size or 0)


@dataclass(frozen=True, slots=True)
class Region:
    """A registered region: its name, the object's key, where it starts in the object and its size in bytes."""

    name: str
    key: str
    offset: int
    byte_size: int

    def as_dict(self) -> dict[str, Any]:
        """The region as Triton's status lists it: name, key, offset, byte_size."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class _Mapped:
    __slots__ = ("map", "region")

    def __init__(self, region: Region, mapped: mmap.mmap) -> None:
        self.region = region
        self.map = mapped

    def close(self) -> None:
        self.map.close()  # nothing holds a view of it: reads copy (SharedMemoryRegions.read)


def _count(what: str, value: Any) -> int:
    if type(value) is not int or value < 0:
        raise _error(f"the register request's '{what}' must be a non-negative integer, got {value!r}")
    return value


def _default_limit() -> int:
    """A quarter of the process's file descriptor limit (each mapping holds one), at least 16; 1024 without one."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1024
    return 1024 if soft == resource.RLIM_INFINITY else max(16, soft // 4)


class SharedMemoryRegions:
    """The system shared memory regions of one server; thread-safe.

    Args:
        root: The folder of the shared memory objects (``/dev/shm``; another one in tests).
        max_regions: Most regions registered at once. Each mapping holds a file descriptor, so the default is
            a quarter of the process's descriptor limit: the rest stays for connections and models.
    """

    def __init__(self, root: Path = SHM_ROOT, max_regions: int | None = None) -> None:
        self._root = root
        self._regions: dict[str, _Mapped] = {}
        self._lock = threading.Lock()
        self.max_regions = _default_limit() if max_regions is None else max_regions

    def _path(self, key: str) -> Path:
        name = key.lstrip("/")
        if not name or "/" in name or name in (".", "..") or "\0" in name:
            raise _error(f"shared memory key {key!r} is not the name of a shared memory object",
                         "use the key the object was created with: '/name', one '/' and no other")
        if not self._root.is_dir():
            raise _error(f"this machine has no {self._root}: system shared memory needs a POSIX shared memory "
                         "file system (Linux)", "send the tensors in the request instead")
        return self._root / name

    def register(self, name: Any, key: Any, offset: Any = 0, byte_size: Any = None) -> Region:
        """Map ``byte_size`` bytes of the object ``key`` from ``offset`` under ``name``.

        Raises:
            ServingError: HYB-713 for a name already registered; HYB-711 for a malformed request or an
                object that cannot be opened or is smaller than ``offset + byte_size``.
        """
        if not isinstance(name, str) or not name:
            raise _error(f"a shared memory region needs a name, got {name!r}")
        if not isinstance(key, str):
            raise _error(f"the register request for region {name!r} has no 'key' string (got {key!r})")
        offset, byte_size = _count("offset", offset), _count("byte_size", byte_size)
        if not byte_size:
            raise _error(f"region {name!r}: byte_size must be positive")
        path = self._path(key)
        with self._lock:
            if name in self._regions:
                raise ServingError("HYB-713", f"shared memory region {name!r} is already registered",
                                   "unregister it first, or register under another name")
            if len(self._regions) >= self.max_regions:
                raise _error(f"{len(self._regions)} shared memory regions are registered, the most this server "
                             f"holds at once (a quarter of its file descriptor limit)",
                             "unregister the regions no longer used, or raise the server's `ulimit -n`")
            try:
                fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
            except OSError as e:
                raise _error(f"cannot open the shared memory object {key!r} for region {name!r}: "
                             f"{e.strerror}") from e
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise _error(f"{key!r} is not a shared memory object")
                if offset + byte_size > info.st_size:
                    raise _error(f"region {name!r} ({byte_size} bytes at offset {offset}) runs past the end of "
                                 f"{key!r}, which has {info.st_size} bytes")
                try:
                    mapped = mmap.mmap(fd, offset + byte_size, flags=mmap.MAP_SHARED,
                                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
                except (OSError, ValueError, OverflowError) as e:  # no address space or memory for the map
                    raise _error(f"cannot map region {name!r} ({offset + byte_size} bytes of {key!r}): {e}") from e
            finally:
                os.close(fd)
            region = Region(name, key, offset, byte_size)
            self._regions[name] = _Mapped(region, mapped)
        return region

    def unregister(self, name: str | None = None) -> None:
        """Drop the region ``name`` (nothing if it is not registered, as in Triton), or every one for None."""
        with self._lock:
            names = list(self._regions) if name is None else [name] if name in self._regions else []
            dropped = [self._regions.pop(n) for n in names]
        for mapped in dropped:
            mapped.close()

    def status(self, name: str | None = None) -> list[Region]:
        """The region ``name``, or every one for None (sorted by name).

        Raises:
            ServingError: HYB-712 when ``name`` is not registered.
        """
        with self._lock:
            if name is None:
                return [self._regions[n].region for n in sorted(self._regions)]
            return [self._get(name).region]

    def _get(self, name: str) -> _Mapped:
        mapped = self._regions.get(name)
        if mapped is None:
            raise ServingError("HYB-712", f"no shared memory region {name!r} is registered",
                               "register it first (POST /v2/systemsharedmemory/region/NAME/register, or "
                               "register_system_shared_memory in tritonclient)")
        return mapped

    def _span(self, name: str, offset: int, byte_size: int, tensor: str) -> tuple[_Mapped, int]:
        mapped = self._get(name)
        region = mapped.region
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise _error(f"{tensor}: {byte_size} bytes at offset {offset} run past the end of shared memory "
                         f"region {name!r} ({region.byte_size} bytes)", "check shared_memory_offset and "
                         "shared_memory_byte_size against the region")
        # pages past the end of an object that shrank since it was registered would kill the process (SIGBUS)
        size = mapped.map.size()  # the object's size now (fstat)
        if size < region.offset + region.byte_size:
            raise _error(f"{tensor}: the object {region.key!r} of region {name!r} shrank to {size} bytes since it "
                         f"was registered with {region.offset + region.byte_size}", "register the region again")
        return mapped, region.offset + offset

    def check(self, span: Span, tensor: str = "a tensor") -> None:
        """Check that ``span`` lies inside a registered region (an output's, before the model runs).

        Raises:
            ServingError: HYB-712 for an unknown region; HYB-711 for a span past its end.
        """
        with self._lock:
            self._span(span.region, span.offset, span.byte_size, tensor)

    def read(self, name: str, offset: int, byte_size: int, tensor: str = "a tensor") -> bytes:
        """A copy of the ``byte_size`` bytes at ``offset`` into region ``name`` (see the module: no views).

        Raises:
            ServingError: HYB-712 for an unknown region; HYB-711 for a span past its end.
        """
        with self._lock:
            mapped, start = self._span(name, offset, byte_size, tensor)
            return mapped.map[start:start + byte_size]

    def write(self, name: str, offset: int, byte_size: int, data: bytes, tensor: str = "an output") -> None:
        """Write ``data`` at ``offset`` into region ``name``, where the request gave it ``byte_size`` bytes.

        Raises:
            ServingError: HYB-712 for an unknown region; HYB-711 for a span past its end or data larger
                than ``byte_size``.
        """
        if len(data) > byte_size:
            raise _error(f"{tensor} needs {len(data)} bytes; its shared_memory_byte_size is {byte_size}",
                         "give the output a region (and shared_memory_byte_size) that can hold it")
        with self._lock:
            mapped, start = self._span(name, offset, byte_size, tensor)
            mapped.map[start:start + len(data)] = data

    def close(self) -> None:
        """Drop every region (the server stops)."""
        self.unregister(None)


def regions_for(regions: SharedMemoryRegions | None, tensor: str) -> SharedMemoryRegions:
    """The server's regions, for a tensor of a request that names one.

    Raises:
        ServingError: HYB-702 where the server takes no shared memory (``regions`` is None).
    """
    if regions is None:
        raise ServingError("HYB-702", f"{tensor} names a shared memory region, but this server takes no shared "
                                      "memory tensors", "send the tensor in the request")
    return regions
