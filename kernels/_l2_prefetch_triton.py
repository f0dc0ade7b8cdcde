"""Triton kernel of `l2_prefetch` (semantics: l2_prefetch.py): bulk prefetches of a byte range into L2 (sm_90+)."""

from __future__ import annotations

import triton
import triton.language as tl

from ._dispatch import pdl_launch_args
from ._pdl_triton import pdl_prologue

LANES = 32  # one warp: lane i issues the program's i-th prefetch; lanes past the program's count issue none


@triton.jit
def l2_prefetch_kernel(w_ptr, nbytes, CHUNK: tl.constexpr, PER_PROGRAM: tl.constexpr, LANES: tl.constexpr,
                       USE_GDC: tl.constexpr):
    """Each of the first PER_PROGRAM lanes asks the TMA unit to bring one CHUNK-byte range of
    [w, w + nbytes) into L2 (`cp.async.bulk.prefetch.L2.global`: a hint with no completion to wait for; the
    copy engine streams on after the program exits). w is 16-byte aligned and nbytes a multiple of 16 (checked
    by the caller), so every range's start and size are too.

    The prefetches go out before the PDL wait (weights never depend on the kernel before). The wait then keeps
    the chain's order: the next kernel waits for this one, so this one must wait for the one before it."""
    lane = tl.arange(0, LANES)
    off = (tl.program_id(0) * PER_PROGRAM + lane).to(tl.int64) * CHUNK
    live = ((lane < PER_PROGRAM) & (off < nbytes)).to(tl.int32)
    size = tl.minimum(nbytes - off, CHUNK).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $3; mov.u32 $0, 0; }",
        "=r,l,r,r", [w_ptr + off, live, size], dtype=tl.int32, is_pure=False, pack=1)
    pdl_prologue(USE_GDC)


def launch_l2_prefetch(flat_bytes, nbytes: int, chunk: int, per_program: int, in_chain: bool) -> None:
    """Prefetch the first `nbytes` of the uint8 tensor `flat_bytes` in `chunk`-byte ranges, `per_program` ranges
    a program (1..32: fewer spread the requests over more SMs' copy engines). in_chain: launched with PDL where
    supported (a link of the current stream's chain), else a plain launch (a side stream)."""
    grid = (triton.cdiv(triton.cdiv(nbytes, chunk), per_program),)
    if in_chain:
        l2_prefetch_kernel[grid](flat_bytes, nbytes, CHUNK=chunk, PER_PROGRAM=per_program, LANES=LANES, num_warps=1,
                                 **pdl_launch_args(flat_bytes.device))
    else:
        l2_prefetch_kernel[grid](flat_bytes, nbytes, CHUNK=chunk, PER_PROGRAM=per_program, LANES=LANES, num_warps=1,
                                 USE_GDC=False)
