"""Memory for joined batches, used again from one batch to the next.

A batch of requests runs as one call on their inputs joined along the batch axis. A fresh array per batch costs more
than the copy into it: the allocator hands a large block back to the system when it is freed, and every page of the
next one faults in again (on a batch of eight 96x96 images, the faults and unmaps took as long as the copy itself,
``perf`` in benchmarks/history/RESULTS-to-2026-12-07.md).
:class:`BatchBuffers` keeps the blocks of the batches that have ended and joins
the next batches into them.

A block is taken back only when no output of its run shares memory with it (a backend may answer with its input,
as an Identity graph does): an answer never changes under its reader. Used from one thread, the event loop's, where
batches are joined and split.

The memory kept is bounded: at most ``keep`` free blocks per dtype and inner shape, each as large as the largest
batch joined so far; it stays with the model until the model is unloaded (as a pool of buffers does in Triton).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["BatchBuffers"]

_Key = tuple[str, tuple[int, ...]]  # dtype, shape after the batch axis


class BatchBuffers:
    """Blocks to join batches into, kept from the batches that ended.

    Args:
        keep: Free blocks kept per dtype and inner shape. Batches in flight at once (one per runner, one more
            joined ahead of them) take one each; past ``keep`` a block ended is left to the allocator.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._free: dict[_Key, list[np.ndarray]] = {}
        self._rows: dict[_Key, int] = {}  # the most rows joined so far: a new block holds that many
        self._lent: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id of a joined array -> it and its block

    def join(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """``parts`` (same dtype and inner shape) joined along their first axis, in a kept block or a new one."""
        first = parts[0]
        key = (first.dtype.str, first.shape[1:])
        rows = sum(len(p) for p in parts)
        block = None
        free = self._free.get(key)
        if free:
            for i, candidate in enumerate(free):
                if len(candidate) >= rows:
                    block = free.pop(i)
                    break
        if block is None:
            self._rows[key] = size = max(rows, self._rows.get(key, 0))
            block = np.empty((size, *first.shape[1:]), first.dtype)
        joined = block[:rows]
        np.concatenate(parts, axis=0, out=joined)
        self._lent[id(joined)] = (joined, block)
        return joined

    def give_back(self, joined: Iterable[Any], outputs: Iterable[Any]) -> None:
        """The arrays :meth:`join` returned for a batch that has ended, with what its run answered.

        Arrays that :meth:`join` did not return are passed over. A block that shares memory with an output stays
        with that output.
        """
        answers = [o for o in outputs if isinstance(o, np.ndarray)]
        for array in joined:
            lent = self._lent.get(id(array))
            if lent is None or lent[0] is not array:
                continue
            del self._lent[id(array)]
            block = lent[1]
            if any(np.may_share_memory(block, o) for o in answers):
                continue
            free = self._free.setdefault((block.dtype.str, block.shape[1:]), [])
            if len(free) < self.keep:
                free.append(block)
