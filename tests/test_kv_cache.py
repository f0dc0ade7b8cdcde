"""The paged caches' block ownership: each slot's ring is its own whole range of blocks (which the CPU attention
reads in place), zeroed on the CPU when a stream is admitted, and the pool's accounting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from realtime.engine.kv_cache import BlockPool, CacheSpec, PagedKVCache


def make_cache(max_streams: int = 3, scratch: int = 0) -> PagedKVCache:
    spec = CacheSpec(num_layers=2, kv_heads=1, head_dim=4, block_size=4, window=10, max_q_len=3)
    return PagedKVCache(spec, num_blocks=max_streams * spec.blocks_per_stream(None) + scratch, max_streams=max_streams,
                        max_positions=None, device=torch.device("cpu"), dtype=torch.float32)


def test_each_slot_owns_its_aligned_ring_whatever_the_admission_order() -> None:
    cache = make_cache()
    w = cache.width
    for slot in (2, 0, 1):
        cache.admit(slot)
        assert cache.tables_host[slot].tolist() == list(range(slot * w, (slot + 1) * w))
        assert cache.tables[slot].tolist() == list(range(slot * w, (slot + 1) * w))
    assert cache.pool.free == 0 and not cache.can_admit()
    cache.release(0)
    assert cache.pool.free == w and cache.can_admit()
    with pytest.raises(MemoryError, match="not all free"):
        cache.admit(1)  # still admitted: its blocks are taken
    cache.admit(0)
    assert cache.tables_host[0].tolist() == list(range(w))


def test_a_ring_is_zeroed_when_a_stream_is_admitted_on_the_cpu() -> None:
    """What an earlier stream left (even NaN) is gone before the next stream of the slot reads its ring in place;
    other rings are untouched."""
    cache = make_cache()
    assert cache.rings_finite
    w = cache.width
    cache.admit(0)
    cache.admit(1)
    for pages in (*cache.k, *cache.v):
        pages[:2 * w] = float("nan")
    cache.release(0)
    cache.admit(0)
    for pages in (*cache.k, *cache.v):
        assert (pages[:w] == 0).all()
        assert pages[w:2 * w].isnan().all()


def test_scratch_blocks_come_after_every_ring() -> None:
    """A draft tree's scratch takes the highest free blocks: never a block of a slot's ring, before or after
    admissions."""
    cache = make_cache(scratch=5)
    rings = 3 * cache.width
    cache.admit(1)
    scratch = cache.pool.take(5)
    assert sorted(scratch) == list(range(rings, rings + 5))
    for slot in (0, 2):
        cache.admit(slot)
    assert cache.pool.free == 0


def test_block_pool_accounting_and_errors() -> None:
    pool = BlockPool(10)
    assert pool.take(0) == [] and pool.free == 10
    assert pool.take(3) == [7, 8, 9]
    assert pool.take_exact(2, 3) == [2, 3, 4]
    with pytest.raises(MemoryError):
        pool.take_exact(4, 2)
    with pytest.raises(MemoryError):
        pool.take_exact(8, 4)  # past the end
    with pytest.raises(MemoryError):
        pool.take(5)
    assert pool.free == 4 and sorted(pool.take(4)) == [0, 1, 5, 6]
    pool.give_back([2, 3])
    with pytest.raises(ValueError, match="twice"):
        pool.give_back([3])
    with pytest.raises(ValueError, match="twice"):
        pool.give_back([4, 4])
    assert pool.free == 2 and np.array_equal(sorted(pool.take(2)), [2, 3])
