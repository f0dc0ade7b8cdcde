"""One-row decode projections with their neighbours fused in (the LM's batch-1 step).

At batch 1 an LM layer is a chain of dependent kernels that each pay a fixed cost of a few
microseconds (fill, drain, the wait for the previous kernel), so the number of kernels per layer sets
much of the step time. These four operations fold the element-wise kernels around a projection into
it, which takes an LM layer from 11 kernels (norm, qkv, RoPE, KV write, attention, split combine, o,
norm, gate/up, SiLU·mul, down) to 6 (8 as the engine runs it by default: `fused_gate_up`):

- `norm_qkv_rope_kv(h, ...)`: q = RoPE(Wq a), and RoPE(Wk a), Wv a written into their paged-cache
  slot, for a = nw * rms_norm(h);
- `linear_residual(x, w, residual)`: residual + W x (o and down projections; the residual stream);
- `norm_gate_up_silu(h, ...)`: silu(Wg a) * (Wu a) for a = nw * rms_norm(h) * scale;
- `norm_linear(h, nw, eps, w)`: W a for a = nw * rms_norm(h) (final norm + LM head).

Every input row is 1-D ([K]); weights are [N, K] with unit stride along K and no bias. Each
reference reproduces the unfused kernels' rounding exactly (they are composed of the
`fused_ops` references and `F.linear`), so on the CPU the fused decode path gives the unfused
path's results bit for bit. The Triton kernel (`_one_row_triton.py`) has two modes per operation:
- FMA (dot = 0): products reduced in another order than the multi-row projection, so on the GPU the
  results agree with the multi-row path to the dtype's rounding, and a near-tie at batch 1 can resolve
  otherwise than in a batch;
- tensor cores (dot = 1, 16-bit dtypes): the projection's sums are `kernels.linear`'s for the same row, bit
  for bit (measured on an H200 at the full-size shapes for every configuration swept, and in the GPU tests);
  the norm, RoPE and residual epilogues too; the SiLU·mul epilogue rounds a few outputs one step apart from
  the separate silu_mul kernel.

`backend="auto"` runs Triton on CUDA tensors (any float dtype: the engine chooses this path for fp16/bf16
only, and fp32 runs make the GPU tests exact; fp32 never takes the tensor cores, which would round to TF32)
and the reference elsewhere. The launch configurations (`CONFIGS`; STREAMSCRIBE_ONE_ROW_CONFIGS overrides
them) come from `benchmarks/bench_one_row.py`'s sweeps and the B1 engine benchmark on an H200: FMA for the
layers, tensor cores for the LM head.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F

from ._dispatch import use_triton
from .fused_ops import add_rms_norm_reference, rope_reference
from .paged_attention import write_kv_reference

# (BLOCK_N, BLOCK_K, warps, pipeline stages, dot) per operation; BLOCK_N counts outputs (pairs of rows for the
# paired ones); dot = 1 multiplies on the tensor cores (the kernel's docstring), and BLOCK_K = 0 there takes
# `linear`'s K tile for the weight, so that the sums are the multi-row kernel's bit for bit.
# FMA_FALLBACK: the fastest dot = 0 configurations of `benchmarks/bench_one_row.py`'s sweep on one H200
# (twenty-fifth session, docs/benchmarks.md; wide K tiles in plain loads beat the cp.async pipeline), and what an
# operation falls back to where a tensor-core configuration cannot run: those need 16-bit inputs and 16 outputs
# per program inside one paired group
FMA_FALLBACK: dict[str, tuple[int, int, int, int, int]] = {
    "qkv": (4, 512, 2, 1, 0),
    "residual": (8, 1024, 4, 1, 0),
    "gate_up": (8, 512, 4, 1, 0),
    "head": (16, 256, 8, 1, 0),
}
# the defaults: FMA everywhere but the LM head, whose norm + projection in tensor-core mode (BLOCK_K 0: bit for bit
# the multi-row path) took 184 us against 217 us alone and the full-size B1 step from 3.185 to 3.127 ms; in the
# layers, tensor cores were slower for o and down, and a layer mixing both kinds lost what gate/up would save
# (twenty-sixth session, docs/benchmarks.md)
CONFIGS: dict[str, tuple[int, int, int, int, int]] = {**FMA_FALLBACK, "head": (64, 0, 2, 3, 1)}


def _takes_kernel(backend: str, *tensors: torch.Tensor) -> bool:
    if not use_triton(backend, tensors[0].device):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def launch_configs() -> dict[str, tuple[int, int, int, int, int]]:
    """CONFIGS, updated with the JSON object in STREAMSCRIBE_ONE_ROW_CONFIGS (benchmarks try others; read at
    launch, so at graph capture)."""
    text = os.environ.get("STREAMSCRIBE_ONE_ROW_CONFIGS")
    if not text:
        return CONFIGS
    try:
        given = {k: tuple(int(x) for x in v) for k, v in json.loads(text).items()}
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"STREAMSCRIBE_ONE_ROW_CONFIGS must be a JSON object of [BLOCK_N, BLOCK_K, warps, stages, "
                         f"dot], got {text!r}") from e
    bad = [k for k, v in given.items() if k not in CONFIGS or len(v) != 5 or min(v[0], v[2], v[3]) < 1 or v[1] < 0
           or v[4] not in (0, 1) or (v[4] and v[0] < 16) or (v[1] == 0 and not v[4])]
    if bad:
        raise ValueError(f"STREAMSCRIBE_ONE_ROW_CONFIGS: unknown operations or bad configs {bad}")
    return {**CONFIGS, **given}


def _config(key: str, w: torch.Tensor, half: int = 1) -> tuple[int, int, int, int, int]:
    """The configuration `key` launches with for weight `w`; paired programs (`half` > 1) must stay inside one
    group of rows: the largest BLOCK_N <= the tuned one dividing `half`."""
    config = launch_configs()[key]
    if config[4] and (w.dtype not in (torch.float16, torch.bfloat16) or (half > 1 and half % 16)):
        config = FMA_FALLBACK[key]  # fp32 would multiply in TF32 on the tensor cores; tiles need 16 outputs
    if config[4] and config[1] == 0:
        from ._linear_triton import config_for

        config = (config[0], config_for(w.shape[0], w.shape[1])[1], *config[2:])
    bn = config[0]
    while half > 1 and bn > 1 and half % bn:
        bn //= 2
    return (bn, *config[1:])


def fused_gate_up() -> bool:
    """Whether the one-row LM path takes `norm_gate_up_silu` (STREAMSCRIBE_ONE_ROW_GATE_UP=1) or, by default,
    the unfused layer's norm, projection and SiLU·mul kernels for the MLP (read at launch, so at graph
    capture). On an H200 the fused gate/up ran at 1.6x its bytes against the tensor-core projection's 1.1x,
    more than the two kernels it saves (docs/benchmarks.md, twenty-fifth session); in tensor-core mode it ran at
    1.14x alone but made the layer slower beside the FMA kernels (twenty-sixth session)."""
    return os.environ.get("STREAMSCRIBE_ONE_ROW_GATE_UP", "0") == "1"


def _check(name: str, h: torch.Tensor, w: torch.Tensor, rows: int | None = None) -> None:
    if h.dim() != 1:
        raise ValueError(f"{name}: one input row [K] expected, got {tuple(h.shape)}")
    if w.dim() != 2 or w.shape[1] != h.shape[0] or w.stride(1) != 1:
        raise ValueError(f"{name}: weight must be [N, {h.shape[0]}] with unit stride along K, got {tuple(w.shape)}")
    if rows is not None and w.shape[0] != rows:
        raise ValueError(f"{name}: weight must have {rows} rows, got {w.shape[0]}")
    if w.dtype != h.dtype or w.device != h.device:
        raise TypeError(f"{name}: input {h.dtype} on {h.device}, weight {w.dtype} on {w.device}")


def _contiguous_row(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _normed(h: torch.Tensor, norm_weight: torch.Tensor, eps: float, scale: torch.Tensor | None = None
            ) -> torch.Tensor:
    return add_rms_norm_reference(h, None, norm_weight, eps, scale)[0]


# ---------------------------------------------------------------------------------------------
# the four operations
# ---------------------------------------------------------------------------------------------
def norm_qkv_rope_kv(h: torch.Tensor, norm_weight: torch.Tensor, eps: float, w_qkv: torch.Tensor,
                     cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slot: torch.Tensor, num_heads: int, num_kv_heads: int, *, backend: str = "auto") -> torch.Tensor:
    """q [num_heads, D] of a = nw * rms_norm(h); k and v (k with RoPE) stored at cache slot `slot` ([1] int64,
    `physical_block * block_size + offset`; negative: not stored). cos/sin [D]: this row's RoPE tables
    (rotate_half convention). The caches are [num_blocks, block_size, num_kv_heads, D]."""
    d = k_cache.shape[-1]
    _check("norm_qkv_rope_kv", h, w_qkv, (num_heads + 2 * num_kv_heads) * d)
    if k_cache.shape != v_cache.shape or k_cache.shape[2] != num_kv_heads or d % 2:
        raise ValueError(f"norm_qkv_rope_kv: caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not fit "
                         f"{num_kv_heads} kv heads of an even head_dim")
    if cos.shape != (d,) or sin.shape != (d,) or slot.shape != (1,):
        raise ValueError(f"norm_qkv_rope_kv: cos/sin must be [{d}] and slot [1], got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)}, {tuple(slot.shape)}")
    if not _takes_kernel(backend, h, w_qkv, norm_weight):
        qkv = F.linear(_normed(h, norm_weight, eps), w_qkv)
        nq, nk = num_heads * d, num_kv_heads * d
        q = qkv[:nq].view(1, num_heads, d)
        k = qkv[nq:nq + nk].view(1, num_kv_heads, d)
        v = qkv[nq + nk:].view(1, num_kv_heads, d)
        q, k = rope_reference(q, cos[None], sin[None]), rope_reference(k, cos[None], sin[None])
        write_kv_reference(k_cache, v_cache, k, v, slot)
        return q[0]
    from ._one_row_triton import EPI_ROPE_KV, launch

    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("norm_qkv_rope_kv: the caches need one layout with unit stride along head_dim")
    q = torch.empty(num_heads, d, device=h.device, dtype=h.dtype)
    launch(_contiguous_row(h), w_qkv, q, epilogue=EPI_ROPE_KV, config=_config("qkv", w_qkv, d // 2),
           norm_weight=norm_weight, eps=eps, half=d // 2, cos=_contiguous_row(cos), sin=_contiguous_row(sin),
           k_cache=k_cache, v_cache=v_cache, slot=slot, heads=(num_heads, num_kv_heads))
    return q


def linear_residual(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, *, backend: str = "auto"
                    ) -> torch.Tensor:
    """residual + W x, with W x rounded to the dtype before the sum (as projection, then residual add)."""
    _check("linear_residual", x, w)
    if residual.shape != (w.shape[0],) or residual.dtype != x.dtype:
        raise ValueError(f"linear_residual: residual must be [{w.shape[0]}] {x.dtype}, got "
                         f"{tuple(residual.shape)} {residual.dtype}")
    if not _takes_kernel(backend, x, w, residual):
        return F.linear(x, w) + residual
    from ._one_row_triton import EPI_RESIDUAL, launch

    out = torch.empty_like(residual)
    launch(_contiguous_row(x), w, out, epilogue=EPI_RESIDUAL, config=_config("residual", w),
           residual=_contiguous_row(residual))
    return out


def norm_gate_up_silu(h: torch.Tensor, norm_weight: torch.Tensor, eps: float, scale: torch.Tensor | None,
                      w_gate_up: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """silu(gate) * up of W_gate_up a ([2I, K], gate rows first), a = nw * rms_norm(h) [* scale] -> [I]."""
    _check("norm_gate_up_silu", h, w_gate_up)
    inter = w_gate_up.shape[0] // 2
    if w_gate_up.shape[0] % 2:
        raise ValueError(f"norm_gate_up_silu: gate/up weight needs an even row count, got {w_gate_up.shape[0]}")
    if not _takes_kernel(backend, h, w_gate_up, norm_weight):
        gu = F.linear(_normed(h, norm_weight, eps, scale), w_gate_up)
        return F.silu(gu[:inter]) * gu[inter:]
    from ._one_row_triton import EPI_SILU_MUL, launch

    out = torch.empty(inter, device=h.device, dtype=h.dtype)
    launch(_contiguous_row(h), w_gate_up, out, epilogue=EPI_SILU_MUL,
           config=_config("gate_up", w_gate_up, inter),
           norm_weight=norm_weight, eps=eps, scale=None if scale is None else _contiguous_row(scale), half=inter)
    return out


def norm_linear(h: torch.Tensor, norm_weight: torch.Tensor, eps: float, w: torch.Tensor, *, backend: str = "auto"
                ) -> torch.Tensor:
    """W a for a = nw * rms_norm(h) (the final norm and the LM head)."""
    _check("norm_linear", h, w)
    if not _takes_kernel(backend, h, w, norm_weight):
        return F.linear(_normed(h, norm_weight, eps), w)
    from ._one_row_triton import EPI_STORE, launch

    out = torch.empty(w.shape[0], device=h.device, dtype=h.dtype)
    launch(_contiguous_row(h), w, out, epilogue=EPI_STORE, config=_config("head", w), norm_weight=norm_weight,
           eps=eps)
    return out
