"""Decode-step input embeddings: `out[i] = embed_table[token_ids[i]] + audio_buf[audio_rows[i]]`.

Voxtral-Realtime adds an audio embedding to the token embedding at every position, so each LM
step gathers one token row and one encoder-cache row per scheduled position and writes their sum
into the persistent `inputs_embeds` buffer that the CUDA graphs read. One kernel does both
gathers and the add, in place, without allocating or syncing (graph capturable).

Semantics (the Triton kernel and `gather_add_reference` are bitwise equal):
- `audio_rows[i] < 0`: no audio for this row, the audio term is +0.0;
- `token_ids[i] < 0`: padding row, `out[i] = 0` (nothing is read for it);
- otherwise `out[i] = cast(fp32(embed_table[token_ids[i]]) + fp32(audio_buf[audio_rows[i]]))`:
  the sum is taken in fp32 and rounded once to the output dtype (round-to-nearest-even), so the
  result does not depend on which implementation ran.
Indices must be in range (`token_ids < V`, `audio_rows < N`): the kernel cannot check them
without syncing; the reference raises on CPU.
"""

from __future__ import annotations

import torch

from ._dispatch import FLOAT_DTYPES, check_index_tensor, use_triton


def _check(out: torch.Tensor, token_ids: torch.Tensor, embed_table: torch.Tensor, audio_buf: torch.Tensor,
           audio_rows: torch.Tensor) -> None:
    if out.dim() != 2 or embed_table.dim() != 2 or audio_buf.dim() != 2:
        raise ValueError("out, embed_table and audio_buf must be 2-D [rows, hidden]")
    rows, hidden = out.shape
    if embed_table.shape[1] != hidden or audio_buf.shape[1] != hidden:
        raise ValueError(f"hidden sizes differ: out {hidden}, embed_table {embed_table.shape[1]}, "
                         f"audio_buf {audio_buf.shape[1]}")
    if out.dtype not in FLOAT_DTYPES or embed_table.dtype != out.dtype or audio_buf.dtype != out.dtype:
        raise TypeError(f"out/embed_table/audio_buf must share one of {FLOAT_DTYPES}, got "
                        f"{out.dtype}/{embed_table.dtype}/{audio_buf.dtype}")
    for name, t in (("embed_table", embed_table), ("audio_buf", audio_buf)):
        if t.device != out.device:
            raise ValueError(f"{name} is on {t.device}, out on {out.device}")
    check_index_tensor("token_ids", token_ids, rows, out.device)
    check_index_tensor("audio_rows", audio_rows, rows, out.device)


def gather_add_reference(out: torch.Tensor, token_ids: torch.Tensor, embed_table: torch.Tensor,
                         audio_buf: torch.Tensor, audio_rows: torch.Tensor) -> torch.Tensor:
    """Pure-torch definition of `gather_add_embeddings` (vectorised; writes `out` in place)."""
    _check(out, token_ids, embed_table, audio_buf, audio_rows)
    has_tok = token_ids >= 0
    emb = embed_table.index_select(0, token_ids.clamp(min=0)).float()
    if audio_buf.shape[0] > 0:
        has_audio = audio_rows >= 0
        aud = audio_buf.index_select(0, audio_rows.clamp(min=0)).float()
        # where(), not multiplication: a zero audio term must be +0.0 even if the row holds NaN/inf.
        aud = torch.where(has_audio[:, None], aud, 0.0)
    else:
        aud = torch.zeros_like(emb)
    total = torch.where(has_tok[:, None], emb + aud, 0.0)
    out.copy_(total.to(out.dtype))
    return out


def gather_add_embeddings(out: torch.Tensor, token_ids: torch.Tensor, embed_table: torch.Tensor,
                          audio_buf: torch.Tensor, audio_rows: torch.Tensor, *, backend: str = "auto"
                          ) -> torch.Tensor:
    """Write `embed_table[token_ids] + audio_buf[audio_rows]` into `out` [R, H] in place; returns `out`.

    token_ids, audio_rows: [R] int32/int64 on out's device (negative = padding row / no audio,
    see the module docstring). Rows of `out`/tables must have unit stride along hidden. The Triton
    path allocates nothing and never syncs, so it can be captured in a CUDA graph.
    """
    _check(out, token_ids, embed_table, audio_buf, audio_rows)
    if not use_triton(backend, out.device):
        return gather_add_reference(out, token_ids, embed_table, audio_buf, audio_rows)
    from ._gather_add_triton import launch_gather_add

    launch_gather_add(out, token_ids, embed_table, audio_buf, audio_rows)
    return out
