"""Triton kernels of `write_kv` and `paged_attention` (semantics: paged_attention.py).

Attention work decomposition, chosen for 1..9 queries per sequence per step:
- one program per (run of `tokens_per_run` consecutive query tokens, kv head, key split). Its
  BLOCK_M rows are (query token, q head of the GQA group) pairs, so each key/value tile is loaded
  once for every query that needs it (LM decode: 1 token x 4 heads; encoder: 4 tokens x 1 head;
  verify: k+1 tokens x 4 heads). Rows are padded to 16 so both products run on tensor cores.
- keys are visited in tiles of BLOCK_N positions; each position is mapped through the ring table
  on its own, so any cache block size works. Online softmax in fp32 (exp2 domain).
- split-K: the key range of a run is cut into `num_splits` contiguous chunks (chosen so that
  ~4 programs per SM exist at small batch: LM decode at batch 1 has only 8 (run, kv head)
  pairs but 8192 keys each). Each split writes (acc, max, sum) to an fp32 workspace and a second
  tiny kernel combines them. With one split the first kernel writes the output directly.
Everything the kernels read per step (tables, positions, sequence ids) is device data; only
shapes, window, scale and the split count are baked in, so a captured CUDA graph replays with
new metadata.
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from ._dispatch import env_int, pdl_launch_args
from ._pdl_triton import pdl_prologue

# below this a split costs more in combining than it gains in parallelism. 64 (one key tile) since the
# twenty-seventh session: the batch-1 encoder step (750-frame window, 32 heads) went from 6 splits to 12, and B1
# from 3.039 to 2.991 ms on an H200 (one run, 3 alternating repeats each, all 3 faster; 128 before); the LM's
# batch-1 split count is capped by MAX_SPLITS either way, and larger batches are capped by PROGRAMS_PER_SM
MIN_KEYS_PER_SPLIT = 64
MAX_SPLITS = 64
PROGRAMS_PER_SM = 4  # target occupancy when choosing the number of splits


@triton.jit
def write_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, num_heads,
                    stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, stride_slot,
                    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr,
                    BLOCK_D: tl.constexpr, USE_GDC: tl.constexpr):
    """One program per token: copy its [Hkv, D] key and value rows to their cache slot (slot < 0: skip)."""
    pdl_prologue(USE_GDC)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t * stride_slot).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < num_heads) & (d[None, :] < HEAD_DIM) & (slot >= 0)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    kc = kc_ptr + blk * stride_kcb + off * stride_kcs + h[:, None] * stride_kch + d[None, :]
    vc = vc_ptr + blk * stride_vcb + off * stride_vcs + h[:, None] * stride_vch + d[None, :]
    tl.store(kc, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(vc_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _key_slots(kstart, end, bt_row, table_width, root, tslot_row, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
               HAS_TREE: tl.constexpr):
    """(physical block, offset in it) of the key positions kstart .. kstart + BLOCK_N - 1 (those >= end: 0, unread)."""
    kpos = kstart + tl.arange(0, BLOCK_N)
    k_in = kpos < end
    phys = tl.load(bt_row + (kpos // BLOCK_SIZE) % table_width, mask=k_in, other=0).to(tl.int64)
    in_blk = (kpos % BLOCK_SIZE).to(tl.int64)
    if HAS_TREE:
        in_tree = k_in & (root >= 0) & (kpos > root)
        tslot = tl.load(tslot_row + (kpos - root - 1), mask=in_tree, other=0).to(tl.int64)
        phys = tl.where(in_tree, tslot // BLOCK_SIZE, phys)
        in_blk = tl.where(in_tree, tslot % BLOCK_SIZE, in_blk)
    return phys, in_blk


@triton.jit
def _scores(q, k, kpos, k_in, pos, good, window, scale_log2, HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr):
    """The tile's scores in the exp2 domain, -inf where a row may not attend."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    allowed = good[:, None] & k_in[None, :] & (kpos[None, :] <= pos[:, None])
    if HAS_WINDOW:
        allowed = allowed & (kpos[None, :] > pos[:, None] - window)
    return tl.where(allowed, s * scale_log2, float("-inf"))


@triton.jit
def paged_attention_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, seq_ptr, pos_ptr, out_ptr, ws_acc_ptr, ws_m_ptr, ws_l_ptr,
                           root_ptr, tslot_ptr,
                           num_tokens, window, table_width, scale_log2,
                           stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                           stride_bt, stride_ot, stride_oh, stride_seq, stride_pos, stride_tslot,
                           HQ: tl.constexpr, GROUP: tl.constexpr, RUN: tl.constexpr, HEAD_DIM: tl.constexpr,
                           BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, HAS_WINDOW: tl.constexpr,
                           IEEE: tl.constexpr, HAS_TREE: tl.constexpr, EARLY: tl.constexpr, USE_GDC: tl.constexpr):
    if not EARLY:
        pdl_prologue(USE_GDC)
    run = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    # Rows: (query token of the run, q head of this kv head's group).
    rows = tl.arange(0, BLOCK_M)
    tok = run * RUN + rows // GROUP
    head = kvh * GROUP + rows % GROUP
    row_in = (rows < RUN * GROUP) & (tok < num_tokens)
    pos = tl.load(pos_ptr + tok * stride_pos, mask=row_in, other=-1).to(tl.int32)
    seq = tl.load(seq_ptr + tok * stride_seq, mask=row_in, other=-1).to(tl.int32)
    is_query = row_in & (pos >= 0)
    run_seq = tl.max(tl.where(is_query, seq, -1), axis=0)
    good = is_query & (seq == run_seq)
    bad = is_query & (seq != run_seq)  # broken tokens_per_run contract: reported as NaN

    # Key positions this run needs: [lo, hi]; this split takes a BLOCK_N-aligned chunk of them.
    hi = tl.max(tl.where(good, pos, -1), axis=0)
    if HAS_WINDOW:
        p_min = tl.min(tl.where(good, pos, 1 << 30), axis=0)
        lo = tl.maximum(p_min - window + 1, 0)
    else:
        lo = hi * 0
    n_keys = tl.maximum(hi - lo + 1, 0)
    chunk = tl.cdiv(tl.cdiv(n_keys, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, hi + 1)

    bt_row = bt_ptr + run_seq.to(tl.int64) * stride_bt  # only dereferenced when the run has queries
    root = 0
    tslot_row = tslot_ptr
    if HAS_TREE:  # RUN == 1: the program's one token; keys after its root come from its own slot list
        root = tl.load(root_ptr + run).to(tl.int32)
        tslot_row = tslot_ptr + run.to(tl.int64) * stride_tslot
    if EARLY:
        # The step's metadata (positions, sequence ids, ring tables, tree slots) is copied from the host before the
        # step's graphs start and never written by a kernel of the step, so it, and with it the first key tile's
        # cache slots, is read before the PDL wait, while the kernel before still runs; the queries, keys and values
        # (that kernel may have written this step's) only after it. Each tile's keys and values are then requested
        # together, and the next tile's slots right behind them.
        phys, in_blk = _key_slots(start, end, bt_row, table_width, root, tslot_row, BLOCK_N, BLOCK_SIZE, HAS_TREE)
        pdl_prologue(USE_GDC)

    d = tl.arange(0, BLOCK_D)
    d_in = d < HEAD_DIM
    q_off = tok.to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=good[:, None] & d_in[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for kstart in range(start, end, BLOCK_N):
        kpos = kstart + tl.arange(0, BLOCK_N)
        k_in = kpos < end
        if not EARLY:
            phys, in_blk = _key_slots(kstart, end, bt_row, table_width, root, tslot_row, BLOCK_N, BLOCK_SIZE,
                                      HAS_TREE)
        kmask = k_in[:, None] & d_in[None, :]
        k = tl.load(k_ptr + (phys * stride_kb + in_blk * stride_ks + kvh * stride_kh)[:, None] + d[None, :],
                    mask=kmask, other=0.0)
        if EARLY:
            v = tl.load(v_ptr + (phys * stride_vb + in_blk * stride_vs + kvh * stride_vh)[:, None] + d[None, :],
                        mask=kmask, other=0.0)
            phys, in_blk = _key_slots(kstart + BLOCK_N, end, bt_row, table_width, root, tslot_row, BLOCK_N,
                                      BLOCK_SIZE, HAS_TREE)
        s = _scores(q, k, kpos, k_in, pos, good, window, scale_log2, HAS_WINDOW, IEEE)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet stay at 0
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if not EARLY:
            v = tl.load(v_ptr + (phys * stride_vb + in_blk * stride_vs + kvh * stride_vh)[:, None] + d[None, :],
                        mask=kmask, other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    omask = row_in[:, None] & d_in[None, :]
    if NUM_SPLITS == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding rows: 0 / 1
        o = tl.where(bad[:, None], float("nan"), o)
        o_off = tok.to(tl.int64) * stride_ot + head * stride_oh
        tl.store(out_ptr + o_off[:, None] + d[None, :], o.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        ws_row = (tok.to(tl.int64) * HQ + head) * NUM_SPLITS + split
        tl.store(ws_acc_ptr + ws_row[:, None] * HEAD_DIM + d[None, :], acc, mask=omask)
        tl.store(ws_m_ptr + ws_row, tl.where(bad, float("nan"), m_i), mask=row_in)
        tl.store(ws_l_ptr + ws_row, l_i, mask=row_in)


@triton.jit
def combine_splits_kernel(ws_acc_ptr, ws_m_ptr, ws_l_ptr, out_ptr, stride_ot, stride_oh,
                          HQ: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
                          BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, USE_GDC: tl.constexpr):
    """One program per (token, q head): merge the splits' partial softmaxes (log-sum-exp rescaling)."""
    pdl_prologue(USE_GDC)
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_in = s < NUM_SPLITS
    d_in = d < HEAD_DIM
    base = (tok * HQ + head) * NUM_SPLITS
    m = tl.load(ws_m_ptr + base + s, mask=s_in, other=float("-inf"))
    l = tl.load(ws_l_ptr + base + s, mask=s_in, other=0.0)
    acc = tl.load(ws_acc_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=s_in[:, None] & d_in[None, :],
                  other=0.0)
    is_nan = m != m
    any_nan = tl.max(is_nan.to(tl.int32), axis=0) > 0
    m = tl.where(is_nan, float("-inf"), m)
    m_max = tl.max(m, axis=0)
    m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_ref)  # empty splits: exp2(-inf) = 0
    total = tl.sum(w * l, axis=0)
    o = tl.sum(w[:, None] * acc, axis=0) / tl.where(total > 0, total, 1.0)
    o = tl.where(any_nan, float("nan"), o)
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + d, o.to(out_ptr.dtype.element_ty), mask=d_in)


def _device_ctx(t: torch.Tensor) -> contextlib.AbstractContextManager:
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def launch_write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    t, hkv, d = k.shape
    if t == 0:
        return
    for name, x in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must have unit stride along head_dim")
    with _device_ctx(k):
        write_kv_kernel[(t,)](k, v, k_cache, v_cache, slot_mapping, hkv,
                              k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                              k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                              v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), slot_mapping.stride(0),
                              HEAD_DIM=d, BLOCK_SIZE=k_cache.shape[1], BLOCK_H=triton.next_power_of_2(hkv),
                              BLOCK_D=triton.next_power_of_2(d), num_warps=4, **pdl_launch_args(k.device))


def early_metadata() -> bool:
    """Whether the attention kernel reads the step's metadata and its first key tile's cache slots before the PDL
    wait, and requests each tile's keys and values together (`paged_attention_kernel`, EARLY). The default since the
    twenty-eighth session: full-size B1 on an H200 faster or equal in all 8 alternating repeats of two runs (2.988
    against 3.004 ms, 2.965 against 2.987 ms); STREAMSCRIBE_ATTN_EARLY=0 turns it off (read at launch, so at graph
    capture)."""
    return os.environ.get("STREAMSCRIBE_ATTN_EARLY", "1") != "0"


def kernel_config(dtype: torch.dtype, block_m: int) -> tuple[int, int]:
    """(keys per tile, warps) keeping the kernel free of register spills on sm_90 (checked with an
    offline compile for head_dim 128): fp32 uses the FMA path of `tl.dot`, which needs small tiles."""
    if dtype == torch.float32:
        return 16, 4 if block_m <= 32 else 8
    return 64, 4 if block_m <= 16 else 8


def min_keys_per_split() -> int:
    """MIN_KEYS_PER_SPLIT, or STREAMSCRIBE_ATTN_MIN_KEYS (a positive number of keys; benchmarks try others; read at
    launch, so at graph capture)."""
    return env_int("STREAMSCRIBE_ATTN_MIN_KEYS", MIN_KEYS_PER_SPLIT, 1, 1 << 30, "a positive number of keys")


def max_splits() -> int:
    """MAX_SPLITS, or STREAMSCRIBE_ATTN_MAX_SPLITS (1..1024; benchmarks try others: at batch 1 the LM's split count
    is this cap, and at a session age of 1 minute only 12 of its 64 splits have keys; read at launch, so at graph
    capture)."""
    return env_int("STREAMSCRIBE_ATTN_MAX_SPLITS", MAX_SPLITS, 1, 1024, "a number of splits in 1..1024")


def choose_num_splits(num_runs: int, kv_heads: int, max_keys: int | None, device: torch.device) -> int:
    """Splits per (run, kv head) so that about PROGRAMS_PER_SM programs per SM exist, each with
    at least MIN_KEYS_PER_SPLIT keys, at most `max_splits()`. Depends only on shapes (fixed for a captured graph)."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = triton.cdiv(PROGRAMS_PER_SM * sms, max(1, num_runs * kv_heads))
    cap = max_splits()
    by_work = cap if max_keys is None else triton.cdiv(max_keys, min_keys_per_split())
    return max(1, min(want, by_work, cap))


def launch_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_ids: torch.Tensor, q_pos: torch.Tensor,
                           window: int | None, scale: float, out: torch.Tensor, *, tokens_per_run: int,
                           num_splits: int | None, tree_root: torch.Tensor | None = None,
                           tree_slots: torch.Tensor | None = None) -> None:
    t, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    if t == 0:
        return
    if q.dtype == torch.float64:
        raise TypeError("the Triton path supports fp32/fp16/bf16 (fp64 runs on the reference only)")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out), ("block_tables", block_tables)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must have unit stride along its last dimension")
    group = hq // hkv
    run = tokens_per_run
    num_runs = triton.cdiv(t, run)
    has_window = bool(window)
    max_keys = (window + run - 1) if has_window else None
    if num_splits is None:
        num_splits = choose_num_splits(num_runs, hkv, max_keys, q.device)
    if not 1 <= num_splits <= 1024:
        raise ValueError(f"num_splits must be in 1..1024, got {num_splits}")
    block_m = max(16, triton.next_power_of_2(run * group))
    block_d = max(16, triton.next_power_of_2(d))
    block_n, num_warps = kernel_config(q.dtype, block_m)
    if num_splits > 1:
        ws_acc = torch.empty(t, hq, num_splits, d, dtype=torch.float32, device=q.device)
        ws_m = torch.empty(t, hq, num_splits, dtype=torch.float32, device=q.device)
        ws_l = torch.empty(t, hq, num_splits, dtype=torch.float32, device=q.device)
    else:  # unused by the kernel (NUM_SPLITS == 1 branch); any valid pointer will do
        ws_acc = ws_m = ws_l = out
    with _device_ctx(q):
        paged_attention_kernel[(num_runs, hkv, num_splits)](
            q, k_cache, v_cache, block_tables, seq_ids, q_pos, out, ws_acc, ws_m, ws_l,
            q_pos if tree_root is None else tree_root, q_pos if tree_slots is None else tree_slots,
            t, int(window or 0), block_tables.shape[1], float(scale) * 1.4426950408889634,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_tables.stride(0), out.stride(0), out.stride(1), seq_ids.stride(0), q_pos.stride(0),
            0 if tree_slots is None else tree_slots.stride(0),
            HQ=hq, GROUP=group, RUN=run, HEAD_DIM=d, BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_D=block_d,
            BLOCK_N=block_n, NUM_SPLITS=num_splits, HAS_WINDOW=has_window, IEEE=q.dtype == torch.float32,
            HAS_TREE=tree_root is not None, EARLY=early_metadata(), num_warps=num_warps, num_stages=2,
            **pdl_launch_args(q.device))
        if num_splits > 1:
            combine_splits_kernel[(t, hq)](
                ws_acc, ws_m, ws_l, out, out.stride(0), out.stride(1),
                HQ=hq, HEAD_DIM=d, NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits),
                BLOCK_D=block_d, num_warps=2, **pdl_launch_args(q.device))
