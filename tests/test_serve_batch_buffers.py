"""Joined batches in memory used again (hybrid.serve.core.batch_buffers)."""

from __future__ import annotations

import numpy as np

from hybrid.serve.core.batch_buffers import BatchBuffers


def _parts(rows: list[int], seed: int = 0, inner: tuple[int, ...] = (3, 4)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random((n, *inner)).astype(np.float32) for n in rows]


def _unaligned(arr: np.ndarray) -> np.ndarray:
    """``arr``'s values in a view one byte into a buffer (not aligned for its dtype)."""
    raw = b"\x00" + arr.tobytes()
    out = np.frombuffer(raw, arr.dtype, arr.size, offset=1).reshape(arr.shape)
    assert not out.flags.aligned
    return out


def test_join_is_concatenate_into_aligned_memory():
    buffers = BatchBuffers()
    parts = [_unaligned(p) for p in _parts([1, 2, 1])]
    joined = buffers.join(parts)
    np.testing.assert_array_equal(joined, np.concatenate(parts))
    assert joined.flags.c_contiguous and joined.flags.aligned and joined.shape == (4, 3, 4)


def test_a_block_given_back_is_joined_into_again():
    buffers = BatchBuffers()
    first = buffers.join(_parts([2, 2]))
    buffers.give_back([first], [np.zeros((4, 5), np.float32)])
    second_parts = _parts([1, 2], seed=1)
    second = buffers.join(second_parts)
    assert np.shares_memory(first, second)  # the same block, fewer rows
    np.testing.assert_array_equal(second, np.concatenate(second_parts))


def test_a_block_an_output_shares_stays_with_the_output():
    buffers = BatchBuffers()
    joined = buffers.join(_parts([1, 1]))
    answer = joined[:, 0]  # a backend that answers with (a view of) its input
    kept = answer.copy()
    buffers.give_back([joined], [answer])
    later = buffers.join(_parts([1, 1], seed=2))
    assert not np.shares_memory(later, answer)
    np.testing.assert_array_equal(answer, kept)


def test_arrays_it_did_not_join_are_passed_over():
    buffers = BatchBuffers()
    own = _parts([2])[0]
    buffers.give_back([own], [])
    assert not np.shares_memory(buffers.join(_parts([1, 1])), own)


def test_a_larger_batch_gets_a_larger_block_and_smaller_ones_fit_in_it():
    buffers = BatchBuffers()
    small = buffers.join(_parts([1, 1]))
    buffers.give_back([small], [])
    large = buffers.join(_parts([3, 3]))
    assert not np.shares_memory(small, large) and large.shape[0] == 6
    buffers.give_back([large], [])
    again = buffers.join(_parts([2, 2]))
    assert np.shares_memory(again, large)


def test_other_dtypes_and_shapes_get_their_own_blocks():
    buffers = BatchBuffers()
    floats = buffers.join(_parts([1, 1]))
    buffers.give_back([floats], [])
    ints = buffers.join([np.ones((1, 3, 4), np.int32), np.zeros((1, 3, 4), np.int32)])
    wider = buffers.join(_parts([1, 1], inner=(3, 5)))
    assert ints.dtype == np.int32 and not np.shares_memory(ints, floats)
    assert wider.shape == (2, 3, 5) and not np.shares_memory(wider, floats)


def test_at_most_keep_blocks_are_kept():
    buffers = BatchBuffers(keep=2)
    joined = [buffers.join(_parts([1, 1], seed=i)) for i in range(4)]
    buffers.give_back(joined, [])
    again = [buffers.join(_parts([1, 1], seed=9)) for _ in range(4)]
    reused = sum(any(np.shares_memory(a, j) for j in joined) for a in again)
    assert reused == 2
