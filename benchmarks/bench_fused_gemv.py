"""Experiment for issue 3's B1: fold the RMS norm and SiLU·mul into one-row projections?

    python benchmarks/bench_fused_gemv.py [--layers 26] [--out FILE.json]

At batch 1 the LM step is a chain of 11 dependent kernels per layer. Programmatic dependent launch
(PDL, twenty-third session) overlaps their launches, but each kernel still waits for its predecessor's
results, so fewer kernels per layer is what is left. Three of the 11 could go into the projections that
follow them: the input norm into qkv, the post-attention norm (with its delay scale) into gate/up, and
SiLU·mul into down. The session's first attempt did that on a padded 16-row tensor-core tile, and its
fp32 temporaries spilled registers (B1 10.4 ms). Its second attempt used a one-row kernel that reduced
across threads at every K tile (B1 3.79 ms against 3.38 unfused). Both results are in docs/benchmarks.md.

`fused_gemv` below keeps the per-tile products in a [BLOCK_N, BLOCK_K] fp32 accumulator and reduces it
once, after the K loop. This script times one LM layer's projections both ways, 26 layers back to back
in one CUDA graph with PDL on (fresh weights per layer, as in a step, so nothing is served from L2):

- `unfused`: norm kernel -> `kernels.linear` (qkv); o; norm kernel -> gate/up; SiLU·mul kernel -> down;
- `fused`: `fused_gemv` with the norm prologue (qkv); o; `fused_gemv` with norm + scale (gate/up);
  `fused_gemv` with the SiLU·mul prologue (down),

for each `fused_gemv` configuration in CONFIGS. The o projection's input stands in for attention's
output and is the same in both. It first checks that both chains compute the same layer outputs
(bf16 tolerance). Nothing in the engine uses `fused_gemv`; this measures whether it should.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

log = logging.getLogger("bench_fused_gemv")

PLAIN, SILU_MUL, RMS_NORM = 0, 1, 2  # what `fused_gemv` does to its input row before the product
CONFIGS = [(bn, bk, w) for bn in (8, 16, 32) for bk in (128, 256) for w in (2, 4)]  # BLOCK_N, BLOCK_K, warps
LM_SHAPES = {"hidden": 3072, "q_out": 4096, "qkv": 6144, "inter": 9216}  # full-size LM layer


try:  # the kernel is defined at module level (Triton resolves a kernel's names in its module)
    import triton
    import triton.language as tl

    from kernels._dispatch import pdl_launch_args
    from kernels._pdl_triton import pdl_prologue
except ImportError:  # the CPU test skips without triton
    triton = None

if triton is not None:
    @triton.jit
    def _row(x_ptr, r_ptr, nw_ptr, s_ptr, kk, K, rstd, PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr,
             HAS_SCALE: tl.constexpr):
        dt = x_ptr.dtype.element_ty
        mk = kk < K
        if PROLOGUE == 1:  # silu(gate) * up; x is gate_up [2K]
            g = tl.load(x_ptr + kk, mask=mk, other=0.0).to(tl.float32)
            u = tl.load(x_ptr + K + kk, mask=mk, other=0.0).to(tl.float32)
            a = ((g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u).to(dt)
        elif PROLOGUE == 2:  # nw * rms_norm(x + residual) [* scale]
            h = tl.load(x_ptr + kk, mask=mk, other=0.0)
            if HAS_RES:
                h = (h.to(tl.float32) + tl.load(r_ptr + kk, mask=mk, other=0.0).to(tl.float32)).to(dt)
            a = (h.to(tl.float32) * rstd).to(dt)
            a = (tl.load(nw_ptr + kk, mask=mk, other=0.0).to(tl.float32) * a.to(tl.float32)).to(dt)
            if HAS_SCALE:
                a = (a.to(tl.float32) * tl.load(s_ptr + kk, mask=mk, other=0.0).to(tl.float32)).to(dt)
        else:
            a = tl.load(x_ptr + kk, mask=mk, other=0.0)
        return a

    @triton.jit
    def _fused_gemv_kernel(x_ptr, w_ptr, y_ptr, r_ptr, nw_ptr, s_ptr, ro_ptr, N, K, eps, stride_wn,
                           PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_GDC: tl.constexpr):
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        n_in = rn < N
        w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
        w = tl.load(w_rows + rk[None, :], mask=n_in[:, None] & (rk[None, :] < K), other=0.0)  # before the wait
        pdl_prologue(USE_GDC)
        rstd = 0.0
        if PROLOGUE == 2:  # the row's statistics first (a few KB from L2); program 0 writes the residual
            ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + rk
                h = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
                if HAS_RES:
                    h = (h.to(tl.float32) + tl.load(r_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
                         ).to(x_ptr.dtype.element_ty)
                    if pid == 0:
                        tl.store(ro_ptr + kk, h, mask=kk < K)
                ss += h.to(tl.float32) * h.to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
        a = _row(x_ptr, r_ptr, nw_ptr, s_ptr, rk, K, rstd, PROLOGUE, HAS_RES, HAS_SCALE)
        acc = w.to(tl.float32) * a.to(tl.float32)[None, :]  # reduced once, after the loop
        for k0 in range(BLOCK_K, K, BLOCK_K):
            kk = k0 + rk
            w = tl.load(w_rows + kk[None, :], mask=n_in[:, None] & (kk[None, :] < K), other=0.0)
            a = _row(x_ptr, r_ptr, nw_ptr, s_ptr, kk, K, rstd, PROLOGUE, HAS_RES, HAS_SCALE)
            acc += w.to(tl.float32) * a.to(tl.float32)[None, :]
        tl.store(y_ptr + rn, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n_in)


def fused_gemv(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, prologue: int,
               config: tuple[int, int, int] = (16, 256, 4), *, residual: torch.Tensor | None = None,
               norm_weight: torch.Tensor | None = None, scale: torch.Tensor | None = None,
               residual_out: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """y[N] = w @ f(x) for ONE row x, f as `prologue` says (PLAIN, SILU_MUL on gate_up [2K], RMS_NORM:
    norm_weight * rms_norm(x + residual) [* scale], writing x + residual to residual_out), rounded like
    `kernels.fused_ops`' kernels."""
    if triton is None:
        raise RuntimeError("bench_fused_gemv needs triton")
    n, k = w.shape
    if x.dim() != 1 or y.shape != (n,):
        raise ValueError(f"fused_gemv takes one row: x {tuple(x.shape)}, y {tuple(y.shape)}")
    bn, bk, warps = config
    _fused_gemv_kernel[(triton.cdiv(n, bn),)](
        x, w, y, residual if residual is not None else w, norm_weight if norm_weight is not None else w,
        scale if scale is not None else w, residual_out if residual_out is not None else w,
        n, k, float(eps), w.stride(0), PROLOGUE=prologue, HAS_RES=residual is not None,
        HAS_SCALE=scale is not None, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, **pdl_launch_args(x.device))
    return y


class LayerWeights:
    """One LM layer's projection and norm weights (on `dev`, bf16 by default), scaled to keep values O(1)."""

    def __init__(self, dev: torch.device, s: dict[str, int], g: torch.Generator,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        def w(n: int, k: int) -> torch.Tensor:
            return (torch.randn(n, k, generator=g) / k ** 0.5).to(dev, dtype)

        h = s["hidden"]
        self.qkv, self.o = w(s["qkv"], h), w(h, s["q_out"])
        self.gate_up, self.down = w(2 * s["inter"], h), w(h, s["inter"])
        self.norm1 = (1 + 0.1 * torch.randn(h, generator=g)).to(dev, dtype)
        self.norm2 = (1 + 0.1 * torch.randn(h, generator=g)).to(dev, dtype)
        self.scale = (1 + 0.1 * torch.randn(h, generator=g)).to(dev, dtype)


def unfused_layer(x: torch.Tensor, res: torch.Tensor, attn: torch.Tensor, lw: LayerWeights
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qkv, mlp output, residual) the way the engine runs a one-row layer today."""
    from kernels.fused_ops import add_rms_norm, silu_mul
    from kernels.linear import linear

    h, res = add_rms_norm(x, res, lw.norm1, 1e-5)
    qkv = linear(h, lw.qkv)
    o = linear(attn, lw.o)
    h2, res = add_rms_norm(o, res, lw.norm2, 1e-5, lw.scale)
    return qkv, linear(silu_mul(linear(h2, lw.gate_up)), lw.down), res


def fused_layer(config: tuple[int, int, int], x: torch.Tensor, res: torch.Tensor, attn: torch.Tensor, lw: LayerWeights
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same layer with the norms and SiLU·mul inside the projections (three launches fewer)."""
    from kernels.linear import linear

    dev, dt = x.device, x.dtype
    res1 = torch.empty_like(x)
    qkv = fused_gemv(x[0], lw.qkv, torch.empty(lw.qkv.shape[0], device=dev, dtype=dt), RMS_NORM, config,
                     residual=res[0], norm_weight=lw.norm1, residual_out=res1[0])
    o = linear(attn, lw.o)
    res2 = torch.empty_like(x)
    gu = fused_gemv(o[0], lw.gate_up, torch.empty(lw.gate_up.shape[0], device=dev, dtype=dt), RMS_NORM, config,
                    residual=res1[0], norm_weight=lw.norm2, scale=lw.scale, residual_out=res2[0])
    y = fused_gemv(gu, lw.down, torch.empty(lw.down.shape[0], device=dev, dtype=dt), SILU_MUL, config)
    return qkv[None], y[None], res2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=26)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from bench_kernels import copy_bandwidth
    from bench_skinny_gemm import cuda_for_experiment, finish_experiment, graph_us_per_call

    dev = cuda_for_experiment(log)
    if dev is None:
        return 2
    g = torch.Generator().manual_seed(0)
    layers = [LayerWeights(dev, LM_SHAPES, g) for _ in range(args.layers)]
    h = LM_SHAPES["hidden"]
    x0 = torch.randn(1, h, generator=g).to(dev, torch.bfloat16)
    r0 = torch.randn(1, h, generator=g).to(dev, torch.bfloat16)
    attn = torch.randn(1, LM_SHAPES["q_out"], generator=g).to(dev, torch.bfloat16)

    def chain(layer_fn):
        x, res = x0, r0
        for lw in layers:
            _, y, res = layer_fn(x, res, attn, lw)
            x = y
        return x, res

    want = chain(unfused_layer)
    failed = 0
    for config in CONFIGS:  # same layer outputs, to bf16 rounding of the norm's sum order
        got = chain(lambda x, r, a, lw, c=config: fused_layer(c, x, r, a, lw))
        err = max(((u.float() - v.float()).abs().max() / v.float().abs().max()).item() for u, v in zip(got, want))
        if err > 0.05:
            log.error("config %s: relative error %.3g against the unfused chain", config, err)
            failed += 1
    bytes_per_layer = sum(t.numel() * 2 for t in (layers[0].qkv, layers[0].o, layers[0].gate_up, layers[0].down))
    floor_ms = args.layers * bytes_per_layer / copy_bandwidth(dev) * 1e3
    unfused_ms = graph_us_per_call([lambda: chain(unfused_layer)]) / 1e3
    fused = {str(c): graph_us_per_call([lambda c=c: chain(lambda x, r, a, lw: fused_layer(c, x, r, a, lw))]) / 1e3
             for c in CONFIGS}
    best = min(fused, key=fused.get)
    log.info("%d layers: floor %.3f ms, unfused %.3f ms, fused best %.3f ms (config %s)", args.layers, floor_ms,
             unfused_ms, fused[best], best)
    result = {"gpu": torch.cuda.get_device_name(), "layers": args.layers, "floor_ms": floor_ms,
              "unfused_ms": unfused_ms, "fused_ms": fused, "best_config": best, "configs_wrong": failed}
    return finish_experiment(result, args.out, failed)


if __name__ == "__main__":
    sys.exit(main())
