"""Time the drafter's training step, chained (`--unroll U` passes) against parallel (one pass over
the real rows and U-1 draft rows per anchor), on random features shaped like the target's.

    python benchmarks/drafter_train_speed.py --target models/default [--steps 20] [--batch 8] [--seq-len 256]
        [--unroll 4] [--profile] [--out FILE.json]

Why: on the device the parallel drafter trained at ~8 steps/s against ~35 for the chained one, while
on the CPU it costs ~1.5x; this finds where a parallel step's time goes (torch.profiler, top kernels).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from realtime.config import load_config
from speculative.drafter import DrafterConfig, EagleDrafter, ParallelEagleDrafter
from speculative.train import TrainConfig, _train_step

log = logging.getLogger("drafter_train_speed")


def random_batch(batch: int, seq_len: int, hidden: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"tok_in": torch.randint(0, vocab, (batch, seq_len), generator=g),
            "audio": torch.randn(batch, seq_len, hidden, generator=g),
            "hid_prev": torch.randn(batch, seq_len, hidden, generator=g),
            "hid_tgt": torch.randn(batch, seq_len, hidden, generator=g),
            "tok_tgt": torch.randint(0, vocab, (batch, seq_len), generator=g),
            "pos": torch.arange(seq_len)[None].repeat(batch, 1) + 100,
            "mask": torch.ones(batch, seq_len, dtype=torch.bool),
            "delay": torch.full((batch,), 6)}


def time_mode(parallel: bool, args: argparse.Namespace, dev: torch.device) -> dict:
    cfg = load_config(args.target)
    dc = DrafterConfig.for_target(cfg, num_layers=args.layers)
    emb = torch.randn(dc.vocab_size, dc.hidden_size, device=dev) * 0.02
    d = (ParallelEagleDrafter if parallel else EagleDrafter)(dc).to(dev).tie_to(emb)
    opt = torch.optim.AdamW(d.parameters(), lr=1e-4)
    tc = TrainConfig(unroll=args.unroll, parallel=parallel)
    batch = {k: v.to(dev) for k, v in random_batch(args.batch, args.seq_len, dc.hidden_size, dc.vocab_size).items()}
    autocast = dev.type == "cuda"

    def step() -> None:
        loss, _, _ = _train_step(d, batch, tc, True, autocast)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    row: dict = {"parallel": parallel, "steps_per_s": args.steps / (time.perf_counter() - t0)}
    if args.profile:
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if autocast else [])
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(3):
                step()
            if autocast:
                torch.cuda.synchronize(dev)
        key = "cuda_time_total" if autocast else "cpu_time_total"
        row["profile"] = prof.key_averages().table(sort_by=key, row_limit=15)
    log.info("%s: %.2f steps/s", "parallel" if parallel else "chained", row["steps_per_s"])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="models/default", help="checkpoint folder (only its config is read)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--unroll", type=int, default=4)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = [time_mode(p, args, dev) for p in (False, True)]
    for r in rows:
        if "profile" in r:
            print(("parallel" if r["parallel"] else "chained") + "\n" + r["profile"])
    if args.out:
        Path(args.out).write_text(json.dumps({"device": str(dev), "args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
