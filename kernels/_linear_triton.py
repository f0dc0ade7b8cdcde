"""Triton kernel of `linear` for a few rows (semantics: linear.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import pdl_launch_args
from ._pdl_triton import pdl_prologue


@triton.jit
def skinny_linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                         HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, USE_GDC: tl.constexpr):
    """One program per BLOCK_N output features, the whole K loop in the program (no split-K pass).

    The first weight tile is requested before the PDL wait: weights never depend on the previous
    kernel, so at batch 1 their first DRAM round trip overlaps the previous kernel's tail."""
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_in = rn < N
    m_in = rm < M
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    w = tl.load(w_rows + rk[None, :], mask=n_in[:, None] & (rk[None, :] < K), other=0.0)
    pdl_prologue(USE_GDC)
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=m_in[:, None] & (rk[None, :] < K), other=0.0)
    acc = tl.dot(x, tl.trans(w))
    for k0 in range(BLOCK_K, K, BLOCK_K):
        kk = k0 + rk
        w = tl.load(w_rows + kk[None, :], mask=n_in[:, None] & (kk[None, :] < K), other=0.0)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=m_in[:, None] & (kk[None, :] < K),
                    other=0.0)
        acc += tl.dot(x, tl.trans(w))
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_in, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_in[:, None] & n_in[None, :])


def config_for(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps): the ninth session's tuning of every batch-1 shape on the H200
    (`benchmarks/bench_skinny_gemm.py`) picked 16 output features per program and 256-wide K tiles
    with two warps, except 128-wide tiles for the widest output (LM gate/up)."""
    return 16, 128 if n >= 16384 else 256, 2


def launch_linear(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor) -> None:
    """y[M, N] = x2[M, K] @ weight[N, K].T (+ bias), M <= 16; unit stride along K and N."""
    m, k = x2.shape
    n = weight.shape[0]
    block_n, block_k, warps = config_for(n, k)
    # tl.dot needs 16 rows: missing rows load as zeros and are never stored
    skinny_linear_kernel[(triton.cdiv(n, block_n),)](
        x2, weight, bias if bias is not None else weight, y, m, n, k, x2.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
        **pdl_launch_args(x2.device))
