"""Attention backends for one stream or a dense batch (the batched engine has its paged one).

Semantics shared by all backends (and by transformers): a query at position p attends to keys at
positions k with `p - window < k <= p`; no window means plain causal attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Boolean [B, Tq, Tk] mask (True = attend) from query/key positions [B, Tq] / [B, Tk]."""
    diff = q_pos[:, :, None] - k_pos[:, None, :]
    allowed = diff >= 0
    if window is not None:
        allowed &= diff < window
    return allowed


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D], mask [B, Tq, Tk] -> [B, Tq, Hq, D]."""
    rep = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2)
    kh = k.transpose(1, 2).repeat_interleave(rep, dim=1) if rep > 1 else k.transpose(1, 2)
    vh = v.transpose(1, 2).repeat_interleave(rep, dim=1) if rep > 1 else v.transpose(1, 2)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[:, None, :, :], scale=q.shape[-1] ** -0.5)
    return out.transpose(1, 2)


class DenseAttention:
    """No cache: every call sees all keys of the call (training, offline parity checks)."""

    def __init__(self, positions: torch.Tensor, window: int | None) -> None:
        self.mask = window_mask(positions, positions, window)

    @classmethod
    def with_mask(cls, mask: torch.Tensor) -> DenseAttention:
        """Attention under an explicit boolean [B or 1, Tq, Tk] mask (rows that are not one causal sequence)."""
        self = cls.__new__(cls)
        self.mask = mask
        return self

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return masked_attention(q, k, v, self.mask)


class SlidingWindowCache:
    """Per-layer key/value cache holding only the `window - 1` newest positions.

    Call `begin(positions)` before each forward with the positions of the new tokens; memory stays
    bounded by the window whatever the stream length.
    """

    def __init__(self, num_layers: int, window: int | None) -> None:
        self.window = window
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers
        self.pos: torch.Tensor | None = None
        self._new_pos: torch.Tensor | None = None
        self._all_pos: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None

    def begin(self, positions: torch.Tensor) -> None:
        self._new_pos = positions
        self._all_pos = positions if self.pos is None else torch.cat([self.pos, positions], dim=1)
        self._mask = window_mask(positions, self._all_pos, self.window)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self._mask is not None, "begin() must be called before a forward"
        past_k, past_v = self.k[layer], self.v[layer]
        k_all = k if past_k is None else torch.cat([past_k, k], dim=1)
        v_all = v if past_v is None else torch.cat([past_v, v], dim=1)
        out = masked_attention(q, k_all, v_all, self._mask)
        keep = k_all.shape[1] if self.window is None else min(k_all.shape[1], self.window - 1)
        self.k[layer], self.v[layer] = k_all[:, k_all.shape[1] - keep:], v_all[:, v_all.shape[1] - keep:]
        if layer == len(self.k) - 1:
            assert self._all_pos is not None
            self.pos = self._all_pos[:, self._all_pos.shape[1] - keep:]
        return out

    def num_cached(self) -> int:
        return 0 if self.pos is None else self.pos.shape[1]
