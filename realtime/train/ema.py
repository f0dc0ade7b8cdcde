"""An exponential moving average of a model's weights during training (imports torch only).

Why: every run since the ninth session ended worse on the held-out voices than the average of its
weights with its starting point (the "soups" of `realtime.train.soup`): the last steps fit the
training speakers. An average along the run's own path is the same idea taken over all of its
steps. It starts at the weights the run starts from (a warm start's included), so with decay `d`
after `n` steps the start still weighs `d ** n` (0.999 ** 2000 = 13.5%).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class WeightAverage:
    """`avg <- decay * avg + (1 - decay) * weight` after every optimizer step, kept in fp32 on the
    model's device for every floating-point parameter (buffers are not trained, so not averaged)."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"weight-average decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.names = [n for n, p in model.named_parameters() if p.is_floating_point()]
        self.avg = [p.detach().float().clone() for n, p in model.named_parameters() if p.is_floating_point()]

    def _params(self, model: torch.nn.Module) -> list[torch.Tensor]:
        params = dict(model.named_parameters())
        return [params[n] for n in self.names]

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        current = [p.detach().float() for p in self._params(model)]
        torch._foreach_lerp_(self.avg, current, 1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.avg, strict=True))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if sorted(state) != sorted(self.names):
            raise ValueError("weight-average state holds other parameters than the model")
        for a, n in zip(self.avg, self.names, strict=True):
            a.copy_(state[n])

    @contextmanager
    @torch.no_grad()
    def swapped_into(self, model: torch.nn.Module) -> Iterator[None]:
        """The model holds the averaged weights inside the block (to validate or export them) and
        its own weights again after it, bit for bit."""
        params = self._params(model)
        saved = [p.detach().clone() for p in params]
        for p, a in zip(params, self.avg, strict=True):
            p.copy_(a)
        try:
            yield
        finally:
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)
