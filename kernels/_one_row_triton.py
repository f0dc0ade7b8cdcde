"""Triton kernel of `one_row` (semantics and rounding order: one_row.py).

One kernel, specialised by constexpr switches, computes y = W @ a for ONE activation row a:

- prologue (NORM): a = nw * rms_norm(h) [* scale], rounded as `fused_ops.add_rms_norm` rounds; the
  row's statistic comes from a first pass over h (a few KB, served from L2), so each program needs
  no other program's result;
- PAIRED programs own two sets of weight rows, `r` and `r + HALF` inside groups of 2*HALF rows:
  gate and up rows of one SwiGLU unit (one group, HALF = intermediate size), or the two rotated
  halves of one attention head (groups = heads, HALF = head_dim / 2);
- epilogue: store y; store y + residual (the residual stream); silu(gate) * up; or RoPE on the q
  and k heads with the k and v heads written straight into their paged-cache slot.

Two ways to form the products (`DOT`):

- DOT = False: the K loop keeps the products in a [BLOCK_N, BLOCK_K] fp32 accumulator and reduces it
  once, after the loop; the activation tiles are loaded in the weight tile's layout (no shared-memory
  reshuffle per step), so each thread recomputes the activation of its columns for every row it holds;
- DOT = True: the activation of a K tile is computed once as a vector, placed as row 0 of a 16-row
  tile (rows 1-15 zero) and multiplied on the tensor cores, exactly as `linear`'s multi-row kernel
  (`_linear_triton.py`) multiplies its padded rows: with the same K tile, every sum is that kernel's
  sum for the same row, bit for bit, so a batch-1 step rounds as a batch of 2-16 rows does.

The first weight tile is requested before the programmatic-dependent-launch wait (weights never
depend on the kernel before); the others go through Triton's software pipeline (`STAGES`: cp.async
into shared memory, STAGES - 1 tiles in flight; 1: plain loads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import pdl_launch_args
from ._pdl_triton import pdl_prologue

EPI_STORE, EPI_RESIDUAL, EPI_SILU_MUL, EPI_ROPE_KV = 0, 1, 2, 3


@triton.jit
def _tile(ptr, kk, K):
    """A [BLOCK_N, BLOCK_K] tile of a row vector (every row the same columns `kk`): loaded in the weight
    tile's own layout, so each thread reads its columns straight from L1/L2 instead of the row being
    redistributed through shared memory (two barriers per K step) before the product."""
    return tl.load(ptr + kk, mask=kk < K, other=0.0)


@triton.jit
def _activation(h, nw, s, rstd, NORM: tl.constexpr, HAS_SCALE: tl.constexpr):
    """nw * rms_norm(h) [* scale] rounded as `fused_ops.add_rms_norm` rounds (NORM), else h; in fp32."""
    if NORM:
        dt = h.dtype
        a = (h.to(tl.float32) * rstd).to(dt)
        a = (nw.to(tl.float32) * a.to(tl.float32)).to(dt)
        if HAS_SCALE:
            a = (a.to(tl.float32) * s.to(tl.float32)).to(dt)
        return a.to(tl.float32)
    return h.to(tl.float32)


@triton.jit
def _row0_tile(h_ptr, nw, s_ptr, kk, K, rstd, rm, NORM: tl.constexpr, HAS_SCALE: tl.constexpr):
    """The activation of columns `kk` (computed once, as a vector) as row 0 of a [16, BLOCK_K] tensor-core
    operand in the input dtype; rows 1-15 are zeros (the rows `linear`'s kernel pads with)."""
    dt = h_ptr.dtype.element_ty
    h = tl.load(h_ptr + kk, mask=kk < K, other=0.0)
    s = tl.load(s_ptr + kk, mask=kk < K, other=0.0) if HAS_SCALE else 0.0
    a = _activation(h, nw, s, rstd, NORM, HAS_SCALE).to(dt)  # exact: the activation is rounded to dt already
    return tl.where(rm[:, None] == 0, a[None, :], tl.zeros_like(a)[None, :])


@triton.jit
def one_row_kernel(h_ptr, w_ptr, nw_ptr, s_ptr, out_ptr, res_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, slot_ptr,
                   N, K, stride_w, eps,
                   stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                   HALF: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, CACHE_BLOCK: tl.constexpr,
                   NORM: tl.constexpr, HAS_SCALE: tl.constexpr, PAIRED: tl.constexpr, EPILOGUE: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_POW2: tl.constexpr, STAGES: tl.constexpr,
                   DOT: tl.constexpr, USE_GDC: tl.constexpr):
    pid = tl.program_id(0)
    j = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # output features (PAIRED: pairs of rows)
    rk = tl.arange(0, BLOCK_K)
    rk2 = rk[None, :] + tl.zeros((BLOCK_N, 1), dtype=tl.int32)  # [BLOCK_N, BLOCK_K]: the columns, on every row
    n_in = j < N
    if PAIRED:  # HALF % BLOCK_N == 0: a program stays inside one group
        group = (pid * BLOCK_N) // HALF
        i = j - group * HALF
        rows1 = group * (2 * HALF) + i
    else:
        group = 0
        i = j
        rows1 = j
    w1_rows = w_ptr + rows1.to(tl.int64)[:, None] * stride_w
    w_mask = n_in[:, None] & (rk[None, :] < K)
    # the weights and the norm weight never depend on the kernel before: requested before the wait (the delay
    # scale may be a step's own result, so it is read after it)
    w1 = tl.load(w1_rows + rk[None, :], mask=w_mask, other=0.0)
    if PAIRED:
        w2_rows = w1_rows + HALF * stride_w
        w2 = tl.load(w2_rows + rk[None, :], mask=w_mask, other=0.0)
    if DOT:
        nw = tl.load(nw_ptr + rk, mask=rk < K, other=0.0) if NORM else 0.0
    else:
        nw = tl.load(nw_ptr + rk2, mask=rk2 < K, other=0.0) if NORM else 0.0
    pdl_prologue(USE_GDC)  # everything below may read what the previous kernel wrote

    rstd = 0.0
    if NORM:  # the row's statistic: the whole row in one load (a few KB from L2), one reduction
        row = tl.arange(0, K_POW2)
        hf = tl.load(h_ptr + row, mask=row < K, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / K + eps)
    if DOT:
        # as `linear`'s kernel: acc [16, BLOCK_N] = x [16, BLOCK_K] @ w.T per tile, first tile outside the loop
        rm = tl.arange(0, 16)
        x = _row0_tile(h_ptr, nw, s_ptr, rk, K, rstd, rm, NORM, HAS_SCALE)
        acc1 = tl.dot(x, tl.trans(w1))
        if PAIRED:
            acc2 = tl.dot(x, tl.trans(w2))
        for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
            kk = k0 + rk
            mask = n_in[:, None] & (kk[None, :] < K)
            nw_k = tl.load(nw_ptr + kk, mask=kk < K, other=0.0) if NORM else 0.0
            x = _row0_tile(h_ptr, nw_k, s_ptr, kk, K, rstd, rm, NORM, HAS_SCALE)
            acc1 += tl.dot(x, tl.trans(tl.load(w1_rows + kk[None, :], mask=mask, other=0.0)))
            if PAIRED:
                acc2 += tl.dot(x, tl.trans(tl.load(w2_rows + kk[None, :], mask=mask, other=0.0)))
        # row 0 holds the results (rows 1-15 are sums of zeros)
        sum1 = tl.sum(tl.where(rm[:, None] == 0, acc1, 0.0), axis=0)
        if PAIRED:
            sum2 = tl.sum(tl.where(rm[:, None] == 0, acc2, 0.0), axis=0)
    else:
        # the first K tile, whose weights were requested before the wait
        s = _tile(s_ptr, rk2, K) if HAS_SCALE else 0.0
        a = _activation(_tile(h_ptr, rk2, K), nw, s, rstd, NORM, HAS_SCALE)
        acc1 = w1.to(tl.float32) * a
        if PAIRED:
            acc2 = w2.to(tl.float32) * a
        # the other tiles through Triton's software pipeline (STAGES - 1 tiles in flight, via shared memory)
        for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
            kk = k0 + rk
            mask = n_in[:, None] & (kk[None, :] < K)
            kk2 = k0 + rk2
            nw_k = _tile(nw_ptr, kk2, K) if NORM else 0.0
            s_k = _tile(s_ptr, kk2, K) if HAS_SCALE else 0.0
            a = _activation(_tile(h_ptr, kk2, K), nw_k, s_k, rstd, NORM, HAS_SCALE)
            acc1 += tl.load(w1_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32) * a
            if PAIRED:
                acc2 += tl.load(w2_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32) * a
        sum1 = tl.sum(acc1, axis=1)
        if PAIRED:
            sum2 = tl.sum(acc2, axis=1)

    dt = out_ptr.dtype.element_ty
    y1 = sum1.to(dt)  # rounded to the model dtype, as a projection's output is
    if EPILOGUE == 0:
        tl.store(out_ptr + j, y1, mask=n_in)
    elif EPILOGUE == 1:
        r = tl.load(res_ptr + j, mask=n_in, other=0.0)
        tl.store(out_ptr + j, (y1.to(tl.float32) + r.to(tl.float32)).to(dt), mask=n_in)
    elif EPILOGUE == 2:
        g = y1.to(tl.float32)
        u = sum2.to(dt).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(dt)  # silu(gate) rounded before the product, as eager does
        tl.store(out_ptr + j, (act.to(tl.float32) * u).to(dt), mask=n_in)
    else:  # RoPE / KV: group = head among [q heads; k heads; v heads], i = index in its first half
        x1 = y1.to(tl.float32)
        x2 = sum2.to(dt).to(tl.float32)
        if group < HQ + HKV:
            c1 = tl.load(cos_ptr + i).to(tl.float32)
            c2 = tl.load(cos_ptr + HALF + i).to(tl.float32)
            s1 = tl.load(sin_ptr + i).to(tl.float32)
            s2 = tl.load(sin_ptr + HALF + i).to(tl.float32)
            # eager rounds (x * cos) and (rotate_half(x) * sin) to the dtype before their sum
            o1 = ((x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)).to(dt)
            o2 = ((x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)).to(dt)
        else:
            o1 = x1.to(dt)
            o2 = x2.to(dt)
        if group < HQ:
            q_base = out_ptr + group * (2 * HALF)
            tl.store(q_base + i, o1, mask=n_in)
            tl.store(q_base + HALF + i, o2, mask=n_in)
        else:
            slot = tl.load(slot_ptr).to(tl.int64)
            blk = slot // CACHE_BLOCK
            off = slot % CACHE_BLOCK
            keep = n_in & (slot >= 0)  # a padding row writes nothing
            if group < HQ + HKV:
                base = kc_ptr + blk * stride_kcb + off * stride_kcs + (group - HQ) * stride_kch
            else:
                base = vc_ptr + blk * stride_vcb + off * stride_vcs + (group - HQ - HKV) * stride_vch
            tl.store(base + i, o1.to(kc_ptr.dtype.element_ty), mask=keep)
            tl.store(base + HALF + i, o2.to(kc_ptr.dtype.element_ty), mask=keep)


def launch(h: torch.Tensor, w: torch.Tensor, out: torch.Tensor, *, epilogue: int, config: tuple[int, int, int, int],
           norm_weight: torch.Tensor | None = None, eps: float = 0.0, scale: torch.Tensor | None = None,
           residual: torch.Tensor | None = None, half: int = 1, cos: torch.Tensor | None = None,
           sin: torch.Tensor | None = None, k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
           slot: torch.Tensor | None = None, heads: tuple[int, int] = (0, 0)) -> None:
    """One launch; `out` gets the epilogue's result. Shapes are checked by the callers in one_row.py.
    `config` is (BLOCK_N, BLOCK_K, warps, stages, dot)."""
    k = h.shape[0]
    paired = epilogue in (EPI_SILU_MUL, EPI_ROPE_KV)
    n = w.shape[0] // 2 if paired else w.shape[0]  # outputs (pairs of rows when paired)
    block_n, block_k, warps, stages, dot = config
    dummy = h  # any valid pointer for the arguments this specialisation never reads
    if k_cache is not None and v_cache is not None:
        kc, vc, cache_block = k_cache, v_cache, k_cache.shape[1]
        cache_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
    else:
        kc, vc, cache_strides, cache_block = dummy, dummy, (0,) * 6, 1
    one_row_kernel[(triton.cdiv(n, block_n),)](
        h, w, norm_weight if norm_weight is not None else dummy, scale if scale is not None else dummy, out,
        residual if residual is not None else dummy, cos if cos is not None else dummy,
        sin if sin is not None else dummy, kc, vc, slot if slot is not None else dummy,
        n, k, w.stride(0), float(eps), *cache_strides,
        HALF=half, HQ=heads[0], HKV=heads[1], CACHE_BLOCK=cache_block,
        NORM=norm_weight is not None, HAS_SCALE=scale is not None, PAIRED=paired, EPILOGUE=epilogue,
        BLOCK_N=block_n, BLOCK_K=block_k, K_POW2=triton.next_power_of_2(k), STAGES=stages, DOT=bool(dot),
        num_warps=warps, num_stages=stages, **pdl_launch_args(h.device))
