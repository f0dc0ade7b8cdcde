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
    """Which staging copies have surely finished: every copy gets a ticket as it is queued, and the
    host's waits for the device stream say up to which ticket the copies are done.

    `mark()`: the tickets issued so far; `passed(upto)`: the caller has just waited for everything queued
    before `mark()` returned `upto` (e.g. an event recorded after a step's device -> host token copy), or
    for everything queued so far (upto None); `wait()`: wait for the whole device now (the encoder's
    copies may be queued on a stream of their own: `ModelRunner.on_encoder_stream`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.issued = 0  # tickets handed out
        self.done = 0  # tickets below this are finished copies
        # CPU copies are synchronous: a staging buffer is free as soon as its copy returns
        self.asynchronous = device.type == "cuda"

    def ticket(self) -> int:
        self.issued += 1
        return self.issued - 1

    def mark(self) -> int:
        return self.issued

    def passed(self, upto: int | None = None) -> None:
        self.done = max(self.done, self.issued if upto is None else upto)

    def wait(self) -> None:
        if self.asynchronous:  # the whole device: staging copies are queued on more than one stream
            torch.cuda.synchronize(self.device)
        self.done = self.issued


class StagingRing:
    """`depth` sets of host staging tensors (pinned on CUDA) that take turns.

    `acquire()` returns the index of the next set, after making sure no copy out of it can still be
    queued: a set whose last copy the fence does not know to be done makes the fence wait (on the CPU
    copies are synchronous and nothing waits)."""

    def __init__(self, fence: CopyFence, depth: int = 2) -> None:
        self.fence, self.depth = fence, depth
        self._ticket = [-1] * depth  # the ticket of each set's last copy (-1: never copied out of)
        self._next = 0

    def acquire(self) -> int:
        i = self._next
        self._next = (i + 1) % self.depth
        if self.fence.asynchronous and self._ticket[i] >= self.fence.done:
            self.fence.wait()
        return i

    def mark_copied(self, i: int) -> None:
        self._ticket[i] = self.fence.ticket()


class TokenCopy:
    """A step's token ids to the host without waiting for the work queued after them: a non-blocking
    copy into pinned memory and an event right behind it (CUDA); the host then waits for that event, not
    for the whole stream, so work queued after `start` (the next step's audio) runs while the host
    handles the tokens. On the CPU the copy is immediate."""

    def __init__(self, numel: int, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._buf = torch.empty(numel, dtype=torch.int64, pin_memory=self.cuda)
        self._event = torch.cuda.Event() if self.cuda else None
        self._n = 0

    def start(self, ids: torch.Tensor) -> None:
        self._n = ids.numel()
        if self._n > self._buf.numel():  # sized for the engine's step output; grows if a step has more
            self._buf = torch.empty(self._n, dtype=torch.int64, pin_memory=self.cuda)
        self._buf[: self._n].copy_(ids, non_blocking=self.cuda)
        if self._event is not None:
            self._event.record()

    def wait(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()
        return self._buf[: self._n].tolist()


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
