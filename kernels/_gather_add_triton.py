"""Triton kernel of `gather_add_embeddings` (see gather_add.py for the semantics)."""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ._dispatch import pdl_launch_args
from ._pdl_triton import pdl_prologue


@triton.jit
def gather_add_kernel(out_ptr, tok_ptr, emb_ptr, aud_ptr, arow_ptr, hidden, stride_out, stride_emb, stride_aud,
                      stride_tok, stride_arow, BLOCK_H: tl.constexpr, USE_GDC: tl.constexpr):
    """One program per (row, BLOCK_H slice of hidden): two row gathers, an fp32 add, one store."""
    pdl_prologue(USE_GDC)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_row = cols < hidden
    tok = tl.load(tok_ptr + row * stride_tok).to(tl.int64)
    arow = tl.load(arow_ptr + row * stride_arow).to(tl.int64)
    has_tok = tok >= 0
    has_audio = has_tok & (arow >= 0)
    emb = tl.load(emb_ptr + tok * stride_emb + cols, mask=in_row & has_tok, other=0.0).to(tl.float32)
    aud = tl.load(aud_ptr + arow * stride_aud + cols, mask=in_row & has_audio, other=0.0).to(tl.float32)
    total = tl.where(has_tok, emb + aud, 0.0)
    tl.store(out_ptr + row.to(tl.int64) * stride_out + cols, total.to(out_ptr.dtype.element_ty), mask=in_row)


def launch_gather_add(out: torch.Tensor, token_ids: torch.Tensor, embed_table: torch.Tensor,
                      audio_buf: torch.Tensor, audio_rows: torch.Tensor) -> None:
    """Launch on already-validated tensors (shape checks only; graph capturable)."""
    rows, hidden = out.shape
    for name, t in (("out", out), ("embed_table", embed_table), ("audio_buf", audio_buf)):
        if t.shape[0] > 0 and t.stride(1) != 1:
            raise ValueError(f"{name} must have unit stride along hidden")
    if rows == 0:
        return
    block_h = min(1024, triton.next_power_of_2(hidden))
    grid = (rows, triton.cdiv(hidden, block_h))
    # An empty audio_buf still needs a valid pointer; no row reads it (every audio_rows is < 0).
    aud = audio_buf if audio_buf.shape[0] > 0 else embed_table
    stride_aud = audio_buf.stride(0) if audio_buf.shape[0] > 0 else 0
    with torch.cuda.device(out.device) if out.is_cuda else contextlib.nullcontext():
        gather_add_kernel[grid](out, token_ids, embed_table, aud, audio_rows, hidden, out.stride(0),
                                embed_table.stride(0), stride_aud, token_ids.stride(0), audio_rows.stride(0),
                                BLOCK_H=block_h, num_warps=4, **pdl_launch_args(out.device))
