"""Triton kernel of `linear` for a few rows (semantics: linear.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import pdl_launch_args
from ._pdl_triton import pdl_prologue


@triton.jit
def skinny_linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, K_PER_SPLIT,
                         HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, USE_GDC: tl.constexpr):
    """One program per BLOCK_N output features, K range and BLOCK_M-row tile: the whole K loop (SPLIT False), or
    its part [split * K_PER_SPLIT, +K_PER_SPLIT) written in fp32 to the workspace y[split] for `splitk_sum_kernel`.
    Every row tile runs the same code over the same K tiles, so a row's result never depends on the other rows
    of the call, nor on how many there are (batch invariance: what makes a look-ahead chunk of 8 audio tokens
    give the bits of 8 one-token calls).

    The first weight tile is requested before the PDL wait: weights never depend on the previous
    kernel, so at batch 1 their first DRAM round trip overlaps the previous kernel's tail."""
    pid = tl.program_id(0)
    k_lo = tl.program_id(1) * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = k_lo + tl.arange(0, BLOCK_K)
    n_in = rn < N
    m_in = rm < M
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    w = tl.load(w_rows + rk[None, :], mask=n_in[:, None] & (rk[None, :] < k_hi), other=0.0)
    pdl_prologue(USE_GDC)
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    x = tl.load(x_rows + rk[None, :], mask=m_in[:, None] & (rk[None, :] < k_hi), other=0.0)
    acc = tl.dot(x, tl.trans(w))
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_rows + kk[None, :], mask=n_in[:, None] & (kk[None, :] < k_hi), other=0.0)
        x = tl.load(x_rows + kk[None, :], mask=m_in[:, None] & (kk[None, :] < k_hi), other=0.0)
        acc += tl.dot(x, tl.trans(w))
    out_mask = m_in[:, None] & n_in[None, :]
    if SPLIT:  # y is the fp32 workspace [splits, M, N] (row stride N)
        part = y_ptr + tl.program_id(1).to(tl.int64) * M * N
        tl.store(part + rm.to(tl.int64)[:, None] * N + rn[None, :], acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_in, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=out_mask)


@triton.jit
def splitk_sum_kernel(ws_ptr, b_ptr, y_ptr, M, N, stride_ym, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    """y[m] = sum of the workspace's SPLITS parts of row m (in split order: deterministic) + bias, rounded."""
    pdl_prologue(USE_GDC)
    m = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    n_in = rn < N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLITS):
        acc += tl.load(ws_ptr + (s * M + m) * N + rn, mask=n_in, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_in, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + rn, acc.to(y_ptr.dtype.element_ty), mask=n_in)


def config_for(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps): the ninth session's tuning of every batch-1 shape on the H200
    (`benchmarks/bench_skinny_gemm.py`) picked 16 output features per program and 256-wide K tiles
    with two warps, except 128-wide tiles for the widest output (LM gate/up)."""
    return 16, 128 if n >= 16384 else 256, 2


MAX_SPLITS = 8


def split_k_for(n: int, k: int, sms: int) -> int:
    """How many K ranges a projection of n outputs is cut into: 1 unless its output blocks leave SMs idle. At
    batch 1 the full-size encoder's o and down projections (1,280 outputs) make 80 programs on an H200's 132 SMs,
    each streaming its rows' whole K (down: 160 KB): they ran at 8.2 us against about 2 us of bytes (kernel
    inventory, twenty-seventh session). Cut, about 2 programs per SM stream shorter ranges side by side."""
    block_n, block_k, _ = config_for(n, k)
    programs, tiles = triton.cdiv(n, block_n), triton.cdiv(k, block_k)
    if programs >= sms or tiles < 2:
        return 1
    return min(triton.cdiv(2 * sms, programs), tiles, MAX_SPLITS)


def launch_linear(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
                  splits: int = 1) -> None:
    """y[M, N] = x2[M, K] @ weight[N, K].T (+ bias); unit stride along K and N; rows in tiles of 16, each tile
    computed alike. splits > 1: the K loop cut into that many ranges (whole K tiles), their fp32 sums added by
    a second kernel in a fixed order (the same result on every run, and for a row in a call of any size)."""
    m, k = x2.shape
    n = weight.shape[0]
    block_n, block_k, warps = config_for(n, k)
    tiles = triton.cdiv(k, block_k)
    per_split = triton.cdiv(tiles, max(1, min(splits, tiles)))  # K tiles per range
    splits = triton.cdiv(tiles, per_split)
    out = y if splits == 1 else torch.empty(splits, m, n, device=y.device, dtype=torch.float32)
    b = bias if bias is not None else weight
    # tl.dot needs 16 rows: missing rows load as zeros and are never stored
    skinny_linear_kernel[(triton.cdiv(n, block_n), splits, triton.cdiv(m, 16))](
        x2, weight, b, out, m, n, k, x2.stride(0), weight.stride(0), y.stride(0), per_split * block_k,
        HAS_BIAS=bias is not None, SPLIT=splits > 1, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
        **pdl_launch_args(x2.device))
    if splits > 1:
        block = min(1024, triton.next_power_of_2(n))
        splitk_sum_kernel[(m, triton.cdiv(n, block))](out, b, y, m, n, y.stride(0), SPLITS=splits,
                                                        HAS_BIAS=bias is not None, BLOCK=block, num_warps=4,
                                                        **pdl_launch_args(x2.device))
