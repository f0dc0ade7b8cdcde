"""Triton kernels of `round_layout` and `round_accept` (see spec_round.py for the semantics): one program each."""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .spec_round import RoundConstants, RoundLayout


@triton.jit
def _kv_slots(tables, slot, q, block, width, table_stride, mask):
    b = tl.load(tables + slot * table_stride + (q // block) % width, mask=mask, other=0).to(tl.int64)
    return b * block + q % block


@triton.jit
def round_layout_kernel(state, tokens, d_tables, lm_tables,
                        c_tok, c_hid, c_slot, c_pos, c_dly, c_aud, c_last,
                        dr_pos, dr_slot, dr_aud, dr_stride,
                        v_tok, v_src, v_aud, v_slot, v_stash, v_pos, v_dly,
                        K, RING, CROWS, CHAIN, STASH, AROWS, PAD_STASH, ZERO_STASH, PAD_AUDIO, MASK_TOK, MIN_BUF,
                        D_BS, D_W, D_TS, LM_BS, LM_W, LM_TS,
                        PARALLEL: tl.constexpr, HAS_AUD: tl.constexpr, HAS_DR_AUD: tl.constexpr,
                        BLOCK: tl.constexpr):
    p = tl.load(state + 0)
    prev = tl.load(state + 1)
    last = tl.load(state + 2)
    slot = tl.load(state + 3)
    dly = tl.load(state + 4)
    ks = tl.where(last - p + 1 >= MIN_BUF, tl.minimum(tl.maximum(last - p, 0), K), 0)
    j = tl.arange(0, BLOCK).to(tl.int64)
    # catch-up rows
    n_acc = p - prev
    if PARALLEL:
        n_mask = tl.maximum(ks - 1, 0)
        other_tok = MASK_TOK
    else:
        n_mask = ks * 0
        other_tok = -1
    rows = j < CROWS
    accepted = j < n_acc
    ok = j < n_acc + n_mask
    q = prev + 1 + j
    tok = tl.load(tokens + q % RING, mask=accepted & rows, other=0)
    tok = tl.where(accepted, tok, other_tok)
    hid = tl.where(accepted, slot * STASH + j, ZERO_STASH)
    dslot = _kv_slots(d_tables, slot, q, D_BS, D_W, D_TS, ok & rows)
    tl.store(c_tok + j, tl.where(ok, tok, -1).to(c_tok.dtype.element_ty), mask=rows)
    tl.store(c_hid + j, tl.where(ok, hid, PAD_STASH).to(c_hid.dtype.element_ty), mask=rows)
    tl.store(c_slot + j, tl.where(ok, dslot, -1).to(c_slot.dtype.element_ty), mask=rows)
    tl.store(c_pos + j, tl.where(ok, q, -1).to(c_pos.dtype.element_ty), mask=rows)
    tl.store(c_dly + j, tl.where(ok, dly, 0).to(c_dly.dtype.element_ty), mask=rows)
    if HAS_AUD:
        tl.store(c_aud + j, tl.where(ok, slot * AROWS + q % AROWS, PAD_AUDIO).to(c_aud.dtype.element_ty), mask=rows)
    tl.store(c_last, (n_acc - 1).to(c_last.dtype.element_ty))
    # chain steps (chain drafters: CHAIN = k-1 > 0)
    steps = j < CHAIN
    qd = p + 1 + j
    ok_d = j < ks - 1
    dr = _kv_slots(d_tables, slot, qd, D_BS, D_W, D_TS, ok_d & steps)
    tl.store(dr_pos + j * dr_stride, tl.where(ok_d, qd, -1).to(dr_pos.dtype.element_ty), mask=steps)
    tl.store(dr_slot + j * dr_stride, tl.where(ok_d, dr, -1).to(dr_slot.dtype.element_ty), mask=steps)
    if HAS_DR_AUD:
        tl.store(dr_aud + j * dr_stride, tl.where(ok_d, slot * AROWS + qd % AROWS, PAD_AUDIO)
                 .to(dr_aud.dtype.element_ty), mask=steps)
    # verify rows
    vrows = j <= K
    ok_v = j <= ks
    qv = p + j
    tok_p = tl.load(tokens + p % RING)
    lslot = _kv_slots(lm_tables, slot, qv, LM_BS, LM_W, LM_TS, ok_v & vrows)
    tl.store(v_tok + j, tl.where(j == 0, tok_p, -1).to(v_tok.dtype.element_ty), mask=vrows)
    tl.store(v_src + j, tl.where((j >= 1) & ok_v, j - 1, -1).to(v_src.dtype.element_ty), mask=vrows)
    tl.store(v_aud + j, tl.where(ok_v, slot * AROWS + qv % AROWS, -1).to(v_aud.dtype.element_ty), mask=vrows)
    tl.store(v_slot + j, tl.where(ok_v, lslot, -1).to(v_slot.dtype.element_ty), mask=vrows)
    tl.store(v_stash + j, tl.where(ok_v, slot * STASH + j, PAD_STASH).to(v_stash.dtype.element_ty), mask=vrows)
    tl.store(v_pos + j, tl.where(ok_v, qv, -1).to(v_pos.dtype.element_ty), mask=vrows)
    tl.store(v_dly + j, tl.where(ok_v, dly, 0).to(v_dly.dtype.element_ty), mask=vrows)


@triton.jit
def round_accept_kernel(state, tokens, v_next, v_tokens, log, log_stride, K, RING, MIN_BUF, BLOCK: tl.constexpr):
    p = tl.load(state + 0)
    last = tl.load(state + 2)
    r = tl.load(state + 5)
    ks = tl.where(last - p + 1 >= MIN_BUF, tl.minimum(tl.maximum(last - p, 0), K), 0)
    j = tl.arange(0, BLOCK).to(tl.int64)
    vrows = j <= K
    nxt = tl.load(v_next + j, mask=vrows, other=-1)
    inp = tl.load(v_tokens + 1 + j, mask=j < K, other=-2)
    agree = (inp == nxt) & (j < ks)
    n_acc = tl.min(tl.where(agree, K, j), axis=0).to(tl.int64)  # the first draft that disagrees (or ks)
    tl.store(tokens + (p + 1 + j) % RING, nxt, mask=vrows)
    row = log + r * log_stride
    tl.store(row + 2 + j, nxt, mask=vrows)
    tl.store(row, ks)
    tl.store(row + 1, n_acc)
    tl.store(state + 0, p + n_acc + 1)
    tl.store(state + 1, p)
    tl.store(state + 5, r + 1)


def _device(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def launch_round_layout(c: RoundConstants, state: torch.Tensor, tokens: torch.Tensor, d_tables: torch.Tensor,
                        lm_tables: torch.Tensor, out: RoundLayout) -> None:
    """Launch on already-validated views (graph capturable)."""
    for name in ("c_tok", "c_hid", "c_slot_mapping", "c_pos", "c_dly", "v_tok", "v_src", "v_aud", "v_slot_mapping",
                 "v_stash", "v_pos", "v_dly", "c_aud"):
        t = getattr(out, name)
        if t is not None and t.numel() > 1 and t.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous")
    for name, t in (("d_tables", d_tables), ("lm_tables", lm_tables)):
        if t.dim() != 2 or t.stride(1) != 1:
            raise ValueError(f"{name} must be [slots, width] with unit stride along width")
    chain = out.dr_pos is not None and c.chain_steps > 0
    dr_pos = out.dr_pos if chain else out.c_pos  # unused pointers where there is no chain (CHAIN = 0)
    dr_slot = out.dr_slot_mapping if chain else out.c_slot_mapping
    dr_aud = out.dr_aud if chain and out.dr_aud is not None else dr_slot
    if chain and (out.dr_slot_mapping.stride(0) != dr_pos.stride(0)
                  or (out.dr_aud is not None and out.dr_aud.stride(0) != dr_pos.stride(0))):
        raise ValueError("the chain steps' views must share one stride")
    block = triton.next_power_of_2(max(c.catchup_rows, c.k + 1, c.chain_steps, 2))
    with _device(state):
        round_layout_kernel[(1,)](
            state, tokens, d_tables, lm_tables,
            out.c_tok, out.c_hid, out.c_slot_mapping, out.c_pos, out.c_dly,
            out.c_aud if out.c_aud is not None else out.c_hid, out.c_last,
            dr_pos, dr_slot, dr_aud, dr_pos.stride(0) if chain else 1,
            out.v_tok, out.v_src, out.v_aud, out.v_slot_mapping, out.v_stash, out.v_pos, out.v_dly,
            c.k, c.ring, c.catchup_rows, c.chain_steps if chain else 0, c.stash_stride, c.audio_rows, c.pad_stash,
            c.zero_stash, c.pad_audio, c.mask_token, c.min_buffered,
            c.d_block, c.d_width, d_tables.stride(0), c.lm_block, c.lm_width, lm_tables.stride(0),
            PARALLEL=c.parallel, HAS_AUD=out.c_aud is not None, HAS_DR_AUD=chain and out.dr_aud is not None,
            BLOCK=block, num_warps=1)


def launch_round_accept(c: RoundConstants, state: torch.Tensor, tokens: torch.Tensor, v_next: torch.Tensor,
                        v_tokens: torch.Tensor, log: torch.Tensor) -> None:
    with _device(state):
        round_accept_kernel[(1,)](state, tokens, v_next, v_tokens, log, log.stride(0), c.k, c.ring,
                                  c.min_buffered, BLOCK=triton.next_power_of_2(c.k + 2), num_warps=1)
