"""The unified memory pool, hybrid.Tensor residency and hybrid.utils.memory_summary."""

from __future__ import annotations

import gc
import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests._models import check_light_outputs, light_with_logits

import hybrid
from hybrid.errors import BackendError, RunError
from hybrid.hal import memory
from hybrid.hal.arena import GRANULE, Arena

KIB = 1024


@pytest.fixture(autouse=True)
def _no_pools():
    memory.configure_pools({})
    yield
    memory.configure_pools({})


def cpu_pool(size: int = 64 * KIB) -> memory.MemoryPool:
    hybrid.init({"memory_pool": {"cpu": size}})
    pool = memory.get_pool("cpu")
    assert pool is not None
    return pool


# ------------------------------------------------------------------------------------------ allocator
ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 9000), st.sampled_from([1, 8, 64, 128, 256, 4096])),
    st.tuples(st.just("free"), st.integers(0, 10_000), st.just(0)),
), min_size=1, max_size=120)


@pytest.mark.timeout(120)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
def test_random_alloc_free_never_overlaps_or_corrupts(sequence):
    pool = memory.MemoryPool.on_host(64 * KIB)
    live: list[tuple[memory.Block, int]] = []
    fill = 0
    for op, arg, alignment in sequence:
        if op == "alloc":
            try:
                block = pool.alloc(arg, alignment)
            except RunError as e:
                assert e.code == "HYB-410" and str(arg) in e.message
                needed = -(-max(arg, 1) // GRANULE) * GRANULE
                if alignment <= GRANULE:  # without padding, failing means no free block was big enough
                    assert pool.stats().largest_free < needed
                continue
            assert block.offset % GRANULE == 0 and block.address % max(alignment, GRANULE) == 0
            fill = fill % 255 + 1
            block.array(np.uint8, arg)[:] = fill
            live.append((block, fill))
        elif live:
            block, _ = live.pop(arg % len(live))
            pool.free(block)
        pool.check()  # extents tile the arena, no overlap, free neighbours merged, table == allocator
        for block, value in live:  # no block was written by another's allocation
            assert np.all(block.array(np.uint8, block.nbytes) == value)
        stats = pool.stats()
        assert stats.allocated + stats.free == stats.reserved
        assert stats.live_blocks == len(live)
    for block, _ in live:
        pool.free(block)
    pool.check()
    stats = pool.stats()
    assert stats.allocated == 0 and stats.largest_free == stats.reserved and stats.fragmentation == 0.0
    assert stats.arena_allocations == 1


def test_best_fit_and_coalescing():
    arena = Arena(64 * KIB)
    a, gap1, b, gap2, c, gap3, d = (arena.alloc(n) for n in (1024, 1024, 1024, 512, 1024, 2048, 1024))
    for hole in (gap1, gap2, gap3):
        arena.free(hole.offset)
    got = arena.alloc(300)  # fits all three holes; best fit is the 512-byte one
    assert got.offset == gap2.offset
    assert arena.free_blocks == 4  # 1024 hole, 192 left of the 512 one, 2048 hole, the tail
    for ext in (got, a, b, c, d):
        arena.free(ext.offset)
    assert [(e.offset, e.size) for e in arena.free_extents()] == [(0, 64 * KIB)]
    with pytest.raises(KeyError):
        arena.free(a.offset)


def test_exhaustion_names_the_request_and_the_largest_free_block():
    pool = cpu_pool(64 * KIB)
    blocks = [pool.alloc(8 * KIB) for _ in range(8)]
    for b in blocks[::2]:
        pool.free(b)
    with pytest.raises(RunError) as info:
        pool.alloc(10 * KIB)
    assert info.value.code == "HYB-410"
    assert "10240 bytes" in info.value.message and "largest free block 8.0 KiB (8192 bytes)" in info.value.message
    assert pool.stats().failed_allocs == 1
    assert pool.stats().fragmentation == pytest.approx(0.75)


def test_bad_handles_and_sizes_are_hyb_416():
    pool = cpu_pool()
    other = memory.MemoryPool.on_host(4 * KIB)
    block = pool.alloc(100)
    with pytest.raises(RunError, match="HYB-416"):
        other.free(block)
    with pytest.raises(RunError, match="HYB-416"):
        block.array(np.float32, (100,))  # 400 bytes do not fit in 100
    pool.free(block)
    for bad in (lambda: pool.free(block), lambda: block.array(), lambda: pool.alloc(-1),
                lambda: pool.alloc(10, alignment=3), lambda: pool.free("nope")):
        with pytest.raises(RunError) as info:
            bad()
        assert info.value.code == "HYB-416"


def test_views_share_the_arena():
    pool = cpu_pool()
    block, arr = pool.empty((4, 8), np.float32)
    arr[:] = 3.0
    again = block.array(np.float32, (4, 8))
    assert again.ctypes.data == arr.ctypes.data == block.address
    assert np.all(again == 3.0) and again.dtype == np.float32
    assert pool._host.ctypes.data <= block.address < pool._host.ctypes.data + pool.capacity
    t = block.torch(np.float32, (4, 8))
    assert t.data_ptr() == block.address
    pool.free(block)


def test_no_new_arena_allocations_after_warm_up():
    pool = cpu_pool(4 << 20)
    shapes = [(1, 64, 56, 56), (1, 128, 28, 28), (1, 256, 14, 14), (1, 1000)]

    def inference() -> None:  # an interpreter's intermediates: allocate as produced, free after last use
        prev = None
        for shape in shapes:
            block, arr = pool.empty(shape, np.float32)
            arr.fill(1.0)
            if prev is not None:
                pool.free(prev)
            prev = block
        pool.free(prev)

    inference()
    before = memory.arena_allocations()
    allocs = pool.stats().allocs
    for _ in range(200):
        inference()
    assert memory.arena_allocations() == before
    assert pool.stats().arena_allocations == 1 and pool.stats().allocs == allocs + 200 * len(shapes)
    assert pool.stats().allocated == 0 and pool.stats().peak == 64 * 56 * 56 * 4 + 128 * 28 * 28 * 4  # two live at most


def test_configure_keeps_unchanged_pools_and_drops_removed_ones():
    hybrid.init({"memory_pool": {"cpu": "1MB"}})
    pool = memory.get_pool("cpu")
    assert pool.capacity == 1 << 20 and memory.get_pool("gpu") is None
    count = memory.arena_allocations()
    hybrid.init({"memory_pool": {"cpu": "1MB"}})
    assert memory.get_pool("cpu") is pool and memory.arena_allocations() == count
    hybrid.init({"memory_pool": {"cpu": "2MB"}})
    assert memory.get_pool("cpu") is not pool and memory.arena_allocations() == count + 1
    hybrid.init({"memory_pool": {}})
    assert memory.get_pool("cpu") is None and memory.pools() == {}


def test_absent_device_pool_follows_the_fallback_policy(caplog):
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        hybrid.init({"memory_pool": {"cpu": "1MB", "gpu": "4GB", "pinned": "1GB", "npu": "2GB"}})
    for kind in ("gpu", "pinned", "npu"):
        assert f"memory_pool.{kind}" in caplog.text
        assert memory.get_pool(kind) is None  # no fake arena
    assert memory.get_pool("cpu") is not None and set(memory.snapshot()) == {"cpu"}
    memory.configure_pools({})
    hybrid.init({"device_fallback": "error"})
    with pytest.raises(BackendError) as info:
        hybrid.init({"memory_pool": {"cpu": "1MB", "gpu": "1GB"}})
    assert info.value.code == "HYB-307"
    assert memory.get_pool("cpu") is None  # nothing was half-configured


# ------------------------------------------------------------------------------------------ summary
def test_memory_summary_reports_every_counter(capsys):
    pool = cpu_pool(64 * KIB)
    a, b = pool.alloc(16 * KIB), pool.alloc(8 * KIB)
    pool.free(a)
    text = hybrid.utils.memory_summary("cpu")
    assert capsys.readouterr().out.strip() == text
    for label in ("reserved", "allocated", "peak", "free", "largest free block", "fragmentation", "transfers",
                  "bytes moved", "arena allocations"):
        assert label in text
    assert "64.0 KiB" in text and "8.0 KiB in 1 blocks" in text and "24.0 KiB" in text  # reserved, live, peak
    pool.free(b)


def test_memory_summary_without_pool_and_for_absent_devices(capsys):
    text = hybrid.utils.memory_summary()
    assert "no pool configured" in text
    with pytest.raises(BackendError) as info:
        hybrid.utils.memory_summary("gpu")
    assert info.value.code == "HYB-303" and "present: cpu" in info.value.message
    with pytest.raises(BackendError, match="HYB-303"):
        hybrid.utils.memory_summary("tpu")


# ------------------------------------------------------------------------------------------ Tensor
def test_tensor_lives_in_the_pool_and_its_views_keep_it_alive():
    pool = cpu_pool(64 * KIB)
    src = np.arange(1000, dtype=np.float32)
    t = hybrid.Tensor(src)
    src[0] = -1  # the tensor holds its own copy
    view = t.numpy()
    assert view[0] == 0 and not view.flags.writeable
    assert pool._host.ctypes.data <= view.ctypes.data < pool._host.ctypes.data + pool.capacity
    assert t.resident == ("cpu",) and t.device == "cpu" and t.shape == (1000,) and t.nbytes == 4000
    del t
    gc.collect()
    assert pool.stats().live_blocks == 1  # the view still uses the block
    assert view.sum() == np.arange(1000, dtype=np.float32).sum()
    del view
    gc.collect()
    assert pool.stats().live_blocks == 0


def test_tensor_writes_go_through_the_tensor():
    t = hybrid.Tensor(np.zeros((2, 3), np.float32))
    before = t.version
    t[0, 1] = 5
    assert t.version == before + 1 and t.numpy()[0, 1] == 5
    t.update(np.ones(4, np.int64))
    assert t.shape == (4,) and t.dtype == np.int64 and t.version == before + 2
    assert np.asarray(t, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError):
        t.numpy()[0] = 3  # read-only: a silent write would leave device copies stale


def test_tensor_feeds_a_compiled_model(light):
    model, _ = light_with_logits("squeezenet")  # the logits too: its softmax alone is decided by rounding
    cm = hybrid.compile(model, "onnxruntime")
    x = light.light_input()
    got = cm(hybrid.Tensor(x))
    check_light_outputs("squeezenet", list(got))
    for a, b in zip(got, cm(x), strict=True):  # a Tensor feeds the same values as its array
        np.testing.assert_array_equal(a, b)


def test_tensor_on_an_absent_device_follows_the_fallback_policy(caplog):
    t = hybrid.Tensor(np.ones(3, np.float32))
    with caplog.at_level(logging.WARNING, logger="hybrid"):
        host = t.data("cuda:7")
    assert isinstance(host, np.ndarray) and t.resident == ("cpu",)
    assert memory.transfer_stats("cpu").transfers == 0
    hybrid.init({"device_fallback": "error"})
    with pytest.raises(BackendError, match="HYB-307"):
        t.to("npu")
    with pytest.raises(BackendError, match="HYB-301"):
        t.data("tpu")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs torch with a CUDA GPU")
def test_tensor_migrates_once_and_drops_stale_copies_on_gpu():
    hybrid.init({"memory_pool": {"cpu": "16MB", "pinned": "16MB", "gpu": "16MB"}})
    t = hybrid.Tensor(np.arange(1024, dtype=np.float32))
    moved = memory.transfer_stats("gpu").transfers_in
    first = t.data("cuda:0")
    again = t.data("cuda:0")
    assert first.data_ptr() == again.data_ptr() and memory.transfer_stats("gpu").transfers_in == moved + 1
    gpu_pool = memory.get_pool("gpu")
    assert gpu_pool.stats().live_blocks == 1 and set(t.resident) == {"cpu", "cuda:0"}
    t[0] = 42
    assert t.resident == ("cpu",)
    assert float(t.data("cuda:0")[0].item()) == 42.0
    assert memory.transfer_stats("gpu").transfers_in == moved + 2


# ------------------------------------------------------------------------------------------ Workspace
def _interpret(ws: memory.Workspace, x: np.ndarray) -> np.ndarray:
    """A tiny interpreter with the hook wired: adopt each result, release after last use, detach the output."""
    a = ws.adopt(x * 2.0)
    b = ws.adopt(np.tanh(a))
    ws.release(a)  # last use of a
    c = ws.adopt(b + 1.0)
    ws.release(b)
    out = ws.detach(c)
    ws.release_all()
    return out


def test_workspace_runs_intermediates_through_the_pool():
    pool = cpu_pool(1 << 20)
    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    expected = np.tanh(x * 2.0) + 1.0
    np.testing.assert_allclose(_interpret(memory.Workspace("cpu"), x), expected)
    before, allocs = memory.arena_allocations(), pool.stats().allocs
    for _ in range(50):
        out = _interpret(memory.Workspace("cpu"), x)
    np.testing.assert_allclose(out, expected)
    assert memory.arena_allocations() == before
    assert pool.stats().allocs == allocs + 150 and pool.stats().allocated == 0
    assert pool.stats().peak == 2 * 4096 * 4  # two intermediates alive at once, never more
    assert not (pool._host.ctypes.data <= out.ctypes.data < pool._host.ctypes.data + pool.capacity)


def test_workspace_without_a_pool_passes_arrays_through():
    ws = memory.Workspace("cpu")
    value = np.ones(3)
    assert ws.pool is None and ws.adopt(value) is value and ws.detach(value) is value
    ws.release(value)
    assert ws.empty((2,), np.int8).shape == (2,)


def test_workspace_exhaustion_and_release_all():
    pool = cpu_pool(16 * KIB)
    ws = memory.Workspace("cpu")
    ws.empty((2048,), np.float32)
    with pytest.raises(RunError) as info:
        ws.empty((4096,), np.float32)
    assert info.value.code == "HYB-410"
    ws.release_all()
    assert pool.stats().allocated == 0


@pytest.mark.timeout(120)
def test_reference_backend_takes_intermediates_from_the_pool_without_new_arenas(light):
    import hybrid
    from hybrid.hal import memory

    x = light.light_input()
    plain = hybrid.compile(light.light_model_path("resnet50"), target="reference")(x)
    hybrid.init({"memory_pool": {"cpu": "256MB"}})
    try:
        cm = hybrid.compile(light.light_model_path("resnet50"), target="reference")
        pool = memory.get_pool("cpu")
        y = cm(x)  # warm-up
        arenas, before = memory.arena_allocations(), pool.stats()
        for _ in range(2):
            y = cm(x)
        after = pool.stats()
        assert memory.arena_allocations() == arenas  # no new arena after warm-up
        per_run = before.allocs  # the warm-up run: one block per intermediate (fused ResNet-50: ~58 steps)
        assert per_run > 40 and after.allocs - before.allocs == 2 * per_run  # every intermediate, every run...
        assert after.allocated == 0 and after.live_blocks == 0  # ...and went back to it
        pool.check()
        np.testing.assert_array_equal(y, plain)
    finally:
        memory.configure_pools({})
