"""Offset bookkeeping for one memory arena: best-fit allocation with coalescing on free.

The :class:`Arena` knows nothing about memory itself; it hands out ``(offset, size)`` extents inside
``[0, capacity)``. :mod:`hybrid.hal.memory` puts a real buffer (a numpy array, a pinned or device
torch tensor) behind it. Keeping the two apart lets the allocator be tested exhaustively without
touching a device.

Free space is kept twice: by offset (to find the neighbours to merge with on free) and by
``(size, offset)`` (to find the smallest block that fits on alloc). Both are sorted lists searched
with :mod:`bisect`; an arena holds at most a few thousand blocks, where a list beats a tree.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

__all__ = ["GRANULE", "Arena", "Extent"]

GRANULE = 64  # every extent starts and ends on a cache-line boundary: no two blocks share a line


@dataclass(frozen=True, slots=True)
class Extent:
    """A contiguous byte range of an arena."""

    offset: int
    size: int

    @property
    def end(self) -> int:
        """One past the extent's last byte."""
        return self.offset + self.size


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class Arena:
    """Best-fit allocator over ``capacity`` bytes; not thread-safe (the pool holds the lock).

    Args:
        capacity: Bytes under management; rounded down to a multiple of :data:`GRANULE`.
        base: Address of offset 0 (a multiple of :data:`GRANULE`); alignment requests are met for
            ``base + offset``, the real address.
    """

    def __init__(self, capacity: int, base: int = 0) -> None:
        if base % GRANULE:
            raise ValueError(f"arena base address {base:#x} is not a multiple of {GRANULE}")
        self.base = base
        self.capacity = capacity - capacity % GRANULE
        self._free_by_offset: list[int] = []  # offsets of free extents, sorted
        self._free_size: dict[int, int] = {}  # free offset -> size
        self._free_by_size: list[tuple[int, int]] = []  # (size, offset), sorted
        self._used: dict[int, int] = {}  # allocated offset -> size
        self.used_bytes = 0
        if self.capacity:
            self._add_free(0, self.capacity)

    # ------------------------------------------------------------------ free-list primitives
    def _add_free(self, offset: int, size: int) -> None:
        bisect.insort(self._free_by_offset, offset)
        self._free_size[offset] = size
        bisect.insort(self._free_by_size, (size, offset))

    def _remove_free(self, offset: int) -> int:
        size = self._free_size.pop(offset)
        del self._free_by_offset[bisect.bisect_left(self._free_by_offset, offset)]
        del self._free_by_size[bisect.bisect_left(self._free_by_size, (size, offset))]
        return size

    # ------------------------------------------------------------------ public
    def alloc(self, nbytes: int, alignment: int = GRANULE) -> Extent | None:
        """Reserve ``nbytes`` (rounded up to the granule) where ``base + offset`` is a multiple of ``alignment``.

        Returns None when no free extent can hold it; the caller reports exhaustion.
        """
        size = _round_up(max(nbytes, 1), GRANULE)
        align = max(alignment, GRANULE)
        i = bisect.bisect_left(self._free_by_size, (size, -1))
        while i < len(self._free_by_size):
            free_size, offset = self._free_by_size[i]
            start = _round_up(self.base + offset, align) - self.base
            if start + size <= offset + free_size:
                break
            i += 1  # alignment padding made this one too small; the next larger may fit
        else:
            return None
        self._remove_free(offset)
        if start > offset:  # the padding in front stays free
            self._add_free(offset, start - offset)
        tail = offset + free_size - (start + size)
        if tail:
            self._add_free(start + size, tail)
        self._used[start] = size
        self.used_bytes += size
        return Extent(start, size)

    def free(self, offset: int) -> int:
        """Return the extent at ``offset`` to the free list, merged with free neighbours; return its size.

        Raises:
            KeyError: when no allocated extent starts at ``offset`` (double free, foreign offset).
        """
        size = self._used.pop(offset)
        self.used_bytes -= size
        start, end = offset, offset + size
        i = bisect.bisect_left(self._free_by_offset, offset)
        if i < len(self._free_by_offset) and self._free_by_offset[i] == end:
            end += self._remove_free(end)
        if i > 0:
            prev = self._free_by_offset[i - 1]
            if prev + self._free_size[prev] == start:
                self._remove_free(prev)
                start = prev
        self._add_free(start, end - start)
        return size

    def size_of(self, offset: int) -> int | None:
        """The size of the allocated extent at ``offset``, or None if none starts there."""
        return self._used.get(offset)

    # ------------------------------------------------------------------ inspection
    @property
    def free_bytes(self) -> int:
        """Bytes not in use."""
        return self.capacity - self.used_bytes

    @property
    def largest_free(self) -> int:
        """Size of the largest free extent."""
        return self._free_by_size[-1][0] if self._free_by_size else 0

    @property
    def free_blocks(self) -> int:
        """Number of free extents."""
        return len(self._free_by_size)

    @property
    def used_blocks(self) -> int:
        """Number of extents in use."""
        return len(self._used)

    def fragmentation(self) -> float:
        """``1 - largest_free / free``: 0 when all free space is one block, near 1 when it is scattered."""
        free = self.free_bytes
        return 0.0 if free == 0 else 1.0 - self.largest_free / free

    def free_extents(self) -> list[Extent]:
        """Free extents in offset order (for tests and diagnostics)."""
        return [Extent(o, self._free_size[o]) for o in self._free_by_offset]

    def used_extents(self) -> list[Extent]:
        """Allocated extents in offset order (for tests and diagnostics)."""
        return [Extent(o, self._used[o]) for o in sorted(self._used)]
