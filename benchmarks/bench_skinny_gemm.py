"""Experiment for issue 3's B1: can a one-launch Triton kernel beat cuBLAS on the step's skinny GEMMs?

    python benchmarks/bench_skinny_gemm.py [--out FILE.json]

At batch 1 the encoder multiplies 4 rows (one 80 ms token = 4 encoder frames) by 1280-wide weights
and the LM 1 row by 3072-wide ones. The eighth session's kernel inventory showed the encoder's GEMMs at
6-9 us each, 0.5-3 TB/s: latency, not bandwidth. This script times, for every GEMM shape of the
step, `F.linear` (cuBLAS) against `skinny_linear` below (a row-block of the weight per program, the
whole K loop in one program, no split-K reduction launch), the way the engine runs them: many
launches back to back in one CUDA graph, each on its own copy of the weight so that no call finds its
weight in the 50 MB L2. It first checks `skinny_linear` against `F.linear` on every shape. Reports
microseconds per call and GB/s of weight read against the copy bandwidth measured in the same run.
Nothing in the engine uses `skinny_linear`; this measures whether it should.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import copy_bandwidth  # the same bandwidth as the kernel benchmark's floors

log = logging.getLogger("bench_skinny_gemm")

# (name, rows M, K, N) of one batch-1 step (full-size config; bias only on the encoder's qkv and o)
SHAPES = [
    ("enc.qkv", 4, 1280, 3840), ("enc.o", 4, 1280, 1280), ("enc.gate_up", 4, 1280, 10240), ("enc.down", 4, 5120, 1280),
    ("lm.qkv", 1, 3072, 6144), ("lm.o", 1, 4096, 3072), ("lm.gate_up", 1, 3072, 18432), ("lm.down", 1, 9216, 3072),
]


CONFIGS = [(bn, bk, w) for bn in (16, 32, 64) for bk in (128, 256) for w in (2, 4)]  # BLOCK_N, BLOCK_K, warps


def skinny_linear_factory():
    """`skinny_linear(x, w, y, config)`: y = x @ w.T for x of at most 16 rows, one program per BLOCK_N
    output columns, each running the whole K loop (no split-K, so one launch and no reduction)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _skinny_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_M: tl.constexpr):
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
            acc += tl.dot(x, tl.trans(w))
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    def skinny_linear(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor,
                      config: tuple[int, int, int] = (32, 128, 4)) -> torch.Tensor:
        m, k = x.shape
        n = w.shape[0]
        if m > 16:
            raise ValueError(f"skinny_linear takes at most 16 rows, got {m}")
        bn, bk, warps = config
        # tl.dot needs at least 16 rows: the missing rows are masked to zero and never stored
        _skinny_kernel[(triton.cdiv(n, bn),)](x, w, y, m, n, k, BLOCK_N=bn, BLOCK_K=bk, BLOCK_M=16, num_warps=warps)
        return y

    return skinny_linear


def graph_us_per_call(calls: list) -> float:
    """Median microseconds per call of a CUDA graph replaying `calls` back to back."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    times = []
    for _ in range(15):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


def cuda_for_experiment(logger: logging.Logger) -> torch.device | None:
    """Logging set up for a GPU experiment script, and its device (None, logged, without a GPU)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if not torch.cuda.is_available():
        logger.error("needs a CUDA GPU")
        return None
    return torch.device("cuda")


def finish_experiment(result: dict, out: str | None, failed: int) -> int:
    """Write the result (to `out` when given, and stdout); exit status 1 when a correctness check failed."""
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--weights-mb", type=float, default=400.0, help="weight copies per shape (beyond L2)")
    args = ap.parse_args(argv)
    dev = cuda_for_experiment(log)
    if dev is None:
        return 2
    torch.manual_seed(0)
    skinny_linear = skinny_linear_factory()
    bw = copy_bandwidth(dev)
    rows, failed = [], 0
    for name, m, k, n in SHAPES:
        nbytes = n * k * 2
        copies = max(8, int(args.weights_mb * 1e6 / nbytes))
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        ys = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        ref = F.linear(x.float(), ws[0].float())
        err = max((skinny_linear(x, ws[0], ys[0], c).float() - ref).abs().max().item() for c in CONFIGS)
        ok = err <= 0.02 * ref.abs().max().item() + 1e-3
        failed += not ok
        cublas = graph_us_per_call([lambda w=w, x=x: F.linear(x, w) for w in ws])
        # tuned the way it would run: each configuration timed in the same back-to-back graph
        timed = {c: graph_us_per_call([lambda w=w, y=y, c=c, x=x: skinny_linear(x, w, y, c)
                                          for w, y in zip(ws, ys)])
                 for c in CONFIGS}
        config = min(timed, key=timed.get)
        ours = timed[config]
        floor_us = nbytes / bw * 1e6
        row = {"gemm": name, "M": m, "K": k, "N": n, "weight_MB": nbytes / 1e6, "floor_us": floor_us,
               "cublas_us": cublas, "skinny_us": ours, "cublas_GBps": nbytes / cublas / 1e3,
               "skinny_GBps": nbytes / ours / 1e3, "skinny_config": config, "max_abs_err": err, "correct": ok}
        rows.append(row)
        log.info("%-12s M=%d K=%5d N=%5d  floor %5.1f us  cuBLAS %5.1f us  skinny %5.1f us  %s", name, m, k, n,
                 floor_us, cublas, ours, "ok" if ok else f"WRONG (err {err:.3g})")
        del ws, ys
        torch.cuda.empty_cache()
    per_step = {"enc": 32, "lm": 26}
    totals = {key: sum(r[key] * per_step[r["gemm"].split(".")[0]] for r in rows)
              for key in ("floor_us", "cublas_us", "skinny_us")}
    totals["best_of_both_us"] = sum(min(r["cublas_us"], r["skinny_us"]) * per_step[r["gemm"].split(".")[0]]
                                    for r in rows)
    log.info("per step (32 encoder + 26 LM layers, LM head not included): %s",
             {k: round(v, 1) for k, v in totals.items()})
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_GBps": bw / 1e9,
              "rows": rows, "per_step": totals}
    return finish_experiment(result, args.out, failed)


if __name__ == "__main__":
    sys.exit(main())
