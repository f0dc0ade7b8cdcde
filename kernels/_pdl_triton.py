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


@triton.jit
def l2_prefetch(ptr, nbytes):
    """Ask L2 for `nbytes` bytes from `ptr` (16-byte aligned, a multiple of 16; sm_90's bulk prefetch, one
    instruction issued by thread 0 of the program). Only a hint: nothing waits for it and nothing depends
    on it. Programs that call it before `pdl_prologue` keep DRAM busy with their weights while the kernel
    before them drains, where one tile requested before the wait covers only the start of a program's rows."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [tl.cast(ptr, tl.int64), nbytes], dtype=tl.int32, is_pure=False, pack=1)
