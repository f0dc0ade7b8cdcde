"""Fused element-wise ops of the transformer layers (Triton on CUDA, torch reference elsewhere).

At batch 1 a decode step is thousands of tiny kernels, and each costs a few microseconds even when
replayed from a CUDA graph; fusing the element-wise chains cuts the count per layer from ~45 to ~11.
Each reference reproduces the eager model's rounding order exactly (sum in the tensor dtype,
normalise in fp32, cast, scale), so results match the unfused network bit for bit on CPU.

- `add_rms_norm(x, residual, weight, eps, scale=None)` -> (y, new_residual):
  new_residual = x + residual (or x); y = weight * rms_norm(new_residual) [* scale].
- `rope_(q, k, cos, sin)`: rotate_half RoPE applied in place to q [T, Hq, D] and k [T, Hkv, D].
- `silu_mul(gate_up)`: silu(gate) * up for gate_up = [..., 2I] (gate first).
- `rope_write_kv(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)` -> rotated q: `rope` whose rotated keys and
  the values go straight to their paged-cache slots (`paged_attention.write_kv`), one launch instead of two.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ._dispatch import use_triton
from .paged_attention import check_write, write_kv


# ---------------------------------------------------------------------------------------------
# references (also the CPU implementation)
# ---------------------------------------------------------------------------------------------
def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                           scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    h = x if residual is None else x + residual
    h32 = h.float()
    y = (h32 * torch.rsqrt(h32.square().mean(-1, keepdim=True) + eps)).to(h.dtype)
    y = weight * y
    if scale is not None:
        y = y * scale
    return y, h


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, H, D]; cos/sin [..., T, D]."""
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return x * c + _rotate_half(x) * s


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


# ---------------------------------------------------------------------------------------------
# dispatchers
# ---------------------------------------------------------------------------------------------
def _needs_autograd(*tensors: torch.Tensor | None) -> bool:
    """The Triton kernels have no backward: training must take the (differentiable) references."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 scale: torch.Tensor | None = None, *, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(backend, x.device) or x.shape[-1] > 16384 or _needs_autograd(x, residual, weight, scale):
        return add_rms_norm_reference(x, residual, weight, eps, scale)
    from ._fused_triton import launch_add_rms_norm

    return launch_add_rms_norm(x, residual, weight, eps, scale)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backend: str = "auto"
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q [B, T, Hq, D] and k [B, T, Hkv, D] with cos/sin [B, T, D]; returns new tensors."""
    if not use_triton(backend, q.device) or _needs_autograd(q, k, cos, sin):
        return rope_reference(q, cos, sin), rope_reference(k, cos, sin)
    from ._fused_triton import launch_rope

    return launch_rope(q, k, cos, sin)


def rope_write_kv_enabled() -> bool:
    """Whether the model's attention rotates and writes the keys in one launch (`rope_write_kv`) where its backend
    names the cache slots (`realtime.model.SupportsFusedKVWrite`): the default since the fifty-seventh session
    (the same bits; on an H100 the batch-1 encoder chain 3.1-3.4% faster, B1 0.3%); STREAMSCRIBE_ROPE_KV=0 turns it
    off (read at every call, so at graph capture)."""
    return os.environ.get("STREAMSCRIBE_ROPE_KV", "1") != "0"


def rope_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, *, backend: str = "auto"
                  ) -> torch.Tensor:
    """RoPE on q [B, T, Hq, D] and k [B, T, Hkv, D] (cos/sin [B, T, D]); the rotated keys and the values
    v [B, T, Hkv, D] are stored at `slot_mapping` [B*T] of the paged cache (`paged_attention.write_kv`: slot < 0
    skipped). Returns the rotated q. The same numbers as `rope` followed by `write_kv`."""
    b, t, hkv, d = k.shape
    if v.shape != k.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != d:
        raise ValueError(f"rope_write_kv: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not agree")
    flat = lambda x: x.reshape(b * t, hkv, d)  # noqa: E731
    if not use_triton(backend, q.device) or _needs_autograd(q, k, v, cos, sin):
        q_rot, k_rot = rope(q, k, cos, sin, backend="torch")
        write_kv(k_cache, v_cache, flat(k_rot), flat(v), slot_mapping, backend="torch")
        return q_rot
    check_write(k_cache, v_cache, flat(k), flat(v), slot_mapping)
    from ._fused_triton import launch_rope_write_kv

    return launch_rope_write_kv(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)


def silu_mul(gate_up: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    if not use_triton(backend, gate_up.device) or _needs_autograd(gate_up):
        return silu_mul_reference(gate_up)
    from ._fused_triton import launch_silu_mul

    return launch_silu_mul(gate_up)
