"""Where benchmark time goes: the kernels of a GPU step (torch.profiler / CUPTI) and the host
functions of a run (cProfile). Used by bench_engine.py (B1) and bench_speculative.py (batch-1 rounds)."""

from __future__ import annotations

import cProfile
import json
import pstats
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

KERNEL_KINDS = (  # first match wins; names as CUDA reports them (cuBLAS, Triton, ATen)
    ("attention", ("paged_attention", "combine_splits")),
    ("gemm", ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet", "splitk", "cublas")),
    ("norm", ("rms_norm",)),
    ("rope", ("rope",)),
    ("kv_write", ("write_kv",)),
    ("act", ("silu", "gelu")),
    ("gather_add", ("gather_add",)),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, keys in KERNEL_KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def kernel_profile(step: Callable[[], object], steps: int = 20) -> dict:
    """Per-step kernel inventory of `step` after 3 warm-up calls (graph replays included: CUPTI
    reports the kernels inside a graph)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    return profile_kernels(lambda: [step() for _ in range(steps)], steps)


def profile_kernels(fn: Callable[[], object], per: int | Callable[[], int]) -> dict:
    """Kernels of one call of `fn`, summarised per `per` units (steps, rounds; a callable is asked
    after `fn` ran, for counts only the run knows): count, summed time
    by kind, the top kernels, and busy time. Busy time is the union of kernel intervals: the span
    minus busy time is what launches, host work and gaps between kernels cost."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    return summarize_kernels(kernels, per() if callable(per) else per)


def kernel_grid_profile(step: Callable[[], object], steps: int, warmup: int = 5) -> dict:
    """`step` run `steps` times under the profiler after `warmup` calls -> its kernels per (name, grid) per step
    (`kernel_table`): the grid tells apart the shapes of one kernel name (the projections of one step)."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:  # the grids are in the chrome trace, not in `prof.events()`
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        table = kernel_table(json.loads(path.read_text())["traceEvents"], steps)
    return {"kernels_per_step": sum(r["calls_per_step"] for r in table),
            "kernel_us_per_step": sum(r["us_per_step"] for r in table), "kernels": table}


def kernel_table(trace_events: list[dict], steps: int) -> list[dict]:
    """Kernel events of a chrome trace -> rows per (name, grid): calls and µs per step, µs per call; the
    most expensive first."""
    groups: dict[tuple[str, tuple[int, ...]], list[float]] = {}
    for ev in trace_events:
        if ev.get("cat") != "kernel":
            continue
        grid = tuple(ev.get("args", {}).get("grid", ()))
        groups.setdefault((ev["name"], grid), []).append(float(ev["dur"]))
    rows = [{"name": name[:90], "grid": list(grid), "calls_per_step": len(d) / steps,
             "us_per_step": sum(d) / steps, "us_per_call": sum(d) / len(d)} for (name, grid), d in groups.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def summarize_kernels(kernels: list[tuple[str, float, float]], steps: int, top_n: int = 15) -> dict:
    """(name, start us, end us) of every kernel in `steps` steps -> per-step figures. Busy time is the
    union of the kernel intervals (overlapping kernels count once)."""
    spans = sorted((a, b) for _, a, b in kernels)
    busy, cur_s, cur_e = 0.0, 0.0, None
    for a, b in spans:
        if cur_e is None or a > cur_e:
            busy += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    busy += 0.0 if cur_e is None else cur_e - cur_s
    by_name: dict[str, list[float]] = {}
    for name, a, b in kernels:
        by_name.setdefault(name, []).append(b - a)
    by_kind: dict[str, float] = {}
    count_kind: dict[str, float] = {}
    for name, ts in by_name.items():
        k = kernel_kind(name)
        by_kind[k] = by_kind.get(k, 0.0) + sum(ts) / steps
        count_kind[k] = count_kind.get(k, 0.0) + len(ts) / steps
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top_n]
    return {"steps": steps, "kernels_per_step": len(kernels) / steps,
            "kernel_us_per_step": sum(b - a for _, a, b in kernels) / steps, "busy_us_per_step": busy / steps,
            "first_to_last_us_per_step": (spans[-1][1] - spans[0][0]) / steps if spans else 0.0,
            "by_kind_us": by_kind, "count_by_kind": count_kind,
            "top": [{"name": n[:120], "kind": kernel_kind(n), "per_step": len(ts) / steps,
                     "us_per_step": sum(ts) / steps, "mean_us": statistics.fmean(ts)} for n, ts in top]}


def host_profile(fn: Callable[[], object], top_n: int = 25) -> list[dict]:
    """cProfile of one call of `fn`: the functions with the most own time (tracing slows Python
    code, so read the shares, not the absolute times)."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, func), (cc, nc, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{'/'.join(file.rsplit('/', 2)[-2:])}:{line}:{func}",
                     "calls": nc, "own_s": tt, "cumulative_s": ct})
    total = sum(r["own_s"] for r in rows) or 1.0
    rows.sort(key=lambda r: -r["own_s"])
    for r in rows:
        r["own_share"] = r["own_s"] / total
    return rows[:top_n]
