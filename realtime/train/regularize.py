"""Training-only dropout on the residual branches of a `VoxtralRealtime` (imports torch only); the
same hooks regularise the Eagle drafter's layers (`speculative.train --dropout`).

Why: the model fits its ~37 training speakers and stops generalising to new ones within 500-1000
steps of a continuation (the held-out validation loss turns up while the training loss still falls;
model card, twelfth and thirteenth sessions). Dropout on every sublayer's output (Vaswani et al.
2017's residual dropout) is the standard regulariser for that, and the architecture has none.

It is added with forward hooks, so the serving model (`realtime.model`) carries no training code
and its outputs are untouched: a hook drops only while its module is in training mode
(`model.eval()`, as validation and export use, turns every hook into the identity).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch.utils.hooks import RemovableHandle

from ..model import Attention, SwiGLU, VoxtralRealtime


def check_dropout(p: float) -> float:
    """`p` if it is a dropout probability, in [0, 1); a clear error otherwise (also for NaN)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {p}")
    return p


def add_residual_dropout(model: VoxtralRealtime, p: float) -> list[RemovableHandle]:
    """Drop each attention and MLP output of every encoder and LM layer with probability `p` while
    training (inverted dropout: kept values are scaled by 1 / (1 - p)). Returns the hooks' handles
    (`handle.remove()` takes one off); `p` = 0 adds none."""
    return add_sublayer_dropout([*model.audio_tower.layers, *model.language_model.layers], p)


def add_sublayer_dropout(layers: Iterable[torch.nn.Module], p: float, *,
                         generator: torch.Generator | None = None) -> list[RemovableHandle]:
    """The same on any decoder layers with `self_attn` and `mlp` sublayers (the Eagle drafter's too).
    `generator` (on the layers' device) draws the masks instead of torch's global generator, so a
    trainer that saves its state can resume with the same masks."""
    if check_dropout(p) == 0.0:
        return []

    def drop(module: torch.nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        if generator is None or not module.training:
            return F.dropout(output, p, training=module.training)
        keep = torch.rand(output.shape, generator=generator, device=output.device) >= p
        return output * keep.to(output.dtype) / (1.0 - p)

    handles = []
    for layer in layers:
        for sub in (layer.self_attn, layer.mlp):
            if not isinstance(sub, (Attention, SwiGLU)):
                raise TypeError(f"unexpected sublayer {type(sub).__name__}")
            handles.append(sub.register_forward_hook(drop))
    return handles
