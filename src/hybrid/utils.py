"""``hybrid.utils``: small user-facing helpers that read the runtime's state."""

from __future__ import annotations

from hybrid.config import get_config
from hybrid.errors import BackendError
from hybrid.hal.memory import PoolScope, format_bytes, get_pool, pool_kind, pool_scope, transfer_stats
from hybrid.hal.registry import backend_class

__all__ = ["memory_summary"]


def _present(kind: str) -> tuple[bool, list[str]]:
    """Whether a device of this pool kind is present, and the names of those that are."""
    from hybrid.hal import devices

    devs = devices()
    names = [d.name for d in devs]
    has_cuda = any(d.kind == "cuda" for d in devs)
    if has_cuda:
        names.append("pinned")
    if "cpu" not in names:
        names.insert(0, "cpu")
    present = {"cpu": True, "pinned": has_cuda, "gpu": any(d.is_gpu for d in devs),
               "npu": any(d.kind == "npu" for d in devs)}[kind]
    return present, names


def memory_summary(device: str = "cpu") -> str:
    """Print and return the memory pool counters of one device.

    Lines: reserved, allocated (and live blocks), peak, free, largest free block, fragmentation
    (``1 - largest free / free``), transfers and bytes moved in and out of the device, and how many
    arenas were reserved from the OS or driver. Then the pool's scope: who draws from it (as each backend
    declares), and a line per backend that does not, saying how it allocates instead (its own allocators
    and the options that shape them, as configured): their memory is not in the counters above.

    Args:
        device: 'cpu', 'pinned', 'gpu' (or 'cuda', 'cuda:0'), 'npu'.

    Raises:
        BackendError: HYB-303 when the device is not present; the message lists those that are.
    """
    kind = pool_kind(device) if isinstance(device, str) else None
    present, names = _present(kind) if kind else (False, _present("cpu")[1])
    if not present:
        raise BackendError("HYB-303", f"memory_summary: device {device!r} is not present; present: "
                           f"{', '.join(names)}", "pass one of the present devices")
    pool = get_pool(kind)
    moved = transfer_stats(kind)
    lines = [f"hybrid memory pool: {kind}" + (f" ({pool.device})" if pool is not None else "")]
    if pool is None:
        lines.append(f"  no pool configured; hybrid.init({{'memory_pool': {{'{kind}': '1GB'}}}}) makes one")
        stats = None
    else:
        stats = pool.stats()
    rows = [
        ("reserved", format_bytes(stats.reserved) if stats else "0 B"),
        ("allocated", f"{format_bytes(stats.allocated)} in {stats.live_blocks} blocks" if stats else "0 B"),
        ("peak", format_bytes(stats.peak) if stats else "0 B"),
        ("free", format_bytes(stats.free) if stats else "0 B"),
        ("largest free block", format_bytes(stats.largest_free) if stats else "0 B"),
        ("fragmentation", f"{100 * stats.fragmentation:.1f} %" if stats else "0.0 %"),
        ("transfers", f"{moved.transfers} ({moved.transfers_in} in, {moved.transfers_out} out)"),
        ("bytes moved", f"{format_bytes(moved.bytes_moved)} ({format_bytes(moved.bytes_in)} in, "
                        f"{format_bytes(moved.bytes_out)} out)"),
        ("arena allocations", str(stats.arena_allocations if stats else 0)),
    ]
    lines += [f"  {name:<20}{value}" for name, value in rows]
    lines += _scope_lines(pool_scope(kind))
    text = "\n".join(lines)
    print(text)
    return text


def _scope_lines(scope: PoolScope) -> list[str]:
    """Who draws from the pool, then one line per backend that manages its own memory."""
    lines = [f"  {'drawn from by':<20}{', '.join(f'{who} ({use})' for who, use in scope.drawn)}"]
    configured = get_config().backends
    for name in scope.own:
        own = backend_class(name).own_memory(configured.get(name, {}))
        lines.append(f"  {name:<20}own memory, not this pool: {own}")
    return lines
