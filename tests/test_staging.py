"""Staging of step metadata: the ring of host buffers and the fence that says when one is free.

A staging buffer rewritten while its non-blocking copy is still queued would send the next step's
metadata to the previous step's graphs. The CPU copies synchronously, so these tests use a fence
that behaves as on CUDA and records its waits; the GPU test uploads on the device for real."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from realtime.engine.staging import CopyFence, Field, StagingRing, StepMetadata, TokenCopy


class RecordingFence(CopyFence):
    """A fence that treats copies as asynchronous (as on CUDA) and counts the waits it makes."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.asynchronous = True
        self.waits = 0

    def wait(self) -> None:  # what waiting does to the state: every earlier copy is done
        self.waits += 1
        self.done = self.issued


def test_a_set_copied_since_the_last_wait_is_not_reused_without_waiting():
    fence = RecordingFence()
    ring = StagingRing(fence, depth=2)
    a = ring.acquire()
    ring.mark_copied(a)
    b = ring.acquire()
    ring.mark_copied(b)
    assert a != b and fence.waits == 0  # two uploads between waits: both free
    c = ring.acquire()  # the ring comes back to a set whose copy may still be queued
    assert c == a and fence.waits == 1
    ring.mark_copied(c)
    fence.passed()  # the engine waited for the device (its tokens came to the host)
    for _ in range(2):
        ring.mark_copied(ring.acquire())
    assert fence.waits == 1


def test_a_wait_for_the_tokens_frees_only_the_copies_queued_before_them():
    """The engine waits for its step's token copy (an event behind it), not for the whole stream:
    staging copies queued before the tokens are done then, the next step's encoder metadata queued
    after them may not be."""
    fence = RecordingFence()
    ring = StagingRing(fence, depth=2)
    a = ring.acquire()
    ring.mark_copied(a)  # this step's metadata
    upto = fence.mark()  # the tokens' copy is queued here
    b = ring.acquire()
    ring.mark_copied(b)  # the next step's audio, queued after the tokens
    fence.passed(upto)
    assert ring.acquire() == a and fence.waits == 0  # copied before the tokens: free
    ring.mark_copied(a)
    assert ring.acquire() == b and fence.waits == 1  # copied after them: the fence had to wait


def test_token_copy_returns_the_steps_ids_and_grows():
    copy = TokenCopy(2, torch.device("cpu"))
    copy.start(torch.tensor([5, 6]))
    assert copy.wait() == [5, 6]
    copy.start(torch.arange(7))  # more than it was sized for
    assert copy.wait() == list(range(7))


def test_a_set_acquired_but_never_copied_out_of_needs_no_wait():
    fence = RecordingFence()
    ring = StagingRing(fence, depth=2)
    for _ in range(5):
        ring.acquire()
    assert fence.waits == 0


def test_step_metadata_alternates_its_staging_and_resets_every_begin():
    fence = RecordingFence()
    meta = StepMetadata({"pos": Field((4,), torch.int32, -1), "slots": Field((2, 3), torch.int64, 7)},
                        torch.device("cpu"), fence)
    fence.passed()  # the constructor's upload (of the padding) is done
    h1 = meta.begin()
    h1["pos"][:2] = [5, 6]
    h1["slots"][0] = [1, 2, 3]
    meta.upload()
    assert meta.dev["pos"].tolist() == [5, 6, -1, -1]
    assert meta.dev["slots"].tolist() == [[1, 2, 3], [7, 7, 7]]
    h2 = meta.begin()
    # the next step writes another staging set: the first one's numbers (maybe still copying) stay
    assert not np.shares_memory(h1["pos"], h2["pos"])
    assert h1["pos"].tolist() == [5, 6, -1, -1] and h2["pos"].tolist() == [-1, -1, -1, -1]
    h2["pos"][0] = 9
    meta.upload()
    assert meta.dev["pos"].tolist() == [9, -1, -1, -1] and meta.dev["slots"].tolist() == [[7, 7, 7]] * 2
    fence.passed()
    meta.begin()
    meta.upload()
    meta.begin()
    assert fence.waits == 0
    meta.upload()
    meta.begin()  # a third upload since the last wait comes back to a set still maybe copying
    assert fence.waits == 1


def test_the_plain_fence_never_waits_on_the_cpu():
    fence = CopyFence(torch.device("cpu"))
    ring = StagingRing(fence, depth=1)
    for _ in range(3):
        ring.mark_copied(ring.acquire())
    assert fence.done == 0


def test_token_copy_returns_each_steps_ids_whatever_their_count():
    """A step of another size than the one before, or with more ids than the buffer holds, returns exactly its
    own ids."""
    copy = TokenCopy(4, torch.device("cpu"))
    for n in (3, 3, 1, 4, 9, 2, 9):
        ids = torch.arange(100 + n, 100 + 2 * n)
        copy.start(ids)
        assert copy.wait() == ids.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_uploads_behind_a_busy_device_arrive_intact():
    """Many uploads queued behind slow device work, with and without the engine's waits: every
    graph-read buffer gets exactly its step's numbers (a reused staging set would show up here)."""
    dev = torch.device("cuda")
    fence = CopyFence(dev)
    meta = StepMetadata({"x": Field((1024,), torch.int64, -1)}, dev, fence)
    big = torch.randn(4096, 4096, device=dev)
    seen = []
    for step in range(12):
        for _ in range(3):
            big = big @ big / 64.0  # keep the stream busy so copies queue behind it
        h = meta.begin()
        h["x"][:] = step
        meta.upload()
        seen.append(meta.dev["x"].clone())
        if step % 3 == 2:
            torch.cuda.synchronize()
            fence.passed()
    torch.cuda.synchronize()
    assert [int(s.min()) for s in seen] == list(range(12)) and [int(s.max()) for s in seen] == list(range(12))


def test_host_slot_lookup_equals_the_block_table_arithmetic():
    """The per-slot lookup table gives what the ring's block table says, through wraps of the ring,
    and forgets a released slot (its blocks may go to another stream)."""
    from realtime.engine.kv_cache import CacheSpec, PagedKVCache

    spec = CacheSpec(num_layers=1, kv_heads=1, head_dim=4, block_size=4, window=10, max_q_len=3)
    cache = PagedKVCache(spec, num_blocks=3 * spec.blocks_per_stream(None), max_streams=3, max_positions=None,
                         device=torch.device("cpu"), dtype=torch.float32)
    for slot in (2, 0):
        cache.admit(slot)
    positions = np.arange(0, 5 * cache.width * spec.block_size + 3)
    for slot in (2, 0):
        blocks = cache.tables_host[slot].astype(np.int64)
        want = blocks[(positions // spec.block_size) % cache.width] * spec.block_size + positions % spec.block_size
        assert np.array_equal(cache.host_slots(slot, positions), want)
        dev = cache.slot_mapping(torch.full((len(positions),), slot), torch.from_numpy(positions))
        assert np.array_equal(dev.numpy(), want)
    # many streams at once: row i for the stream in slots[i], the same numbers as one call per stream
    rows = np.stack([positions[:40], positions[7:47] * 3, positions[:40]])
    many = cache.host_slots_rows(np.array([2, 0, 0]), rows)
    assert many.dtype == np.int64
    assert np.array_equal(many, np.stack([cache.host_slots(2, rows[0]), cache.host_slots(0, rows[1]),
                                          cache.host_slots(0, rows[2])]))
    cache.release(2)
    with pytest.raises(KeyError):
        cache.host_slots(2, positions)
    cache.admit(1)  # its own ring (slot 1's blocks), whatever was released before
    blocks = cache.tables_host[1].astype(np.int64)
    assert np.array_equal(cache.host_slots(1, positions[:8]),
                          blocks[(positions[:8] // 4) % cache.width] * 4 + positions[:8] % 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_token_copy_takes_the_ids_before_later_work_changes_them():
    """The copy is queued in stream order: work queued after `start` (here: overwriting the ids behind a
    slow matrix product) cannot change what `wait` returns, and `wait` returns the step's ids."""
    dev = torch.device("cuda")
    big = torch.randn(4096, 4096, device=dev)
    ids = torch.zeros(64, dtype=torch.int64, device=dev)
    copy = TokenCopy(64, dev)
    for step in range(5):
        big = big @ big / 64.0  # the step's work, still running when the copy is queued
        ids.fill_(step)
        copy.start(ids)
        big = big @ big / 64.0  # later work ...
        ids.fill_(-1)  # ... that overwrites the ids
        assert copy.wait() == [step] * 64
    torch.cuda.synchronize()
