"""The programmatic-dependent-launch prologue shared by the Triton kernels (see `_dispatch.pdl_enabled`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pdl_prologue(USE_GDC: tl.constexpr):
    """Wait for the previous kernel on the stream (its writes become visible), then let the next one start.

    Every program calls this before it reads anything a previous kernel wrote and before it writes:
    a kernel launched with PDL may be running while its predecessor still is. The signal is given at
    once: the next kernel's programs then wait in the same prologue, so starting them early is safe,
    and they can already request their weights.
    """
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
