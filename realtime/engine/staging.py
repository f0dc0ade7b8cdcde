"""Step metadata for graph replays: many small index buffers filled with one host-to-device copy.

A speculative step needs ~20 index vectors (positions, slot mappings, cache rows, block tables...)
at fixed device addresses. Writing each with its own copy or computing it with small device ops
costs a kernel launch apiece, which at batch 1 is a visible share of the step. Here the buffers
are views into one flat device tensor per dtype; the host fills the matching views of a (pinned)
staging tensor with numpy, starting from a template that holds every buffer's padding value, and
one non-blocking copy per dtype moves it all. An event guards the staging tensor: it is not
rewritten before the previous copy out of it has finished.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Field:
    shape: tuple[int, ...]
    dtype: torch.dtype  # torch.int32 or torch.int64
    fill: int  # the padding value every step starts from


class StepMetadata:
    def __init__(self, fields: dict[str, Field], device: torch.device) -> None:
        self.device = device
        self.dev: dict[str, torch.Tensor] = {}  # fixed-address device views (what the graphs read)
        self.host: dict[str, np.ndarray] = {}  # the matching numpy views of the staging tensors
        self._groups: list[tuple[torch.Tensor, torch.Tensor, np.ndarray]] = []  # (device, staging, template)
        pinned = device.type == "cuda"
        for dtype in (torch.int64, torch.int32):
            names = [n for n, f in fields.items() if f.dtype == dtype]
            if not names:
                continue
            sizes = [int(np.prod(fields[n].shape)) for n in names]
            total = sum(sizes)
            dev = torch.empty(total, dtype=dtype, device=device)
            staging = torch.empty(total, dtype=dtype, pin_memory=pinned)
            template = np.empty(total, dtype=np.int64 if dtype == torch.int64 else np.int32)
            flat = staging.numpy()
            off = 0
            for n, size in zip(names, sizes):
                f = fields[n]
                template[off: off + size] = f.fill
                self.dev[n] = dev[off: off + size].view(f.shape)
                self.host[n] = flat[off: off + size].reshape(f.shape)
                off += size
            self._groups.append((dev, staging, template))
        self._event = torch.cuda.Event() if device.type == "cuda" else None
        self._pending = False
        self.begin()
        self.upload()

    def begin(self) -> dict[str, np.ndarray]:
        """Start a step: wait until the last upload has left the staging memory, reset to padding."""
        if self._event is not None and self._pending:
            self._event.synchronize()
        for _, staging, template in self._groups:
            np.copyto(staging.numpy(), template)
        return self.host

    def upload(self) -> None:
        for dev, staging, _ in self._groups:
            dev.copy_(staging, non_blocking=True)
        if self._event is not None:
            self._event.record()
            self._pending = True
