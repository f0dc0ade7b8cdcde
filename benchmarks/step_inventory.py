"""Where a batch-1 step's device time goes, kernel by kernel and shape by shape (issue 3, B1).

    python benchmarks/step_inventory.py --model DIR [--streams 1] [--steps 50] --out F.json

For the encoder step alone and the LM step alone (`SyntheticStreams` parts, graphs on, session age one minute), it
times the step with programmatic dependent launch (the default) and without (`STREAMSCRIBE_PDL=0`), then profiles
the step without PDL: each kernel then starts after the one before it ends, so the duration CUPTI reports is the
kernel's own (with PDL on, a kernel's span also holds its wait for the one before). Kernels are grouped by name
and grid: the projections of one name run with a grid per shape, which tells qkv, o, gate/up and down apart.
The table (µs per step, per call, calls per step) is the place to look for the kernels that cost more than
their bytes. DIR without a checkpoint gets the full-size random one (`gpu_model_parity.build_checkpoint`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import SyntheticStreams, copy_bandwidth, random_checkpoint, time_steps, weight_bytes
from profile_tools import kernel_grid_profile

from realtime.engine.model_runner import ModelRunner, RunnerOptions
from realtime.loader import load_model

log = logging.getLogger("step_inventory")


def profile_part(runner: ModelRunner, streams: int, parts: str, steps: int) -> dict:
    sim = SyntheticStreams(runner, streams, [750] * streams, parts=parts)
    try:
        return kernel_grid_profile(sim.step, steps)
    finally:
        sim.release()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--out", default="step_inventory.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    random_checkpoint(Path(args.model))
    model, _ = load_model(args.model, device="cuda", dtype=torch.bfloat16)
    report: dict = {"gpu": torch.cuda.get_device_name(), "streams": args.streams,
                    "floor_ms": weight_bytes(model) / copy_bandwidth() * 1e3, "parts": {}}
    n = args.streams
    for pdl in ("1", "0"):
        with mock.patch.dict(os.environ, {"STREAMSCRIBE_PDL": pdl}):  # read while the graphs are captured
            runner = ModelRunner(model, RunnerOptions(max_streams=n, max_batch=n, max_session_seconds=120,
                                                      encoder_stream=False))
            for parts in ("encoder", "lm"):
                sim = SyntheticStreams(runner, n, [750] * n, parts=parts)
                report["parts"][f"{parts}_pdl{pdl}_ms"] = time_steps(sim, 200, warmup=10)["median_ms"]
                sim.release()
                if pdl == "0":
                    report["parts"][parts] = profile_part(runner, n, parts, args.steps)
            del runner
    for parts in ("encoder", "lm"):
        p = report["parts"][parts]
        log.info("%s: %.3f ms a step with PDL, %.3f without; %d kernels, %.1f us of kernels a step; top:", parts,
                 report["parts"][f"{parts}_pdl1_ms"], report["parts"][f"{parts}_pdl0_ms"], p["kernels_per_step"],
                 p["kernel_us_per_step"])
        for r in p["kernels"][:14]:
            log.info("  %7.1f us/step %5.0f calls %6.2f us/call grid %-14s %s", r["us_per_step"], r["calls_per_step"],
                     r["us_per_call"], r["grid"], r["name"][:60])
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
