"""Tests of `kernels`: references against straightforward implementations, Triton kernels against the
references (under the Triton interpreter on CPU, natively on GPU), poisoned buffers, CUDA graphs.

The interpreter needs TRITON_INTERPRET=1 before triton is imported, so its checks run once in a
subprocess (this file executed as a script, see `_interpreter_main`) and report one result per check;
nothing leaks into the other tests of the session.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from pathlib import Path
from typing import Callable
from unittest import mock

import pytest
import torch

import kernels
from kernels import (
    RunsPlan,
    gather_add_embeddings,
    gather_add_reference,
    paged_attention,
    paged_attention_reference,
    paged_attention_runs,
    ring_table_width,
    write_kv,
    write_kv_reference,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


# =============================================================================================
# Case builders (torch only; shared by the CPU, interpreter and GPU tests)
# =============================================================================================
def make_gather_case(seed: int, rows: int, hidden: int, vocab: int, audio_rows: int, dtype: torch.dtype,
                     device: str = "cpu") -> dict:
    """Random tables and indices with padding rows (token < 0) and rows without audio (row < 0)."""
    g = torch.Generator().manual_seed(seed)
    embed = (torch.randn(vocab, hidden, generator=g) * 3).to(dtype)
    audio = torch.randn(max(audio_rows, 0), hidden, generator=g).to(dtype)
    tok = torch.randint(0, vocab, (rows,), generator=g)
    arow = torch.randint(0, max(audio_rows, 1), (rows,), generator=g) if audio_rows else torch.full((rows,), -1)
    kind = torch.randint(0, 4, (rows,), generator=g)  # 0: padding, 1: no audio, else both
    tok = torch.where(kind == 0, -1 - torch.randint(0, 5, (rows,), generator=g), tok)
    arow = torch.where(kind == 1, -1 - torch.randint(0, 5, (rows,), generator=g), arow)
    if rows >= 2:
        tok[0], arow[0] = -1, -1  # make sure every kind is present
        tok[1], arow[1] = 0, -3
    return {k: v.to(device) for k, v in dict(embed=embed, audio=audio, tok=tok.to(torch.int32),
                                              arow=arow.to(torch.int64)).items()}


def gather_add_loop(case: dict) -> torch.Tensor:
    """Straightforward per-row definition: fp32 sum of the two rows, rounded once."""
    embed, audio, tok, arow = case["embed"], case["audio"], case["tok"].tolist(), case["arow"].tolist()
    out = torch.empty(len(tok), embed.shape[1], dtype=embed.dtype)
    for i, (t, a) in enumerate(zip(tok, arow)):
        if t < 0:
            out[i] = 0
            continue
        row = embed[t].float().cpu()
        if a >= 0:
            row = row + audio[a].float().cpu()
        out[i] = row.to(embed.dtype)
    return out


def make_paged_case(seed: int, *, hq: int, hkv: int, d: int, block_size: int, window: int | None,
                    last: list[int], q_lens: list[int], dtype: torch.dtype, device: str = "cpu",
                    run_len: int | None = None, pad_rows: int = 2, spare_blocks: int = 3, q_scale: float = 1.0,
                    ring_slots: list[int] | None = None, unread: str = "nan") -> dict:
    """A paged cache in the state the engine leaves it in just before attention (write-then-attend).

    Sequence s has its newest step's queries at positions last[s]-q_lens[s]+1 .. last[s]. Physical
    blocks are a random permutation; every cache slot a query cannot see (never written, older than
    every window, or stale in the ring) holds NaN, so reading one poisons the result. Tokens are in
    random order with `pad_rows` padding rows (garbage seq ids), or, with `run_len`, in runs of
    `run_len` rows per sequence padded with padding rows plus a few all-padding runs.
    ring_slots: sequence s owns the whole ring-aligned blocks ring_slots[s]*width .. (the engine's layout)
    instead of random ones. unread="garbage": the slots no query may read hold large finite values instead of
    NaN (what `rings_finite` promises), so reading one still changes the result far beyond rounding.
    """
    g = torch.Generator().manual_seed(seed)
    s_count = len(last)
    if window:
        width = ring_table_width(window, block_size, max(q_lens))
    else:
        width = max(math.ceil((p + 1) / block_size) for p in last)
    if ring_slots is None:
        num_blocks = s_count * width + spare_blocks
        tables = torch.randperm(num_blocks, generator=g)[: s_count * width].view(s_count, width).to(torch.int32)
    else:
        num_blocks = (max(ring_slots) + 1) * width + spare_blocks
        tables = (torch.tensor(ring_slots)[:, None] * width + torch.arange(width)).to(torch.int32)
    shape = (num_blocks, block_size, hkv, d)
    if unread == "nan":
        k_cache = torch.full(shape, float("nan"), dtype=dtype)
        v_cache = torch.full_like(k_cache, float("nan"))
    else:
        k_cache = (torch.randn(shape, generator=g) * 300).to(dtype)
        v_cache = (torch.randn(shape, generator=g) * 300).to(dtype)
    hist = []
    for s in range(s_count):
        ring_lo = max(0, (last[s] // block_size - width + 1) * block_size)  # oldest position still in the ring
        pos = torch.arange(ring_lo, last[s] + 1)
        keys = torch.randn(len(pos), hkv, d, generator=g).to(dtype)
        vals = torch.randn(len(pos), hkv, d, generator=g).to(dtype)
        seen_lo = max(0, last[s] - q_lens[s] + 1 - window + 1) if window else 0
        assert seen_lo >= ring_lo, "ring too narrow: a visible position was recycled"
        seen = pos >= seen_lo
        phys = tables[s, (pos // block_size) % width].long()
        k_cache[phys[seen], pos[seen] % block_size] = keys[seen]
        v_cache[phys[seen], pos[seen] % block_size] = vals[seen]
        hist.append((ring_lo, keys, vals))
    tokens = [(s, p) for s in range(s_count) for p in range(last[s] - q_lens[s] + 1, last[s] + 1) if p >= 0]
    pad = (-1, -1)
    if run_len is None:
        rows = tokens + [pad] * pad_rows
        rows = [rows[i] for i in torch.randperm(len(rows), generator=g).tolist()]
    else:
        rows = []
        for s in range(s_count):
            mine = [t for t in tokens if t[0] == s]
            for i in range(0, len(mine), run_len):
                chunk = mine[i:i + run_len]
                rows += chunk + [pad] * (run_len - len(chunk))
            if s == 0 and pad_rows:
                rows += [pad] * run_len  # a run of padding only
        while rows and rows[-1] == pad:  # a short final run
            rows.pop()
        rows += [pad] * min(pad_rows, run_len - 1)
    n = len(rows)
    seq_ids = torch.tensor([s for s, _ in rows], dtype=torch.int32)
    q_pos = torch.tensor([p for _, p in rows], dtype=torch.int32)
    is_pad = q_pos < 0
    garbage = torch.randint(-3, 1_000_000, (n,), generator=g, dtype=torch.int32)
    seq_ids = torch.where(is_pad, garbage, seq_ids)
    q_pos = torch.where(is_pad, -torch.randint(1, 100, (n,), generator=g, dtype=torch.int32), q_pos)
    q = (torch.randn(n, hq, d, generator=g) * q_scale).to(dtype)
    case = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables, seq_ids=seq_ids, q_pos=q_pos)
    case = {k: v.to(device) for k, v in case.items()}
    case.update(window=window, scale=d ** -0.5, hist=hist)
    return case


def assert_attention_close(out: torch.Tensor, expected: torch.Tensor, rel: float) -> None:
    """Max error relative to the largest expected value: outputs of long, flat softmaxes are tiny, so
    an absolute tolerance alone would accept an all-zero result."""
    err = (out.double() - expected.double()).abs().max().item()
    size = expected.double().abs().max().item()
    assert size > 0 and err <= rel * size, f"max error {err:.3g} vs max |expected| {size:.3g}"


def attention_args(case: dict) -> tuple:
    return (case["q"], case["k_cache"], case["v_cache"], case["block_tables"], case["seq_ids"], case["q_pos"],
            case["window"], case["scale"])


def dense_attention(case: dict) -> torch.Tensor:
    """Straightforward definition in float64: per token, the contiguous history of its sequence and an
    explicit window mask (no block tables involved)."""
    q, seq_ids, q_pos = case["q"].cpu(), case["seq_ids"].tolist(), case["q_pos"].tolist()
    window, scale = case["window"], case["scale"]
    t, hq, d = q.shape
    out = torch.zeros(t, hq, d, dtype=torch.float64)
    for i in range(t):
        p = q_pos[i]
        if p < 0:
            continue
        ring_lo, keys, vals = case["hist"][seq_ids[i]]
        group = hq // keys.shape[1]
        k = keys.double().repeat_interleave(group, dim=1)  # [n, hq, d]
        v = vals.double().repeat_interleave(group, dim=1)
        key_pos = torch.arange(ring_lo, ring_lo + len(keys))
        allowed = key_pos <= p
        if window:
            allowed &= key_pos > p - window
        scores = torch.einsum("hd,nhd->hn", q[i].double(), k) * scale
        scores = scores.masked_fill(~allowed[None, :], float("-inf"))
        out[i] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)
    return out


def make_tree_case(seed: int, dtype: torch.dtype, *, window: int | None = 12, device: str = "cpu") -> dict:
    """Tree verification's view of the cache: sequence s holds positions up to its root p_s in its ring
    (positions after it are NaN there), and a draft tree whose nodes' keys sit in spare blocks (slots no
    ring uses). Rows: each root, each node (q_pos = root + depth, tree_root = root, tree_slots = the
    slots of its ancestors at depths 1.., itself last), padding rows and a row of a sequence without a
    tree (tree_root -1). `nodes` gives each row's ancestors' keys and values, for `dense_tree_attention`."""
    roots, bs = [21, 9], 4
    case = make_paged_case(seed, hq=4, hkv=2, d=16, block_size=bs, window=window, last=roots + [30], q_lens=[1, 1, 1],
                           dtype=dtype, pad_rows=0, spare_blocks=6)
    k_cache, v_cache, tables = case["k_cache"], case["v_cache"], case["block_tables"]
    used = set(tables.flatten().tolist())
    spare = [b for b in range(k_cache.shape[0]) if b not in used]
    free_slots = [b * bs + o for b in spare for o in range(bs)]
    g = torch.Generator().manual_seed(seed + 1)
    parents = [-1, -1, 0, 0, 2, 1]  # nodes 0, 1 at depth 1; 2, 3 under 0; 4 under 2; 5 under 1
    rows, depth_cap = [], 4
    for s, p in enumerate(roots):
        chains, kv = [], []
        for n, par in enumerate(parents):
            slot = free_slots.pop(int(torch.randint(len(free_slots), (1,), generator=g)))
            k = torch.randn(2, 16, generator=g).to(dtype)
            v = torch.randn(2, 16, generator=g).to(dtype)
            k_cache.view(-1, 2, 16)[slot], v_cache.view(-1, 2, 16)[slot] = k, v
            chain = ([] if par < 0 else chains[par]) + [slot]
            chain_kv = ([] if par < 0 else kv[par]) + [(k, v)]
            chains.append(chain)
            kv.append(chain_kv)
            rows.append(dict(seq=s, pos=p + len(chain), root=p, slots=chain, kv=chain_kv))
        rows.append(dict(seq=s, pos=p, root=p, slots=[], kv=[]))  # the root row itself
    rows.append(dict(seq=2, pos=30, root=-1, slots=[], kv=[]))  # no tree: the ring as usual
    rows += [dict(seq=-1, pos=-1, root=-1, slots=[], kv=[])] * 2
    order = torch.randperm(len(rows), generator=g).tolist()
    rows = [rows[i] for i in order]
    q = torch.randn(len(rows), 4, 16, generator=g).to(dtype)
    tslots = torch.full((len(rows), depth_cap), -7, dtype=torch.int64)  # never read past a row's depth
    for i, r in enumerate(rows):
        tslots[i, : len(r["slots"])] = torch.tensor(r["slots"], dtype=torch.int64)
    dev = {k: v.to(device) for k, v in dict(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables,
        seq_ids=torch.tensor([max(r["seq"], 0) for r in rows], dtype=torch.int32),
        q_pos=torch.tensor([r["pos"] for r in rows], dtype=torch.int32),
        tree_root=torch.tensor([r["root"] for r in rows], dtype=torch.int32), tree_slots=tslots).items()}
    return dict(dev, window=window, scale=16 ** -0.5, hist=case["hist"], rows=rows)


def dense_tree_attention(case: dict) -> torch.Tensor:
    """Float64 definition: a row's keys are its sequence's history up to the root (window applied)
    followed by its ancestors' keys at root+1 .. q_pos; a row without a tree sees its history."""
    q, window, scale = case["q"].cpu(), case["window"], case["scale"]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i, r in enumerate(case["rows"]):
        if r["pos"] < 0:
            continue
        ring_lo, keys, vals = case["hist"][r["seq"]]
        top = r["root"] if r["root"] >= 0 else r["pos"]
        key_pos = torch.arange(ring_lo, top + 1)
        k = torch.cat([keys[: len(key_pos)].double()] + [kk[None].double() for kk, _ in r["kv"]])
        v = torch.cat([vals[: len(key_pos)].double()] + [vv[None].double() for _, vv in r["kv"]])
        key_pos = torch.cat([key_pos, torch.arange(top + 1, top + 1 + len(r["kv"]))])
        allowed = key_pos > r["pos"] - window if window else torch.ones(len(key_pos), dtype=torch.bool)
        group = q.shape[1] // k.shape[1]
        scores = torch.einsum("hd,nhd->hn", q[i].double(), k.repeat_interleave(group, 1)) * scale
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        out[i] = torch.einsum("hn,nhd->hd", torch.softmax(scores, -1), v.repeat_interleave(group, 1))
    return out


# LM-like (GQA), encoder-like (no GQA, 4 queries), verify-like (5 queries), no window, tiny blocks.
PAGED_CASES: dict[str, dict] = {
    "gqa_window_smaller_than_history": dict(hq=8, hkv=2, d=32, block_size=4, window=12, last=[40, 7, 100],
                                            q_lens=[1, 1, 1]),
    "window_larger_than_history": dict(hq=4, hkv=4, d=16, block_size=4, window=64, last=[5, 30, 0],
                                       q_lens=[4, 4, 1]),
    "no_window": dict(hq=6, hkv=2, d=16, block_size=8, window=None, last=[19, 3], q_lens=[3, 1]),
    "ring_wraparound": dict(hq=4, hkv=1, d=32, block_size=4, window=9, last=[1000, 517, 64], q_lens=[5, 2, 5]),
    "block_size_one": dict(hq=2, hkv=1, d=16, block_size=1, window=5, last=[12, 2], q_lens=[2, 3]),
    "encoder_like": dict(hq=4, hkv=4, d=64, block_size=16, window=30, last=[95, 47, 2], q_lens=[4, 4, 3]),
}


# =============================================================================================
# gather_add (CPU, reference)
# =============================================================================================
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,hidden,audio_rows", [(1, 8, 3), (9, 40, 5), (33, 130, 0)])
def test_gather_add_reference_matches_row_loop_bitwise(dtype: torch.dtype, rows: int, hidden: int,
                                                       audio_rows: int) -> None:
    case = make_gather_case(rows * 7 + hidden, rows, hidden, 17, audio_rows, dtype)
    out = torch.full((rows, hidden), float("nan"), dtype=dtype)
    ret = gather_add_reference(out, case["tok"], case["embed"], case["audio"], case["arow"])
    assert ret is out
    assert torch.equal(out, gather_add_loop(case))  # bitwise (no NaN left: equal() is False on NaN)


def test_gather_add_dispatch_on_cpu_uses_reference_and_writes_in_place() -> None:
    case = make_gather_case(3, 12, 24, 9, 4, torch.bfloat16)
    out = torch.full((12, 24), float("nan"), dtype=torch.bfloat16)
    ptr = out.data_ptr()
    gather_add_embeddings(out, case["tok"], case["embed"], case["audio"], case["arow"])
    assert out.data_ptr() == ptr
    assert torch.equal(out, gather_add_loop(case))


def test_gather_add_zero_audio_term_ignores_nan_audio_rows() -> None:
    """A row without audio must not read (or be poisoned by) the audio buffer."""
    case = make_gather_case(5, 6, 16, 9, 3, torch.float32)
    case["audio"].fill_(float("nan"))
    case["arow"].fill_(-1)
    out = torch.empty(6, 16)
    gather_add_reference(out, case["tok"], case["embed"], case["audio"], case["arow"])
    assert torch.equal(out, gather_add_loop(case))
    assert torch.isfinite(out).all()


def test_gather_add_rejects_bad_shapes_and_dtypes() -> None:
    case = make_gather_case(0, 4, 8, 5, 2, torch.float32)
    with pytest.raises(ValueError):
        gather_add_embeddings(torch.empty(4, 9), case["tok"], case["embed"], case["audio"], case["arow"])
    with pytest.raises(TypeError):
        gather_add_embeddings(torch.empty(4, 8, dtype=torch.float16), case["tok"], case["embed"], case["audio"],
                              case["arow"])
    with pytest.raises(TypeError):
        gather_add_embeddings(torch.empty(4, 8), case["tok"].float(), case["embed"], case["audio"], case["arow"])
    with pytest.raises(ValueError):
        gather_add_embeddings(torch.empty(4, 8), case["tok"][:3], case["embed"], case["audio"], case["arow"])
    with pytest.raises(ValueError):
        gather_add_embeddings(torch.empty(4, 8), case["tok"], case["embed"], case["audio"], case["arow"],
                              backend="cuda")


# =============================================================================================
# ring width, write_kv, paged attention (CPU, reference)
# =============================================================================================
@pytest.mark.parametrize("window,block_size,max_q_len", [(750, 16, 4), (8192, 16, 9), (12, 4, 1), (9, 4, 5),
                                                         (5, 1, 3), (7, 8, 2), (64, 64, 1)])
def test_ring_table_width_is_sufficient_and_nearly_minimal(window: int, block_size: int, max_q_len: int) -> None:
    """Brute force over block alignments: the blocks touched by one step's reads and writes. The
    formula is the simple bound (exact, or one block more when the span is 1 mod block_size)."""
    needed = 0
    for newest in range(window + max_q_len + 2 * block_size, window + max_q_len + 3 * block_size):
        oldest_read = newest - max_q_len + 1 - window + 1
        needed = max(needed, newest // block_size - oldest_read // block_size + 1)
    assert needed <= ring_table_width(window, block_size, max_q_len) <= needed + 1
    with pytest.raises(ValueError):
        ring_table_width(0, block_size, max_q_len)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_reference_writes_slots_and_skips_padding(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    k_cache = torch.full((5, 4, 2, 8), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    k = torch.randn(6, 2, 8, generator=g).to(dtype)
    v = torch.randn(6, 2, 8, generator=g).to(dtype)
    slots = torch.tensor([17, -1, 0, 19, -5, 6])
    write_kv(k_cache, v_cache, k, v, slots)
    written = torch.zeros(20, dtype=torch.bool)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(k_cache[s // 4, s % 4], k[i]) and torch.equal(v_cache[s // 4, s % 4], v[i])
            written[s] = True
    assert k_cache.view(20, 2, 8)[~written].isnan().all() and v_cache.view(20, 2, 8)[~written].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(PAGED_CASES))
def test_paged_attention_reference_matches_dense(name: str, dtype: torch.dtype) -> None:
    case = make_paged_case(list(PAGED_CASES).index(name), dtype=dtype, **PAGED_CASES[name])
    out = torch.full_like(case["q"], float("nan"))
    ret = paged_attention_reference(*attention_args(case), out=out)
    assert ret is out
    expected = dense_attention(case)
    assert torch.isfinite(out).all(), "unwritten or poisoned output"
    assert_attention_close(out, expected, rel={torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype])
    assert (out[case["q_pos"] < 0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("run_len", [None, 1, 4, 5])
@pytest.mark.parametrize("name", list(PAGED_CASES))
def test_paged_attention_runs_matches_dense(name: str, run_len: int | None, dtype: torch.dtype) -> None:
    """The CPU implementation (one key gather per run of queries) against the definition, with every
    slot no query may read poisoned with NaN, padding rows and all-padding runs."""
    case = make_paged_case(list(PAGED_CASES).index(name) + 100, dtype=dtype, run_len=run_len, **PAGED_CASES[name])
    out = torch.full_like(case["q"], float("nan"))
    ret = paged_attention_runs(*attention_args(case), out=out, tokens_per_run=run_len or 1)
    assert ret is out
    assert torch.isfinite(out).all(), "a poisoned slot leaked in, or a row was left unwritten"
    assert_attention_close(out, dense_attention(case),
                           rel={torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype])
    assert (out[case["q_pos"] < 0] == 0).all()
    assert torch.equal(paged_attention(*attention_args(case), tokens_per_run=run_len or 1), out), \
        "the CPU dispatch is this implementation"


@pytest.mark.parametrize("run_len", [1, 4])
def test_paged_attention_runs_clears_every_slot_a_run_may_not_read(run_len: int) -> None:
    """Only the first gathered block and the tail can hold slots outside a run's range, so only those are
    cleared (`RunsLayout.head_end` / `tail_start`). Here the run that ends earliest ends mid-block (the
    rest of that block never written: NaN), no run is all padding, and the windows slide: every such
    slot must be cleared. A plan reused for a second layer's cache gives that layer's own result."""
    case = make_paged_case(11, hq=4, hkv=2, d=16, block_size=8, window=13, last=[21, 45, 38], q_lens=[3, 4, 2],
                           dtype=torch.float32, run_len=run_len, pad_rows=0)
    plan = RunsPlan()
    out = paged_attention_runs(*attention_args(case), tokens_per_run=run_len, plan=plan)
    lay = plan.layout
    assert lay is not None and 0 < lay.tail_start < lay.phys.shape[1] * 8  # no all-padding run: head and tail only
    assert torch.isfinite(out).all(), "a poisoned slot leaked in"
    assert_attention_close(out, dense_attention(case), rel=1e-5)
    other = make_paged_case(12, hq=4, hkv=2, d=16, block_size=8, window=13, last=[21, 45, 38], q_lens=[3, 4, 2],
                            dtype=torch.float32, run_len=run_len, pad_rows=0)
    args = list(attention_args(other))
    args[3:6] = case["block_tables"], case["seq_ids"], case["q_pos"]  # the first layer's step metadata
    k2 = torch.full_like(case["k_cache"], float("nan"))
    v2 = torch.full_like(case["v_cache"], float("nan"))
    written = ~case["k_cache"].isnan()
    k2[written] = torch.randn(int(written.sum()))
    v2[written] = torch.randn(int(written.sum()))
    second = paged_attention_runs(case["q"], k2, v2, *args[3:], tokens_per_run=run_len, plan=plan)
    fresh = paged_attention_runs(case["q"], k2, v2, *args[3:], tokens_per_run=run_len)
    assert torch.isfinite(second).all() and torch.equal(second, fresh)
    with pytest.raises(ValueError, match="plan was made for"):
        paged_attention_runs(case["q"][:-1], k2, v2, case["block_tables"], case["seq_ids"][:-1], case["q_pos"][:-1],
                             *args[6:], tokens_per_run=run_len, plan=plan)


def test_paged_attention_runs_flags_a_run_that_mixes_sequences() -> None:
    """Same contract as the Triton kernel: rows of a run not of its (largest) sequence come out NaN."""
    case = make_paged_case(3, dtype=torch.float32, **PAGED_CASES["encoder_like"])
    out = paged_attention_runs(*attention_args(case), tokens_per_run=len(case["q_pos"]))
    expected = paged_attention_reference(*attention_args(case))
    is_query = case["q_pos"] >= 0
    kept = is_query & (case["seq_ids"] == case["seq_ids"][is_query].max())
    assert out[is_query & ~kept].isnan().all() and (is_query & ~kept).any()
    torch.testing.assert_close(out[kept], expected[kept], atol=1e-5, rtol=1e-5)
    assert (out[~is_query] == 0).all()


def test_paged_attention_runs_propagates_nan_queries() -> None:
    """A stream that sent NaN gets NaN (the engine detects and fails it); other rows stay exact."""
    case = make_paged_case(5, dtype=torch.float32, run_len=4, **PAGED_CASES["encoder_like"])
    q = case["q"].clone()
    bad = (case["q_pos"] >= 0) & (case["seq_ids"] == 1)
    q[bad] = float("nan")
    args = list(attention_args(case))
    args[0] = q
    out = paged_attention_runs(*args, tokens_per_run=4)
    assert out[bad].isnan().all()
    assert torch.isfinite(out[~bad]).all()
    torch.testing.assert_close(out[~bad], paged_attention_reference(*args)[~bad], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slots", ["in_order", "scattered"])
@pytest.mark.parametrize("name", list(PAGED_CASES))
def test_paged_attention_runs_reads_aligned_rings_in_place(name: str, slots: str, dtype: torch.dtype) -> None:
    """rings_finite: whole ring-aligned rings (the engine's layout), one run per stream, are read in place through
    a view, with the slots a row may not read masked, not cleared. Those slots hold large finite garbage here
    (never written, older than every window, the blocks of rings no run reads), so one read shows far beyond
    rounding. Streams in slot order, and in another order with rings between them that no run reads."""
    spec = PAGED_CASES[name]
    n = len(spec["last"])
    ring_slots = list(range(n)) if slots == "in_order" else [3 * i + 2 for i in range(n)][::-1]
    case = make_paged_case(list(PAGED_CASES).index(name) + 200, dtype=dtype, run_len=max(spec["q_lens"]),
                           ring_slots=ring_slots, unread="garbage", **spec)
    plan = RunsPlan()
    out = torch.full_like(case["q"], float("nan"))
    ret = paged_attention_runs(*attention_args(case), out=out, tokens_per_run=max(spec["q_lens"]), plan=plan,
                               rings_finite=True)
    assert ret is out and plan.rings is not None and plan.layout is None, "the in-place path was taken"
    assert not (slots == "scattered" and plan.rings.direct)  # runs out of ring order are placed, not viewed
    assert torch.isfinite(out).all()
    assert_attention_close(out, dense_attention(case),
                           rel={torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype])
    assert (out[case["q_pos"] < 0] == 0).all()
    # a second layer's cache through the same plan: that layer's own result
    k2 = case["k_cache"] * 0.5
    second = paged_attention_runs(case["q"], k2, case["v_cache"], *attention_args(case)[3:],
                                  tokens_per_run=max(spec["q_lens"]), plan=plan, rings_finite=True)
    fresh = paged_attention_runs(case["q"], k2, case["v_cache"], *attention_args(case)[3:],
                                 tokens_per_run=max(spec["q_lens"]), rings_finite=True)
    assert torch.equal(second, fresh)
    if slots == "in_order":  # without an all-padding run the runs are the view's entries: read by a view
        case = make_paged_case(list(PAGED_CASES).index(name) + 250, dtype=dtype, run_len=max(spec["q_lens"]),
                               ring_slots=ring_slots, unread="garbage", pad_rows=0, **spec)
        plan = RunsPlan()
        out = paged_attention_runs(*attention_args(case), tokens_per_run=max(spec["q_lens"]), plan=plan,
                                   rings_finite=True)
        assert plan.rings is not None and plan.rings.direct
        assert_attention_close(out, dense_attention(case),
                               rel={torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype])
        assert (out[case["q_pos"] < 0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("run_len", [1, 2, 4])
@pytest.mark.parametrize("name", ["encoder_like", "ring_wraparound", "window_larger_than_history"])
def test_paged_attention_runs_reads_a_streams_several_runs_in_place(name: str, run_len: int,
                                                                    dtype: torch.dtype) -> None:
    """A look-ahead chunk: a stream's rows come as several runs (with padding rows and an all-padding run between
    them); in place, each stream's rows all go to its ring's view entry."""
    spec = dict(PAGED_CASES[name])
    spec["q_lens"] = [min(8, p + 1) for p in spec["last"]]
    n = len(spec["last"])
    case = make_paged_case(list(PAGED_CASES).index(name) + 300, dtype=dtype, run_len=run_len,
                           ring_slots=[2 * i + 1 for i in range(n)][::-1], unread="garbage", **spec)
    plan = RunsPlan()
    out = paged_attention_runs(*attention_args(case), tokens_per_run=run_len, plan=plan, rings_finite=True)
    assert plan.rings is not None and not plan.rings.direct
    assert torch.isfinite(out).all()
    assert_attention_close(out, dense_attention(case), rel={torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype])
    assert (out[case["q_pos"] < 0] == 0).all()


@pytest.mark.parametrize("why", ["random_blocks", "sparse_view", "promise_not_given", "shared_ring"])
def test_paged_attention_runs_gathers_where_rings_cannot_be_read_in_place(why: str) -> None:
    """Steps the in-place layout does not cover take the gather path (same bits), whatever rings_finite says:
    tables that are not whole ring-aligned rings, a view that would hold many rings no row reads, two sequence ids
    with one ring; and without the promise the gather path is always taken (NaN in unread slots then never
    leaks)."""
    spec = dict(PAGED_CASES["encoder_like"])
    run_len = 4
    slots = {"random_blocks": None, "sparse_view": [0, 1, 30], "promise_not_given": [0, 1, 2],
             "shared_ring": [0, 1, 2]}[why]
    case = make_paged_case(7, dtype=torch.float32, run_len=run_len, ring_slots=slots,
                           unread="nan" if why == "promise_not_given" else "garbage", **spec)
    if why == "shared_ring":  # a fourth sequence id whose table row is the first's (not the engine's layout)
        case["block_tables"] = torch.cat([case["block_tables"], case["block_tables"][:1]])
        case["seq_ids"] = torch.where(case["seq_ids"] == 2, 3, case["seq_ids"])
        plan = RunsPlan()
        paged_attention_runs(*attention_args(case), tokens_per_run=run_len, plan=plan, rings_finite=True)
        assert plan.rings is None and plan.layout is not None
        return
    plan = RunsPlan()
    out = paged_attention_runs(*attention_args(case), tokens_per_run=run_len, plan=plan,
                               rings_finite=why != "promise_not_given")
    assert plan.rings is None and plan.layout is not None
    assert torch.equal(out, paged_attention_runs(*attention_args(case), tokens_per_run=run_len))
    assert torch.isfinite(out).all()
    assert_attention_close(out, dense_attention(case), rel=1e-5)


def test_paged_attention_runs_in_place_keeps_the_mixed_run_contract() -> None:
    """A run that mixes sequences is never read in place: the gather path flags its foreign rows NaN."""
    case = make_paged_case(3, dtype=torch.float32, ring_slots=[0, 1, 2], unread="garbage",
                           **PAGED_CASES["encoder_like"])
    plan = RunsPlan()
    out = paged_attention_runs(*attention_args(case), tokens_per_run=len(case["q_pos"]), plan=plan,
                               rings_finite=True)
    assert plan.rings is None
    is_query = case["q_pos"] >= 0
    kept = is_query & (case["seq_ids"] == case["seq_ids"][is_query].max())
    assert out[is_query & ~kept].isnan().all() and (is_query & ~kept).any()


def test_paged_attention_reference_chunks_and_dispatch_agree() -> None:
    """The chunked loop of the reference (tiny chunk budget) and the CPU dispatch give one answer."""
    case = make_paged_case(11, dtype=torch.float32, **PAGED_CASES["ring_wraparound"])
    whole = paged_attention(*attention_args(case))
    chunked = paged_attention_reference(*attention_args(case), chunk_elems=1)
    torch.testing.assert_close(whole, chunked, atol=1e-6, rtol=1e-6)


def test_paged_attention_reference_all_padding_and_empty() -> None:
    case = make_paged_case(2, dtype=torch.float32, **PAGED_CASES["no_window"])
    q_pos = torch.full_like(case["q_pos"], -1)
    out = torch.full_like(case["q"], float("nan"))
    args = list(attention_args(case))
    args[5] = q_pos
    paged_attention_reference(*args, out=out)
    assert (out == 0).all()
    empty = paged_attention_reference(case["q"][:0], *args[1:4], case["seq_ids"][:0], q_pos[:0], *args[6:])
    assert empty.shape == (0,) + case["q"].shape[1:]


@pytest.mark.parametrize("window", [12, None])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_paged_attention_tree_rows_read_their_ancestors(window: int | None, dtype: torch.dtype) -> None:
    """tree_root/tree_slots: each node row sees its sequence up to the root and then exactly its own
    ancestors' keys (siblings' keys and the ring's NaN slots after the root never leak in)."""
    case = make_tree_case(5, dtype, window=window)
    out = paged_attention(*attention_args(case), tree_root=case["tree_root"], tree_slots=case["tree_slots"])
    assert torch.isfinite(out).all()
    rel = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    assert_attention_close(out, dense_tree_attention(case).to(out.dtype), rel=rel)
    with pytest.raises(ValueError, match="come together"):
        paged_attention(*attention_args(case), tree_root=case["tree_root"])
    with pytest.raises(ValueError, match="tokens_per_run must be 1"):
        paged_attention(*attention_args(case), tree_root=case["tree_root"], tree_slots=case["tree_slots"],
                        tokens_per_run=2)


def test_paged_attention_rejects_bad_inputs() -> None:
    case = make_paged_case(1, dtype=torch.float32, **PAGED_CASES["no_window"])
    args = list(attention_args(case))
    with pytest.raises(ValueError):  # 6 q heads over 4 kv heads
        paged_attention(case["q"], case["k_cache"].repeat(1, 1, 2, 1), case["v_cache"].repeat(1, 1, 2, 1),
                        *args[3:])
    with pytest.raises(TypeError):
        paged_attention(case["q"].half(), *args[1:])
    with pytest.raises(ValueError):
        paged_attention(*args, out=torch.empty(1))
    with pytest.raises(ValueError):
        paged_attention(*args, tokens_per_run=0)


# =============================================================================================
# Triton kernels under the interpreter (one subprocess, one pytest result per check)
# =============================================================================================
def _assert_bitwise(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    ints = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[a.dtype]
    assert torch.equal(a.view(ints), b.view(ints)), f"{(a != b).sum()} elements differ"


def _check_interpreter_active() -> None:
    """The kernels are interpreted functions (not compiled, not bypassed)."""
    from triton.runtime.interpreter import InterpretedFunction

    from kernels import _gather_add_triton, _paged_attention_triton

    for fn in (_gather_add_triton.gather_add_kernel, _paged_attention_triton.paged_attention_kernel,
               _paged_attention_triton.combine_splits_kernel, _paged_attention_triton.write_kv_kernel):
        assert isinstance(fn, InterpretedFunction), type(fn)


def _gather_check(dtype: torch.dtype) -> Callable[[], None]:
    def check() -> None:
        for rows, hidden, audio_rows in [(7, 40, 5), (20, 1500, 3), (3, 16, 0)]:
            case = make_gather_case(rows + hidden, rows, hidden, 11, audio_rows, dtype)
            out = torch.full((rows, hidden), float("nan"), dtype=dtype)
            ret = gather_add_embeddings(out, case["tok"], case["embed"], case["audio"], case["arow"],
                                        backend="triton")
            assert ret is out
            expected = _REFERENCES["gather_add_reference"](torch.empty_like(out), case["tok"], case["embed"],
                                                           case["audio"], case["arow"])
            if dtype == torch.bfloat16:
                # The interpreter rounds fp32 -> bf16 toward zero (GPUs round to nearest even), so
                # here the kernel may be one bf16 ulp off; the GPU test checks bf16 bitwise.
                assert torch.isfinite(out).all()
                torch.testing.assert_close(out, expected, atol=0, rtol=2 ** -7)
            else:
                _assert_bitwise(out, expected)
    return check


def _write_kv_check() -> None:
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        k_cache = torch.full((6, 4, 3, 24), float("nan"), dtype=dtype)
        v_cache = torch.full_like(k_cache, float("nan"))
        k = torch.randn(7, 3, 24, generator=g).to(dtype)
        v = torch.randn(7, 3, 24, generator=g).to(dtype)
        slots = torch.tensor([23, -1, 0, 5, 9, -2, 14])
        write_kv(k_cache, v_cache, k, v, slots, backend="triton")
        ref_k, ref_v = torch.full_like(k_cache, float("nan")), torch.full_like(v_cache, float("nan"))
        _REFERENCES["write_kv_reference"](ref_k, ref_v, k, v, slots)
        torch.testing.assert_close(k_cache, ref_k, atol=0, rtol=0, equal_nan=True)
        torch.testing.assert_close(v_cache, ref_v, atol=0, rtol=0, equal_nan=True)
        assert not k_cache.isnan().all()


def _attention_check(name: str, dtype: torch.dtype, *, run_len: int | None = None, num_splits: int = 1,
                     **overrides: object) -> Callable[[], None]:
    def check() -> None:
        params = dict(PAGED_CASES[name], **overrides)
        case = make_paged_case(7, dtype=dtype, run_len=run_len, **params)
        out = torch.full_like(case["q"], float("nan"))
        ret = paged_attention(*attention_args(case), out=out, tokens_per_run=run_len or 1, num_splits=num_splits,
                              backend="triton")
        assert ret is out
        assert torch.isfinite(out).all(), "unwritten or poisoned output rows"
        assert (out[case["q_pos"] < 0] == 0).all()
        expected = _REFERENCES["paged_attention_reference"](*attention_args(case))
        rel = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]
        assert_attention_close(out, expected, rel=rel)
    return check


def _tree_check(num_splits: int) -> Callable[[], None]:
    def check() -> None:
        case = make_tree_case(9, torch.float32)
        out = paged_attention(*attention_args(case), tree_root=case["tree_root"], tree_slots=case["tree_slots"],
                              num_splits=num_splits, backend="triton")
        assert torch.isfinite(out).all()
        assert_attention_close(out, dense_tree_attention(case).float(), rel=1e-5)
    return check


def _run_contract_violation_check() -> None:
    """A run mixing two sequences reports NaN on the rows of the odd one out, never wrong numbers."""
    case = make_paged_case(3, dtype=torch.float32, **PAGED_CASES["encoder_like"])
    out = paged_attention(*attention_args(case), tokens_per_run=len(case["q_pos"]), backend="triton")
    expected = _REFERENCES["paged_attention_reference"](*attention_args(case))
    is_query = case["q_pos"] >= 0
    kept = is_query & (case["seq_ids"] == case["seq_ids"][is_query].max())
    assert out[is_query & ~kept].isnan().all() and (is_query & ~kept).any()
    torch.testing.assert_close(out[kept], expected[kept], atol=1e-5, rtol=1e-5)
    assert (out[~is_query] == 0).all()


def _with_env(env: dict[str, str], check: Callable[[], None]) -> Callable[[], None]:
    """`check` with the environment switches `env` set (the kernels read them at launch)."""
    def run() -> None:
        with mock.patch.dict(os.environ, env):
            check()
    return run


def _early_is_taken_check() -> None:
    """The kernel's EARLY switch is on by default and STREAMSCRIBE_ATTN_EARLY=0 reaches it (so the `attn_*` checks
    test the path without it and the `attn_early_*` checks the one with it)."""
    from kernels import _paged_attention_triton as pat

    with mock.patch.dict(os.environ):
        os.environ.pop("STREAMSCRIBE_ATTN_EARLY", None)
        assert pat.early_metadata()
        os.environ["STREAMSCRIBE_ATTN_EARLY"] = "0"
        assert not pat.early_metadata()


EARLY = {"STREAMSCRIBE_ATTN_EARLY": "1"}
LATE = {"STREAMSCRIBE_ATTN_EARLY": "0"}  # the metadata read after the PDL wait (the kernel before the default)
# No bf16 attention here: triton 3.6's interpreter multiplies the raw bits of bf16 operands in tl.dot
# (it stores bf16 as uint16), so bf16 attention is checked on the GPU only.
INTERPRETER_CHECKS: dict[str, Callable[[], None]] = {
    "interpreter_active": _check_interpreter_active,
    "gather_add_fp32": _gather_check(torch.float32),
    "gather_add_fp16": _gather_check(torch.float16),
    "gather_add_bf16": _gather_check(torch.bfloat16),
    "write_kv": _write_kv_check,
    # the metadata read after the PDL wait (STREAMSCRIBE_ATTN_EARLY=0; the default before the twenty-eighth session)
    "attn_gqa_window_fp32": _with_env(LATE, _attention_check("gqa_window_smaller_than_history", torch.float32)),
    "attn_gqa_window_fp16_splits": _with_env(LATE, _attention_check("gqa_window_smaller_than_history",
                                                                    torch.float16, num_splits=3)),
    "attn_long_window_runs_fp16": _with_env(LATE, _attention_check("window_larger_than_history", torch.float16,
                                                                   run_len=4)),
    "attn_no_window_splits_fp32": _with_env(LATE, _attention_check("no_window", torch.float32, num_splits=2)),
    "attn_ring_wrap_runs_splits_fp32": _with_env(LATE, _attention_check("ring_wraparound", torch.float32, run_len=5,
                                                                        num_splits=2)),
    "attn_block_size_one_fp32": _with_env(LATE, _attention_check("block_size_one", torch.float32)),
    "attn_encoder_runs_fp16": _with_env(LATE, _attention_check("encoder_like", torch.float16, run_len=4)),
    "attn_head_dim_24_fp32": _with_env(LATE, _attention_check("gqa_window_smaller_than_history", torch.float32,
                                                              d=24)),
    "attn_run_contract_violation": _with_env(LATE, _run_contract_violation_check),
    "attn_tree_fp32": _with_env(LATE, _tree_check(1)),
    "attn_tree_splits_fp32": _with_env(LATE, _tree_check(3)),
    # the metadata read before the PDL wait, keys and values requested together (the default)
    "attn_early_switch": _early_is_taken_check,
    "attn_early_gqa_window_fp16_splits": _with_env(EARLY, _attention_check("gqa_window_smaller_than_history",
                                                                           torch.float16, num_splits=3)),
    "attn_early_ring_wrap_runs_splits_fp32": _with_env(EARLY, _attention_check("ring_wraparound", torch.float32,
                                                                               run_len=5, num_splits=2)),
    "attn_early_block_size_one_fp32": _with_env(EARLY, _attention_check("block_size_one", torch.float32)),
    "attn_early_encoder_runs_fp16": _with_env(EARLY, _attention_check("encoder_like", torch.float16, run_len=4)),
    "attn_early_no_window_fp32": _with_env(EARLY, _attention_check("no_window", torch.float32, num_splits=2)),
    "attn_early_run_contract_violation": _with_env(EARLY, _run_contract_violation_check),
    "attn_early_tree_splits_fp32": _with_env(EARLY, _tree_check(3)),
    # several key tiles per program (fp32 tiles hold 16 keys): the next tile's slots are read a tile ahead
    "attn_early_multi_tile_encoder_fp32": _with_env(EARLY, _attention_check("encoder_like", torch.float32, run_len=4)),
    "attn_early_multi_tile_long_window_fp32": _with_env(EARLY, _attention_check("window_larger_than_history",
                                                                                torch.float32, run_len=4)),
    "attn_early_multi_tile_tree_fp32": _with_env(EARLY, _tree_check(1)),
}
# Filled in the subprocess with the real references before the dispatch copies are disabled.
_REFERENCES: dict[str, Callable] = {}


def _interpreter_main() -> None:
    """Entry point of the subprocess: run every check, print {name: "ok" | error} as JSON."""
    import traceback

    assert os.environ.get("TRITON_INTERPRET") == "1"
    # importlib: the package re-exports functions under the submodules' names.
    ga = importlib.import_module("kernels.gather_add")
    pa = importlib.import_module("kernels.paged_attention")

    _REFERENCES.update(gather_add_reference=ga.gather_add_reference, write_kv_reference=pa.write_kv_reference,
                       paged_attention_reference=pa.paged_attention_reference)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the dispatcher ran the torch reference instead of the Triton kernel")

    ga.gather_add_reference = pa.write_kv_reference = pa.paged_attention_reference = forbidden
    torch.set_num_threads(1)
    results = {}
    for name, check in INTERPRETER_CHECKS.items():
        try:
            check()
            results[name] = "ok"
        except Exception:  # report every failure, keep going
            results[name] = traceback.format_exc()
    print("RESULTS " + json.dumps(results))


@pytest.fixture(scope="module")
def interpreter_results() -> dict[str, str]:
    from conftest import run_under_triton_interpreter

    return run_under_triton_interpreter(Path(__file__).resolve())


@pytest.mark.skipif(not kernels.HAVE_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("name", list(INTERPRETER_CHECKS))
def test_triton_interpreter(name: str, interpreter_results: dict[str, str]) -> None:
    assert interpreter_results.get(name) == "ok", interpreter_results.get(name, "check did not run")


# =============================================================================================
# GPU: native Triton vs reference at realistic shapes, poisoned outputs, CUDA graphs
# =============================================================================================
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_gather_add_bitwise(dtype: torch.dtype) -> None:
    case = make_gather_case(0, 512, 3072, 4096, 700, dtype, device="cuda")
    out = torch.full((512, 3072), float("nan"), dtype=dtype, device="cuda")
    gather_add_embeddings(out, case["tok"], case["embed"], case["audio"], case["arow"])
    expected = gather_add_reference(torch.empty_like(out), case["tok"], case["embed"], case["audio"], case["arow"])
    _assert_bitwise(out, expected)
    _assert_bitwise(out.cpu(), gather_add_loop({k: v.cpu() for k, v in case.items()}))


def test_attention_min_keys_per_split_switch(monkeypatch) -> None:
    pytest.importorskip("triton")
    from kernels import _paged_attention_triton as pat

    monkeypatch.delenv("STREAMSCRIBE_ATTN_MIN_KEYS", raising=False)
    assert pat.min_keys_per_split() == pat.MIN_KEYS_PER_SPLIT == 64
    monkeypatch.setenv("STREAMSCRIBE_ATTN_MIN_KEYS", "128")
    assert pat.min_keys_per_split() == 128
    for bad in ("0", "-5", "many"):
        monkeypatch.setenv("STREAMSCRIBE_ATTN_MIN_KEYS", bad)
        with pytest.raises(ValueError, match="STREAMSCRIBE_ATTN_MIN_KEYS must be a positive number"):
            pat.min_keys_per_split()


def test_attention_split_cap_switch(monkeypatch) -> None:
    """STREAMSCRIBE_ATTN_MAX_SPLITS caps the split count (the LM's at batch 1 is the cap itself), and only caps it."""
    pytest.importorskip("triton")
    from types import SimpleNamespace

    from kernels import _paged_attention_triton as pat

    monkeypatch.setattr(pat.torch.cuda, "get_device_properties", lambda _: SimpleNamespace(multi_processor_count=132))
    cuda = torch.device("cuda")
    monkeypatch.delenv("STREAMSCRIBE_ATTN_MAX_SPLITS", raising=False)
    assert pat.max_splits() == pat.MAX_SPLITS == 64
    assert pat.choose_num_splits(1, 8, 8192, cuda) == 64  # LM, batch 1: 66 wanted, 128 by work
    assert pat.choose_num_splits(1, 32, 753, cuda) == 12  # encoder, batch 1: by work
    monkeypatch.setenv("STREAMSCRIBE_ATTN_MAX_SPLITS", "16")
    assert pat.choose_num_splits(1, 8, 8192, cuda) == 16
    assert pat.choose_num_splits(1, 32, 753, cuda) == 12  # under the cap: unchanged
    assert pat.choose_num_splits(64, 8, 8192, cuda) == 2  # larger batches: bounded by programs per SM
    assert pat.choose_num_splits(1, 8, 8192, torch.device("cpu")) == 1
    for bad in ("0", "1025", "many"):
        monkeypatch.setenv("STREAMSCRIBE_ATTN_MAX_SPLITS", bad)
        with pytest.raises(ValueError, match="STREAMSCRIBE_ATTN_MAX_SPLITS must be a number of splits"):
            pat.max_splits()


@pytest.mark.gpu
def test_gpu_write_kv_matches_reference() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    k_cache = torch.full((64, 16, 8, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    v_cache = torch.full_like(k_cache, float("nan"))
    k = torch.randn(300, 8, 128, generator=g, device="cuda").bfloat16()
    v = torch.randn(300, 8, 128, generator=g, device="cuda").bfloat16()
    slots = torch.randperm(64 * 16, generator=g, device="cuda")[:300]
    slots[::7] = -1
    write_kv(k_cache, v_cache, k, v, slots)
    ref_k, ref_v = torch.full_like(k_cache, float("nan")), torch.full_like(v_cache, float("nan"))
    write_kv_reference(ref_k, ref_v, k, v, slots)
    torch.testing.assert_close(k_cache, ref_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, ref_v, atol=0, rtol=0, equal_nan=True)


LM = dict(hq=32, hkv=8, d=128, block_size=16, window=8192)
ENCODER = dict(hq=32, hkv=32, d=64, block_size=16, window=750)
GPU_CASES = {
    # name: (shape, last positions, q_len, tokens_per_run)
    "lm_decode_batch1_long": (LM, [20000], 1, 1),
    "lm_decode_batch16": (LM, [9000 + 613 * i for i in range(15)] + [37], 1, 1),
    "lm_verify_q5": (LM, [8500 + 997 * i for i in range(6)] + [3], 5, 5),
    "encoder_step_q4": (ENCODER, [749 + 131 * i for i in range(24)] + [1, 3], 4, 4),
    "encoder_step_q4_per_token": (ENCODER, [2000 + 17 * i for i in range(8)], 4, 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("early", ["0", "1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_paged_attention_matches_reference(name: str, dtype: torch.dtype, early: str, monkeypatch) -> None:
    monkeypatch.setenv("STREAMSCRIBE_ATTN_EARLY", early)  # the metadata read before the PDL wait, or after it
    shape, last, q_len, run = GPU_CASES[name]
    case = make_paged_case(1, dtype=dtype, device="cuda", last=last, q_lens=[q_len] * len(last),
                           run_len=run if run > 1 else None, q_scale=1.5, **shape)
    expected = paged_attention_reference(*attention_args(case))
    for num_splits in (None, 1, 7):
        out = torch.full_like(case["q"], float("nan"))
        paged_attention(*attention_args(case), out=out, tokens_per_run=run, num_splits=num_splits)
        assert torch.isfinite(out).all(), f"unwritten or poisoned rows (num_splits={num_splits})"
        assert (out[case["q_pos"] < 0] == 0).all()
        assert_attention_close(out, expected, rel=2e-2 if dtype == torch.bfloat16 else 5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("early", ["0", "1"])
def test_gpu_cuda_graph_replay_matches_eager(early: str, monkeypatch) -> None:
    """write_kv + paged_attention + gather_add captured once, replayed with new metadata in place. With
    STREAMSCRIBE_ATTN_EARLY=1 the attention reads its metadata before the PDL wait and the keys write_kv has just
    written after it: a key read too early would differ from eager launches."""
    monkeypatch.setenv("STREAMSCRIBE_ATTN_EARLY", early)
    dev, dtype = "cuda", torch.bfloat16
    case = make_paged_case(5, dtype=dtype, device=dev, last=[300, 40, 1000, 7], q_lens=[1] * 4, pad_rows=0,
                           hq=8, hkv=2, d=128, block_size=16, window=256)
    t, hq, d = case["q"].shape
    bs, width = case["k_cache"].shape[1], case["block_tables"].shape[1]
    gen = torch.Generator(device=dev).manual_seed(0)
    static = dict(q=case["q"].clone(), k=torch.zeros(t, 2, d, dtype=dtype, device=dev),
                  v=torch.zeros(t, 2, d, dtype=dtype, device=dev), pos=case["q_pos"].clone(),
                  seq=case["seq_ids"].clone(), slots=torch.full((t,), -1, dtype=torch.int64, device=dev),
                  out=torch.empty_like(case["q"]), tok=torch.zeros(t, dtype=torch.int64, device=dev),
                  arow=torch.zeros(t, dtype=torch.int64, device=dev), emb=torch.empty(t, 64, dtype=dtype, device=dev))
    embed = torch.randn(100, 64, generator=gen, device=dev).to(dtype)
    audio = torch.randn(10, 64, generator=gen, device=dev).to(dtype)

    def step(k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, emb_out: torch.Tensor) -> None:
        gather_add_embeddings(emb_out, static["tok"], embed, audio, static["arow"])
        write_kv(k_cache, v_cache, static["k"], static["v"], static["slots"])
        paged_attention(static["q"], k_cache, v_cache, case["block_tables"], static["seq"], static["pos"],
                        case["window"], case["scale"], out=out, num_splits=3)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile + warm up outside the capture
        step(case["k_cache"].clone(), case["v_cache"].clone(), torch.empty_like(static["out"]),
             torch.empty_like(static["emb"]))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(case["k_cache"], case["v_cache"], static["out"], static["emb"])

    # Next step: every sequence advances by one position; new q/k/v and metadata copied in place.
    new_pos = case["q_pos"] + 1
    blocks = case["block_tables"][case["seq_ids"].long(), (new_pos // bs) % width].long()
    static["pos"].copy_(new_pos)
    static["slots"].copy_(blocks * bs + new_pos % bs)
    static["q"].copy_(torch.randn(t, hq, d, generator=gen, device=dev).to(dtype))
    static["k"].copy_(torch.randn(t, 2, d, generator=gen, device=dev).to(dtype))
    static["v"].copy_(torch.randn(t, 2, d, generator=gen, device=dev).to(dtype))
    static["tok"].copy_(torch.randint(0, 100, (t,), generator=gen, device=dev))
    static["arow"].copy_(torch.tensor([3, -1, 9, 0], device=dev))
    k_before, v_before = case["k_cache"].clone(), case["v_cache"].clone()
    static["out"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()

    k_eager, v_eager = k_before.clone(), v_before.clone()
    out_eager, emb_eager = torch.empty_like(static["out"]), torch.empty_like(static["emb"])
    step(k_eager, v_eager, out_eager, emb_eager)
    _assert_bitwise(static["out"], out_eager)
    _assert_bitwise(static["emb"], emb_eager)
    torch.testing.assert_close(case["k_cache"], k_eager, atol=0, rtol=0, equal_nan=True)
    expected = paged_attention_reference(static["q"], k_eager, v_eager, case["block_tables"], static["seq"],
                                         static["pos"], case["window"], case["scale"])
    assert_attention_close(static["out"], expected, rel=2e-2)


if __name__ == "__main__":
    _interpreter_main()
