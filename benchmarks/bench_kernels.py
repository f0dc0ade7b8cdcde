"""Benchmark of the `kernels` Triton kernels at the real model's shapes (run on a GPU, unattended).

    python benchmarks/bench_kernels.py [--block-size 16] [--dtype bf16] [--budget-s 100]

For every case it first checks the kernel against its torch reference on a few sequences of the
same cache, then times it with `triton.testing.do_bench` (median) and reports the bytes the kernel
must move (unique K/V read once per sequence, queries, outputs, gathered rows) as GB/s and as a
share of the device-to-device copy bandwidth measured in the same run. Cases that do not fit in
memory or run past the time budget are reported as skipped; the exit code is 1 if any correctness
check failed, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import (  # noqa: E402
    gather_add_embeddings,
    gather_add_reference,
    paged_attention,
    paged_attention_reference,
    ring_table_width,
    write_kv,
    write_kv_reference,
)

log = logging.getLogger("bench_kernels")

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Row:
    kernel: str
    case: str
    batch: int
    extra: str
    ms: float
    nbytes: int


def bench_ms(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def copy_bandwidth(dev: torch.device) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting read + write (as docs/DESIGN.md does)."""
    n = 1 << 29  # 1 GiB of bf16
    src = torch.empty(n, dtype=torch.bfloat16, device=dev).normal_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


# ---------------------------------------------------------------------------------------------
# paged attention
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttnShape:
    name: str
    hq: int
    hkv: int
    d: int
    window: int
    q_len: int
    tokens_per_run: int


LM_DECODE = AttnShape("lm_decode", 32, 8, 128, 8192, 1, 1)
LM_VERIFY = AttnShape("lm_verify_q5", 32, 8, 128, 8192, 5, 5)
ENCODER = AttnShape("encoder_q4", 32, 32, 64, 750, 4, 4)


def build_attention(shape: AttnShape, batch: int, block_size: int, dtype: torch.dtype, dev: torch.device,
                    gen: torch.Generator) -> dict:
    """A full-window cache per stream (ring already wrapped), queries of the newest step."""
    width = ring_table_width(shape.window, block_size, shape.q_len)
    num_blocks = batch * width
    k_cache = torch.empty(num_blocks, block_size, shape.hkv, shape.d, dtype=dtype, device=dev).normal_(generator=gen)
    v_cache = torch.empty_like(k_cache).normal_(generator=gen)
    tables = torch.randperm(num_blocks, generator=gen, device=dev).view(batch, width).to(torch.int32)
    last = shape.window + shape.q_len + torch.randint(0, 3 * shape.window, (batch,), generator=gen, device=dev)
    offs = torch.arange(shape.q_len, device=dev)
    q_pos = (last[:, None] - shape.q_len + 1 + offs[None, :]).reshape(-1).to(torch.int32)
    seq_ids = torch.arange(batch, device=dev).repeat_interleave(shape.q_len).to(torch.int32)
    q = torch.randn(batch * shape.q_len, shape.hq, shape.d, generator=gen, device=dev).to(dtype)
    keys_per_seq = shape.window + shape.q_len - 1  # all histories are longer than the window
    elem = k_cache.element_size()
    nbytes = (batch * keys_per_seq * shape.hkv * shape.d * 2 * elem  # unique K and V
              + 2 * q.numel() * elem + 3 * q_pos.numel() * 4)  # q in, out, seq/pos/table reads (approx.)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables, seq_ids=seq_ids, q_pos=q_pos,
                scale=shape.d ** -0.5, nbytes=nbytes)


def attention_rows(shape: AttnShape, batches: list[int], block_size: int, dtype: torch.dtype, dev: torch.device,
                   split_sweep: bool) -> tuple[list[Row], list[str]]:
    from kernels._paged_attention_triton import choose_num_splits

    rows: list[Row] = []
    failures: list[str] = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for batch in batches:
        try:
            c = build_attention(shape, batch, block_size, dtype, dev, gen)
        except torch.cuda.OutOfMemoryError:
            log.warning("skipping %s batch %d: out of GPU memory", shape.name, batch)
            torch.cuda.empty_cache()
            continue
        args = (c["q"], c["k_cache"], c["v_cache"], c["block_tables"], c["seq_ids"], c["q_pos"], shape.window,
                c["scale"])
        kw = dict(tokens_per_run=shape.tokens_per_run)
        # Correctness on the first few streams of this very cache.
        n_check = min(batch, 4) * shape.q_len
        sub = (c["q"][:n_check], *args[1:4], c["seq_ids"][:n_check], c["q_pos"][:n_check], *args[6:])
        err = rel_error(paged_attention(*sub, **kw), paged_attention_reference(*sub))
        if not err < 2e-2:
            failures.append(f"paged_attention {shape.name} batch {batch}: relative error {err:.3g}")
            log.error("%s", failures[-1])
        out = torch.empty_like(c["q"])
        runs = math.ceil(c["q"].shape[0] / shape.tokens_per_run)
        auto = choose_num_splits(runs, shape.hkv, shape.window + shape.q_len - 1, dev)
        sweep = [None] + ([s for s in (1, 4, 8, 16, 32, 64) if s != auto] if split_sweep else [])
        for splits in sweep:
            ms = bench_ms(lambda: paged_attention(*args, out=out, num_splits=splits, **kw))
            label = f"splits={auto} (auto)" if splits is None else f"splits={splits}"
            rows.append(Row("paged_attention", shape.name, batch, label, ms, c["nbytes"]))
        del c, args, sub, out
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows, failures


# ---------------------------------------------------------------------------------------------
# gather-add and write_kv
# ---------------------------------------------------------------------------------------------
def gather_rows(batches: list[int], dtype: torch.dtype, dev: torch.device) -> tuple[list[Row], list[str]]:
    gen = torch.Generator(device=dev).manual_seed(1)
    hidden, vocab, audio_n = 3072, 131072, 8192
    embed = torch.empty(vocab, hidden, dtype=dtype, device=dev).normal_(generator=gen)
    audio = torch.empty(audio_n, hidden, dtype=dtype, device=dev).normal_(generator=gen)
    rows, failures = [], []
    for batch in batches:
        tok = torch.randint(0, vocab, (batch,), generator=gen, device=dev)
        arow = torch.randint(0, audio_n, (batch,), generator=gen, device=dev)
        out = torch.empty(batch, hidden, dtype=dtype, device=dev)
        gather_add_embeddings(out, tok, embed, audio, arow)
        ref = gather_add_reference(torch.empty_like(out), tok, embed, audio, arow)
        if not torch.equal(out, ref):
            failures.append(f"gather_add batch {batch}: not bitwise equal to the reference")
            log.error("%s", failures[-1])
        ms = bench_ms(lambda: gather_add_embeddings(out, tok, embed, audio, arow))
        nbytes = 3 * batch * hidden * out.element_size()  # two gathered rows in, one row out
        rows.append(Row("gather_add", "lm_embed+audio", batch, f"H={hidden}", ms, nbytes))
    return rows, failures


def write_kv_rows(batches: list[int], block_size: int, dtype: torch.dtype, dev: torch.device
                  ) -> tuple[list[Row], list[str]]:
    gen = torch.Generator(device=dev).manual_seed(2)
    rows, failures = [], []
    hkv, d, num_blocks = 8, 128, 4096
    k_cache = torch.zeros(num_blocks, block_size, hkv, d, dtype=dtype, device=dev)
    v_cache = torch.zeros_like(k_cache)
    for batch in batches:
        k = torch.randn(batch, hkv, d, generator=gen, device=dev).to(dtype)
        v = torch.randn(batch, hkv, d, generator=gen, device=dev).to(dtype)
        slots = torch.randperm(num_blocks * block_size, generator=gen, device=dev)[:batch]
        write_kv(k_cache, v_cache, k, v, slots)
        ref_k, ref_v = k_cache.clone().zero_(), v_cache.clone().zero_()
        write_kv_reference(ref_k, ref_v, k, v, slots)
        written = slots
        if not (torch.equal(k_cache.view(-1, hkv, d)[written], ref_k.view(-1, hkv, d)[written])
                and torch.equal(v_cache.view(-1, hkv, d)[written], ref_v.view(-1, hkv, d)[written])):
            failures.append(f"write_kv batch {batch}: differs from the reference")
            log.error("%s", failures[-1])
        ms = bench_ms(lambda: write_kv(k_cache, v_cache, k, v, slots))
        rows.append(Row("write_kv", "lm_layer", batch, f"Hkv={hkv} D={d}", ms, 4 * k.numel() * k.element_size()))
    return rows, failures


# ---------------------------------------------------------------------------------------------
def print_table(rows: list[Row], copy_bw: float) -> None:
    header = f"{'kernel':16s} {'case':16s} {'batch':>5s} {'config':22s} {'time us':>9s} {'GB/s':>8s} {'% copy':>7s}"
    print(header)
    print("-" * len(header))
    for r in rows:
        bw = r.nbytes / (r.ms * 1e-3)
        print(f"{r.kernel:16s} {r.case:16s} {r.batch:5d} {r.extra:22s} {r.ms * 1e3:9.1f} {bw / 1e9:8.0f} "
              f"{100 * bw / copy_bw:6.1f}%")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--budget-s", type=float, default=100.0, help="stop starting new cases after this long")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if not torch.cuda.is_available():
        log.error("no CUDA device: this benchmark needs a GPU")
        return 2
    dev = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    t0 = time.monotonic()
    log.info("device %s, torch %s", torch.cuda.get_device_name(dev), torch.__version__)
    copy_bw = copy_bandwidth(dev)
    log.info("device-to-device copy bandwidth (read+write): %.0f GB/s", copy_bw / 1e9)

    jobs: list[tuple[str, Callable[[], tuple[list[Row], list[str]]]]] = [
        ("gather_add", lambda: gather_rows([1, 64, 256, 512], dtype, dev)),
        ("write_kv", lambda: write_kv_rows([1, 64, 512], args.block_size, dtype, dev)),
        ("lm decode b1", lambda: attention_rows(LM_DECODE, [1], args.block_size, dtype, dev, split_sweep=True)),
        ("lm decode", lambda: attention_rows(LM_DECODE, [64, 256, 512], args.block_size, dtype, dev, False)),
        ("encoder", lambda: attention_rows(ENCODER, [1, 64, 256], args.block_size, dtype, dev, False)),
        ("verify", lambda: attention_rows(LM_VERIFY, [1, 64, 256], args.block_size, dtype, dev, False)),
    ]
    rows: list[Row] = []
    failures: list[str] = []
    for name, job in jobs:
        if time.monotonic() - t0 > args.budget_s:
            log.warning("skipping %s: time budget of %.0f s spent", name, args.budget_s)
            continue
        try:
            r, f = job()
            rows += r
            failures += f
        except torch.cuda.OutOfMemoryError:
            log.warning("skipping the rest of %s: out of GPU memory", name)
            torch.cuda.empty_cache()
        log.info("%s done (%.0f s elapsed)", name, time.monotonic() - t0)
    print()
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s (read+write); bytes = unique data each kernel must move; "
          f"block_size {args.block_size}, {args.dtype}")
    print_table(rows, copy_bw)
    if failures:
        print("\nCORRECTNESS FAILURES:\n" + "\n".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
