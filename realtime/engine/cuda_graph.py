"""CUDA graphs for the LM decode step, one per batch-size bucket.

Capture runs the step on whatever the persistent buffers hold (dummy values: padding rows that
neither write KV nor read it); the encoder never runs during capture. At run time the engine
fills the buffers (the gather-add kernel writes `inputs_embeds`), pads the batch to its bucket
and replays.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

import torch

logger = logging.getLogger(__name__)


def batch_buckets(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 640, 768, 1024]
    out = [s for s in sizes if s < max_batch]
    return out + [max_batch]


@contextmanager
def collected_then_no_gc() -> Iterator[None]:
    """Collect garbage now, then keep the automatic GC off until the block ends (as it was before).

    Graph capture needs it: engines sit in reference cycles, so only the GC frees them, and a
    collection that frees an older engine destroys its CUDA graphs, which CUDA forbids while a
    stream captures (the capture is invalidated)."""
    gc.collect()
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def high_priority_stream(device: torch.device) -> torch.cuda.Stream:
    """A new CUDA stream of the highest priority. Graphs captured on it keep that priority wherever they are
    replayed: torch instantiates graphs with per-node priorities (cudaGraphInstantiateFlagUseNodePriority), and a
    captured kernel node takes its capture stream's."""
    _, greatest = torch.cuda.Stream.priority_range()
    return torch.cuda.Stream(device, priority=greatest)


class DecodeGraphRunner:
    def __init__(self, forward: Callable[[int], None], max_batch: int, device: torch.device,
                 capture_stream: torch.cuda.Stream | None = None) -> None:
        self.forward = forward
        self.buckets = batch_buckets(max_batch)
        self.device = device
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        # the stream the graphs are captured on (None: torch's one default capture stream). Graphs that
        # are replayed side by side need different capture streams: cuBLAS keeps one workspace per
        # (handle, stream), so every graph captured on one stream bakes in the same workspace address,
        # whatever its memory pool (pytorch/pytorch#193402), and two of them running at once race on it
        self.capture_stream = capture_stream

    def bucket(self, b: int) -> int:
        for size in self.buckets:
            if size >= b:
                return size
        raise ValueError(f"batch {b} exceeds the largest graph bucket {self.buckets[-1]}")

    @torch.no_grad()
    def capture(self, warmup: bool = True) -> None:
        """Capture `forward` at every bucket. `warmup`: run it eagerly first (lazy init, Triton compilation,
        allocator); False for a forward whose every kernel has already run at these shapes and whose eager run
        would write caches (a capture only records)."""
        if warmup:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for b in self.buckets:
                    self.forward(b)
            torch.cuda.current_stream(self.device).wait_stream(stream)
        with collected_then_no_gc():
            # largest first so smaller graphs reuse the memory pool
            for b in reversed(self.buckets):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool, stream=self.capture_stream):
                    self.forward(b)
                if self.pool is None:
                    self.pool = g.pool()
                self.graphs[b] = g
        torch.cuda.synchronize(self.device)
        logger.info("captured %d decode graphs (batch buckets %s)", len(self.graphs), self.buckets)

    def replay(self, b: int) -> None:
        self.graphs[b].replay()
