"""Intra-op threads for the big GEMMs: hybrid splits them itself, over single-threaded BLAS calls.

OpenBLAS's own threads wait for each other at every GEMM; on a machine whose cores are also busy
with other work a waiting thread loses whole time slices, and a 1 ms GEMM can take 20 ms. Splitting
a GEMM into row blocks that worker threads compute with single-threaded BLAS (numpy releases the
GIL) uses free cores when there are some and degrades to one-thread speed when there are none.

The executable sets the thread count for the duration of a run (per calling thread, so two models
running at once in different threads do not disturb each other); kernels call :func:`matmul` and
:func:`batched_matmul`.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["batched_matmul", "matmul", "set_threads"]

_local = threading.local()
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()

# below this many multiply-adds a GEMM is not worth a hand-off to another thread (~20 µs)
_MIN_MACS = 2_000_000


def set_threads(n: int) -> int:
    """Set the calling thread's intra-op thread count; return the previous one."""
    previous = getattr(_local, "threads", 1)
    _local.threads = n
    return previous


def _pool(n: int) -> ThreadPoolExecutor:
    with _pools_lock:
        pool = _pools.get(n)
        if pool is None:
            pool = _pools[n] = ThreadPoolExecutor(n - 1, thread_name_prefix="hybrid-ref")
        return pool


def _run_split(pieces: list[tuple]) -> None:
    pool = _pool(len(pieces))
    futures = [pool.submit(np.matmul, *p[:2], out=p[2]) for p in pieces[1:]]
    np.matmul(*pieces[0][:2], out=pieces[0][2])
    for f in futures:
        f.result()


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for 2-D operands, split into row blocks of ``a`` across the intra-op threads."""
    n = getattr(_local, "threads", 1)
    m = a.shape[0]
    if n <= 1 or m < 32 * n or m * a.shape[1] * b.shape[1] < _MIN_MACS:
        return a @ b
    out = np.empty((m, b.shape[1]), dtype=np.result_type(a, b))
    cuts = [round(m * i / n / 16) * 16 for i in range(n)] + [m]  # blocks of whole 16-row tiles
    _run_split([(a[lo:hi], b, out[lo:hi]) for lo, hi in itertools.pairwise(cuts) if hi > lo])
    return out


def batched_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul`` for 3-D operands with equal batch sizes, the batch split across the threads."""
    n = getattr(_local, "threads", 1)
    batch = a.shape[0]
    if n <= 1 or batch < n or batch * a.shape[1] * a.shape[2] * b.shape[2] < _MIN_MACS:
        return np.matmul(a, b)
    out = np.empty((batch, a.shape[1], b.shape[2]), dtype=np.result_type(a, b))
    cuts = [batch * i // n for i in range(n)] + [batch]
    _run_split([(a[lo:hi], b[lo:hi], out[lo:hi]) for lo, hi in itertools.pairwise(cuts) if hi > lo])
    return out
