"""`linear`: y = x @ weight.T + bias, with a one-launch Triton kernel for a few rows on the GPU.

At batch 1 every projection of a step multiplies 1 row (LM) or 4 rows (encoder: the frames of one
token) by a weight matrix: the time is the weight bytes plus a fixed cost per launch, and the step is a
chain of ~300 dependent launches. The Triton kernel (`_linear_triton.py`) requests its first weight
tile before waiting on the previous kernel (programmatic dependent launch, `_dispatch.pdl_enabled`),
which a cuBLAS launch cannot do. (Norm or SiLU·mul folded into the kernel's prologue were measured
and were slower: docs/benchmarks.md, twenty-third session.)

Larger row counts, fp32, training and the CPU take `F.linear` (the reference).
STREAMSCRIBE_SKINNY_ROWS (default 16, at most 16) is the largest row count sent to the Triton kernel;
0 sends everything to `F.linear` (benchmarks A/B it). A caller may send more rows, up to `max_rows`
(the audio encoder: `INVARIANT_ROWS`): the kernel takes them in 16-row tiles computed alike, so each row's
result is the one it gets alone, bit for bit, which cuBLAS does not promise across row counts. That is what
lets the encoder take 8 audio tokens of look-ahead in one call and produce what 8 one-token calls do
(lossless speculation in bf16, issue 5). Projections whose output blocks leave SMs idle cut their K
loop into ranges summed by a second small kernel (`_linear_triton.split_k_for`; STREAMSCRIBE_SPLIT_K=0: never).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from ._dispatch import env_int, use_triton

MAX_ROWS = 16  # the kernel pads rows to one 16-row tensor-core tile
# rows a batch-invariant caller (the audio encoder) sends to the kernel: its conv stem at a look-ahead chunk of
# 8 audio tokens (64 mel frames), its layers at 8 tokens of 4 frames (32 rows), or 16 streams of one token
INVARIANT_ROWS = 64
# the most rows a batch-invariant caller may ask for: the encoder's conv stem at a look-ahead chunk of 32 audio
# tokens (256 mel frames), which a chain of speculative rounds encodes in one call (`SpeculativeConfig.chunk`)
MAX_INVARIANT_ROWS = 256


def invariant_rows_limit() -> int:
    """The most rows a call's `max_rows` may send to the kernel: MAX_INVARIANT_ROWS, or STREAMSCRIBE_INVARIANT_ROWS
    (16..256; 16: more than 16 rows take `F.linear` again, the encoder's projections before the twenty-eighth
    session, for A/B runs of batches of 5-16 streams; read at each call, so at graph capture)."""
    return env_int("STREAMSCRIBE_INVARIANT_ROWS", MAX_INVARIANT_ROWS, MAX_ROWS, MAX_INVARIANT_ROWS,
                   f"an integer in {MAX_ROWS}..{MAX_INVARIANT_ROWS}")


def skinny_rows_limit() -> int:
    value = os.environ.get("STREAMSCRIBE_SKINNY_ROWS", str(MAX_ROWS))
    try:
        return max(0, min(MAX_ROWS, int(value)))
    except ValueError:
        raise ValueError(f"STREAMSCRIBE_SKINNY_ROWS must be an integer (0..{MAX_ROWS}), got {value!r}") from None


def kernel_rows(max_rows: int) -> int:
    """The most rows a call with this `max_rows` sends to the kernel. A plain caller (max_rows <= 16): the
    STREAMSCRIBE_SKINNY_ROWS limit. A batch-invariant caller: its max_rows, capped by STREAMSCRIBE_INVARIANT_ROWS,
    and never below the plain limit. STREAMSCRIBE_SKINNY_ROWS=0 sends everything to `F.linear`."""
    limit = skinny_rows_limit()
    if not limit or max_rows <= MAX_ROWS:
        return min(limit, max_rows)
    return max(limit, min(max_rows, invariant_rows_limit()))


def _takes_kernel(backend: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  max_rows: int) -> bool:
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    tensors = (x, weight, bias)
    return (use_triton(backend, x.device) and x.dtype in (torch.float16, torch.bfloat16)
            and 0 < rows <= kernel_rows(max_rows)
            and all(t is None or (t.dtype == x.dtype and t.stride(-1) == 1) for t in tensors[1:])
            and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)))


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[rows, width] with unit stride along width (a view when possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           backend: str = "auto", max_rows: int = MAX_ROWS) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T (+ bias [N]) -> [..., N] in x's dtype, accumulated in fp32.
    max_rows: up to this many rows take the Triton kernel (row by row the same result at any count up to it);
    more take `F.linear`."""
    if not _takes_kernel(backend, x, weight, bias, max_rows):
        return F.linear(x, weight, bias)
    k = x.shape[-1]
    if weight.shape[-1] != k or (bias is not None and bias.shape != weight.shape[:1]):
        raise ValueError(f"linear: input width {k}, weight {tuple(weight.shape)}, "
                         f"bias {None if bias is None else tuple(bias.shape)}")
    from ._linear_triton import launch_linear

    x2 = _rows(x)
    y = torch.empty(x2.shape[0], weight.shape[0], device=x.device, dtype=x.dtype)
    launch_linear(x2, weight, bias, y, splits=split_k(weight.shape[0], k, x.device))
    return y.view(*x.shape[:-1], weight.shape[0])


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def split_k(n: int, k: int, device: torch.device) -> int:
    """K ranges for the kernel (`_linear_triton.split_k_for`): by the shape and the GPU's SM count (so the same
    at capture and replay), 1 off CUDA or with STREAMSCRIBE_SPLIT_K=0 (benchmarks A/B it)."""
    if device.type != "cuda" or os.environ.get("STREAMSCRIBE_SPLIT_K", "1") == "0":
        return 1
    from ._linear_triton import split_k_for

    return split_k_for(n, k, _sm_count(device.index if device.index is not None else torch.cuda.current_device()))
