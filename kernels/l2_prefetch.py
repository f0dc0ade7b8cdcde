"""`L2Prefetcher`: weights that a chain of batch-1 kernels reads next, brought into the GPU's L2 cache while a
latency-bound kernel leaves DRAM idle.

Why: a batch-1 step is a chain of dependent kernels, and a projection starts streaming its weights from DRAM
only once it runs (its first tile just before: programmatic dependent launch). The attention before each
layer's o projection runs for several microseconds on about one microsecond of bytes (full-size model on an
H200: 6-8 us against 0.7-1.5 us; `docs/benchmarks.md`, twenty-seventh session), so DRAM is nearly idle there.
`fetch`, called just before the attention is queued, asks the copy engine (sm_90's
`cp.async.bulk.prefetch.L2`: a few lanes issue it, no SM streams it) to bring the o projection's weights into
L2 meanwhile; the projection then reads them from L2.

Outputs never change: L2 holds copies of the same bytes, and only weights (never written by a step) are fetched.

Two ways to issue a fetch (`PrefetchConfig.side_stream`):
- in the chain (the default): a small kernel queued on the current stream with programmatic dependent launch.
  It issues its prefetches as soon as it starts (weights never depend on the kernel before), then waits for
  the kernel before it like every kernel of the chain, so the chain's order and its PDL overlap are kept;
- on a side stream: `fetch` makes the side stream wait for what the current stream has queued (in a capture, an
  edge from the kernel queued last) and `join` makes the current stream wait for every fetch since the last
  join (call it before a captured region ends). Measured on an H100, an event between two kernels of a PDL
  chain costs that boundary its overlap: with a fetch before each of the encoder's projections, its step went
  from 1.69 to 2.03 ms (`docs/benchmarks.md`, fifty-fourth session). Each chain of kernels that runs beside
  another (the LM step, the encoder step) needs its own prefetcher, or one chain's fetches would wait for the
  other's kernels.

A second policy, "ahead" (`ahead_bytes`), pipelines a whole chain instead: right before each projection is queued,
the next projection's weights (up to `ahead_bytes`) are asked for, so that DRAM streams projection i + 1 while
projection i reads its own from L2. It suits chains whose consecutive weights fit in L2 together (the full-size
audio encoder's at batch 1: 5-26 MB each, against 50 MB of L2).

STREAMSCRIBE_L2_PREFETCH=1 turns it on where supported (sm_90+ with Triton; runners read it when made); the other
switches (`prefetch_config_from_env`) set `PrefetchConfig`'s fields for A/B runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ._dispatch import HAVE_TRITON, _compute_capability, env_int

ALIGN = 16  # the bulk prefetch's unit: start and size multiples of 16 bytes


def l2_prefetch_supported(device: torch.device) -> bool:
    """sm_90+ CUDA with Triton (not the interpreter): where the bulk prefetch instruction exists."""
    if device.type != "cuda" or not HAVE_TRITON or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    return _compute_capability(device.index if device.index is not None else torch.cuda.current_device())[0] >= 9


def fetch_plan(t: torch.Tensor, max_bytes: int | None = None) -> int:
    """How many leading bytes of `t` a fetch asks for: all of them (or `max_bytes`), rounded down to the
    prefetch unit; 0 where `t` cannot be fetched as one range (not contiguous, or not 16-byte aligned)."""
    if not t.is_contiguous() or t.data_ptr() % ALIGN:
        return 0
    n = t.numel() * t.element_size()
    if max_bytes is not None:
        n = min(n, max_bytes)
    return n - n % ALIGN


@dataclass(frozen=True)
class PrefetchConfig:
    # bytes of one bulk prefetch: on an H100, 16 KB chunks brought the LM's o projection (25 MB) in too slowly to
    # help, 64 KB ones in time (`benchmarks/bench_l2_prefetch.py`, fifty-fourth session)
    chunk_bytes: int = 64 << 10
    mlp_bytes: int = 0  # leading bytes of the layer's MLP input projection also fetched at the attention
    ahead_bytes: int = 0  # > 0: the "ahead" policy, at most this many bytes of each next projection
    per_program: int = 32  # bulk prefetches a program issues (one a lane): 32 beat 4 and 1 in the same sweep
    side_stream: bool = False  # issue fetches from a side stream instead of in the chain

    def __post_init__(self) -> None:
        if self.chunk_bytes <= 0 or self.chunk_bytes % ALIGN:
            raise ValueError(f"chunk_bytes must be a positive multiple of {ALIGN}, got {self.chunk_bytes}")
        if not 1 <= self.per_program <= 32:
            raise ValueError(f"per_program must be in 1..32, got {self.per_program}")
        if self.mlp_bytes < 0 or self.ahead_bytes < 0:
            raise ValueError("mlp_bytes and ahead_bytes must not be negative")


def prefetch_switched_on() -> bool:
    """STREAMSCRIBE_L2_PREFETCH=1 (read now; runners read it when made)."""
    return os.environ.get("STREAMSCRIBE_L2_PREFETCH", "0") == "1"


def _env_mb(name: str) -> int:
    """Bytes of the environment switch `name`, a number of MB in 0..1024 (default 0)."""
    text = os.environ.get(name, "0")
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not 0 <= mb <= 1024:
        raise ValueError(f"{name} must be a number of MB in 0..1024, got {text!r}")
    return int(mb * (1 << 20))


def prefetch_config_from_env() -> PrefetchConfig:
    """`PrefetchConfig` from STREAMSCRIBE_L2_PREFETCH_CHUNK_KB (default 64), _MLP_MB and _AHEAD_MB (default 0),
    _PER_PROGRAM (default 32) and _SIDE (1: side stream), read now; a bad value is refused with the switch's name."""
    side = os.environ.get("STREAMSCRIBE_L2_PREFETCH_SIDE", "0")
    if side not in ("0", "1"):
        raise ValueError(f"STREAMSCRIBE_L2_PREFETCH_SIDE must be 0 or 1, got {side!r}")
    return PrefetchConfig(
        chunk_bytes=env_int("STREAMSCRIBE_L2_PREFETCH_CHUNK_KB", 64, 1, 1 << 16, "a chunk size in KB (1..65536)") << 10,
        mlp_bytes=_env_mb("STREAMSCRIBE_L2_PREFETCH_MLP_MB"),
        ahead_bytes=_env_mb("STREAMSCRIBE_L2_PREFETCH_AHEAD_MB"),
        per_program=env_int("STREAMSCRIBE_L2_PREFETCH_PER_PROGRAM", 32, 1, 32, "a number of chunks in 1..32"),
        side_stream=side == "1")


class L2Prefetcher:
    """Fetches tensors into L2 (see the module's docstring); one per chain of kernels."""

    def __init__(self, device: torch.device, config: PrefetchConfig = PrefetchConfig()) -> None:
        self.device = device
        self.config = config
        self.mlp_bytes, self.ahead_bytes = config.mlp_bytes, config.ahead_bytes
        self.side = torch.cuda.Stream(device) if config.side_stream else None
        self.pending = False
        self.fetched_bytes = 0  # bytes asked for since this prefetcher was made (tests, benchmarks)

    def fetch(self, t: torch.Tensor, max_bytes: int | None = None) -> None:
        """Ask for the leading bytes of `t` (`fetch_plan`), after what is queued now."""
        from ._l2_prefetch_triton import launch_l2_prefetch

        n = fetch_plan(t, max_bytes)
        if n == 0:
            return
        flat = t.reshape(-1).view(torch.uint8)
        c = self.config
        if self.side is None:
            launch_l2_prefetch(flat, n, c.chunk_bytes, c.per_program, in_chain=True)
        else:
            self.side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.side):
                launch_l2_prefetch(flat, n, c.chunk_bytes, c.per_program, in_chain=False)
            self.pending = True
        self.fetched_bytes += n

    def join(self) -> None:
        """The current stream waits for every side-stream fetch since the last join (in the chain: nothing to do)."""
        if self.pending and self.side is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.side)
            self.pending = False
