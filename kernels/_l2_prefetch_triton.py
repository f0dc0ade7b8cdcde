"""Triton kernel of `l2_prefetch` (semantics: l2_prefetch.py): bulk prefetches of a byte range into L2 (sm_90+)."""

from __future__ import annotations

import triton
import triton.language as tl

LANES = 32  # one warp: lane i issues the program's i-th prefetch; lanes past the program's count issue none


@triton.jit
def l2_prefetch_kernel(base_ptr, nbytes, CHUNK: tl.constexpr, PER_PROGRAM: tl.constexpr, LANES: tl.constexpr):
    """Each of the first PER_PROGRAM lanes asks the TMA unit to bring one CHUNK-byte range of
    [base, base + nbytes) into L2 (`cp.async.bulk.prefetch.L2.global`: a hint with no completion to wait
    for, so the program exits at once and the copy engine streams on). base is 16-byte aligned and nbytes a
    multiple of 16 (checked by the caller), so every range's start and size are too."""
    lane = tl.arange(0, LANES)
    off = (tl.program_id(0) * PER_PROGRAM + lane).to(tl.int64) * CHUNK
    live = ((lane < PER_PROGRAM) & (off < nbytes)).to(tl.int32)
    size = tl.minimum(nbytes - off, CHUNK).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $3; mov.u32 $0, 0; }",
        "=r,l,r,r", [base_ptr + off, live, size], dtype=tl.int32, is_pure=False, pack=1)


def launch_l2_prefetch(flat_bytes, nbytes: int, chunk: int, per_program: int) -> None:
    """Prefetch the first `nbytes` of the uint8 tensor `flat_bytes` in `chunk`-byte ranges, `per_program` ranges
    a program (1..32): fewer spread the requests over more SMs' copy engines."""
    programs = triton.cdiv(triton.cdiv(nbytes, chunk), per_program)
    l2_prefetch_kernel[(programs,)](flat_bytes, nbytes, CHUNK=chunk, PER_PROGRAM=per_program, LANES=LANES,
                                    num_warps=1)
