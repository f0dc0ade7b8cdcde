"""Where the host's time goes in a batch-1 offline step, without and with speculation.

At batch 1 a step (plain) or round (speculative) of the small default model keeps the GPU busy for
about 0.3-0.4 ms, but takes about 0.6 ms of wall time: the rest is Python between the moment the
step's tokens reach the host and the next step's first launch. This script times each phase of the
engine loop with perf_counter, by wrapping the bound methods of one engine instance (no engine code
changes, nothing shared with other engines):

- `sync`: `_sync_with_clients` (inboxes, joins, closes); `plan`: the scheduler;
- `look_ahead`, `layout`, `launch`, `look_ahead_next`: the speculative step's parts (look-ahead
  encoder, host layout of the metadata + its upload, graph replays, the next step's look-ahead queued
  behind them); plain decoding: `encode` (this step's audio and, queued behind the LM step, the next
  one's), `launch` (the LM step);
- `wait`: what is left of `_run_step` (the device -> host copy of the tokens, which waits for the
  device, plus a few bookkeeping lines);
- `accept`: greedy acceptance on the host; `emit`: detokenising and the token callbacks;
- `chained`: chains of rounds run with their layout and acceptance on the device (`chained_rounds`), whole.
  Mode `chain` chains where it can (the default); `host-chain` runs every round through the host.

    python benchmarks/host_phases.py --target models/default --drafter models/default_drafter \
        --audio .bench_audio/* --clip-seconds 45 --modes plain chain host-chain 16 --out host_phases.json

`--batch N` decodes N streams at once (the clips repeated in turn) instead of one clip at a time, `--layout` (or a
mode's `@LAYOUT`) picks how a step's rows are laid out on the host, and `--max-verify-rows R` caps a step's verify
rows (`SpeculativeConfig.max_verify_rows`; with N streams, R < 4 N drafts nothing): the host's share of a
many-stream step, which is the same Python on any device (forty-ninth session, one H100: at 64 streams the
whole-step layout cut a speculative step from 3.36 to 2.56 ms). `--skip-encoder-forward` (CPU) leaves the encoder's
own work out of its calls, so that their phases time the host alone. `--tokens-in-flight off` sends a step's token
events at the end of their own step instead of while the device runs the next (CUDA's default since the fiftieth
session): the `emit` phase then no longer overlaps the device, and `wait` shows what that costs.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from realtime.audio import load_audio_file
from realtime.engine import BatchedEngine, RunnerOptions
from realtime.engine.offline import run_engine_offline
from realtime.engine.speculation import SpeculativeConfig, step_tokens_for
from realtime.model_store import load_model_and_tokenizer
from speculative.capability import default_num_speculative_tokens
from speculative.drafter import load_drafter

log = logging.getLogger("host_phases")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_AT_ONCE_FROM = {"auto": None, "per-stream": 10**9, "at-once": 1}  # --layout -> Speculator.at_once_from
_IN_FLIGHT = {"auto": None, "on": True, "off": False}  # --tokens-in-flight -> RunnerOptions.send_tokens_in_flight


class PhaseClock:
    """Accumulates wall seconds per phase name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, obj: object, attr: str, phase: str) -> None:
        fn: Callable = getattr(obj, attr)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[phase] += time.perf_counter() - t

        setattr(obj, attr, timed)  # on the instance: other engines keep the class's methods


def instrument(eng: BatchedEngine) -> PhaseClock:
    clock = PhaseClock()
    clock.wrap(eng, "_sync_with_clients", "sync")
    clock.wrap(eng, "_run_step", "run_step")
    clock.wrap(eng, "_emit_token", "emit")
    clock.wrap(eng.scheduler, "plan", "plan")
    sp = eng.speculator
    if sp is None:
        clock.wrap(eng.runner, "encode_step", "encode")
        clock.wrap(eng.runner, "decode_step", "launch")
    else:
        clock.wrap(sp, "_look_ahead", "look_ahead")
        clock.wrap(sp, "_look_ahead_next", "look_ahead_next")
        clock.wrap(sp, "_layout", "layout")
        clock.wrap(sp, "_run", "launch")
        clock.wrap(sp, "accept", "accept")
        clock.wrap(sp, "run_chained", "chained")  # a whole chain of rounds (`chained_rounds`): host and device
    return clock


def run_mode(model, tok, clips: list, mode: str, drafter, k: int, graphs: bool,
             max_verify_rows: int | None = None, at_once_from: int | None = None,
             skip_encoder_forward: bool = False, tokens_in_flight: bool | None = None) -> dict:
    """One offline run of `clips` decoded together in `mode`; phases in microseconds a step.
    `skip_encoder_forward` (eager only): the encoder calls do all their host work but not the encoder itself, so
    that on the CPU, where the device's work is the host's too, the encode phases time the host alone (the LM
    then reads audio embeddings that were never written: its tokens mean nothing)."""
    if skip_encoder_forward and graphs:
        raise ValueError("skip_encoder_forward needs eager steps: a graph replays the encoder it captured")
    spec = None
    if mode != "plain":
        # "chain": the chain of drafts, its rounds chained on the device where they can be (chained_rounds=8, the
        # default on CUDA); "host-chain": every round through the host (chained_rounds=0); a number: a tree
        spec = SpeculativeConfig(drafter, num_speculative_tokens=k,
                                 tree_nodes=None if mode in ("chain", "host-chain") else int(mode),
                                 chained_rounds=0 if mode == "host-chain" else 8, max_verify_rows=max_verify_rows)
    n = len(clips)
    opts = RunnerOptions(max_streams=n, max_batch=n, cuda_graphs=graphs, max_step_tokens=step_tokens_for(k),
                         send_tokens_in_flight=tokens_in_flight)
    eng = BatchedEngine(model, tok, opts=opts, speculative=spec)
    if eng.speculator is not None and at_once_from is not None:
        eng.speculator.at_once_from = at_once_from
    if skip_encoder_forward:
        eng.runner.encoder._forward = lambda n, b: None  # this engine's encoder only (an instance attribute)
    run_engine_offline(eng, [c[: 3 * model.config.audio.sampling_rate] for c in clips])  # warm-up (first shapes)
    clock = instrument(eng)
    m0 = (eng.speculator.metrics.rounds, eng.speculator.metrics.accepted) if eng.speculator is not None else None
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    run = run_engine_offline(eng, clips)
    per = {name: 1e6 * s / run.steps for name, s in clock.seconds.items()}
    inner = [n for n in ("plan", "encode", "look_ahead", "layout", "launch", "look_ahead_next", "accept", "emit",
                         "chained")
             if n in per]
    per["wait"] = per.pop("run_step") - sum(per[n] for n in inner)
    per["outside_run_step"] = 1e6 * run.seconds / run.steps - per["wait"] - sum(per[n] for n in inner) - per["sync"]
    out = {"steps": run.steps, "wall_us_per_step": 1e6 * run.seconds / run.steps,
           "phases_us_per_step": {n: round(v, 1) for n, v in per.items()},
           "tokens": sum(len(r.token_ids) for r in run.results)}
    if m0 is not None:  # this run's rounds only (not the warm-up's)
        m = eng.speculator.metrics
        out["mean_acceptance_length"] = 1 + (m.accepted - m0[1]) / max(1, m.rounds - m0[0])
    return out


def add_target_and_drafter_args(ap: argparse.ArgumentParser) -> None:
    """--target, --drafter, --audio and --k: what the batch-1 speculation profilers (this one, round_anatomy.py)
    take."""
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--audio", nargs="+", required=True)
    ap.add_argument("--k", type=int, default=None,
                    help="drafts per round (default: the drafter's on this device, as bench_speculative.py)")


def load_target_and_drafter(args: argparse.Namespace, device: str, dtype: torch.dtype) -> tuple:
    """(model, tokenizer, drafter tied to the model's embedding) from --target and --drafter; a missing --k becomes
    the drafter's default on `device`."""
    model, tok = load_model_and_tokenizer(args.target, device=device, dtype=dtype)
    drafter = load_drafter(args.drafter, target_embedding=model.language_model.embed_tokens.weight, device=device,
                           dtype=dtype)
    if args.k is None:
        args.k = default_num_speculative_tokens(drafter, device)
    return model, tok, drafter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_and_drafter_args(ap)
    ap.add_argument("--clip-seconds", type=float, default=45.0)
    ap.add_argument("--modes", nargs="+", default=["plain", "chain", "host-chain", "16"],
                    help="plain, chain (rounds chained on the device where they can be), host-chain (every round "
                         "through the host), or a tree's node count")
    ap.add_argument("--repeats", type=int, default=3, help="runs per mode and clip (alternating); medians reported")
    ap.add_argument("--batch", type=int, default=1,
                    help="streams decoded at once (the clips repeated in turn); above 1 a repeat is one run of them")
    ap.add_argument("--max-verify-rows", type=int, default=None,
                    help="speculative modes: the most rows a step verifies (default: the device's)")
    ap.add_argument("--layout", choices=("auto", "per-stream", "at-once"), default="auto",
                    help="a chain's host layout: a stream at a time (as before the forty-eighth session), all streams "
                         "at once, or the engine's choice by the step's streams (AT_ONCE_MIN_STREAMS); a mode "
                         "MODE@LAYOUT sets its own (chain@per-stream chain@auto: both in one process, alternating)")
    ap.add_argument("--skip-encoder-forward", action="store_true",
                    help="CPU: encoder calls without the encoder's own work, so that encode and look-ahead phases "
                         "time their host work alone (the tokens are then meaningless)")
    ap.add_argument("--tokens-in-flight", choices=sorted(_IN_FLIGHT), default="auto",
                    help="send a step's token events while the device runs the next step (on), at the end of their "
                         "own step (off), or the engine's default (auto: on with CUDA; RunnerOptions."
                         "send_tokens_in_flight)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default=None)
    ap.add_argument("--out", default="host_phases.json")
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error("--batch must be at least 1")
    for m in args.modes:
        if m.partition("@")[2] not in ("", *_AT_ONCE_FROM):
            ap.error(f"mode {m}: the layout after @ is one of {', '.join(_AT_ONCE_FROM)}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    dtype = _DTYPES[args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")]
    model, tok, drafter = load_target_and_drafter(args, args.device, dtype)
    rate = model.config.audio.sampling_rate
    clips = [load_audio_file(f)[: int(args.clip_seconds * rate)] for f in args.audio]
    graphs = args.device.startswith("cuda")
    if args.skip_encoder_forward and graphs:
        ap.error("--skip-encoder-forward needs eager steps (the CPU)")
    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    groups = [[c] for c in clips] if args.batch == 1 else [[clips[i % len(clips)] for i in range(args.batch)]]
    for group in groups:
        for _ in range(args.repeats):
            for m in args.modes:
                base, _, layout = m.partition("@")
                runs[m].append(run_mode(model, tok, group, base, drafter, args.k, graphs, args.max_verify_rows,
                                        _AT_ONCE_FROM[layout or args.layout], args.skip_encoder_forward,
                                        _IN_FLIGHT[args.tokens_in_flight]))
    report = {"device": torch.cuda.get_device_name() if graphs else "cpu", "dtype": str(dtype), "k": args.k,
              "clips": args.audio, "clip_seconds": args.clip_seconds, "repeats": args.repeats, "batch": args.batch,
              "max_verify_rows": args.max_verify_rows, "layout": args.layout,
              "skip_encoder_forward": args.skip_encoder_forward, "tokens_in_flight": args.tokens_in_flight,
              "modes": {}}
    for m, rs in runs.items():
        names = rs[0]["phases_us_per_step"].keys()
        med = {"wall_us_per_step": statistics.median(r["wall_us_per_step"] for r in rs),
               "steps": sum(r["steps"] for r in rs) / len(rs), "tokens": sum(r["tokens"] for r in rs) / len(rs),
               "phases_us_per_step": {n: round(statistics.median(r["phases_us_per_step"][n] for r in rs), 1)
                                      for n in names}}
        med["us_per_token"] = med["wall_us_per_step"] * med["steps"] / med["tokens"]
        if "mean_acceptance_length" in rs[0]:
            med["mean_acceptance_length"] = statistics.median(r["mean_acceptance_length"] for r in rs)
        report["modes"][m] = {"median": med, "runs": rs}
        log.info("%-6s %.1f us/step, %.1f us/token, phases %s", m, med["wall_us_per_step"], med["us_per_token"],
                 med["phases_us_per_step"])
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
