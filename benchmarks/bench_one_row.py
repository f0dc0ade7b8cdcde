"""Issue 3's B1: tune the fused one-row kernels (`kernels.one_row`) and time an LM layer's kernels both ways.

    python benchmarks/bench_one_row.py [--layers 26] [--out FILE.json]

At batch 1 the LM step is a chain of dependent kernels; `kernels.one_row` folds a layer's 11 into 6.
This script, on the full-size LM's shapes (bf16, PDL on, fresh weights per layer so that nothing is
served from L2, each chain replayed from one CUDA graph):

1. times each fused operation (qkv + RoPE + KV write, o + residual, gate/up + SiLU·mul, down +
   residual, final norm + head) for every configuration in GRID, after checking each configuration's
   result against the reference (bf16 tolerance); configurations that do not fit (shared memory) are
   skipped;
2. times a whole layer's projections and element-wise kernels (attention left out: it is the same in
   both) as the engine ran them before (`unfused`: norm, qkv, RoPE, KV write, o, norm, gate/up,
   SiLU·mul, down) and fused with the best configurations;
3. prints `BEST_CONFIGS {json}` (the value for STREAMSCRIBE_ONE_ROW_CONFIGS) as its last line, after the best of
   each mode alone (`BEST_FMA_CONFIGS`, `BEST_DOT_CONFIGS`); a tensor-core configuration's log line and the JSON's
   `differ_from_multi_row` count its outputs that differ from the multi-row path's (0: bit for bit).
The floor of each row is its weight bytes over the copy bandwidth measured in the same run.

    python benchmarks/bench_one_row.py --resources [--out FILE.json]

needs no GPU: it compiles every configuration for sm_90 with Triton's bundled ptxas and reports registers,
spill stack and the SASS loads (16-byte loads, cp.async) of each.

    ncu ... python benchmarks/bench_one_row.py --profile gate_up [--rounds 4]

runs one operation (or `gate_up_unfused`, the engine's default for it) eagerly over every layer, for a profiler
(`benchmarks/gpu_ncu_one_row.sh`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

log = logging.getLogger("bench_one_row")

H, HQ, HKV, D, INTER, VOCAB = 3072, 32, 8, 128, 9216, 131072  # the full-size LM
# (BLOCK_N, BLOCK_K, warps, pipeline stages, dot); configurations the sm_90 compiler spills are skipped. dot = 1: the
# tensor-core mode; BLOCK_K 0 there is `linear`'s K tile (bit-identical to the multi-row kernel)
GRID = ([(bn, bk, w, st, 0) for bn, bk, w in ((4, 256, 2), (8, 256, 4), (16, 256, 4), (16, 256, 8), (8, 512, 4),
                                             (32, 256, 8), (4, 512, 2), (8, 1024, 4)) for st in (1, 2)]
        + [(bn, 0, w, st, 1) for bn in (16, 32, 64) for w in (2, 4) for st in (1, 2, 3, 4)]
        + [(16, 256, 2, 3, 1), (16, 512, 2, 2, 1), (32, 512, 4, 2, 1), (16, 128, 2, 4, 1)])
# what each operation launches (one_row_kernel's constexprs) at the full-size shapes: (epilogue, K, HALF)
OP_KERNEL = {"qkv": (3, H, D // 2), "o": (1, HQ * D, 1), "gate_up": (2, H, INTER), "down": (1, INTER, 1),
             "head": (0, H, 1)}
OP_ROWS = {"qkv": (HQ + 2 * HKV) * D, "o": H, "gate_up": 2 * INTER, "down": H, "head": VOCAB}  # weight rows


def resources(op: str, config: tuple[int, ...]) -> dict:
    """Compile `op`'s kernel for sm_90 without a GPU (Triton's bundled ptxas) and read its resource usage
    (registers, stack = spill space) and the loads its SASS holds (cuobjdump, also bundled)."""
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels._one_row_triton import EPI_ROPE_KV, EPI_SILU_MUL, one_row_kernel

    from kernels._linear_triton import config_for

    epilogue, k, half = OP_KERNEL[op]
    bn, bk, warps, stages, dot = config
    if dot and bk == 0:
        bk = config_for(OP_ROWS[op], k)[1]
    if epilogue in (EPI_ROPE_KV, EPI_SILU_MUL):
        while half % bn:
            bn //= 2
    names = one_row_kernel.arg_names
    ints = {"N", "K", "stride_w", "stride_kcb", "stride_kcs", "stride_kch", "stride_vcb", "stride_vcs", "stride_vch"}
    sig = {n: "*i64" if n == "slot_ptr" else "*bf16" if n.endswith("_ptr") else "fp32" if n == "eps" else
           "i32" if n in ints else "constexpr" for n in names}
    norm = op in ("qkv", "gate_up", "head")
    const = {"HALF": half, "HQ": HQ, "HKV": HKV, "CACHE_BLOCK": 16, "NORM": norm, "HAS_SCALE": op == "gate_up",
             "PAIRED": epilogue in (EPI_ROPE_KV, EPI_SILU_MUL), "EPILOGUE": epilogue, "BLOCK_N": bn, "BLOCK_K": bk,
             "K_POW2": triton.next_power_of_2(k), "STAGES": stages, "DOT": bool(dot), "USE_GDC": True}
    aligned = [n for n in names if n.endswith("_ptr") or n in ("K", "stride_w")]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    compiled = triton.compile(ASTSource(one_row_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages})
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([str(tools / "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if m is None:
        raise RuntimeError(f"no resource usage for {op} {config}: {usage[-300:]}")
    return {"registers": int(m.group(1)), "stack_bytes": int(m.group(2)), "ldg_128": sass.count("LDG.E.128"),
            "cp_async": sass.count("LDGSTS"), "local_loads_stores": len(re.findall(r"\b(?:LDL|STL)\b", sass))}


def resource_table() -> dict[str, dict[str, dict]]:
    return {op: {str(c): resources(op, c) for c in GRID} for op in OP_KERNEL}


class Layer:
    def __init__(self, dev: torch.device, g: torch.Generator) -> None:
        def w(n: int, k: int) -> torch.Tensor:
            return (torch.randn(n, k, generator=g) / k ** 0.5).to(dev, torch.bfloat16)

        def near_one(n: int) -> torch.Tensor:
            return (1 + 0.1 * torch.randn(n, generator=g)).to(dev, torch.bfloat16)

        self.qkv, self.o = w((HQ + 2 * HKV) * D, H), w(H, HQ * D)
        self.gate_up, self.down = w(2 * INTER, H), w(H, INTER)
        self.nw1, self.nw2, self.scale = near_one(H), near_one(H), near_one(H)


class Inputs:
    """The activations every chain reads (random, not zeros), and a small paged cache for the KV writes."""

    def __init__(self, dev: torch.device, g: torch.Generator) -> None:
        def rnd(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g).to(dev, torch.bfloat16)

        self.res, self.attn, self.act = rnd(H), rnd(HQ * D), rnd(INTER)
        ang = torch.randn(D // 2, generator=g)
        self.cos = torch.cat([ang.cos(), ang.cos()]).to(dev, torch.bfloat16)
        self.sin = torch.cat([ang.sin(), ang.sin()]).to(dev, torch.bfloat16)
        self.kc = torch.zeros(8, 16, HKV, D, device=dev, dtype=torch.bfloat16)
        self.vc = torch.zeros_like(self.kc)
        self.slot = torch.tensor([37], device=dev)


def op_calls(op: str, layers: list[Layer], heads: list[torch.Tensor], x: Inputs, backend: str = "auto") -> list:
    """One call per layer (head: per copy) of the fused operation `op`."""
    from kernels import one_row

    if op == "qkv":
        return [lambda L=L: one_row.norm_qkv_rope_kv(x.res, L.nw1, 1e-5, L.qkv, x.cos, x.sin, x.kc, x.vc, x.slot, HQ,
                                                     HKV, backend=backend) for L in layers]
    if op == "o":
        return [lambda L=L: one_row.linear_residual(x.attn, L.o, x.res, backend=backend) for L in layers]
    if op == "gate_up":
        return [lambda L=L: one_row.norm_gate_up_silu(x.res, L.nw2, 1e-5, L.scale, L.gate_up, backend=backend)
                for L in layers]
    if op == "down":
        return [lambda L=L: one_row.linear_residual(x.act, L.down, x.res, backend=backend) for L in layers]
    if op == "head":
        return [lambda w=w: one_row.norm_linear(x.res, layers[0].nw1, 1e-5, w, backend=backend) for w in heads]
    raise ValueError(op)


def unfused_gate_up(L: "Layer", res: torch.Tensor) -> torch.Tensor:
    """The MLP input as the multi-row path (and the one-row path by default) computes it: norm kernel with the
    delay scale, `kernels.linear`, SiLU·mul kernel."""
    from kernels.fused_ops import add_rms_norm, silu_mul
    from kernels.linear import linear

    return silu_mul(linear(add_rms_norm(res, None, L.nw2, 1e-5, L.scale)[0], L.gate_up))


def multi_row_result(op: str, L: "Layer", head: torch.Tensor, x: "Inputs") -> torch.Tensor:
    """`op`'s result as the multi-row path computes it for this one row (norm kernel, `kernels.linear`,
    element-wise kernels): what the tensor-core mode must equal bit for bit."""
    from kernels.fused_ops import add_rms_norm, rope
    from kernels.linear import linear

    if op == "qkv":
        qkv = linear(add_rms_norm(x.res, None, L.nw1, 1e-5)[0], L.qkv)
        q, k = qkv[: HQ * D].reshape(1, 1, HQ, D), qkv[HQ * D: (HQ + HKV) * D].reshape(1, 1, HKV, D)
        return rope(q, k, x.cos[None, None], x.sin[None, None])[0].reshape(HQ, D)
    if op == "o":
        return linear(x.attn, L.o) + x.res
    if op == "gate_up":
        return unfused_gate_up(L, x.res)
    if op == "down":
        return linear(x.act, L.down) + x.res
    return linear(add_rms_norm(x.res, None, L.nw1, 1e-5)[0], head)


CONFIG_KEY = {"qkv": "qkv", "o": "residual", "gate_up": "gate_up", "down": "residual", "head": "head"}


def unfused_layer(L: Layer, x: Inputs) -> None:
    """A layer's kernels as the engine ran them before `one_row` (attention left out)."""
    from kernels.fused_ops import add_rms_norm, rope, silu_mul
    from kernels.linear import linear
    from kernels.paged_attention import write_kv

    h, res = add_rms_norm(x.res[None, None], x.act[None, None, :H], L.nw1, 1e-5)
    q, k, v = linear(h, L.qkv).split([HQ * D, HKV * D, HKV * D], dim=-1)
    q, k = rope(q.reshape(1, 1, HQ, D), k.reshape(1, 1, HKV, D), x.cos[None, None], x.sin[None, None])
    write_kv(x.kc, x.vc, k[0], v.reshape(1, HKV, D), x.slot)
    o = linear(x.attn[None, None], L.o)
    h2, res = add_rms_norm(o, res, L.nw2, 1e-5, L.scale)
    linear(silu_mul(linear(h2, L.gate_up)), L.down)


def unfused_gate_up_calls(layers: list[Layer], x: Inputs) -> list:
    """The engine's default MLP input at batch 1 (norm, tensor-core projection, SiLU·mul), one call per layer."""
    return [lambda L=L: unfused_gate_up(L, x.res) for L in layers]


def fused_layer(L: Layer, x: Inputs) -> None:
    from kernels import one_row

    one_row.norm_qkv_rope_kv(x.res, L.nw1, 1e-5, L.qkv, x.cos, x.sin, x.kc, x.vc, x.slot, HQ, HKV)
    res = one_row.linear_residual(x.attn, L.o, x.res)
    one_row.linear_residual(one_row.norm_gate_up_silu(res, L.nw2, 1e-5, L.scale, L.gate_up), L.down, res)


def engine_layer(L: Layer, x: Inputs) -> None:
    """The layer as the engine's one-row path runs it by default (`one_row.fused_gate_up()` off): the gate/up as
    norm, `linear` and SiLU·mul."""
    from kernels import one_row

    one_row.norm_qkv_rope_kv(x.res, L.nw1, 1e-5, L.qkv, x.cos, x.sin, x.kc, x.vc, x.slot, HQ, HKV)
    res = one_row.linear_residual(x.attn, L.o, x.res)
    one_row.linear_residual(unfused_gate_up(L, res), L.down, res)


def op_bytes(op: str, layers: list[Layer], heads: list[torch.Tensor]) -> int:
    if op == "head":
        return sum(w.numel() * 2 for w in heads)
    return sum(getattr(L, op).numel() * 2 for L in layers)  # the op names are Layer's weight names


# one tensor-core configuration for every operation of a layer (a PDL chain mixes them otherwise; the twenty-sixth
# session's per-operation bests were slower together than alone)
LAYER_GRID = [(bn, 0, w, st, 1) for bn in (16, 32, 64) for w in (2, 4) for st in (1, 2, 3)]


def layer_sweep(layers: list[Layer], x: Inputs, bw: float, out: str | None, grid: list[tuple[int, ...]]) -> int:
    """The fused layer and the engine's layer (gate/up unfused) for each uniform tensor-core configuration, against
    the FMA configurations (`one_row.FMA_FALLBACK`)."""
    from bench_skinny_gemm import finish_experiment, graph_us_per_call

    from kernels import one_row

    layer_bytes = sum(t.numel() * 2 for t in (layers[0].qkv, layers[0].o, layers[0].gate_up, layers[0].down))
    result: dict = {"gpu": torch.cuda.get_device_name(), "copy_bandwidth_GBps": bw / 1e9, "layers": len(layers),
                    "floor_us": layer_bytes / bw * 1e6, "rows": {}}
    candidates = {"fma": dict(one_row.FMA_FALLBACK)}
    candidates.update({str(c): {k: c for k in one_row.CONFIGS} for c in grid})
    for name, configs in candidates.items():
        os.environ["STREAMSCRIBE_ONE_ROW_CONFIGS"] = json.dumps(configs)
        row = result["rows"][name] = {
            "fused_us": graph_us_per_call([lambda L=L: fused_layer(L, x) for L in layers]),
            "engine_us": graph_us_per_call([lambda L=L: engine_layer(L, x) for L in layers])}
        log.info("layer %-18s fused %.1f us, as the engine runs it %.1f us (floor %.1f)", name, row["fused_us"],
                 row["engine_us"], result["floor_us"])
    os.environ.pop("STREAMSCRIBE_ONE_ROW_CONFIGS")
    dots = [n for n in candidates if n != "fma"]
    best = min(dots, key=lambda n: result["rows"][n]["fused_us"])
    result["best_dot"] = best
    code = finish_experiment(result, out, 0)
    print("BEST_LAYER_DOT_CONFIGS " + json.dumps(candidates[best]))
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=26)
    ap.add_argument("--head-copies", type=int, default=4)
    ap.add_argument("--out", default=None)
    ap.add_argument("--resources", action="store_true",
                    help="only the sm_90 compiler's resource report of every configuration (no GPU needed)")
    ap.add_argument("--profile", choices=[*OP_KERNEL, "gate_up_unfused"], default=None,
                    help="only run one operation eagerly over every layer (--rounds times), for a profiler such as "
                         "ncu (gate_up_unfused: the engine's default norm, projection and SiLU·mul kernels)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--layer-sweep", action="store_true",
                    help="only time whole layers (the fused layer and the engine's) for one tensor-core configuration "
                         "given to every operation, for each of LAYER_GRID, against the FMA configurations; prints "
                         "BEST_LAYER_DOT_CONFIGS {json}")
    ap.add_argument("--layer-configs", default=None,
                    help="with --layer-sweep: a JSON list of tensor-core configurations to try instead of LAYER_GRID")
    args = ap.parse_args(argv)
    if args.resources:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        table = resource_table()
        for op, rows in table.items():
            for config, r in rows.items():
                log.info("%-8s %-16s regs %3d stack %3d B  LDG.128 %2d  cp.async %2d", op, config, r["registers"],
                         r["stack_bytes"], r["ldg_128"], r["cp_async"])
        if args.out:
            Path(args.out).write_text(json.dumps(table, indent=1))
        return 0
    from bench_kernels import copy_bandwidth
    from bench_skinny_gemm import cuda_for_experiment, finish_experiment, graph_us_per_call

    from triton.runtime.errors import OutOfResources

    from kernels import one_row

    dev = cuda_for_experiment(log)
    if dev is None:
        return 2
    g = torch.Generator().manual_seed(0)
    layers = [Layer(dev, g) for _ in range(args.layers)]
    heads = [(torch.randn(VOCAB, H, generator=g) / H ** 0.5).to(dev, torch.bfloat16) for _ in range(args.head_copies)]
    x = Inputs(dev, g)
    if args.profile is not None:
        calls = (unfused_gate_up_calls(layers, x) if args.profile == "gate_up_unfused"
                 else op_calls(args.profile, layers, heads, x))
        for _ in range(args.rounds):
            for call in calls:
                call()
        torch.cuda.synchronize()
        log.info("profiled %s: %d rounds of %d calls", args.profile, args.rounds, len(calls))
        return 0
    bw = copy_bandwidth(dev)
    if args.layer_sweep:
        grid = [tuple(c) for c in json.loads(args.layer_configs)] if args.layer_configs else LAYER_GRID
        return layer_sweep(layers, x, bw, args.out, grid)
    result: dict = {"gpu": torch.cuda.get_device_name(), "copy_bandwidth_GBps": bw / 1e9, "layers": args.layers,
                    "ops": {}}
    failed = 0
    timings: dict[str, dict[tuple[int, ...], float]] = {}
    identical: dict[str, dict[str, int]] = {}  # op -> tensor-core config -> outputs that differ from multi-row
    result["differ_from_multi_row"] = identical

    def timed_config(op: str, config: tuple[int, ...], want: torch.Tensor) -> float | None:
        """µs per call of `op` with `config`, after checking its result; None when it does not fit or is wrong."""
        nonlocal failed
        os.environ["STREAMSCRIBE_ONE_ROW_CONFIGS"] = json.dumps({CONFIG_KEY[op]: config})
        try:
            got = op_calls(op, layers[:1], heads[:1], x)[0]().float()
        except OutOfResources as e:  # e.g. too much shared memory for a paired tile: not a result
            log.info("%s config %s does not fit: %s", op, config, e)
            return None
        err = ((got - want).abs().max() / want.abs().max()).item()
        if not err <= 0.02:
            log.error("%s config %s: relative error %.3g", op, config, err)
            failed += 1
            return None
        if config[4]:  # the tensor-core mode: does it round as the multi-row path does?
            multi = multi_row_result(op, layers[0], heads[0], x).float()
            identical.setdefault(op, {})[str(config)] = int((got != multi).sum().item())
            log.info("%s config %s: %d of %d outputs differ from the multi-row path", op, config,
                     identical[op][str(config)], got.numel())
        return graph_us_per_call(op_calls(op, layers, heads, x))

    for op in ("qkv", "o", "gate_up", "down", "head"):
        key = CONFIG_KEY[op]
        want = op_calls(op, layers[:1], heads[:1], x, backend="torch")[0]().float()
        floor_us = op_bytes(op, layers, heads) / bw * 1e6 / len(op_calls(op, layers, heads, x))
        timed = timings[op] = {}
        for config in GRID:
            t = timed_config(op, config, want)
            if t is not None:
                timed[config] = t
        os.environ.pop("STREAMSCRIBE_ONE_ROW_CONFIGS")
        top = min(timed, key=timed.get)
        result["ops"][op] = {"floor_us": floor_us, "us": {str(c): t for c, t in timed.items()}, "best": top,
                             "best_us": timed[top]}
        log.info("%-8s floor %6.1f us, best %6.1f us %s; default %s: %.1f us", op, floor_us, timed[top], top,
                 one_row.CONFIGS[key], timed.get(one_row.CONFIGS[key], float("nan")))
    def best_of(modes: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """The fastest configuration of each operation among those of the given dot modes."""
        pick = {}
        for op in ("qkv", "gate_up", "head"):
            timed = {c: t for c, t in timings[op].items() if c[4] in modes}
            pick[CONFIG_KEY[op]] = min(timed, key=timed.get)
        # one configuration serves both residual projections (o and down): the best of their sum
        both = {c: timings["o"][c] + timings["down"][c] for c in timings["o"] if c in timings["down"] and c[4] in modes}
        pick["residual"] = min(both, key=both.get)
        return pick

    layer_bytes = sum(t.numel() * 2 for t in (layers[0].qkv, layers[0].o, layers[0].gate_up, layers[0].down))
    result["layer"] = {"floor_us": layer_bytes / bw * 1e6,
                       "unfused_us": graph_us_per_call([lambda L=L: unfused_layer(L, x) for L in layers])}
    # the layer fused (gate/up too) and as the engine runs it by default (gate/up unfused), with the best
    # configurations of each mode: FMA reduction only, tensor cores only, either
    for name, modes in (("fma", (0,)), ("dot", (1,)), ("best", (0, 1))):
        picked = best_of(modes)
        os.environ["STREAMSCRIBE_ONE_ROW_CONFIGS"] = json.dumps(picked)
        result["layer"][name] = {
            "configs": picked,
            "fused_us": graph_us_per_call([lambda L=L: fused_layer(L, x) for L in layers]),
            "engine_us": graph_us_per_call([lambda L=L: engine_layer(L, x) for L in layers])}
        log.info("layer (no attention), %s configs: floor %.1f us, unfused %.1f us, fused %.1f us, as the engine "
                 "runs it %.1f us", name, result["layer"]["floor_us"], result["layer"]["unfused_us"],
                 result["layer"][name]["fused_us"], result["layer"][name]["engine_us"])
    best = result["layer"]["best"]["configs"]
    code = finish_experiment(result, args.out, failed)
    print("BEST_FMA_CONFIGS " + json.dumps(result["layer"]["fma"]["configs"]))
    print("BEST_DOT_CONFIGS " + json.dumps(result["layer"]["dot"]["configs"]))
    print("BEST_CONFIGS " + json.dumps(best))
    return code


if __name__ == "__main__":
    sys.exit(main())
