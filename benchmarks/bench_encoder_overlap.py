"""The encoder of step k+1 beside the LM of step k: what it does to a step (issue 3, B1/B2).

A backlogged step needs `encoder(k) -> LM(k)`; the encoder of the next token needs only audio, so the
engine queues it after the LM launch (`RunnerOptions.encode_ahead`) and, on CUDA, on the encoder's own
stream (`RunnerOptions.encoder_stream`), where it runs beside the LM step. Three orders, alternated in one
run, on the same model and batch:

- `serial`: each step encodes its own token, then runs the LM (one CUDA stream);
- `ahead_one_stream`: the engine's order before the encoder had a stream of its own (the next token's
  encoder queued after the LM launch, behind it; the tokens do not wait for it);
- `ahead_encoder_stream`: the same order, the encoder on its own stream (the engine's default).

    python benchmarks/bench_encoder_overlap.py --model DIR [--counts 1,64,256] [--steps 200] --out F.json

Drives `ModelRunner` directly (graphs on) through `bench_engine.SyntheticStreams`, at a session age of
one minute. DIR without a checkpoint gets the full-size random one (`gpu_model_parity.build_checkpoint`).
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
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import SyntheticStreams, copy_bandwidth, random_checkpoint, time_steps, weight_bytes

from realtime.engine.model_runner import ModelRunner, RunnerOptions
from realtime.loader import load_model

log = logging.getLogger("bench_encoder_overlap")

MODES = {  # name: (the runner's encoder stream, encode ahead)
    "serial": (False, False),
    "ahead_one_stream": (False, True),
    "ahead_encoder_stream": (True, True),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--counts", default="1,64,256")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench_encoder_overlap.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    random_checkpoint(Path(args.model))
    model, _ = load_model(args.model, device="cuda", dtype=torch.bfloat16)
    floor_ms = weight_bytes(model) / copy_bandwidth() * 1e3
    report: dict = {"gpu": torch.cuda.get_device_name(), "model": args.model, "floor_ms": floor_ms, "rows": []}
    for n in [int(x) for x in args.counts.split(",")]:
        runners = {stream: ModelRunner(model, RunnerOptions(max_streams=n, max_batch=n, max_session_seconds=120,
                                                            encoder_stream=stream)) for stream in (False, True)}
        row: dict = {"streams": n, **{mode: [] for mode in MODES}}
        for _ in range(args.repeats):  # alternated, so drift hits every mode alike
            for mode, (stream, ahead) in MODES.items():
                sim = SyntheticStreams(runners[stream], n, [750] * n, ahead=ahead)
                row[mode].append(time_steps(sim, args.steps, warmup=10))
                sim.release()
        for mode in MODES:
            row[f"{mode}_median_ms"] = statistics.median(x["median_ms"] for x in row[mode])
        log.info("streams %d: %s; floor %.3f ms", n,
                 ", ".join(f"{m} {row[f'{m}_median_ms']:.3f} ms" for m in MODES), floor_ms)
        report["rows"].append(row)
        del runners
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
