"""Does `kernels.l2_prefetch` bring weights into L2 in time? One projection, cold against prefetched (issue 3).

Each measured graph replays, `--iters` times over:

- `cold`: a write of `--flush-mb` MB (evicts L2), a spin of `--spin-us` microseconds (a latency-bound kernel such as
  an attention: DRAM idle), then `linear` of `--rows` rows on the weight (the batch-invariant Triton kernel, PDL);
- `prefetched`: the same, with the weight's prefetch queued right after the flush (in the chain, or forked onto a
  side stream), so that it streams during the spin (what the engine does during each layer's attention);
- `spin_only` / `flush_only`: the parts alone, to subtract.

The projection's own time is then `cold - spin_only` against `prefetched - spin_only`; its floor is the weight's
bytes over the copy bandwidth measured in the same run. Shapes: the full-size model's encoder o (1280 x 2048),
down (1280 x 5120), gate/up (10240 x 1280), LM o (3072 x 4096).

    python benchmarks/bench_l2_prefetch.py --out F.json [--configs 64x32,256x1]

`--configs`: the prefetcher's chunk size in KB x chunks a program (`PrefetchConfig.chunk_bytes`, `per_program`),
with a trailing `s` from a side stream (`side_stream`).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import copy_bandwidth

from kernels.l2_prefetch import L2Prefetcher, PrefetchConfig
from kernels.linear import linear

log = logging.getLogger("bench_l2_prefetch")

SHAPES = {"encoder_o": (1280, 2048), "encoder_down": (1280, 5120), "encoder_gate_up": (10240, 1280),
          "lm_o": (3072, 4096)}


def spin_cycles(us: float) -> int:
    """Clock cycles of `torch.cuda._sleep` for about `us` microseconds (calibrated once)."""
    n = 1_000_000
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda._sleep(n)
    s.record()
    torch.cuda._sleep(n)
    e.record()
    e.synchronize()
    return int(n * us / (s.elapsed_time(e) * 1e3))


def time_graph(body, iters: int, repeats: int = 7) -> float:
    """Median microseconds per iteration of `body` replayed in a CUDA graph of `iters` copies."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()  # warm-up: compilation, allocator
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(iters):
                body()
    torch.cuda.current_stream().wait_stream(stream)
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / iters)
    return statistics.median(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--flush-mb", type=int, default=160)
    ap.add_argument("--spin-us", type=float, default=12.0)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--configs", default="16x32,64x32,64x32s,256x32")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    cycles = spin_cycles(args.spin_us)
    flush = torch.empty(args.flush_mb << 20, dtype=torch.uint8, device=dev)
    report: dict = {"gpu": torch.cuda.get_device_name(), "copy_bandwidth_gbs": bw / 1e9, "spin_us": args.spin_us,
                    "rows": args.rows, "flush_mb": args.flush_mb, "shapes": {}}
    flush_only = time_graph(lambda: flush.fill_(1), args.iters)
    spin_only = time_graph(lambda: (flush.fill_(1), torch.cuda._sleep(cycles)), args.iters)
    report.update(flush_only_us=flush_only, spin_only_us=spin_only)
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        x = torch.randn(args.rows, k, device=dev, dtype=torch.bfloat16)
        floor_us = n * k * 2 / bw * 1e6

        def cold() -> None:
            flush.fill_(1)
            torch.cuda._sleep(cycles)
            linear(x, w, max_rows=64)

        row = {"floor_us": floor_us, "cold_us": time_graph(cold, args.iters) - spin_only}
        for config in args.configs.split(","):
            side = config.endswith("s")
            kb, per = (int(v) for v in config.rstrip("s").split("x"))
            p = L2Prefetcher(dev, PrefetchConfig(chunk_bytes=kb << 10, per_program=per, side_stream=side))

            def prefetched(p=p) -> None:
                flush.fill_(1)
                p.fetch(w)
                torch.cuda._sleep(cycles)
                linear(x, w, max_rows=64)
                p.join()

            row[f"prefetched_{config}_us"] = time_graph(prefetched, args.iters) - spin_only
        report["shapes"][name] = row
        log.info("%s %dx%d: floor %.2f us, cold %.2f us, %s", name, n, k, floor_us, row["cold_us"],
                 ", ".join(f"{key} {v:.2f}" for key, v in row.items() if key.startswith("prefetched")))
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
