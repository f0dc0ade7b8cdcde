"""Short-query attention over sliding-window paged key/value caches.

Cache layout (per layer): `k_cache`, `v_cache` [num_blocks, block_size, Hkv, D]. Each sequence owns
a ring of `table_width` physical blocks, `block_tables` [S, table_width] (int32): logical block
`b = position // block_size` of sequence s lives in physical block `block_tables[s, b % table_width]`
at offset `position % block_size`. Slots are `physical_block * block_size + offset`.

A query at position p attends to the keys at positions k with `max(0, p - window + 1) <= k <= p`
(`window` None or 0: all `0 <= k <= p`). Keys of the current step are written first
(`write_kv`), so a query sees its own key. GQA: q head h reads kv head `h // (Hq // Hkv)`.
Rows with `q_pos < 0` are padding and produce 0. Positions outside a query's window are never
read, so the engine may recycle their blocks: see `ring_table_width` for how wide a ring must be.

`paged_attention_reference` defines the semantics (one gather per query, the straightforward way);
`paged_attention_runs` is the CPU implementation (one gather per run of queries, like the kernel; or, where the
caller promises finite rings laid out whole and ring-aligned, as the engine's are, no gather at all: the rings are
read in place through a view, `rings_finite`);
the Triton kernels (`_paged_attention_triton.py`) are the CUDA one and are CUDA-graph capturable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._dispatch import FLOAT_DTYPES, check_index_tensor, use_triton


def ring_table_width(window: int, block_size: int, max_q_len: int) -> int:
    """Smallest ring (blocks per sequence) that never overwrites a position a query can still read.

    One step writes up to `max_q_len` positions ending at p and its oldest query reads back to
    `p - max_q_len + 1 - window + 1`: a span of `window + max_q_len - 1` positions, which touches at
    most `ceil((window + max_q_len - 1) / block_size) + 1` blocks when it does not start on a block
    boundary. Without a window the table must simply cover every position (no ring).
    """
    if not window or window < 1:
        raise ValueError("a ring needs a sliding window >= 1; without one the table must cover all positions")
    if block_size < 1 or max_q_len < 1:
        raise ValueError(f"block_size and max_q_len must be >= 1, got {block_size}, {max_q_len}")
    return math.ceil((window + max_q_len - 1) / block_size) + 1


# ---------------------------------------------------------------------------------------------
# write_kv
# ---------------------------------------------------------------------------------------------
def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache/v_cache must both be [num_blocks, block_size, Hkv, D], got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.dtype != v_cache.dtype or k_cache.device != v_cache.device:
        raise TypeError("k_cache and v_cache must share dtype and device")


def check_write(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                slot_mapping: torch.Tensor) -> None:
    _check_cache(k_cache, v_cache)
    if k.dim() != 3 or k.shape != v.shape or k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"k/v must be [T, Hkv, D] matching the cache, got {tuple(k.shape)}, {tuple(v.shape)} "
                         f"for cache {tuple(k_cache.shape)}")
    if k.device != k_cache.device or v.device != k_cache.device:
        raise ValueError("k/v must be on the cache's device")
    check_index_tensor("slot_mapping", slot_mapping, k.shape[0], k_cache.device)


def write_kv_reference(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       slot_mapping: torch.Tensor) -> None:
    """Store k/v [T, Hkv, D] at `slot_mapping` [T] (slot < 0: skipped). Slots must be distinct.

    Boolean indexing syncs the host, so this is the CPU path, not a graph-capturable one.
    """
    check_write(k_cache, v_cache, k, v, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[keep].to(v_cache.dtype)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor, *, backend: str = "auto") -> None:
    """Store the step's keys/values in the paged cache (in place).

    k, v: [T, Hkv, D]; slot_mapping: [T] int64 `physical_block * block_size + offset`, negative for
    padding rows (skipped). Distinct slots only. The Triton path (CUDA) is graph capturable.
    """
    check_write(k_cache, v_cache, k, v, slot_mapping)
    if not use_triton(backend, k_cache.device):
        write_kv_reference(k_cache, v_cache, k, v, slot_mapping)
        return
    from ._paged_attention_triton import launch_write_kv

    launch_write_kv(k_cache, v_cache, k, v, slot_mapping)


# ---------------------------------------------------------------------------------------------
# paged_attention
# ---------------------------------------------------------------------------------------------
def _check_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_ids: torch.Tensor, q_pos: torch.Tensor, window: int | None,
                     out: torch.Tensor | None) -> None:
    _check_cache(k_cache, v_cache)
    if q.dim() != 3:
        raise ValueError(f"q must be [T, Hq, D], got {tuple(q.shape)}")
    t, hq, d = q.shape
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"head_dim differs: q {d}, cache {k_cache.shape[3]}")
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
    if q.dtype != k_cache.dtype or q.dtype not in FLOAT_DTYPES + (torch.float64,):
        raise TypeError(f"q and the cache must share a float dtype, got {q.dtype} and {k_cache.dtype}")
    if q.device != k_cache.device:
        raise ValueError(f"q is on {q.device}, the cache on {k_cache.device}")
    if block_tables.dim() != 2 or block_tables.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"block_tables must be a 2-D int32/int64 tensor, got {block_tables.dtype} "
                        f"{tuple(block_tables.shape)}")
    if block_tables.device != q.device:
        raise ValueError("block_tables must be on q's device")
    check_index_tensor("seq_ids", seq_ids, t, q.device)
    check_index_tensor("q_pos", q_pos, t, q.device)
    if window is not None and window < 0:
        raise ValueError(f"window must be None or >= 0, got {window}")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device):
        raise ValueError(f"out must be like q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")


def _output_and_max_position(q: torch.Tensor, q_pos: torch.Tensor, out: torch.Tensor | None
                             ) -> tuple[torch.Tensor, int]:
    """The output tensor and the largest query position (a host sync); all padding: zeroed output, -1."""
    result = torch.zeros_like(q) if out is None else out
    max_pos = int(q_pos.max()) if q.shape[0] else -1
    if max_pos < 0:
        result.zero_()
    return result, max_pos


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_tables: torch.Tensor, seq_ids: torch.Tensor, q_pos: torch.Tensor,
                              window: int | None, scale: float, out: torch.Tensor | None = None, *,
                              chunk_elems: int = 1 << 25, tree_root: torch.Tensor | None = None,
                              tree_slots: torch.Tensor | None = None) -> torch.Tensor:
    """Definition of `paged_attention` in plain torch (tests hold the other implementations to it).

    For each query token it gathers the keys at positions p, p-1, ..., p-L+1 through the ring
    table (L = min(window, max position + 1)), masks positions < 0, and takes a softmax in fp32
    (fp64 for fp64 inputs). Vectorised over tokens, in chunks of tokens whose gathered keys
    [chunk, L, Hkv, D] hold about `chunk_elems` elements. Syncs the host (it reads max(q_pos)), so it
    is not for CUDA-graph capture.
    """
    _check_attention(q, k_cache, v_cache, block_tables, seq_ids, q_pos, window, out)
    result, max_pos = _output_and_max_position(q, q_pos, out)
    if max_pos < 0:
        return result
    t, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    group = hq // hkv
    compute = torch.promote_types(q.dtype, torch.float32)
    span = max_pos + 1 if not window else min(window, max_pos + 1)
    width = block_tables.shape[1]
    offsets = torch.arange(span, device=q.device)
    chunk = max(1, chunk_elems // max(1, span * hkv * d))
    for start in range(0, t, chunk):
        sl = slice(start, min(t, start + chunk))
        pos = q_pos[sl].long()
        is_query = pos >= 0
        key_pos = pos[:, None] - offsets[None, :]  # [n, L]; p, p-1, ... (window already applied by L)
        valid = (key_pos >= 0) & is_query[:, None]
        key_pos = key_pos.clamp(min=0)
        seq = torch.where(is_query, seq_ids[sl].long(), 0)
        phys = block_tables[seq[:, None], (key_pos // block_size) % width].long()
        off = key_pos % block_size
        if tree_root is not None:  # keys after a token's root come from its own slot list
            root = tree_root[sl].long()[:, None]
            in_tree = (root >= 0) & (key_pos > root) & valid
            idx = (key_pos - root - 1).clamp(0, tree_slots.shape[1] - 1)
            tslot = tree_slots[sl].long().gather(1, idx)
            phys = torch.where(in_tree, tslot // block_size, phys)
            off = torch.where(in_tree, tslot % block_size, off)
        mask4 = valid[:, :, None, None]
        # where(), not a product: never-read slots may hold NaN/inf and must not leak in.
        keys = torch.where(mask4, k_cache[phys, off].to(compute), 0.0)  # [n, L, Hkv, D]
        vals = torch.where(mask4, v_cache[phys, off].to(compute), 0.0)
        qc = q[sl].to(compute).view(-1, hkv, group, d)
        scores = torch.einsum("nhgd,nlhd->nhgl", qc, keys) * scale
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("nhgl,nlhd->nhgd", probs, vals).reshape(-1, hq, d)
        o = torch.where(is_query[:, None, None], o, 0.0)  # padding rows: 0 (their softmax is NaN)
        result[sl] = o.to(q.dtype)
    return result


@dataclass
class RunsLayout:
    """The index work of `paged_attention_runs` for one step's queries: which keys each run reads and
    which (query, key) pairs are allowed. It depends only on the step's tables, sequence ids, positions,
    window and block size, so every layer of a cache can share it (`RunsPlan`)."""

    t: int  # query rows
    r: int  # rows per run
    n_runs: int
    pad: int  # padding rows added to fill the last run
    phys: torch.Tensor  # [n_runs, nb] physical key blocks each run reads
    drop: torch.Tensor  # [n_runs, L, 1, 1] gathered slots outside the run's key range
    # where `drop` may be true: slots [0, head_end) (before key_lo, in the first block) and [tail_start, L)
    # (after the newest position of some run); in between every run's slots are valid
    head_end: int
    tail_start: int
    allowed: torch.Tensor  # [n_runs, 1, r, L] (query, key) pairs a row attends to
    is_query: torch.Tensor  # [T] non-padding rows
    broken: torch.Tensor  # [T] rows of a run that mixes sequences (flagged NaN)


@dataclass
class RingsLayout:
    """The index work of reading rings in place (`paged_attention_runs` with `rings_finite`): every stream of
    the step owns a whole ring of blocks that lies contiguously in the cache, ring-aligned (ring i = blocks
    i*width .. i*width + width - 1), so SDPA reads the keys through a view of rings first .. first + count - 1
    instead of gathering them. Each view entry takes all of its stream's query rows (one run, or the several
    runs of a look-ahead chunk). Slot j of a ring holds the newest written position congruent to j modulo the
    ring's positions, which the mask derives per stream from its newest position."""

    t: int  # query rows
    r: int  # rows per run
    first: int  # the view's first ring
    count: int  # rings in the view (some may belong to no stream of this step: all masked, outputs dropped)
    length: int  # slots read from each ring: all of it, or while no stream has wrapped, the written prefix
    rows: int  # query rows per view entry
    # True: the step's runs are the view's entries in order (run i = entry i; rows as they come, by a view);
    # False: `entry`/`rank` place each query row `qrows` (scattered in, gathered out)
    direct: bool
    qrows: torch.Tensor  # [n] the step's query rows
    entry: torch.Tensor  # [n] each one's view entry
    rank: torch.Tensor  # [n] its place among its entry's rows
    allowed: torch.Tensor  # [count, 1, rows, length] (query, slot) pairs a row attends to
    is_query: torch.Tensor  # [T] non-padding rows


@dataclass
class RunsPlan:
    """A step's `RunsLayout` (or `RingsLayout`), made by the first layer's CPU attention call and reused by the
    others (`PagedAttention` holds one per step). The Triton path never fills it."""

    layout: RunsLayout | None = None
    rings: RingsLayout | None = None
    rings_checked: bool = False  # whether the step's runs were checked for reading rings in place


def _runs_of(q_pos: torch.Tensor, seq_ids: torch.Tensor, r: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's rows as runs of r: positions and sequence ids [n_runs, r] (the last run filled with padding rows),
    which rows are queries, and each run's owner (its largest query row's sequence, -1 for a run of padding)."""
    t = q_pos.shape[0]
    n_runs = -(-t // r)
    pad = n_runs * r - t
    pos, seq = q_pos.long(), seq_ids.long()
    if pad:
        pos = torch.cat([pos, pos.new_full((pad,), -1)])
        seq = torch.cat([seq, seq.new_zeros(pad)])
    pos, seq = pos.view(n_runs, r), seq.view(n_runs, r)
    is_query = pos >= 0
    return pos, seq, is_query, torch.where(is_query, seq, -1).amax(dim=1)


def _runs_layout(block_tables: torch.Tensor, seq_ids: torch.Tensor, q_pos: torch.Tensor, window: int | None,
                 block_size: int, tokens_per_run: int, max_pos: int) -> RunsLayout:
    t, r = q_pos.shape[0], tokens_per_run
    pos, seq, is_query, owner = _runs_of(q_pos, seq_ids, r)
    n_runs = pos.shape[0]
    pad = n_runs * r - t
    run_seq = owner.clamp(min=0)  # [n_runs]
    own = is_query & (seq == run_seq[:, None])  # rows of another sequence are flagged below
    run_top = torch.where(own, pos, -1).amax(dim=1)  # newest position of each run (-1: all padding)
    # keys from the run's oldest query's window start to its newest position, read as whole blocks
    # (block copies, not a per-position gather): logical blocks b0 .. b0 + nb - 1 of the run's ring
    run_low = torch.where(own, pos, max_pos).amin(dim=1)
    key_lo = (run_low - window + 1).clamp(min=0) if window else torch.zeros_like(run_low)
    key_lo = torch.where(run_top >= 0, key_lo, 0)
    b0 = key_lo // block_size
    last_block = run_top.clamp(min=0) // block_size - b0  # [n_runs]: each run's newest key block
    nb = int(last_block.max()) + 1
    # blocks 1 .. min(last_block) - 1 hold only valid keys for every run (a padding run makes it 0: all)
    tail_start = max(int(last_block.min()), 1) * block_size if bool((run_top >= 0).all()) else 0
    width = block_tables.shape[1]
    logical = b0[:, None] + torch.arange(nb, device=q_pos.device)[None, :]  # [n_runs, nb]
    phys = block_tables[run_seq[:, None], logical % width].long()
    key_pos = (b0 * block_size)[:, None] + torch.arange(nb * block_size, device=q_pos.device)[None, :]  # [n_runs, L]
    key_ok = (key_pos >= key_lo[:, None]) & (key_pos <= run_top[:, None])
    rel = pos[:, :, None] - key_pos[:, None, :]  # [n_runs, r, L]: query position - key position
    allowed = (rel >= 0) & key_ok[:, None, :] & is_query[:, :, None]
    if window:
        allowed &= rel < window
    # the contract of a run: its rows belong to its (largest) sequence; others are flagged, not hidden
    broken = (is_query & (seq != run_seq[:, None])).reshape(-1)[:t]
    return RunsLayout(t=t, r=r, n_runs=n_runs, pad=pad, phys=phys, drop=~key_ok[:, :, None, None],
                      head_end=block_size, tail_start=tail_start,
                      allowed=allowed[:, None], is_query=is_query.reshape(-1)[:t], broken=broken)


# a step reads rings in place only while its view holds at most this many rings per stream of the step (plus a
# few): rings of streams outside the step are computed and dropped, so a sparse view would cost more than a gather
_RINGS_PER_STREAM = 2


def _rings_layout(block_tables: torch.Tensor, seq_ids: torch.Tensor, q_pos: torch.Tensor, window: int | None,
                  block_size: int, tokens_per_run: int) -> RingsLayout | None:
    """The in-place layout of a step's rows, or None where it does not apply: no query row, a run mixing
    sequences (the gather path flags it), a table row that is not one whole ring-aligned range of blocks, two
    sequences with one ring, or a view much wider than the step's streams."""
    t, r = q_pos.shape[0], tokens_per_run
    run_pos, run_seq, run_query, owner = _runs_of(q_pos, seq_ids, r)
    if bool((run_query & (run_seq != owner[:, None])).any()):
        return None
    n_runs = run_pos.shape[0]
    pos, seq = run_pos.reshape(-1), run_seq.reshape(-1)
    is_query = pos[:t] >= 0
    qrows = torch.nonzero(is_query).flatten()
    if qrows.numel() == 0:
        return None
    qseq, qpos = seq[qrows], pos[qrows]
    seqs, inverse = torch.unique(qseq, return_inverse=True)
    width = block_tables.shape[1]
    rows = block_tables[seqs].long()  # [streams, width]
    base = rows[:, 0]
    if bool((base % width != 0).any()) or not torch.equal(rows, base[:, None] + torch.arange(width)):
        return None
    ring = base // width
    if torch.unique(ring).numel() != ring.numel():  # two sequences of one ring: not the engine's layout
        return None
    first = int(ring.min())
    count = int(ring.max()) - first + 1
    if count > _RINGS_PER_STREAM * seqs.numel() + 2:
        return None
    entry = ring[inverse] - first  # [n]
    direct = count == n_runs and torch.equal(entry, qrows // r)
    if direct:
        rank, per_entry = qrows % r, r
    else:  # a row's place among its stream's rows, in row order
        counts = torch.bincount(inverse, minlength=seqs.numel())
        order = torch.sort(inverse, stable=True).indices
        rank = torch.empty_like(inverse)
        rank[order] = torch.arange(qrows.numel()) - (torch.cumsum(counts, 0) - counts)[inverse[order]]
        per_entry = int(counts.max())
    ring_pos = width * block_size
    newest = torch.full((seqs.numel(),), -1, dtype=torch.long).scatter_reduce(0, inverse, qpos, "amax")
    top = int(newest.max())
    # while no stream has wrapped, slots past the newest position hold nothing: read the written prefix
    length = ring_pos if top >= ring_pos else min(ring_pos, -(-(top + 1) // block_size) * block_size)
    slots = torch.arange(length)
    held = newest[:, None] - ((newest[:, None] - slots[None, :]) % ring_pos)  # [streams, length]
    row_held = held[inverse]  # [n, length]
    rel = qpos[:, None] - row_held
    ok = (row_held >= 0) & (rel >= 0)
    if window:
        ok &= rel < window
    allowed = torch.zeros(count, 1, per_entry, length, dtype=torch.bool)
    allowed[entry, 0, rank] = ok
    return RingsLayout(t=t, r=r, first=first, count=count, length=length, rows=per_entry, direct=direct,
                       qrows=qrows, entry=entry, rank=rank, allowed=allowed, is_query=is_query)


def _rings_in_place(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lay: RingsLayout, width: int,
                    scale: float) -> torch.Tensor:
    """Attention of the step's rows over their rings read through a view of the cache: [T, Hq, D] in the
    compute dtype. Nothing is gathered; slots a row may not read are masked, never cleared, so they must hold
    finite values (the caller's promise, `rings_finite`)."""
    _, block_size, hkv, d = k_cache.shape
    hq = q.shape[1]
    compute = torch.promote_types(q.dtype, torch.float32)
    lo, hi = lay.first * width, (lay.first + lay.count) * width
    keys = k_cache[lo:hi].view(lay.count, width * block_size, hkv, d)[:, : lay.length].to(compute)
    vals = v_cache[lo:hi].view(lay.count, width * block_size, hkv, d)[:, : lay.length].to(compute)
    qf = q.to(compute)
    # [entries, Hq, rows, D]: q head h*group + g reads kv head h (enable_gqa repeats kv heads that way)
    if lay.direct:
        pad = lay.count * lay.r - lay.t
        if pad:
            qf = torch.cat([qf, qf.new_zeros(pad, hq, d)])
        qh = qf.reshape(lay.count, lay.r, hq, d).transpose(1, 2)
    else:  # rows to their entries; places of no row (and entries of no stream) stay zero
        qh = qf.new_zeros(lay.count, hq, lay.rows, d)
        qh[lay.entry, :, lay.rank] = qf[lay.qrows]
    o = F.scaled_dot_product_attention(qh, keys.transpose(1, 2), vals.transpose(1, 2), attn_mask=lay.allowed,
                                       scale=scale, enable_gqa=hq > hkv)
    if lay.direct:
        o = o.transpose(1, 2).reshape(lay.count * lay.r, hq, d)[: lay.t]
        return torch.where(lay.is_query[:, None, None], o, 0.0)  # padding rows: 0 (a fully masked row is NaN)
    out = qf.new_zeros(lay.t, hq, d)
    out[lay.qrows] = o[lay.entry, :, lay.rank]
    return out


def _cleared(x: torch.Tensor, lay: RunsLayout) -> torch.Tensor:
    """Zero the gathered slots outside each run's key range, in place; only the first block and the
    tail can hold such slots (`RunsLayout.head_end` / `tail_start`), so only those are visited."""
    x[:, : lay.head_end].masked_fill_(lay.drop[:, : lay.head_end], 0.0)
    if lay.tail_start < x.shape[1]:
        x[:, lay.tail_start:].masked_fill_(lay.drop[:, lay.tail_start:], 0.0)
    return x


def paged_attention_runs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                         seq_ids: torch.Tensor, q_pos: torch.Tensor, window: int | None, scale: float,
                         out: torch.Tensor | None = None, *, tokens_per_run: int = 1,
                         plan: RunsPlan | None = None, rings_finite: bool = False) -> torch.Tensor:
    """`paged_attention` in torch, reading each key once per run of queries: the CPU implementation.

    The reference gathers a window of keys for every query token. Here the queries are taken in
    runs of `tokens_per_run` rows of one sequence (the encoder's 4 frames of a token, a verify
    step's k+1 drafts), as the Triton kernel takes them: one gather of the keys from the run's
    newest position back over the window plus the run, then each row masks its own range. Same
    contract as the kernel: rows of a run whose seq id is below the run's largest one come out NaN.
    Never-read slots may hold anything: gathered keys and values outside the valid range are replaced,
    not multiplied, so NaN/inf there never leaks in. The product runs in
    `F.scaled_dot_product_attention` (the single-stream session's attention; 2-5x faster on the CPU
    than the two einsums it replaced).

    plan: a step's `RunsPlan`, shared by the calls of every layer of one cache: the first call fills
    it with the index work (and the host sync for the largest position), the others reuse it.

    rings_finite: the caller promises that every slot of every ring the step's tables name holds a finite
    value (the engine's caches start zeroed and zero a ring when a stream is admitted to it). Then, where
    each stream's ring lies whole and ring-aligned in the cache (the engine's layout: slot s owns blocks
    s*width ..), the rings are read in place through a view, each stream's rows (one run, or a look-ahead
    chunk's several) against its ring, with the slots a row may not read masked instead of cleared: no
    gather, no copy (`RingsLayout`; `benchmarks/bench_cpu_ring_attention.py`). The keys are summed in ring
    order rather than in position order, so results agree with the gather path to rounding. Other steps (a run
    mixing sequences, tables of scattered blocks, a view with many rings no row reads) take the gather path.
    Without the promise a NaN in a masked slot would leak (0 * NaN).
    """
    _check_attention(q, k_cache, v_cache, block_tables, seq_ids, q_pos, window, out)
    if tokens_per_run < 1:
        raise ValueError(f"tokens_per_run must be >= 1, got {tokens_per_run}")
    if rings_finite:
        if plan is not None and plan.rings_checked:
            rings = plan.rings
        else:
            rings = _rings_layout(block_tables, seq_ids, q_pos, window, k_cache.shape[1], tokens_per_run)
            if plan is not None:
                plan.rings, plan.rings_checked = rings, True
        if rings is not None:
            if rings.t != q.shape[0] or rings.r != tokens_per_run:
                raise ValueError(f"the plan was made for {rings.t} rows in runs of {rings.r}, "
                                 f"got {q.shape[0]} in runs of {tokens_per_run}")
            result = torch.empty_like(q) if out is None else out
            result.copy_(_rings_in_place(q, k_cache, v_cache, rings, block_tables.shape[1], scale).to(q.dtype))
            return result
    lay = plan.layout if plan is not None else None
    if lay is not None:  # an earlier layer's: every row below is overwritten, so no zeroing and no host sync
        if lay.t != q.shape[0] or lay.r != tokens_per_run:
            raise ValueError(f"the plan was made for {lay.t} rows in runs of {lay.r}, "
                             f"got {q.shape[0]} in runs of {tokens_per_run}")
        result = torch.empty_like(q) if out is None else out
    else:
        result, max_pos = _output_and_max_position(q, q_pos, out)
        if max_pos < 0:  # all padding: zeros (an all-padding step recomputes this, it is free)
            return result
        lay = _runs_layout(block_tables, seq_ids, q_pos, window, k_cache.shape[1], tokens_per_run, max_pos)
        if plan is not None:
            plan.layout = lay
    _, block_size, hkv, d = k_cache.shape
    hq = q.shape[1]
    group = hq // hkv
    compute = torch.promote_types(q.dtype, torch.float32)
    n, length = lay.n_runs, lay.phys.shape[1] * block_size
    # fresh copies: slots outside the run's range are cleared in place (NaN there must never leak in:
    # a masked score is added to, not replaced)
    blocks = lay.phys.reshape(-1)  # index_select: ~3x faster than advanced indexing on the CPU
    keys = _cleared(torch.index_select(k_cache, 0, blocks).to(compute).view(n, length, hkv, d), lay)
    vals = _cleared(torch.index_select(v_cache, 0, blocks).to(compute).view(n, length, hkv, d), lay)
    qf = q.to(compute)
    if lay.pad:
        qf = torch.cat([qf, qf.new_zeros(lay.pad, hq, d)])
    # [n_runs, Hq, r, D]: q head h*group + g reads kv head h (enable_gqa repeats kv heads that way)
    qh = qf.view(n, lay.r, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(n, hq, lay.r, d)
    o = F.scaled_dot_product_attention(qh, keys.transpose(1, 2), vals.transpose(1, 2), attn_mask=lay.allowed,
                                       scale=scale, enable_gqa=group > 1)
    o = o.transpose(1, 2).reshape(n * lay.r, hq, d)[: lay.t]
    o = torch.where(lay.is_query[:, None, None], o, 0.0)  # padding rows: 0 (their softmax is NaN)
    o = torch.where(lay.broken[:, None, None], float("nan"), o)
    result.copy_(o.to(q.dtype))
    return result


def splits_for_streams(streams: int, kv_heads: int, window: int | None, tokens_per_run: int,
                       device: torch.device) -> int | None:
    """The Triton path's key splits for a call whose runs belong to `streams` streams, as if each stream had one
    run (None off CUDA: the reference does not split). A caller that passes this as `num_splits` gets the same
    splits, so the same sums, for a stream's run whether the call holds one run of it or several (the encoder's
    look-ahead chunks: 8 audio tokens in one call give the bits of 8 one-token calls)."""
    if device.type != "cuda":
        return None
    from ._paged_attention_triton import choose_num_splits

    return choose_num_splits(streams, kv_heads, (window + tokens_per_run - 1) if window else None, device)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_ids: torch.Tensor, q_pos: torch.Tensor, window: int | None, scale: float,
                    out: torch.Tensor | None = None, *, tokens_per_run: int = 1, num_splits: int | None = None,
                    backend: str = "auto", tree_root: torch.Tensor | None = None,
                    tree_slots: torch.Tensor | None = None, plan: RunsPlan | None = None,
                    rings_finite: bool = False) -> torch.Tensor:
    """Attention of T query tokens (several sequences, flattened) over their paged caches.

    q: [T, Hq, D] (RoPE applied); seq_ids: [T] row of `block_tables` per token; q_pos: [T] absolute
    position per token (< 0: padding, output 0). `window`/`scale` are fixed per call site. Returns
    [T, Hq, D] in q's dtype (written into `out` when given).

    tokens_per_run (Triton performance hint, ignored by the reference): the tokens form consecutive
    runs of this many rows (the last run may be shorter) and the non-padding rows of a run belong
    to one sequence, so one program loads each key block once for all of them (encoder: 4,
    speculative verify: k+1). 1 is always valid. A run mixing sequences breaks the contract: its
    rows whose seq id is below the run's largest one are written as NaN, never silently wrong.

    num_splits: key-range splits per (run, kv head) for the Triton path (None: chosen from the
    shapes and the GPU's SM count so that small batches still fill the GPU; being shape-only, the
    choice is the same at capture and replay of a CUDA graph).

    tree_root [T] / tree_slots [T, U] (tree verification; together, with tokens_per_run 1): a token
    whose root r >= 0 reads its keys at positions r+1 .. q_pos (at most U of them) from the cache slots
    `tree_slots[t, position - r - 1]` instead of through the ring: the keys its draft-tree ancestors
    (and itself) wrote where siblings at the same position cannot collide. Positions <= r, and tokens
    with r < 0, read the ring as usual.

    plan: the CPU path's per-step index work, shared by every layer of one cache (`RunsPlan`).
    rings_finite: the CPU path may read whole ring-aligned rings in place (`paged_attention_runs`); the Triton
    path never reads a slot outside a row's range, so it ignores this.
    """
    _check_attention(q, k_cache, v_cache, block_tables, seq_ids, q_pos, window, out)
    if tokens_per_run < 1:
        raise ValueError(f"tokens_per_run must be >= 1, got {tokens_per_run}")
    if (tree_root is None) != (tree_slots is None):
        raise ValueError("tree_root and tree_slots come together")
    if tree_root is not None:
        if tokens_per_run != 1:
            raise ValueError("tree verification reads keys per token: tokens_per_run must be 1")
        check_index_tensor("tree_root", tree_root, q.shape[0], q.device)
        if tree_slots.dim() != 2 or tree_slots.shape[0] != q.shape[0] or tree_slots.device != q.device:
            raise ValueError(f"tree_slots must be [T, U] on q's device, got {tuple(tree_slots.shape)}")
        if tree_slots.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"tree_slots must be int32/int64, got {tree_slots.dtype}")
        if not use_triton(backend, q.device):
            return paged_attention_reference(q, k_cache, v_cache, block_tables, seq_ids, q_pos, window, scale, out,
                                             tree_root=tree_root, tree_slots=tree_slots)
    if not use_triton(backend, q.device):
        return paged_attention_runs(q, k_cache, v_cache, block_tables, seq_ids, q_pos, window, scale, out,
                                    tokens_per_run=tokens_per_run, plan=plan, rings_finite=rings_finite)
    from ._paged_attention_triton import launch_paged_attention

    if out is None:
        out = torch.empty_like(q)
    launch_paged_attention(q, k_cache, v_cache, block_tables, seq_ids, q_pos, window, scale, out,
                           tokens_per_run=tokens_per_run, num_splits=num_splits, tree_root=tree_root,
                           tree_slots=tree_slots)
    return out
