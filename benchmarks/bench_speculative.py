"""Speculative decoding benchmark (issue 5): offline speed-up, end-of-stream flush latency, acceptance.

    python benchmarks/bench_speculative.py --target DIR --drafter DIR [--audio FILES...] --out bench_spec.json
        [--k 4] [--batches 1 16 64] [--clip-seconds 60] [--text-only-drafter DIR] [--device cuda --dtype bf16]
        [--repeats 3] [--skip-flush] [--tree-nodes M [--tree-max-streams N]]

S1  offline transcription (every clip pushed whole and finished, the engine driven flat out) at
    each batch size, without and with speculation: wall time, real-time factor, speed-up, steps,
    whether the outputs are token-identical to the same engine without a drafter, acceptance rate / mean acceptance length / per
    position.
S2  end-of-stream flush: streams fed live (one 80 ms token per step) then finished; time from
    finish to the final event, without and with speculation (the delay + 11 right-pad tokens
    become decodable at once), at batch 1 and the largest batch.
S3  (optional) the same offline run with a text-only drafter: the value of the audio look-ahead.

Targets from the issue: >= 3x offline speed-up at batch 1 with mean acceptance length >= 4 (for a
drafter trained on the trained small default model). Clips come from --audio (cycled and cut or
repeated to --clip-seconds) or, without files, from the synthetic test signal. Batch 1 runs every
file in turn (one stream at a time) and reports each file and the pooled figures (summed wall time
and steps, acceptance counted over all rounds), so no single voice stands for all of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from realtime.audio import load_audio_file
from realtime.engine import BatchedEngine, RunnerOptions
from realtime.engine.model_runner import encoder_rows_for
from realtime.engine.offline import OfflineRun, run_engine_offline
from realtime.engine.speculation import SpeculativeConfig, runner_options_for, step_tokens_for
from realtime.model_store import load_model_and_tokenizer
from realtime.serving import StreamDone, StreamFailed
from speculative.capability import default_num_speculative_tokens
from speculative.drafter import load_drafter

sys.path.insert(0, str(ROOT / "benchmarks"))
from profile_tools import host_profile, profile_kernels

log = logging.getLogger("bench_speculative")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_clips(files: list[str], n: int, seconds: float, rate: int) -> list[np.ndarray]:
    if files:
        pool = [load_audio_file(f, rate) for f in files]
    else:
        from conftest import synthetic_audio

        pool = [synthetic_audio(seconds, seed=1000 + i) for i in range(min(n, 8))]
    want = int(seconds * rate)
    clips = []
    for i in range(n):
        a = pool[i % len(pool)]
        reps = -(-want // max(1, a.size))
        clips.append(np.tile(a, reps)[:want].astype(np.float32))
    return clips


def acceptance(st) -> dict:
    return {"acceptance_rate": st.spec_acceptance_rate, "mean_acceptance_length": st.spec_mean_acceptance_length,
            "rounds": st.spec_rounds, "drafted": st.spec_drafted, "accepted": st.spec_accepted,
            "accepted_per_position": list(st.spec_accepted_per_position),
            "drafted_per_position": list(st.spec_drafted_per_position),
            "per_position_acceptance": st.spec_acceptance_per_position}


def pooled(runs: list[dict]) -> dict:
    """Several offline runs as one: times, steps and acceptance counts summed."""
    out = {k: sum(r[k] for r in runs) for k in ("audio_seconds", "wall_seconds", "steps", "tokens")}
    out["x_real_time"] = out["audio_seconds"] / out["wall_seconds"]
    if "rounds" in runs[0]:
        rounds, drafted, accepted = (sum(r[k] for r in runs) for k in ("rounds", "drafted", "accepted"))
        acc_pos = [sum(c) for c in zip(*(r["accepted_per_position"] for r in runs))]
        dr_pos = [sum(c) for c in zip(*(r["drafted_per_position"] for r in runs))]
        out.update(rounds=rounds, drafted=drafted, accepted=accepted,
                   acceptance_rate=accepted / drafted if drafted else 0.0,
                   mean_acceptance_length=1.0 + accepted / rounds if rounds else 1.0,
                   accepted_per_position=acc_pos, drafted_per_position=dr_pos,
                   per_position_acceptance=[a / d if d else 0.0 for a, d in zip(acc_pos, dr_pos)])
    return out


def same_engine_options(opts: RunnerOptions, spec: SpeculativeConfig) -> RunnerOptions:
    """The plain engine that a speculative engine with `opts` is lossless against: the kernels it chose
    (`speculation.runner_options_for`: no one-row batch-1 kernels, the encoder rows of its look-ahead chunk)."""
    spec_opts = runner_options_for(opts, spec)
    return replace(opts, one_row_decode=spec_opts.one_row_decode, encoder_rows=encoder_rows_for(spec_opts))


def offline(model, tok, clips, opts, spec) -> tuple[dict, list[list[int]]]:
    eng = BatchedEngine(model, tok, opts=opts, speculative=spec)  # graphs captured here, not timed
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    run = run_engine_offline(eng, clips)
    secs = sum(c.size for c in clips) / model.config.audio.sampling_rate
    out = {"audio_seconds": secs, "wall_seconds": run.seconds, "x_real_time": secs / run.seconds,
           "steps": run.steps, "tokens": run.stats.tokens_emitted}
    if spec is not None:
        out.update(acceptance(run.stats))
    return out, [r.token_ids for r in run.results]


def profile_batch1(model, tok, clips, opts, spec) -> dict:
    """Where a batch-1 step (plain) and round (speculative) go: device kernels per step from one
    profiled run, host functions from another (cProfile)."""
    out = {}
    for mode, sp in (("without", None), ("with", spec)):
        eng = BatchedEngine(model, tok, opts=opts, speculative=sp)
        torch.cuda.synchronize()
        runs: list[OfflineRun] = []
        kernels = profile_kernels(lambda e=eng, r=runs: r.append(run_engine_offline(e, clips)), lambda r=runs: r[0].steps)
        eng = BatchedEngine(model, tok, opts=opts, speculative=sp)
        torch.cuda.synchronize()
        host = host_profile(lambda e=eng: run_engine_offline(e, clips))
        tokens = sum(len(r.token_ids) for r in runs[0].results)
        # per token too: with chained rounds a step is a whole chain, so only tokens compare the two modes (device
        # busy time a token against wall time a token: how far the device, not the host, bounds the run)
        out[mode] = {"steps": runs[0].steps, "tokens": tokens,
                     "wall_ms_per_step": 1e3 * runs[0].seconds / runs[0].steps,
                     "wall_us_per_token": 1e6 * runs[0].seconds / tokens,
                     "busy_us_per_token": kernels["busy_us_per_step"] * runs[0].steps / tokens,
                     "kernels_per_token": kernels["kernels_per_step"] * runs[0].steps / tokens,
                     **{k: v for k, v in kernels.items() if k != "steps"}, "host_top": host}
        log.info("profile %s speculation: %d steps, wall %.3f ms/step (under the profiler), kernels %.0f/step, "
                 "busy %.3f ms/step; a token: wall %.1f us, device busy %.1f us, %.1f kernels", mode,
                 out[mode]["steps"], out[mode]["wall_ms_per_step"], out[mode]["kernels_per_step"],
                 out[mode]["busy_us_per_step"] / 1e3, out[mode]["wall_us_per_token"], out[mode]["busy_us_per_token"],
                 out[mode]["kernels_per_token"])
    return out


def median_run(runs: list[tuple[dict, list[list[int]]]]) -> tuple[dict, list[list[int]]]:
    """The run with the median wall time (runs of one mode on the same clips: same tokens and steps)."""
    return sorted(runs, key=lambda r: r[0]["wall_seconds"])[len(runs) // 2]


def flush_latency(model, tok, clips, opts, spec) -> dict:
    """Live feeding (one token of audio per step), then finish: seconds from finish to done."""
    eng = BatchedEngine(model, tok, opts=opts, speculative=spec)
    spt = model.config.samples_per_token
    done: dict[int, float] = {}

    def on_event(ev):
        if isinstance(ev, (StreamDone, StreamFailed)):
            done[ev.stream_id] = time.perf_counter()

    sids = [eng.open_stream(on_event) for _ in clips]
    n_tok = max(c.size for c in clips) // spt
    for t in range(n_tok):
        for sid, c in zip(sids, clips):
            eng.push_audio(sid, c[t * spt: (t + 1) * spt])
        eng._run_step(eng._sync_with_clients())
    for _ in range(4):  # drain: every stream caught up to its audio
        eng._run_step(eng._sync_with_clients())
    steps0 = eng._step
    t0 = time.perf_counter()
    for sid in sids:
        eng.finish_stream(sid)
    while len(done) < len(sids):
        eng._run_step(eng._sync_with_clients())
    lat = [done[s] - t0 for s in sids]
    return {"streams": len(sids), "flush_seconds_max": max(lat), "flush_seconds_mean": sum(lat) / len(lat),
            "flush_steps": eng._step - steps0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--text-only-drafter", default=None, help="a drafter trained with --text-only (ablation S3)")
    ap.add_argument("--audio", nargs="*", default=[])
    ap.add_argument("--out", default="bench_speculative.json")
    ap.add_argument("--k", type=int, default=None,
                    help="drafts per round (default: the drafter's on this device, as the engine's command lines "
                         "use it: speculative.capability.default_num_speculative_tokens)")
    ap.add_argument("--tree-max-streams", type=int, default=None,
                    help="with --tree-nodes: the tree only in steps where at most this many streams draft (default: always)")
    ap.add_argument("--tree-nodes", type=int, default=None,
                    help="tree verification: the target checks the drafter's M best nodes per round (parallel drafters)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--lookahead-chunk", type=int, default=None,
                    help="audio tokens per look-ahead encoder call (default: the largest the runner allows)")
    ap.add_argument("--clip-seconds", type=float, default=60.0)
    ap.add_argument("--flush-clip-seconds", type=float, default=10.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default=None)
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--repeats", type=int, default=1,
                    help="offline runs per mode and clip group, alternating; the median run is reported")
    ap.add_argument("--profile", action="store_true",
                    help="batch 1: kernel inventory per step and host functions, without and with speculation")
    ap.add_argument("--skip-flush", action="store_true", help="leave out S2 (end-of-stream flush)")
    ap.add_argument("--chained-rounds", type=int, default=None,
                    help="SpeculativeConfig.chained_rounds: a lone stream's rounds chained on the device (0: off; "
                         "default: 8 on CUDA, 0 on the CPU)")
    ap.add_argument("--max-verify-rows", type=int, default=None,
                    help="SpeculativeConfig.max_verify_rows: the most verify rows a step takes across its streams, "
                         "drafts cut alike above it (default: 32 on the CPU, no limit on CUDA)")
    ap.add_argument("--compare-host-rounds", action="store_true",
                    help="at batch 1 also time speculation with chained_rounds=0, interleaved with the other two "
                         "modes (the chain's gain over the host path, in the same run)")
    ap.add_argument("--compare-plain-chunk", type=int, default=0,
                    help="also time plain decoding whose steps encode buffered audio up to N tokens a call "
                         "(RunnerOptions.encoder_chunk, no drafter), interleaved with the other modes")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    dtype = _DTYPES[args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")]
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
    model, tok = load_model_and_tokenizer(args.target, device=args.device, dtype=dtype)
    emb = model.language_model.embed_tokens.weight
    drafter = load_drafter(args.drafter, target_embedding=emb, device=args.device, dtype=dtype)
    if args.k is None:
        args.k = default_num_speculative_tokens(drafter, args.device)
    spec = SpeculativeConfig(drafter, num_speculative_tokens=args.k, tree_nodes=args.tree_nodes,
                             tree_max_streams=args.tree_max_streams, lookahead_chunk=args.lookahead_chunk,
                             chained_rounds=args.chained_rounds, max_verify_rows=args.max_verify_rows
                             ).on(model.device)
    host_rounds = dataclasses.replace(spec, chained_rounds=0)
    rate = model.config.audio.sampling_rate
    graphs = not args.no_cuda_graphs
    report: dict = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
                    "target": args.target, "drafter": args.drafter, "k": args.k, "tree_nodes": args.tree_nodes,
                    "tree_max_streams": args.tree_max_streams, "chained_rounds": spec.chained_rounds,
                    "max_verify_rows": spec.max_verify_rows,
                    "dtype": str(dtype),
                    "cuda_graphs": graphs, "clip_seconds": args.clip_seconds, "offline": {}, "flush": {}}

    for b in args.batches:
        opts = RunnerOptions(max_streams=b, max_batch=b, cuda_graphs=graphs, max_step_tokens=step_tokens_for(args.k))
        if b == 1:  # every file on its own
            groups = [[c] for c in make_clips(args.audio, max(1, len(args.audio)), args.clip_seconds, rate)]
        else:
            groups = [make_clips(args.audio, b, args.clip_seconds, rate)]
        # untimed warm-up of both modes at this batch size: the first use of a kernel shape (Triton JIT,
        # prefill, cuBLAS heuristics) must not land in the baseline (it once inflated it up to 2.3x)
        short = [c[: 3 * rate] for c in groups[0]]
        offline(model, tok, short, opts, None)
        offline(model, tok, short, opts, spec)
        bases, specs, identical, identical_default, per_file = [], [], 0, 0, []
        host_runs, host_identical = [], 0
        chunked = (dataclasses.replace(opts, encoder_chunk=args.compare_plain_chunk) if args.compare_plain_chunk
                   else None)
        chunked_runs, chunked_identical = [], 0
        if chunked is not None:  # its first use of the larger encoder calls, untimed
            offline(model, tok, short, chunked, None)
        for clips in groups:
            # --repeats: alternate the two modes (drift of the host hits both) and keep each one's median
            # run; a batch-1 run lasts about a second, and repeats of one were seen to differ by up to 38%
            compare = args.compare_host_rounds and b == 1
            if compare:  # its first use of the host path's shapes, untimed
                offline(model, tok, short, opts, host_rounds)
            pairs = [(offline(model, tok, clips, opts, None), offline(model, tok, clips, opts, spec))
                     + ((offline(model, tok, clips, opts, host_rounds),) if compare else ())
                     + ((offline(model, tok, clips, chunked, None),) if chunked is not None else ())
                     for _ in range(args.repeats)]
            (base, base_tokens), (with_spec, spec_tokens) = (median_run([p[i] for p in pairs]) for i in (0, 1))
            if compare:
                host_run, host_tokens = median_run([p[2] for p in pairs])
                host_runs.append(host_run)
                host_identical += sum(a == b_ for a, b_ in zip(host_tokens, spec_tokens))
            if chunked is not None:
                chunked_run, chunked_tokens = median_run([p[-1] for p in pairs])
                chunked_runs.append(chunked_run)
                chunked_identical += sum(a == b_ for a, b_ in zip(chunked_tokens, base_tokens))
            bases.append(base)
            specs.append(with_spec)
            # lossless means: the tokens of the same engine without a drafter. Speculation runs without the
            # one-row batch-1 kernels and with the encoder's look-ahead rows on the batch-invariant kernel
            # (`speculation.runner_options_for`), so compare with a plain run that does the same (untimed); the
            # timed plain run keeps the fastest plain kernels for the speed-up
            same = same_engine_options(opts, spec)
            if same != opts and model.device.type == "cuda" and model.dtype != torch.float32:
                plain_tokens = offline(model, tok, clips, same, None)[1]
            else:  # the kernels are the ones of the timed plain run (the CPU, fp32): that run is the engine
                plain_tokens = base_tokens
            identical += sum(a == b_ for a, b_ in zip(plain_tokens, spec_tokens))
            identical_default += sum(a == b_ for a, b_ in zip(base_tokens, spec_tokens))
            per_file.append({"speedup": base["wall_seconds"] / with_spec["wall_seconds"],
                             "mean_acceptance_length": with_spec["mean_acceptance_length"],
                             "steps": [base["steps"], with_spec["steps"]],
                             "wall_seconds_runs": [[p[0][0]["wall_seconds"] for p in pairs],
                                                   [p[1][0]["wall_seconds"] for p in pairs]]})
        base, with_spec = pooled(bases), pooled(specs)
        n_clips = sum(len(g) for g in groups)
        row = {"without": base, "with": with_spec, "speedup": base["wall_seconds"] / with_spec["wall_seconds"],
               "identical_outputs": identical, "identical_to_default_plain": identical_default, "clips": n_clips}
        row["wall_seconds_runs"] = [r["wall_seconds_runs"] for r in per_file]  # [group][mode][repeat]
        if host_runs:
            host = pooled(host_runs)
            row["host_rounds"] = host
            row["speedup_host_rounds"] = base["wall_seconds"] / host["wall_seconds"]
            row["host_rounds_identical_to_chained"] = host_identical
            log.info("batch 1, rounds through the host: speed-up %.2f, mean length %.2f; chained: %.2f, %.2f",
                     row["speedup_host_rounds"], host["mean_acceptance_length"], row["speedup"],
                     with_spec["mean_acceptance_length"])
        if chunked_runs:
            plain_chunked = pooled(chunked_runs)
            row["plain_chunked"] = {"encoder_chunk": args.compare_plain_chunk, **plain_chunked,
                                    "identical_to_plain": chunked_identical}
            row["speedup_over_plain_chunked"] = plain_chunked["wall_seconds"] / with_spec["wall_seconds"]
            log.info("batch %d, plain with %d-token encoder calls: %.1fx real time (%.2fx plain), identical to plain "
                     "%d/%d; speculation against it: %.2fx", b, args.compare_plain_chunk, plain_chunked["x_real_time"],
                     base["wall_seconds"] / plain_chunked["wall_seconds"], chunked_identical,
                     sum(len(g) for g in groups), row["speedup_over_plain_chunked"])
        if b == 1 and args.audio:
            row["per_file"] = {Path(f).name: r for f, r in zip(args.audio, per_file)}
            for f, r in row["per_file"].items():
                log.info("batch 1 %s: speed-up %.2f, mean acceptance length %.2f, steps %d -> %d", f, r["speedup"],
                         r["mean_acceptance_length"], *r["steps"])
        if args.text_only_drafter:
            text_drafter = load_drafter(args.text_only_drafter, target_embedding=emb, device=args.device, dtype=dtype)
            text_only = pooled([offline(model, tok, clips, opts,
                                        SpeculativeConfig(text_drafter, num_speculative_tokens=args.k))[0]
                                for clips in groups])
            row["text_only_drafter"] = text_only
            row["speedup_text_only"] = base["wall_seconds"] / text_only["wall_seconds"]
        if args.profile and b == 1 and model.device.type == "cuda":
            row["profile"] = profile_batch1(model, tok, groups[0], opts, spec)
        report["offline"][str(b)] = row
        log.info("offline batch %d: %.1fx -> %.1fx real time (speed-up %.2f), acceptance %.3f, mean length %.2f, "
                 "identical %d/%d (to the default plain kernels: %d/%d)", b, base["x_real_time"],
                 with_spec["x_real_time"], row["speedup"], with_spec["acceptance_rate"],
                 with_spec["mean_acceptance_length"], row["identical_outputs"], n_clips, identical_default, n_clips)

    flush_batches = [] if args.skip_flush else sorted({1, max(args.batches)})
    for b in flush_batches:
        clips = make_clips(args.audio, b, args.flush_clip_seconds, rate)
        opts = RunnerOptions(max_streams=b, max_batch=b, cuda_graphs=graphs, max_step_tokens=step_tokens_for(args.k))
        report["flush"][str(b)] = {"without": flush_latency(model, tok, clips, opts, None),
                                   "with": flush_latency(model, tok, clips, opts, spec)}
        f = report["flush"][str(b)]
        log.info("flush batch %d: %.1f ms (%d steps) -> %.1f ms (%d steps)", b,
                 1e3 * f["without"]["flush_seconds_max"], f["without"]["flush_steps"],
                 1e3 * f["with"]["flush_seconds_max"], f["with"]["flush_steps"])

    b1 = report["offline"].get("1")
    if b1:
        report["targets"] = {"speedup_batch1": b1["speedup"], "speedup_batch1_ok": b1["speedup"] >= 3.0,
                             "mean_acceptance_length": b1["with"]["mean_acceptance_length"],
                             "mean_acceptance_length_ok": b1["with"]["mean_acceptance_length"] >= 4.0}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report.get("targets", {}), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
