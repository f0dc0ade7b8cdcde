"""A speculative round's layout and greedy acceptance from device-resident state (one stream), in one kernel each.

The batched engine can chain a lone stream's speculative rounds on the device (`realtime/engine/chained_rounds.py`):
each round's index metadata is computed from the stream's state on the device, and the round's acceptance advances
that state, so the host never waits between rounds. Written with torch ops, the layout is about a hundred tiny
kernels a round and the acceptance a dozen; on an H100 that version's rounds cost about 150 us more than with these
two kernels, more than the host work chaining hides (docs/benchmarks.md, issue 5, forty-fourth session). Here each
is one launch.

State (int64 [6]): position p, prev (the drafter is exact up to prev; p - prev = positions to catch up, 1..k+1),
the stream's last position, its cache slot, its delay in tokens, and the number of rounds logged. The token ring
(int64 [ring]) holds the input token of position q at q % ring.

`round_layout` writes, for one stream laid out in row 0 of a step (what `Speculator._layout` uploads for it):
- catch-up rows j < catchup_rows at position q = prev+1+j: the positions prev+1 .. p (token from the ring, hidden
  state from stash row slot*stash_stride + j) then, for a parallel drafter, ks-1 mask rows (mask token, the zero
  stash row); every such row its drafter KV slot, position, delay and audio row (slot*audio_rows + q % audio_rows);
  other rows padding (token -1, stash pad_stash, slot -1, position -1, delay 0, audio pad_audio); c_last = p - prev - 1;
- chain steps i < chain_steps (chain drafters) at q = p+1+i, for i < ks-1: position, drafter KV slot, audio row;
  else padding (-1, -1, pad_audio);
- verify rows j <= k at q = p+j, for j <= ks: token (row 0: the ring's token at p; others -1, they take drafts),
  draft source j-1 (row 0: -1), audio row, LM KV slot, stash row slot*stash_stride + j, position, delay; other rows
  padding (-1, -1, -1, -1, pad_stash, -1, 0),
where ks = min(k, last - p) drafts are allowed if last - p + 1 >= min_buffered (else none) and a KV slot is
table[slot, (q // block) % width] * block + q % block. `round_accept` takes the target's argmax at verify rows 0..k
and their input tokens, accepts the longest prefix of drafts (rows 1..ks) equal to the argmax of the row before,
writes the argmaxes as the input tokens of positions p+1 .. p+k+1 (only those up to p+n_acc+1 are this round's: the
rest is rewritten before it is read), logs [ks, n_acc, argmax 0..k] at row `rounds` of `log`, and advances the state
(p += n_acc+1, prev = old p, rounds += 1).

Both allocate nothing and never sync (graph capturable). The Triton kernels and the torch references are equal
element for element (tests/test_spec_round.py). Imports: torch (and triton in the kernel module) only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._dispatch import use_triton

P, PREV, LAST, SLOT, DELAY, ROUNDS = range(6)
STATE_LEN = 6


@dataclass(frozen=True)
class RoundConstants:
    k: int  # drafts a round may verify
    ring: int  # token ring length (> k + 1)
    catchup_rows: int  # k+1 (chain drafters) or 2k (parallel drafters: accepted positions and mask rows)
    parallel: bool  # mask rows follow the catch-up's accepted positions
    chain_steps: int  # a chain drafter's single-position steps a round (k-1), 0 for parallel drafters
    stash_stride: int
    audio_rows: int  # audio cache rows per stream slot
    pad_stash: int
    zero_stash: int
    pad_audio: int
    mask_token: int
    min_buffered: int  # drafts only where at least this many positions (p included) are decodable (>= 2)
    d_block: int  # drafter KV cache: block size, ring width (blocks per slot)
    d_width: int
    lm_block: int
    lm_width: int


@dataclass(frozen=True)
class RoundLayout:
    """The output views (the step-metadata buffers the speculator's graphs read); int64 or int32 each."""

    c_tok: torch.Tensor  # [catchup_rows]
    c_hid: torch.Tensor
    c_slot_mapping: torch.Tensor
    c_pos: torch.Tensor
    c_dly: torch.Tensor
    c_last: torch.Tensor  # [1]
    v_tok: torch.Tensor  # [k+1]
    v_src: torch.Tensor
    v_aud: torch.Tensor
    v_slot_mapping: torch.Tensor
    v_stash: torch.Tensor
    v_pos: torch.Tensor
    v_dly: torch.Tensor
    c_aud: torch.Tensor | None = None  # [catchup_rows]: only for a drafter that gets audio
    dr_pos: torch.Tensor | None = None  # [chain_steps] (any stride): chain drafters
    dr_slot_mapping: torch.Tensor | None = None
    dr_aud: torch.Tensor | None = None  # chain drafters that get audio


def _check(c: RoundConstants, state: torch.Tensor, tokens: torch.Tensor, out: RoundLayout) -> None:
    if state.shape != (STATE_LEN,) or state.dtype != torch.int64:
        raise ValueError(f"state must be int64 [{STATE_LEN}], got {state.dtype} {tuple(state.shape)}")
    if tokens.shape != (c.ring,) or tokens.dtype != torch.int64 or c.ring <= c.k + 1:
        raise ValueError(f"tokens must be int64 [ring > k+1 = {c.k + 1}], got {tokens.dtype} {tuple(tokens.shape)}")
    rows = {"c_tok": c.catchup_rows, "c_hid": c.catchup_rows, "c_slot_mapping": c.catchup_rows,
            "c_pos": c.catchup_rows, "c_dly": c.catchup_rows, "c_aud": c.catchup_rows, "c_last": 1,
            "v_tok": c.k + 1, "v_src": c.k + 1, "v_aud": c.k + 1, "v_slot_mapping": c.k + 1, "v_stash": c.k + 1,
            "v_pos": c.k + 1, "v_dly": c.k + 1, "dr_pos": c.chain_steps, "dr_slot_mapping": c.chain_steps,
            "dr_aud": c.chain_steps}
    for name, n in rows.items():
        t = getattr(out, name)
        if t is None:
            if name in ("c_aud", "dr_aud") or (name.startswith("dr_") and c.chain_steps == 0):
                continue
            raise ValueError(f"{name} is missing")
        if t.shape != (n,) or t.dtype not in (torch.int32, torch.int64) or t.device != state.device:
            raise ValueError(f"{name} must be int32/int64 [{n}] on {state.device}, got {t.dtype} {tuple(t.shape)} "
                             f"on {t.device}")


def _drafts_allowed(c: RoundConstants, state: torch.Tensor) -> torch.Tensor:
    gap = state[LAST] - state[P]
    return torch.where(gap + 1 >= c.min_buffered, gap.clamp(0, c.k), 0)


def _slots(tables: torch.Tensor, slot: torch.Tensor, q: torch.Tensor, block: int, width: int) -> torch.Tensor:
    return tables[slot.expand(q.shape), (q // block) % width].long() * block + q % block


def round_layout_reference(c: RoundConstants, state: torch.Tensor, tokens: torch.Tensor, d_tables: torch.Tensor,
                           lm_tables: torch.Tensor, out: RoundLayout) -> None:
    """Pure-torch definition of `round_layout` (see the module docstring)."""
    _check(c, state, tokens, out)
    dev = state.device
    p, prev, slot, dly = state[P], state[PREV], state[SLOT], state[DELAY]
    ks = _drafts_allowed(c, state)
    jc = torch.arange(c.catchup_rows, device=dev)
    n_acc = p - prev
    n_mask = (ks - 1).clamp(min=0) if c.parallel else torch.zeros_like(ks)
    accepted, ok = jc < n_acc, jc < n_acc + n_mask
    q = prev + 1 + jc
    tok = torch.where(accepted, tokens[q % c.ring], c.mask_token if c.parallel else -1)
    hid = torch.where(accepted, slot * c.stash_stride + jc, c.zero_stash)
    out.c_tok.copy_(torch.where(ok, tok, -1))
    out.c_hid.copy_(torch.where(ok, hid, c.pad_stash))
    out.c_slot_mapping.copy_(torch.where(ok, _slots(d_tables, slot, q, c.d_block, c.d_width), -1))
    out.c_pos.copy_(torch.where(ok, q, -1))
    out.c_dly.copy_(torch.where(ok, dly, 0))
    if out.c_aud is not None:
        out.c_aud.copy_(torch.where(ok, slot * c.audio_rows + q % c.audio_rows, c.pad_audio))
    out.c_last.copy_((n_acc - 1).view(1))
    if c.chain_steps:
        i = torch.arange(c.chain_steps, device=dev)
        qd = p + 1 + i
        ok_d = i < ks - 1
        out.dr_pos.copy_(torch.where(ok_d, qd, -1))
        out.dr_slot_mapping.copy_(torch.where(ok_d, _slots(d_tables, slot, qd, c.d_block, c.d_width), -1))
        if out.dr_aud is not None:
            out.dr_aud.copy_(torch.where(ok_d, slot * c.audio_rows + qd % c.audio_rows, c.pad_audio))
    j = torch.arange(c.k + 1, device=dev)
    ok_v = j <= ks
    qv = p + j
    # (index_select, not tokens[p]: indexing with a 0-d tensor reads it on the host, which a graph cannot)
    out.v_tok.copy_(torch.where(j == 0, tokens.index_select(0, (p % c.ring).view(1)), -1))
    out.v_src.copy_(torch.where((j >= 1) & ok_v, j - 1, -1))
    out.v_aud.copy_(torch.where(ok_v, slot * c.audio_rows + qv % c.audio_rows, -1))
    out.v_slot_mapping.copy_(torch.where(ok_v, _slots(lm_tables, slot, qv, c.lm_block, c.lm_width), -1))
    out.v_stash.copy_(torch.where(ok_v, slot * c.stash_stride + j, c.pad_stash))
    out.v_pos.copy_(torch.where(ok_v, qv, -1))
    out.v_dly.copy_(torch.where(ok_v, dly, 0))


def round_accept_reference(c: RoundConstants, state: torch.Tensor, tokens: torch.Tensor, v_next: torch.Tensor,
                           v_tokens: torch.Tensor, log: torch.Tensor) -> None:
    """Pure-torch definition of `round_accept` (see the module docstring)."""
    _check_accept(c, state, tokens, v_next, v_tokens, log)
    k = c.k
    p = state[P]
    ks = _drafts_allowed(c, state)
    j = torch.arange(k + 1, device=state.device)
    nxt = v_next[: k + 1]
    agree = (v_tokens[1: k + 1] == nxt[:k]) & (j[:k] < ks)
    n_acc = agree.long().cumprod(0).sum()
    tokens.index_copy_(0, (p + 1 + j) % c.ring, nxt)
    log.index_copy_(0, state[ROUNDS].view(1), torch.cat([ks.view(1), n_acc.view(1), nxt]).view(1, -1))
    state[: PREV + 1].copy_(torch.stack([p + n_acc + 1, p]))
    state[ROUNDS] += 1


def _check_accept(c: RoundConstants, state: torch.Tensor, tokens: torch.Tensor, v_next: torch.Tensor,
                  v_tokens: torch.Tensor, log: torch.Tensor) -> None:
    if state.shape != (STATE_LEN,) or state.dtype != torch.int64 or tokens.shape != (c.ring,):
        raise ValueError("state must be int64 [6] and tokens [ring]")
    for name, t in (("v_next", v_next), ("v_tokens", v_tokens)):
        if t.dim() != 1 or t.shape[0] < c.k + 1 or t.dtype != torch.int64 or t.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous int64 [>= k+1 = {c.k + 1}], got {t.dtype} {tuple(t.shape)}")
    if log.dim() != 2 or log.shape[1] != c.k + 3 or log.dtype != torch.int64 or log.stride(1) != 1:
        raise ValueError(f"log must be int64 [rounds, k+3 = {c.k + 3}], got {log.dtype} {tuple(log.shape)}")


def round_layout(c: RoundConstants, state: torch.Tensor, tokens: torch.Tensor, d_tables: torch.Tensor,
                 lm_tables: torch.Tensor, out: RoundLayout, *, backend: str = "auto") -> None:
    """One round's step metadata from the device state (module docstring); in place, no sync."""
    if not use_triton(backend, state.device):
        round_layout_reference(c, state, tokens, d_tables, lm_tables, out)
        return
    _check(c, state, tokens, out)
    from ._spec_round_triton import launch_round_layout

    launch_round_layout(c, state, tokens, d_tables, lm_tables, out)


def round_accept(c: RoundConstants, state: torch.Tensor, tokens: torch.Tensor, v_next: torch.Tensor,
                 v_tokens: torch.Tensor, log: torch.Tensor, *, backend: str = "auto") -> None:
    """Greedy acceptance of a round on the device; advances the state and logs the round (module docstring).
    The log must have a row for every round of the chain (rows are not checked: that would sync)."""
    if not use_triton(backend, state.device):
        round_accept_reference(c, state, tokens, v_next, v_tokens, log)
        return
    _check_accept(c, state, tokens, v_next, v_tokens, log)
    from ._spec_round_triton import launch_round_accept

    launch_round_accept(c, state, tokens, v_next, v_tokens, log)
