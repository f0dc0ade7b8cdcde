"""The encoder of step k+1 beside the LM of step k: what it does to a step (issue 3, B1/B2).

A backlogged step needs `encoder(k) -> LM(k)`; the encoder of the next token needs only audio, so the
engine queues it after the LM launch (`RunnerOptions.encode_ahead`) and, on CUDA, on the encoder's own
stream (`RunnerOptions.encoder_stream`), where it runs beside the LM step. Three orders, alternated in one
run, on the same model and batch:

- `serial`: each step encodes its own token, then runs the LM (one CUDA stream);
- `ahead_one_stream`: the engine's order before the encoder had a stream of its own (the next token's
  encoder queued after the LM launch, behind it; the tokens do not wait for it);
- `ahead_encoder_stream`: the same order, the encoder on its own stream (the engine's default);
- `lm_only` / `encoder_only`: the LM step / the encoder step alone, on the same positions: the lengths of
  the two chains that `ahead_encoder_stream` runs side by side; `encoder_only_own_stream`: the encoder step alone
  on the encoder's stream (with `encoder_sms_N`, on its N SMs).

    python benchmarks/bench_encoder_overlap.py --model DIR [--counts 1,64,256] [--steps 200] --out F.json \
        [--modes serial,ahead_encoder_stream] [--variants cublas,skinny_pdl]

`--variants` also A/Bs the projection kernels in the same run (environment switches of `kernels`, set
while a variant's runners capture and replay their graphs): `cublas` (F.linear, no programmatic
dependent launch: the code before the twenty-third session), `pdl` (PDL on the Triton kernels only),
`skinny` (few-row Triton projections, no PDL), `skinny_pdl` (both: the twenty-third session's default),
`one_row` (and the fused one-row LM kernels of `kernels.one_row` at batch 1: the default since the
twenty-fifth session), `one_row_fused_gate_up` (with the gate/up fused too, STREAMSCRIBE_ONE_ROW_GATE_UP=1),
`encoder_sms_N` (the default kernels, the encoder confined to a green context of N SMs: STREAMSCRIBE_ENCODER_SMS),
`priority_encoder` / `priority_lm` (the encoder's or the LM's graphs on the highest stream priority:
STREAMSCRIBE_STREAM_PRIORITY).

Drives `ModelRunner` directly (graphs on) through `bench_engine.SyntheticStreams`, at a session age of
one minute. DIR without a checkpoint gets the full-size random one (`gpu_model_parity.build_checkpoint`).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import SyntheticStreams, copy_bandwidth, random_checkpoint, time_steps, weight_bytes

from realtime.engine.model_runner import ModelRunner, RunnerOptions
from realtime.loader import load_model

log = logging.getLogger("bench_encoder_overlap")

DOT_CONFIGS = os.environ.get("BENCH_ONE_ROW_DOT_CONFIGS", json.dumps(
    {"qkv": [16, 0, 4, 2, 1], "residual": [16, 0, 2, 3, 1], "gate_up": [16, 0, 4, 3, 1], "head": [32, 0, 4, 2, 1]}))
VARIANTS = {  # name: environment of `kernels` and the runner (kernels/linear.py, kernels/_dispatch.py, model_runner)
    "default": {},
    "cublas": {"STREAMSCRIBE_PDL": "0", "STREAMSCRIBE_SKINNY_ROWS": "0", "STREAMSCRIBE_ONE_ROW": "0"},
    "pdl": {"STREAMSCRIBE_PDL": "1", "STREAMSCRIBE_SKINNY_ROWS": "0", "STREAMSCRIBE_ONE_ROW": "0"},
    "skinny": {"STREAMSCRIBE_PDL": "0", "STREAMSCRIBE_SKINNY_ROWS": "16", "STREAMSCRIBE_ONE_ROW": "0"},
    "skinny_pdl": {"STREAMSCRIBE_PDL": "1", "STREAMSCRIBE_SKINNY_ROWS": "16", "STREAMSCRIBE_ONE_ROW": "0"},
    "one_row": {"STREAMSCRIBE_PDL": "1", "STREAMSCRIBE_SKINNY_ROWS": "16", "STREAMSCRIBE_ONE_ROW": "1"},
    "one_row_fused_gate_up": {"STREAMSCRIBE_PDL": "1", "STREAMSCRIBE_SKINNY_ROWS": "16", "STREAMSCRIBE_ONE_ROW": "1",
                              "STREAMSCRIBE_ONE_ROW_GATE_UP": "1"},
    # the one-row path in tensor-core mode (kernels/one_row.py), with BENCH_ONE_ROW_DOT_CONFIGS (JSON, e.g.
    # bench_one_row.py's BEST_DOT_CONFIGS line) or else the tests' configurations
    "one_row_dot": {"STREAMSCRIBE_ONE_ROW": "1", "STREAMSCRIBE_ONE_ROW_CONFIGS": DOT_CONFIGS},
    "one_row_dot_fused_gate_up": {"STREAMSCRIBE_ONE_ROW": "1", "STREAMSCRIBE_ONE_ROW_CONFIGS": DOT_CONFIGS,
                                  "STREAMSCRIBE_ONE_ROW_GATE_UP": "1"},
    # FMA one-row kernels as the default, but the MLP's norm, gate/up and SiLU-mul as one tensor-core one-row kernel
    # (its best configuration alone in the twenty-sixth session's sweep: 30.5 us against 33 us for the three kernels)
    "fused_gate_up_dot": {"STREAMSCRIBE_ONE_ROW": "1", "STREAMSCRIBE_ONE_ROW_GATE_UP": "1",
                          "STREAMSCRIBE_ONE_ROW_CONFIGS": '{"gate_up": [32, 0, 2, 3, 1]}'},
    # the one-row path with the head's norm and projection in tensor-core mode (the default since the twenty-sixth
    # session; BENCH_ONE_ROW_HEAD_CONFIG, else (64, 0, 2, 3, 1)), and with the FMA head of the session before
    "one_row_head_dot": {"STREAMSCRIBE_ONE_ROW": "1", "STREAMSCRIBE_ONE_ROW_CONFIGS": json.dumps(
        {"head": json.loads(os.environ.get("BENCH_ONE_ROW_HEAD_CONFIG", "[64, 0, 2, 3, 1]"))})},
    "one_row_fma_head": {"STREAMSCRIBE_ONE_ROW": "1", "STREAMSCRIBE_ONE_ROW_CONFIGS": '{"head": [16, 256, 8, 1, 0]}'},
    # the twenty-seventh session: the projections' K loop never cut (`kernels.linear.split_k`), attention splits of
    # at least 128 keys (the encoder's 750-frame window: 6 splits instead of 12), both (`before_s27`: the code before)
    "no_split_k": {"STREAMSCRIBE_SPLIT_K": "0"},
    "attn_min_keys_128": {"STREAMSCRIBE_ATTN_MIN_KEYS": "128"},
    "before_s27": {"STREAMSCRIBE_SPLIT_K": "0", "STREAMSCRIBE_ATTN_MIN_KEYS": "128"},
    # the attention's split cap (64: the LM's split count at batch 1, where a 1-minute session fills only 12)
    **{f"attn_max_splits_{n}": {"STREAMSCRIBE_ATTN_MAX_SPLITS": str(n)} for n in (16, 32)},
    # RoPE and the KV write as two kernels on the multi-row path (the encoder's 4 rows), as before the fifty-seventh
    # session; its default is one kernel (`kernels.fused_ops.rope_write_kv`)
    "rope_kv_off": {"STREAMSCRIBE_ROPE_KV": "0"},
    # the attention reads its metadata before the PDL wait and requests keys and values together (prepared in the
    # twenty-seventh session, opt-in until timed)
    "attn_early": {"STREAMSCRIBE_ATTN_EARLY": "1"},  # the default since the twenty-eighth session
    "attn_late": {"STREAMSCRIBE_ATTN_EARLY": "0"},  # the attention's metadata read after the PDL wait (before it)
    # more than 16 rows of every encoder projection on cuBLAS (the kernel's cap): since the twenty-ninth session a
    # plain runner's default anyway, so this changes only speculative runners' look-ahead encoder
    "encoder_rows_16": {"STREAMSCRIBE_INVARIANT_ROWS": "16"},
    # a plain runner's encoder projections on the batch-invariant kernel up to 64 rows, as a speculative runner's
    # (the default of every runner in the twenty-eighth session; since the twenty-ninth plain runners take 16)
    "encoder_rows_64": {"STREAMSCRIBE_ENCODER_ROWS": "64"},
    # the block scheduler favours the encoder's graphs or the LM's (`RunnerOptions.stream_priority`)
    "priority_encoder": {"STREAMSCRIBE_STREAM_PRIORITY": "encoder"},
    "priority_lm": {"STREAMSCRIBE_STREAM_PRIORITY": "lm"},
    # the default kernels, the encoder's stream in a green context of N SMs (`RunnerOptions.encoder_sms`)
    **{f"encoder_sms_{n}": {"STREAMSCRIBE_ENCODER_SMS": str(n)} for n in (16, 32, 48, 64, 96)},
}

MODES = {  # name: (the runner's encoder stream, encode ahead, the parts of a step run)
    "serial": (False, False, "both"),
    "ahead_one_stream": (False, True, "both"),
    "ahead_encoder_stream": (True, True, "both"),
    "lm_only": (False, False, "lm"),  # the LM step alone: the chain that the encoder's stream runs beside
    "encoder_only": (False, False, "encoder"),
    "encoder_only_own_stream": (True, False, "encoder"),  # the same on the encoder's stream (its SMs: encoder_sms_N)
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--counts", default="1,64,256")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench_encoder_overlap.json")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--variants", default="default", help=f"comma list of {sorted(VARIANTS)}")
    args = ap.parse_args()
    modes = args.modes.split(",")
    variants = args.variants.split(",")
    for name in modes + variants:
        if name not in MODES and name not in VARIANTS:
            ap.error(f"unknown mode or variant {name!r}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    random_checkpoint(Path(args.model))
    model, _ = load_model(args.model, device="cuda", dtype=torch.bfloat16)
    floor_ms = weight_bytes(model) / copy_bandwidth() * 1e3
    report: dict = {"gpu": torch.cuda.get_device_name(), "model": args.model, "floor_ms": floor_ms,
                    "variants": {v: VARIANTS[v] for v in variants}, "rows": []}
    for n in [int(x) for x in args.counts.split(",")]:
        runners = {}
        for variant in variants:
            with mock.patch.dict(os.environ, VARIANTS[variant]):
                for stream in sorted({MODES[m][0] for m in modes}):
                    runners[variant, stream] = ModelRunner(model, RunnerOptions(
                        max_streams=n, max_batch=n, max_session_seconds=120, encoder_stream=stream))
        keys = [(v, m) for v in variants for m in modes]
        row: dict = {"streams": n, **{f"{v}/{m}": [] for v, m in keys}}
        for _ in range(args.repeats):  # alternated, so drift hits every mode alike
            for variant, mode in keys:
                stream, ahead, parts = MODES[mode]
                with mock.patch.dict(os.environ, VARIANTS[variant]):  # graphs are captured in a variant's first steps
                    sim = SyntheticStreams(runners[variant, stream], n, [750] * n, ahead=ahead, parts=parts)
                    row[f"{variant}/{mode}"].append(time_steps(sim, args.steps, warmup=10))
                    sim.release()
        for v, m in keys:
            row[f"{v}/{m}_median_ms"] = statistics.median(x["median_ms"] for x in row[f"{v}/{m}"])
        log.info("streams %d: %s; floor %.3f ms", n,
                 ", ".join(f"{v}/{m} {row[f'{v}/{m}_median_ms']:.3f} ms" for v, m in keys), floor_ms)
        report["rows"].append(row)
        del runners, sim
        gc.collect()  # a runner and its encoder refer to each other: freed by the collector, not by `del`
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
