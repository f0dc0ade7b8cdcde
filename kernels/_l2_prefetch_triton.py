"""Triton kernel of `l2_prefetch` (semantics: l2_prefetch.py): bulk prefetches of a byte range into L2 (sm_90+)."""

from __future__ import annotations

import triton
import triton.language as tl

CHUNKS_PER_PROGRAM = 32  # one warp, one chunk a lane: no lane repeats another's prefetch


@triton.jit
def l2_prefetch_kernel(base_ptr, nbytes, CHUNK: tl.constexpr, PER_PROGRAM: tl.constexpr):
    """Each lane asks the TMA unit to bring one CHUNK-byte range of [base, base + nbytes) into L2
    (`cp.async.bulk.prefetch.L2.global`: a hint with no completion to wait for, so the program exits at
    once and the copy engine streams on). base is 16-byte aligned and nbytes a multiple of 16 (checked
    by the caller), so every range's start and size are too."""
    idx = tl.program_id(0) * PER_PROGRAM + tl.arange(0, PER_PROGRAM)
    off = idx.to(tl.int64) * CHUNK
    live = (off < nbytes).to(tl.int32)
    size = tl.minimum(nbytes - off, CHUNK).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $3; mov.u32 $0, 0; }",
        "=r,l,r,r", [base_ptr + off, live, size], dtype=tl.int32, is_pure=False, pack=1)


def launch_l2_prefetch(flat_bytes, nbytes: int, chunk: int) -> None:
    """Prefetch the first `nbytes` of the uint8 tensor `flat_bytes` in `chunk`-byte ranges."""
    programs = triton.cdiv(triton.cdiv(nbytes, chunk), CHUNKS_PER_PROGRAM)
    l2_prefetch_kernel[(programs,)](flat_bytes, nbytes, CHUNK=chunk, PER_PROGRAM=CHUNKS_PER_PROGRAM, num_warps=1)
