"""The CPU paged attention's two paths on the encoder's shapes: gathering each stream's blocks, or reading its ring
in place (what the engine does since the thirty-eighth session).

The encoder's attention step of the default model (6 heads of 64, a window of 375 frames, 16-frame blocks, one run
of 4 query frames per stream) for S streams, timed on random data:
  - `gather`: `kernels.paged_attention_runs` without `rings_finite` (blocks gathered with `index_select`, slots
    outside a run's range cleared, then SDPA), on rings scattered over the pool;
  - `in_place`: `paged_attention_runs(rings_finite=True)` on the engine's layout (slot s owns blocks s*width ..):
    SDPA reads the pool through a view with a boolean mask of the slots in each query's window, made once per step;
  - `floor`: SDPA alone on that view with the mask already made (what the in-place path adds to it is its output
    handling).
A layer after the step's first reuses the step's index work (`RunsPlan`), as in the engine; `*_first_layer` times
a call that makes it. Outputs are checked equal.

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
        kc, vc = to_contiguous(k, tables), to_contiguous(v, tables)
        aligned = (torch.arange(s)[:, None] * width + torch.arange(width)).to(torch.int32)

        def call(keys, values, table, plan, finite):
            return paged_attention_runs(q, keys, values, table, seq, q_pos, args.window, scale,
                                        tokens_per_run=args.run, plan=plan, rings_finite=finite)

        plan_g, plan_p = RunsPlan(), RunsPlan()
        call(k, v, tables, plan_g, False)
        call(kc, vc, aligned, plan_p, True)
        assert plan_p.rings is not None and plan_g.rings is None
        mask = in_place_mask(q_pos, s, args.run, width, args.block, args.window)
        variants = {
            "gather": lambda: call(k, v, tables, plan_g, False),
            "gather_first_layer": lambda: call(k, v, tables, RunsPlan(), False),
            "in_place": lambda: call(kc, vc, aligned, plan_p, True),
            "in_place_first_layer": lambda: call(kc, vc, aligned, RunsPlan(), True),
            "floor": lambda: in_place(q, kc, vc, mask, s, args.run, scale),
        }
        torch.testing.assert_close(variants["in_place"](), variants["gather"](), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(variants["floor"](), variants["gather"](), rtol=1e-4, atol=1e-5)
        row = {"streams": s, **{f"{name}_us": round(timed(fn, args.repeats) * 1e6, 1) for name, fn in variants.items()}}
        row["ratio"] = round(row["gather_us"] / row["in_place_us"], 2)
        rows.append(row)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
