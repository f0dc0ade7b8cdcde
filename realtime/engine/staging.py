"""Step metadata for graph replays: many small index buffers filled with one host-to-device copy.

A speculative step needs ~20 index vectors (positions, slot mappings, cache rows, block tables...)
at fixed device addresses. Writing each with its own copy or computing it with small device ops
costs a kernel launch apiece, which at batch 1 is a visible share of the step. Here the buffers
are views into one flat device tensor per dtype; the host fills the matching views of a (pinned)
staging tensor with numpy, starting from a template that holds every buffer's padding value, and
one non-blocking copy per dtype moves it all.

A staging tensor must not be rewritten while the copy out of it may still be queued. That is what
`CopyFence` tracks, without recording and waiting on a CUDA event per copy (three per plain step at
batch 1; without them the step's host time fell by ~30 us on the H200, `benchmarks/host_phases.py`).
The engine waits for the device once per step anyway (its tokens come to the host), and tells the
fence; each staging buffer is a small ring of pinned copies, so a few uploads between two such waits
never block, and one more than the ring holds makes the fence wait for the stream itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


class CopyFence:
    """Counts the host's waits for the device stream that the staging copies run on.

    After a wait, every copy queued before it has finished, so every staging buffer is free again.
    `passed()`: the caller has just waited (e.g. a blocking device -> host copy of a step's tokens,
    which runs after everything queued before it on the same stream). `wait()`: wait now."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.epoch = 0  # number of waits so far
        # CPU copies are synchronous: a staging buffer is free as soon as its copy returns
        self.asynchronous = device.type == "cuda"

    def passed(self) -> None:
        self.epoch += 1

    def wait(self) -> None:
        if self.asynchronous:
            torch.cuda.current_stream(self.device).synchronize()
        self.epoch += 1


class StagingRing:
    """`depth` sets of host staging tensors (pinned on CUDA) that take turns.

    `acquire()` returns the index of the next set, after making sure no copy out of it can still be
    queued: a set used since the fence's last wait makes the fence wait (on the CPU copies are
    synchronous and nothing waits)."""

    def __init__(self, fence: CopyFence, depth: int = 2) -> None:
        self.fence, self.depth = fence, depth
        self._used_at = [-1] * depth  # the fence epoch in which each set was last copied out of
        self._next = 0

    def acquire(self) -> int:
        i = self._next
        self._next = (i + 1) % self.depth
        if self.fence.asynchronous and self._used_at[i] == self.fence.epoch:
            self.fence.wait()
        return i

    def mark_copied(self, i: int) -> None:
        self._used_at[i] = self.fence.epoch


@dataclass(frozen=True)
class Field:
    shape: tuple[int, ...]
    dtype: torch.dtype  # torch.int32 or torch.int64
    fill: int  # the padding value every step starts from


class StepMetadata:
    def __init__(self, fields: dict[str, Field], device: torch.device, fence: CopyFence | None = None) -> None:
        self.device = device
        self.ring = StagingRing(fence if fence is not None else CopyFence(device))
        self.dev: dict[str, torch.Tensor] = {}  # fixed-address device views (what the graphs read)
        # per ring set: the numpy views of its staging tensors (`host` is the current set's)
        self._host_sets: list[dict[str, np.ndarray]] = [{} for _ in range(self.ring.depth)]
        # per dtype: (device tensor, its staging tensor per ring set, their numpy views, template)
        self._groups: list[tuple[torch.Tensor, list[torch.Tensor], list[np.ndarray], np.ndarray]] = []
        pinned = device.type == "cuda"
        for dtype in (torch.int64, torch.int32):
            names = [n for n, f in fields.items() if f.dtype == dtype]
            if not names:
                continue
            sizes = [int(np.prod(fields[n].shape)) for n in names]
            total = sum(sizes)
            dev = torch.empty(total, dtype=dtype, device=device)
            stagings = [torch.empty(total, dtype=dtype, pin_memory=pinned) for _ in range(self.ring.depth)]
            flats = [s.numpy() for s in stagings]
            template = np.empty(total, dtype=np.int64 if dtype == torch.int64 else np.int32)
            off = 0
            for n, size in zip(names, sizes):
                f = fields[n]
                template[off: off + size] = f.fill
                self.dev[n] = dev[off: off + size].view(f.shape)
                for host, flat in zip(self._host_sets, flats):
                    host[n] = flat[off: off + size].reshape(f.shape)
                off += size
            self._groups.append((dev, stagings, flats, template))
        self._set = 0
        self.host = self._host_sets[0]
        self.begin()
        self.upload()

    def begin(self) -> dict[str, np.ndarray]:
        """Start a step: take the next staging set (free of pending copies), reset it to padding."""
        self._set = self.ring.acquire()
        for _, _, flats, template in self._groups:
            np.copyto(flats[self._set], template)
        self.host = self._host_sets[self._set]
        return self.host

    def upload(self) -> None:
        for dev, stagings, _, _ in self._groups:
            dev.copy_(stagings[self._set], non_blocking=True)
        self.ring.mark_copied(self._set)
