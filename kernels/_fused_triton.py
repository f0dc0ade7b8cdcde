"""Triton kernels of `fused_ops` (semantics and rounding order: see fused_ops.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import pdl_launch_args
from ._pdl_triton import pdl_prologue


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, scale_ptr, y_ptr, res_out_ptr, n_cols, eps,
                         sx, sr, ss, sy, so,
                         HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    pdl_prologue(USE_GDC)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    dt = y_ptr.dtype.element_ty
    h = tl.load(x_ptr + row * sx + cols, mask=m, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * sr + cols, mask=m, other=0.0)
        h = (h.to(tl.float32) + r.to(tl.float32)).to(dt)  # the residual stream lives in the model dtype
        tl.store(res_out_ptr + row * so + cols, h, mask=m)
    hf = h.to(tl.float32)
    var = tl.sum(hf * hf, axis=0) / n_cols
    y = (hf * (1.0 / tl.sqrt(var + eps))).to(dt)
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    y = (w.to(tl.float32) * y.to(tl.float32)).to(dt)
    if HAS_SCALE:
        s = tl.load(scale_ptr + row * ss + cols, mask=m, other=0.0)
        y = (y.to(tl.float32) * s.to(tl.float32)).to(dt)
    tl.store(y_ptr + row * sy + cols, y, mask=m)


def launch_add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                        scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[-1]

    def rows_of(t: torch.Tensor) -> torch.Tensor:  # [rows, n] with unit stride along n
        t2 = t.reshape(-1, n)
        return t2 if t2.stride(-1) == 1 else t2.contiguous()

    x2 = rows_of(x)
    rows = x2.shape[0]
    y = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    res_out = torch.empty_like(y) if residual is not None else x2
    r2 = rows_of(residual) if residual is not None else x2
    s2 = rows_of(scale.expand(*x.shape[:-1], n)) if scale is not None else x2
    if rows:
        _add_rms_norm_kernel[(rows,)](x2, r2, weight, s2, y, res_out, n, eps,
                                     x2.stride(0), r2.stride(0), s2.stride(0), y.stride(0), res_out.stride(0),
                                     HAS_RES=residual is not None, HAS_SCALE=scale is not None,
                                     BLOCK=triton.next_power_of_2(n), num_warps=4 if n <= 4096 else 8,
                                     **pdl_launch_args(x.device))
    out_res = res_out.view(x.shape) if residual is not None else x
    return y.view(x.shape), out_res


@triton.jit
def _rotated(base, cos_ptr, sin_ptr, t, sc, m, dt, HALF: tl.constexpr):
    """The two halves of y = x*cos + rotate_half(x)*sin for the [BLOCK_H, D] heads at `base` of token t, rounded
    like eager: (x*cos) and (rotate_half(x)*sin) are each rounded to the dtype before the add."""
    d = tl.arange(0, HALF)
    x1 = tl.load(base + d[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + d[None, :], mask=m, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + t * sc + d).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + t * sc + HALF + d).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + t * sc + d).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + t * sc + HALF + d).to(tl.float32)[None, :]
    y1 = ((x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)).to(dt)
    y2 = ((x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)).to(dt)
    return y1, y2


@triton.jit
def _rope_kernel(q_ptr, k_ptr, yq_ptr, yk_ptr, cos_ptr, sin_ptr, n_q, n_k, sqt, sqh, skt, skh, syqt, syqh, sykt, sykh,
                 sc, Q_BLOCKS, HALF: tl.constexpr, BLOCK_H: tl.constexpr, USE_GDC: tl.constexpr):
    """One program per (token, block of q heads or of k heads): y = x*cos + rotate_half(x)*sin, rounded
    like eager. q and k share the launch (one kernel per attention layer, not two)."""
    pdl_prologue(USE_GDC)
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    if hb < Q_BLOCKS:
        h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        hm = h < n_q
        base = q_ptr + t * sqt + h[:, None] * sqh
        out = yq_ptr + t * syqt + h[:, None] * syqh
    else:
        h = (hb - Q_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
        hm = h < n_k
        base = k_ptr + t * skt + h[:, None] * skh
        out = yk_ptr + t * sykt + h[:, None] * sykh
    d = tl.arange(0, HALF)
    m = hm[:, None]
    y1, y2 = _rotated(base, cos_ptr, sin_ptr, t, sc, m, yq_ptr.dtype.element_ty, HALF)
    tl.store(out + d[None, :], y1, mask=m)
    tl.store(out + HALF + d[None, :], y2, mask=m)


@triton.jit
def _rope_kv_kernel(q_ptr, k_ptr, v_ptr, yq_ptr, kc_ptr, vc_ptr, slot_ptr, cos_ptr, sin_ptr, n_q, n_k,
                    sqt, sqh, skt, skh, svt, svh, syqt, syqh, skcb, skcs, skch, svcb, svcs, svch, sslot, sc,
                    Q_BLOCKS, K_BLOCKS, HALF: tl.constexpr, CACHE_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr,
                    USE_GDC: tl.constexpr):
    """`_rope_kernel` whose k heads go, rotated, straight to their paged-cache slot, with a third group of
    programs copying the v heads to theirs (slot < 0: nothing written): RoPE and `write_kv` in one launch."""
    pdl_prologue(USE_GDC)
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    d = tl.arange(0, HALF)
    if hb < Q_BLOCKS:
        h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        m = (h < n_q)[:, None]
        y1, y2 = _rotated(q_ptr + t * sqt + h[:, None] * sqh, cos_ptr, sin_ptr, t, sc, m,
                          yq_ptr.dtype.element_ty, HALF)
        out = yq_ptr + t * syqt + h[:, None] * syqh
        tl.store(out + d[None, :], y1, mask=m)
        tl.store(out + HALF + d[None, :], y2, mask=m)
    else:
        slot = tl.load(slot_ptr + t * sslot).to(tl.int64)
        blk = slot // CACHE_BLOCK
        off = slot % CACHE_BLOCK
        if hb < Q_BLOCKS + K_BLOCKS:
            h = (hb - Q_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
            m = (h < n_k)[:, None] & (slot >= 0)
            y1, y2 = _rotated(k_ptr + t * skt + h[:, None] * skh, cos_ptr, sin_ptr, t, sc, m,
                              k_ptr.dtype.element_ty, HALF)
            out = kc_ptr + blk * skcb + off * skcs + h[:, None] * skch
        else:
            h = (hb - Q_BLOCKS - K_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
            m = (h < n_k)[:, None] & (slot >= 0)
            base = v_ptr + t * svt + h[:, None] * svh
            y1 = tl.load(base + d[None, :], mask=m, other=0.0)
            y2 = tl.load(base + HALF + d[None, :], mask=m, other=0.0)
            out = vc_ptr + blk * svcb + off * svcs + h[:, None] * svch
        # in the caches' dtype (the k and v caches share it: `paged_attention.check_write`), as write_kv stores
        tl.store(out + d[None, :], y1.to(kc_ptr.dtype.element_ty), mask=m)
        tl.store(out + HALF + d[None, :], y2.to(kc_ptr.dtype.element_ty), mask=m)


def _tokens_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, T, H, D] -> [B*T, H, D] with unit stride along D (a view when possible)."""
    x3 = x.reshape(x.shape[0] * x.shape[1], x.shape[2], x.shape[3])
    return x3 if x3.stride(2) == 1 else x3.contiguous()


def _rope_operands(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(cos, sin as [tokens, D] rows, q and k as [tokens, H, D], heads per program) of both RoPE launchers."""
    d = q.shape[-1]
    cos2 = cos.expand(q.shape[0], q.shape[1], d).reshape(-1, d).contiguous()
    sin2 = sin.expand(q.shape[0], q.shape[1], d).reshape(-1, d).contiguous()
    block_h = min(16, triton.next_power_of_2(max(q.shape[2], k.shape[2])))
    return cos2, sin2, _tokens_heads(q), _tokens_heads(k), block_h


def launch_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    if q.dtype != k.dtype:
        raise TypeError(f"rope: q is {q.dtype}, k is {k.dtype}")
    d = q.shape[-1]
    cos2, sin2, q3, k3, block_h = _rope_operands(q, k, cos, sin)
    yq = torch.empty(q3.shape, device=q.device, dtype=q.dtype)
    yk = torch.empty(k3.shape, device=k.device, dtype=k.dtype)
    t_all, nq, nk = q3.shape[0], q3.shape[1], k3.shape[1]
    q_blocks = triton.cdiv(nq, block_h)
    if t_all:
        _rope_kernel[(t_all, q_blocks + triton.cdiv(nk, block_h))](
            q3, k3, yq, yk, cos2, sin2, nq, nk, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
            yq.stride(0), yq.stride(1), yk.stride(0), yk.stride(1), cos2.stride(0), q_blocks,
            HALF=d // 2, BLOCK_H=block_h, num_warps=2, **pdl_launch_args(q.device))
    return yq.view(q.shape), yk.view(k.shape)


def launch_rope_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"rope_write_kv: q, k, v are {q.dtype}, {k.dtype}, {v.dtype}")
    d = q.shape[-1]
    cos2, sin2, q3, k3, block_h = _rope_operands(q, k, cos, sin)
    v3 = _tokens_heads(v)
    yq = torch.empty(q3.shape, device=q.device, dtype=q.dtype)
    t_all, nq, nk = q3.shape[0], q3.shape[1], k3.shape[1]
    q_blocks, k_blocks = triton.cdiv(nq, block_h), triton.cdiv(nk, block_h)
    if t_all:
        _rope_kv_kernel[(t_all, q_blocks + 2 * k_blocks)](
            q3, k3, v3, yq, k_cache, v_cache, slot_mapping, cos2, sin2, nq, nk,
            q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
            yq.stride(0), yq.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], slot_mapping.stride(0),
            cos2.stride(0), q_blocks, k_blocks, HALF=d // 2, CACHE_BLOCK=k_cache.shape[1], BLOCK_H=block_h,
            num_warps=2, **pdl_launch_args(q.device))
    return yq.view(q.shape)


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, n_cols, sx, sy, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    pdl_prologue(USE_GDC)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < n_cols
    dt = y_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * sx + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * sx + n_cols + cols, mask=m, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dt)  # eager rounds silu(gate) before the product
    tl.store(y_ptr + row * sy + cols, (act.to(tl.float32) * u).to(dt), mask=m)


def launch_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    n2 = gate_up.shape[-1]
    n = n2 // 2
    x2 = gate_up.reshape(-1, n2)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape[0], n, device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    if x2.shape[0]:
        _silu_mul_kernel[(x2.shape[0], triton.cdiv(n, block))](x2, y, n, x2.stride(0), y.stride(0), BLOCK=block,
                                                                   **pdl_launch_args(x2.device))
    return y.view(*gate_up.shape[:-1], n)
