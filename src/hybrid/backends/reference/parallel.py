"""Intra-op threads: hybrid splits the heavy kernels itself, over single-threaded BLAS calls.

OpenBLAS's own threads wait for each other at every GEMM; on a machine whose cores are also busy
with other work a waiting thread loses whole time slices, and a 1 ms GEMM can take 20 ms. Here a
kernel hands :func:`for_blocks` a function over a range (output channels, input channels) and the
calling thread and the workers take blocks from a shared counter until none is left: a worker that
lost its core holds up at most one block, a worker that has not started by the time the calling
thread ran out of blocks is cancelled, and the work degrades to one-thread speed instead of
stalling. numpy releases the GIL in BLAS calls and in ufunc loops, so blocks run in parallel.

The executable sets the thread count for the duration of a run, per calling thread, so two models
running at once in different threads do not disturb each other.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["for_blocks", "set_threads", "threads"]

_local = threading.local()
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()

# below this much work (multiply-adds, or elements moved) a hand-off to another thread (~20 µs) loses
_MIN_WORK = 1_000_000
_BLOCKS_PER_THREAD = 4


def set_threads(n: int) -> int:
    """Set the calling thread's intra-op thread count; return the previous one."""
    previous = getattr(_local, "threads", 1)
    _local.threads = n
    return previous


def threads() -> int:
    """The calling thread's intra-op thread count (1 outside a run)."""
    return getattr(_local, "threads", 1)


def _pool(workers: int) -> ThreadPoolExecutor:
    with _pools_lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="hybrid-reference")
        return pool


def for_blocks(total: int, fn: Callable[[int, int], None], work: float, align: int = 1) -> None:
    """Call ``fn(lo, hi)`` for blocks covering ``range(total)``, spread over the intra-op threads.

    Args:
        total: Size of the range (rows, channels).
        fn: Computes one block; blocks must be independent.
        work: Rough cost of the whole range; small jobs run on the calling thread alone.
        align: Block boundaries fall on multiples of this (GEMM row tiles).
    """
    n = getattr(_local, "threads", 1)
    if n <= 1 or work < _MIN_WORK or total < 2 * align:
        fn(0, total)
        return
    count = max(2, min(n * _BLOCKS_PER_THREAD, total // align))
    cuts = sorted({min(total, round(total * i / count / align) * align) for i in range(count)} | {total})
    blocks = list(itertools.pairwise(cuts))
    counter = itertools.count()  # next() on it is atomic under the GIL

    def drain() -> None:
        while (i := next(counter)) < len(blocks):
            fn(*blocks[i])

    futures = [_pool(n - 1).submit(drain) for _ in range(n - 1)]
    try:
        drain()
    finally:
        # a worker that has not started yet would find nothing left: do not wait for it to be scheduled
        for f in futures:
            if not f.cancel():
                f.result()
