"""What the CPU paged attention could save by reading each stream's ring in place instead of gathering it.

The encoder's attention step of the default model (6 heads of 64, a window of 375 frames, 16-frame blocks, one run
of 4 query frames per stream) for S streams, timed two ways on random data:
  - `gather`: `kernels.paged_attention_runs` as the engine calls it (rings scattered over the pool, blocks gathered
    with `index_select`, slots outside a run's range cleared, then SDPA);
  - `in_place`: the floor of the alternative. Each stream's ring is a contiguous slice of the pool (slots 0..S-1),
    so SDPA reads the pool through a view with a boolean mask of the slots in each query's window. Nothing is
    copied, and the mask is built once per step, not per layer.
Both give the same outputs (checked). A real in-place path also needs rings zeroed at admission, since masked slots
still enter SDPA's products and NaN there would leak; that cost is not in this floor.

    python benchmarks/bench_cpu_ring_attention.py --streams 1 4 16 --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from kernels.paged_attention import RunsPlan, paged_attention_runs, ring_table_width


def setup(streams: int, heads: int, head_dim: int, window: int, block: int, run: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    width = ring_table_width(window, block, run)
    pool = streams * width
    k = torch.randn(pool, block, heads, head_dim, generator=g)
    v = torch.randn(pool, block, heads, head_dim, generator=g)
    # the engine's rings: any blocks of the pool (here a random permutation), one row per stream
    tables = torch.randperm(pool, generator=g).view(streams, width).to(torch.int32)
    # each stream at another position, past the window, so every ring wraps
    top = torch.tensor([window * 3 + 37 * s for s in range(streams)])
    q_pos = (top[:, None] - torch.arange(run - 1, -1, -1)[None, :]).reshape(-1)
    seq = torch.arange(streams).repeat_interleave(run)
    q = torch.randn(streams * run, heads, head_dim, generator=g)
    return k, v, tables, q, q_pos, seq, width


def to_contiguous(k: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """The same data laid out stream by stream: ring slot b of stream s at pool block s * width + b."""
    return k.index_select(0, tables.reshape(-1).long()).contiguous()


def in_place_mask(q_pos: torch.Tensor, streams: int, run: int, width: int, block: int, window: int) -> torch.Tensor:
    """[S, 1, run, width*block]: which ring slots hold a position in each query's window (a slot holds the newest
    position congruent to it modulo the ring, at most the stream's newest)."""
    ring = width * block
    slots = torch.arange(ring)
    newest = q_pos.view(streams, run)[:, -1]  # [S]
    # position held by slot j: the largest p <= newest with p % ring == j
    held = newest[:, None] - ((newest[:, None] - slots[None, :]) % ring)  # [S, ring]
    qp = q_pos.view(streams, run)
    rel = qp[:, :, None] - held[:, None, :]  # [S, run, ring]
    return ((rel >= 0) & (rel < window) & (held[:, None, :] >= 0))[:, None]


def in_place(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, mask: torch.Tensor, streams: int, run: int,
             scale: float) -> torch.Tensor:
    heads, d = q.shape[1], q.shape[2]
    keys = kc.view(streams, -1, heads, d).transpose(1, 2)  # [S, H, ring, D]: a view of the pool
    vals = vc.view(streams, -1, heads, d).transpose(1, 2)
    qh = q.view(streams, run, heads, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(qh, keys, vals, attn_mask=mask, scale=scale)
    return o.transpose(1, 2).reshape(streams * run, heads, d)


def timed(fn, repeats: int) -> float:
    fn()
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeats)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--window", type=int, default=375)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--run", type=int, default=4, help="query frames per stream (the encoder's 4 per token)")
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    scale = args.head_dim ** -0.5
    rows = []
    for s in args.streams:
        k, v, tables, q, q_pos, seq, width = setup(s, args.heads, args.head_dim, args.window, args.block, args.run)
        # a layer after the step's first reuses the first layer's index work (RunsPlan), as in the engine
        plan = RunsPlan()
        paged_attention_runs(q, k, v, tables, seq, q_pos, args.window, scale, tokens_per_run=args.run, plan=plan)
        gather = lambda: paged_attention_runs(q, k, v, tables, seq, q_pos, args.window, scale,  # noqa: E731
                                              tokens_per_run=args.run, plan=plan)
        first = lambda: paged_attention_runs(q, k, v, tables, seq, q_pos, args.window, scale,  # noqa: E731
                                             tokens_per_run=args.run, plan=RunsPlan())
        kc, vc = to_contiguous(k, tables), to_contiguous(v, tables)
        mask = in_place_mask(q_pos, s, args.run, width, args.block, args.window)
        place = lambda: in_place(q, kc, vc, mask, s, args.run, scale)  # noqa: E731
        torch.testing.assert_close(place(), gather(), rtol=1e-4, atol=1e-5)
        t_gather, t_first, t_place = (timed(f, args.repeats) for f in (gather, first, place))
        t_mask = timed(lambda: in_place_mask(q_pos, s, args.run, width, args.block, args.window), args.repeats)
        rows.append({"streams": s, "gather_us": round(t_gather * 1e6, 1),
                     "gather_first_layer_us": round(t_first * 1e6, 1),
                     "in_place_us": round(t_place * 1e6, 1), "in_place_mask_once_per_step_us": round(t_mask * 1e6, 1),
                     "ratio": round(t_gather / t_place, 2)})
        print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
