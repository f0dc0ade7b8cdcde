"""Probe for issue 3's B1: would one persistent kernel per chain remove the per-kernel fixed cost?

B1 (batch 1) is 1.41x its byte floor on the H200 and 1.25-1.28x on an H100: every projection of the LM and the
encoder is its own kernel, and each pays a ramp (first DRAM round trips) and a tail (the last wave) that the bytes
do not explain (docs/benchmarks.md, issue 3: the kernel inventory, split-K, one-row kernels, PDL, L2 prefetch). The
remaining route is a persistent kernel that keeps every SM streaming weights across projections, with grid-wide
barriers where a projection needs the whole output of the one before.

This probe measures that route on a skeleton of the batch-1 step (full-size shapes, bf16 weights): L layers of
four matrix-vector products, qkv, o (reading the first `attn` outputs of qkv as a stand-in for attention), gate/up,
and down (reading silu(gate) * up, added to the residual stream); attention, norms, RoPE and the LM head are left
out. The LM's shapes are 6144 x 3072, 3072 x 4096, 18432 x 3072 and 3072 x 9216; the encoder's are `ENCODER`'s.
- `separate`: the engine's kernels as they run at batch 1 (`kernels.linear.linear` per product, PDL on, torch's
  silu * mul, and the one-row `linear_residual` for down), replayed from a CUDA graph;
- `persistent`: one Triton kernel, one or more programs per SM, which walks the chain: each product's work items
  (a block of output rows times a range of K) are spread over the programs, partial sums are added with fp32
  atomics, and a grid-wide barrier (an atomic counter; release on arrive, acquire on wait) separates the products.
  The spin is bounded: a program that waits too long raises a flag and the run reports it, so a grid that is not
  co-resident fails instead of hanging.

Both are checked against torch (fp32 from the same bf16 weights) and timed with CUDA events (median of
repeats); the byte floor is the weights' bytes at the measured copy bandwidth. Results go to --out as JSON.
`--overlap` runs what B1 runs: the LM's 26 layers (engine kernels) with the encoder's 32 beside them on a second
stream, as the engine's kernels, or with either chain as the persistent kernel (`--encoder-programs`,
`--lm-programs`), so that its bytes might stream in the DRAM time the other chain leaves idle, or with both chains
persistent at once on disjoint programs (`--both 99:33`: the SMs split about as the chains' bytes are).
`--prefetch 0 1` runs every persistent variant without and with its first weight tile of each product requested
between the program's arrival at the barrier before it and its wait there (the fifty-fifth session ran without).

    python benchmarks/probe_persistent_chain.py --layers 4 --out F.json     (CUDA only)
    python benchmarks/probe_persistent_chain.py --overlap --out F.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

logger = logging.getLogger("probe_persistent_chain")


@dataclass(frozen=True)
class Dims:
    """One layer's product shapes: hidden, qkv outputs, attention width (o's K), MLP width (down's K)."""

    hidden: int
    qkv: int
    attn: int
    inter: int
    layers: int


LM = Dims(3072, 6144, 4096, 9216, 26)  # Voxtral-Mini-4B-Realtime's LM
ENCODER = Dims(1280, 6144, 2048, 5120, 32)  # its audio encoder (one row here; the engine's batch 1 has 4)


@triton.jit
def _arrive(counter_ptr):
    """This program's part of the phase is stored: count it in (release, so the stores are seen before the count)."""
    tl.debug_barrier()  # this program's threads have all stored their part
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait(counter_ptr, flag_ptr, phase, nprog):
    """Until every program has arrived at the end of `phase` (the grid must be co-resident); returns the next phase.
    The spin is bounded: a wait that gives up raises the flag instead of hanging."""
    target = (phase + 1) * nprog
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < 2_000_000):
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        tl.atomic_max(flag_ptr, 1)
    tl.debug_barrier()
    return phase + 1


@triton.jit
def _k_per(K, K_SPLIT: tl.constexpr, BLOCK_K: tl.constexpr):
    """The K range of one work item: whole K tiles."""
    return tl.cdiv(tl.cdiv(K, BLOCK_K), K_SPLIT) * BLOCK_K


@triton.jit
def _first_tile(w_ptr, N, K, pid, live, K_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                PREFETCH: tl.constexpr):
    """The first weight tile of this program's first work item of W[N, K] (zeros without PREFETCH, or where there
    is none). Weights never depend on the phase before, so it is requested between the program's arrival and its
    wait at the barrier that opens the product: it streams while the program waits."""
    if PREFETCH:
        rn = (pid // K_SPLIT) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = (pid % K_SPLIT) * _k_per(K, K_SPLIT, BLOCK_K) + tl.arange(0, BLOCK_K)
        mask = (rn < N)[:, None] & (rk < K)[None, :] & live
        return tl.load(w_ptr + rn.to(tl.int64)[:, None] * K + rk[None, :], mask=mask, other=0.0)
    return tl.zeros([BLOCK_N, BLOCK_K], w_ptr.dtype.element_ty)


@triton.jit
def _x_tile(x_ptr, rk, K, ACT: tl.constexpr):
    """Columns `rk` of the product's input vector, fp32 (ACT: silu(x[:K]) * x[K:2K], the MLP's gate and up halves).
    `.cg`: other programs wrote it, so it is read from L2, never from a stale L1 line."""
    k_in = rk < K
    if ACT:
        g = tl.load(x_ptr + rk, mask=k_in, other=0.0, cache_modifier=".cg")
        u = tl.load(x_ptr + K + rk, mask=k_in, other=0.0, cache_modifier=".cg")
        return g / (1.0 + tl.exp(-g)) * u
    return tl.load(x_ptr + rk, mask=k_in, other=0.0, cache_modifier=".cg")


@triton.jit
def _matvec_phase(w_ptr, x_ptr, y_ptr, N, K, pid, nprog, w_first, K_SPLIT: tl.constexpr, ACT: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """y[N] += W[N, K] @ x over this program's work items (row block, K range); y was zeroed before. ACT: x is the
    MLP's silu(gate) * up (`_x_tile`). PREFETCH: `w_first` is the first item's first weight tile (`_first_tile`),
    already requested."""
    n_blocks = tl.cdiv(N, BLOCK_N)
    k_per = _k_per(K, K_SPLIT, BLOCK_K)
    for item in range(pid, n_blocks * K_SPLIT, nprog):
        rb = item // K_SPLIT
        k_lo = (item % K_SPLIT) * k_per
        rn = rb * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N], tl.float32)
        k_start = k_lo
        if PREFETCH:
            if item == pid:
                x = _x_tile(x_ptr, k_lo + tl.arange(0, BLOCK_K), K, ACT)
                acc += tl.sum(w_first.to(tl.float32) * x[None, :], axis=1)
                k_start = k_lo + BLOCK_K
        for k0 in range(k_start, tl.minimum(k_lo + k_per, K), BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + rn.to(tl.int64)[:, None] * K + rk[None, :],
                        mask=(rn < N)[:, None] & (rk < K)[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * _x_tile(x_ptr, rk, K, ACT)[None, :], axis=1)
        tl.atomic_add(y_ptr + rn, acc, mask=rn < N, sem="relaxed", scope="gpu")


@triton.jit
def _clear(ptr, n, pid, nprog):
    """ptr[:n] = 0, spread over the programs in blocks of 1,024."""
    offs = tl.arange(0, 1024)
    for i in range(pid * 1024, n, nprog * 1024):
        tl.store(ptr + i + offs, tl.zeros([1024], tl.float32), mask=i + offs < n)


@triton.jit
def persistent_chain_kernel(a_ptr, q_ptr, o_ptr, h_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, counter_ptr, flag_ptr,
                            L, HID: tl.constexpr, NQKV: tl.constexpr, NATTN: tl.constexpr, NINTER: tl.constexpr,
                            KS_QKV: tl.constexpr, KS_O: tl.constexpr, KS_GU: tl.constexpr, KS_D: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr = False):
    """L layers of qkv -> o -> gate/up -> down; a (HID) is the residual stream: each layer's input, and down adds
    its product to it. Each other output buffer is zeroed one phase before it is accumulated into. PREFETCH: each
    program requests its first weight tile of a product before it waits at the barrier that opens it."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    phase = 0
    w_next = _first_tile(wqkv_ptr, NQKV, HID, pid, True, KS_QKV, BLOCK_N, BLOCK_K, PREFETCH)
    for layer in range(L):
        wq = wqkv_ptr + layer * NQKV * HID
        wo = wo_ptr + layer * HID * NATTN
        wg = wgu_ptr + layer * 2 * NINTER * HID
        wd = wd_ptr + layer * HID * NINTER
        # qkv: q = Wqkv a; meanwhile clear o for the next phase (nobody reads it now)
        _matvec_phase(wq, a_ptr, q_ptr, NQKV, HID, pid, nprog, w_next, KS_QKV, False, BLOCK_N, BLOCK_K, PREFETCH)
        _clear(o_ptr, HID, pid, nprog)
        _arrive(counter_ptr)
        w_next = _first_tile(wo, HID, NATTN, pid, True, KS_O, BLOCK_N, BLOCK_K, PREFETCH)
        phase = _wait(counter_ptr, flag_ptr, phase, nprog)
        # o = Wo q[:NATTN]; clear h
        _matvec_phase(wo, q_ptr, o_ptr, HID, NATTN, pid, nprog, w_next, KS_O, False, BLOCK_N, BLOCK_K, PREFETCH)
        _clear(h_ptr, 2 * NINTER, pid, nprog)
        _arrive(counter_ptr)
        w_next = _first_tile(wg, 2 * NINTER, HID, pid, True, KS_GU, BLOCK_N, BLOCK_K, PREFETCH)
        phase = _wait(counter_ptr, flag_ptr, phase, nprog)
        # gate/up: h = Wgu o
        _matvec_phase(wg, o_ptr, h_ptr, 2 * NINTER, HID, pid, nprog, w_next, KS_GU, False, BLOCK_N, BLOCK_K,
                      PREFETCH)
        # q is read again by nobody until the next layer's qkv phase, which clears nothing of it: clear it here
        _clear(q_ptr, NQKV, pid, nprog)
        _arrive(counter_ptr)
        w_next = _first_tile(wd, HID, NINTER, pid, True, KS_D, BLOCK_N, BLOCK_K, PREFETCH)
        phase = _wait(counter_ptr, flag_ptr, phase, nprog)
        # down: a += Wd (silu(gate) * up), the residual stream (which keeps a deep chain's values from vanishing)
        _matvec_phase(wd, h_ptr, a_ptr, HID, NINTER, pid, nprog, w_next, KS_D, True, BLOCK_N, BLOCK_K, PREFETCH)
        _arrive(counter_ptr)
        w_next = _first_tile(wq + NQKV * HID, NQKV, HID, pid, layer + 1 < L, KS_QKV, BLOCK_N, BLOCK_K, PREFETCH)
        phase = _wait(counter_ptr, flag_ptr, phase, nprog)


def k_split(n: int, k: int, block_n: int, block_k: int, nprog: int) -> int:
    """K ranges per row block so that every product has at least about three work items per program."""
    blocks, tiles = triton.cdiv(n, block_n), triton.cdiv(k, block_k)
    return max(1, min(tiles, triton.cdiv(3 * nprog, blocks)))


def make_weights(d: Dims, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def w(*shape: int, gain: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * gain / shape[-1] ** 0.5).to(device=device, dtype=torch.bfloat16)

    # down's products are small next to the residual stream (about 6% of its norm a layer), so that 32 layers
    # neither blow up nor vanish, and a wrong product still moves the output far beyond the check's 1e-3
    return {"qkv": w(d.layers, d.qkv, d.hidden), "o": w(d.layers, d.hidden, d.attn),
            "gu": w(d.layers, 2 * d.inter, d.hidden), "d": w(d.layers, d.hidden, d.inter, gain=0.1)}


def reference(w: dict[str, torch.Tensor], a0: torch.Tensor, d: Dims) -> torch.Tensor:
    a = a0.float()
    for layer in range(d.layers):
        q = w["qkv"][layer].float() @ a
        o = w["o"][layer].float() @ q[:d.attn]
        h = w["gu"][layer].float() @ o
        a = a + w["d"][layer].float() @ (torch.nn.functional.silu(h[:d.inter]) * h[d.inter:])
    return a


def capture(step, stream: torch.cuda.Stream | None = None):
    """`step` warmed up on a side stream, then captured; returns the graph's replay."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()
    return graph.replay


def separate_chain(w: dict[str, torch.Tensor], a0: torch.Tensor, d: Dims):
    """The engine's batch-1 kernels, one per product (down with its residual add, as the engine's one-row
    `linear_residual`), in a CUDA graph; returns (replay, output)."""
    from kernels.linear import linear
    from kernels.one_row import linear_residual

    x = a0.to(torch.bfloat16).view(1, -1).clone()
    out: list[torch.Tensor] = []

    def step() -> None:
        a = x.view(-1)
        for layer in range(d.layers):
            q = linear(a.view(1, -1), w["qkv"][layer])
            o = linear(q[:, :d.attn], w["o"][layer])
            h = linear(o, w["gu"][layer])
            a = linear_residual((torch.nn.functional.silu(h[:, :d.inter]) * h[:, d.inter:]).view(-1), w["d"][layer], a)
        out[:] = [a]

    return capture(step), out


def persistent_chain(w: dict[str, torch.Tensor], a0: torch.Tensor, d: Dims, programs: int, block_n: int,
                     block_k: int, warps: int, stages: int, prefetch: bool = False):
    """The persistent kernel; returns (run, state) where state holds a (the output) and the spin flag."""
    dev = a0.device
    st = {"a": torch.empty(d.hidden, device=dev), "q": torch.zeros(d.qkv, device=dev),
          "o": torch.zeros(d.hidden, device=dev), "h": torch.zeros(2 * d.inter, device=dev),
          "counter": torch.zeros(1, device=dev, dtype=torch.int32), "flag": torch.zeros(1, device=dev,
                                                                                         dtype=torch.int32)}
    ks = {name: k_split(n, k, block_n, block_k, programs) for name, n, k in
          (("qkv", d.qkv, d.hidden), ("o", d.hidden, d.attn), ("gu", 2 * d.inter, d.hidden), ("d", d.hidden, d.inter))}
    st["k_split"] = ks

    def run() -> None:
        st["a"].copy_(a0)
        st["counter"].zero_()
        persistent_chain_kernel[(programs,)](
            st["a"], st["q"], st["o"], st["h"], w["qkv"], w["o"], w["gu"], w["d"], st["counter"], st["flag"],
            d.layers, HID=d.hidden, NQKV=d.qkv, NATTN=d.attn, NINTER=d.inter, KS_QKV=ks["qkv"], KS_O=ks["o"],
            KS_GU=ks["gu"], KS_D=ks["d"], BLOCK_N=block_n, BLOCK_K=block_k, PREFETCH=prefetch, num_warps=warps,
            num_stages=stages)

    return run, st


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """||y - ref|| / ||ref||; a reference that is not finite or about zero verifies nothing (an error)."""
    norm = float(ref.norm())
    if not (norm > 1e-6 and torch.isfinite(ref).all()):
        raise ValueError(f"the reference verifies nothing (norm {norm})")
    return float((y.float() - ref).norm()) / norm


def time_ms(fn, repeats: int, inner: int = 20) -> float:
    """Median over `repeats` of the mean of `inner` runs back to back. Not `bench_kernels.bench_ms`
    (triton.testing.do_bench), which empties L2 before each run: `time_pair_ms` cannot, so both measure alike."""
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / inner)
    return statistics.median(times)


def time_pair_ms(first, second, repeats: int, inner: int = 20) -> float:
    """Wall time of `first` on the current stream and `second` on a side stream, started together each time."""
    side = torch.cuda.Stream()
    main_stream = torch.cuda.current_stream()
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(inner):
            fork = torch.cuda.Event()
            fork.record(main_stream)
            side.wait_event(fork)
            with torch.cuda.stream(side):
                second()
            first()
            join = torch.cuda.Event()
            join.record(side)
            main_stream.wait_event(join)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / inner)
    return statistics.median(times)


def chain_sweep(args: argparse.Namespace, d: Dims, sms: int, floor_of, report: dict) -> None:
    """One chain alone: the engine's kernels, then the persistent kernel in every config."""
    w = make_weights(d, "cuda")
    a0 = torch.randn(d.hidden, generator=torch.Generator().manual_seed(1)).to("cuda")
    ref = reference(w, a0, d)
    floor = floor_of(w)
    report.update({"dims": vars(d), "floor_ms": floor})

    replay, out = separate_chain(w, a0, d)
    replay()
    torch.cuda.synchronize()
    err = rel_error(out[0].view(-1), ref)
    ms = time_ms(replay, args.repeats)
    report["runs"].append({"variant": "separate", "ms": ms, "ratio": ms / floor, "rel_err": err})
    logger.info("separate (engine kernels, graph): %.3f ms = %.3fx floor, rel err %.2e", ms, ms / floor, err)
    for per_sm, cfg, prefetch in ((n, c, f) for n in args.programs_per_sm for c in args.configs
                                  for f in args.prefetch):
        config = tuple(int(v) for v in cfg.split(":"))
        entry = {"variant": "persistent", "programs": per_sm * sms, "config": cfg, "prefetch": bool(prefetch)}
        try:
            run, st, err, failure = checked_persistent(w, a0, d, per_sm * sms, config, bool(prefetch))
        except Exception as exc:  # a config Triton cannot build: record it, go on
            entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
        else:
            entry.update(k_split=st["k_split"], rel_err=err)
            if failure:
                entry["error"] = failure
            else:
                entry["ms"] = time_ms(run, args.repeats)
                entry["ratio"] = entry["ms"] / floor
                if not still_ok(st):
                    entry["error"] = "a barrier wait gave up while timed"
        report["runs"].append(entry)
        logger.info("persistent %s, %d programs: %s", cfg, per_sm * sms,
                    {k: v for k, v in entry.items() if k not in ("variant", "config", "programs")})
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


def checked_persistent(w: dict[str, torch.Tensor], a0: torch.Tensor, d: Dims, programs: int,
                       config: tuple[int, ...], prefetch: bool):
    """The persistent chain, run once and checked against torch: (run, state, relative error, failure or None). A
    barrier that gave up (programs not co-resident) or an error above 1e-3 is a failure."""
    run, st = persistent_chain(w, a0, d, programs, *config, prefetch=prefetch)
    run()
    if a0.is_cuda:
        torch.cuda.synchronize()
    err = rel_error(st["a"], reference(w, a0, d))
    flag = int(st["flag"].item())
    return run, st, err, None if not flag and err <= 1e-3 else f"failed (flag {flag}, err {err:.1e})"


def still_ok(*states: dict) -> bool:
    """No barrier of these runs gave up during the timed runs."""
    return not any(int(st["flag"].item()) for st in states)


def persistent_rows(label: str, w: dict[str, torch.Tensor], a0: torch.Tensor, d: Dims, programs: int,
                    config: tuple[int, ...], prefetch: bool, repeats: int, beside) -> list[tuple[str, float]]:
    """`label`'s chain as the persistent kernel: checked against torch, then timed alone and with `beside(run)` (the
    other chain's engine kernels on the other stream). A wrong result or a barrier that gave up, before or during
    the timed runs, leaves one failed row instead."""
    name = f"{label} persistent x{programs}{' prefetch' if prefetch else ''}"
    run, st, _, failure = checked_persistent(w, a0, d, programs, config, prefetch)
    if failure:
        return [(f"{name}: {failure}", float("nan"))]
    rows = [(f"{name}, alone", time_ms(run, repeats)), (f"{name}, the other chain's kernels beside", beside(run))]
    return rows if still_ok(st) else [(f"{name}: a barrier gave up while timed", float("nan"))]


def both_persistent_rows(lm: tuple, enc: tuple, pair: str, config_lm: tuple[int, ...], config_enc: tuple[int, ...],
                         prefetch: bool, repeats: int) -> list[tuple[str, float]]:
    """Both chains as persistent kernels at once, `pair` = "LM_PROGRAMS:ENCODER_PROGRAMS" programs: together they
    must fit the GPU at once (e.g. 99:33 at one program per SM), so that the SMs are split between the chains
    about as their bytes are, and neither chain's barriers wait for a program that shares an SM with the other's."""
    p_lm, p_enc = (int(v) for v in pair.split(":"))
    name = f"both persistent {p_lm}:{p_enc}{' prefetch' if prefetch else ''}"
    run_lm, st_lm, _, fail_lm = checked_persistent(*lm, p_lm, config_lm, prefetch)
    run_enc, st_enc, _, fail_enc = checked_persistent(*enc, p_enc, config_enc, prefetch)
    if fail_lm or fail_enc:
        return [(f"{name}: lm {fail_lm or 'ok'}, encoder {fail_enc or 'ok'}", float("nan"))]
    ms = time_pair_ms(run_lm, run_enc, repeats)
    return [(name, ms)] if still_ok(st_lm, st_enc) else [(f"{name}: a barrier gave up while timed", float("nan"))]


def overlap(args: argparse.Namespace, sms: int, floor_of, report: dict) -> None:
    """The LM's chain (engine kernels, graph) with the encoder's beside it on a second stream, as the engine runs
    batch 1: both as the engine's kernels, either one as a persistent kernel, or both persistent at once."""
    w_lm, w_enc = make_weights(LM, "cuda", seed=0), make_weights(ENCODER, "cuda", seed=1)
    a_lm = torch.randn(LM.hidden, generator=torch.Generator().manual_seed(1)).to("cuda")
    a_enc = torch.randn(ENCODER.hidden, generator=torch.Generator().manual_seed(2)).to("cuda")
    floor_lm, floor_enc = floor_of(w_lm), floor_of(w_enc)
    report.update({"floor_lm_ms": floor_lm, "floor_enc_ms": floor_enc, "floor_ms": floor_lm + floor_enc})
    lm, _ = separate_chain(w_lm, a_lm, LM)
    enc, _ = separate_chain(w_enc, a_enc, ENCODER)
    rows = [("lm alone", time_ms(lm, args.repeats)), ("encoder alone (engine kernels)", time_ms(enc, args.repeats)),
            ("both (engine kernels)", time_pair_ms(lm, enc, args.repeats))]
    cfg_enc, cfg_lm = (tuple(int(v) for v in c.split(":")) for c in (args.encoder_config, args.lm_config))
    for prefetch in (bool(f) for f in args.prefetch):
        for programs in args.encoder_programs:  # the encoder as one persistent kernel beside the LM's engine kernels
            rows += persistent_rows("encoder", w_enc, a_enc, ENCODER, programs, cfg_enc, prefetch, args.repeats,
                                    lambda run: time_pair_ms(lm, run, args.repeats))
        for programs in args.lm_programs:  # the LM as one persistent kernel, the encoder's engine kernels beside it
            rows += persistent_rows("lm", w_lm, a_lm, LM, programs, cfg_lm, prefetch, args.repeats,
                                    lambda run: time_pair_ms(run, enc, args.repeats))
        for pair in args.both:
            rows += both_persistent_rows((w_lm, a_lm, LM), (w_enc, a_enc, ENCODER), pair, cfg_lm, cfg_enc, prefetch,
                                         args.repeats)
    floor = floor_lm + floor_enc
    for name, ms in rows:
        report["runs"].append({"variant": name, "ms": ms, "ratio_to_both_floors": ms / floor})
        logger.info("%-52s %.3f ms (%.3fx the two chains' floor %.3f ms)", name, ms, ms / floor, floor)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chain", choices=["lm", "encoder"], default="lm", help="the chain the sweep runs alone")
    ap.add_argument("--layers", type=int, default=4, help="layers of the chain the sweep runs (its own: 26 / 32)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--configs", nargs="+",
                    default=["8:256:4:3", "16:512:4:3", "32:256:4:3", "32:512:8:3", "16:256:4:4"],
                    help="BLOCK_N:BLOCK_K:warps:stages of the persistent kernel")
    ap.add_argument("--programs-per-sm", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--overlap", action="store_true", help="the LM and the encoder at once (full depth) instead")
    ap.add_argument("--encoder-programs", type=int, nargs="*", default=[16, 33, 66, 132])
    ap.add_argument("--encoder-config", default="32:512:8:3")
    ap.add_argument("--lm-programs", type=int, nargs="*", default=[], help="also the LM as a persistent kernel")
    ap.add_argument("--lm-config", default="32:512:8:3")
    ap.add_argument("--both", nargs="*", default=[],
                    help="LM_PROGRAMS:ENCODER_PROGRAMS: also both chains persistent at once (e.g. 99:33)")
    ap.add_argument("--prefetch", type=int, nargs="+", default=[0, 1], choices=[0, 1],
                    help="persistent kernels without (0) and with (1) each product's first weight tile requested "
                         "before the barrier that opens it")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    from bench_engine import copy_bandwidth

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()

    def floor_of(w: dict[str, torch.Tensor]) -> float:
        return sum(t.numel() * t.element_size() for t in w.values()) / bw * 1e3

    report: dict = {"gpu": torch.cuda.get_device_name(), "sms": sms, "copy_bandwidth_gbs": bw / 1e9, "runs": []}
    logger.info("%s, %d SMs, copy bandwidth %.0f GB/s", report["gpu"], sms, bw / 1e9)
    if args.overlap:
        overlap(args, sms, floor_of, report)
    else:
        base = LM if args.chain == "lm" else ENCODER
        chain_sweep(args, Dims(base.hidden, base.qkv, base.attn, base.inter, args.layers), sms, floor_of, report)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
