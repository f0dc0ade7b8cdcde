"""Where a chained speculative round's time goes on the GPU (issue 5): each graph's device time, and the host's.

A round chained on the device (`realtime/engine/chained_rounds.py`) is layout, drafter catch-up, draft heads,
the target's input merge, verify and acceptance, plus the look-ahead encoder's calls for its audio. At batch 1
on the small default model the whole run measures ~130 us a token of wall time against ~90 us of kernel time,
so this asks: how long does each graph keep the device when nothing waits for the host (N replays queued back
to back, timed by CUDA events), how long does the host take to queue a round, and what does capturing the whole
round as one graph (`STREAMSCRIBE_ROUND_GRAPH`, the default) save against six graphs.

It drives a real engine over a real clip until its first chain, measures there (the caches and metadata are a real
round's), and stops: the replays rewrite the same KV rows with the same values, but the encoder's replays move its
conv state, so the run's later tokens are not a transcript.

    python benchmarks/round_anatomy.py --target models/default --drafter models/default_drafter \
        --audio .bench_audio/heldout_*.wav --out round_anatomy.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from realtime.audio import load_audio_file
from realtime.engine import BatchedEngine, RunnerOptions
from realtime.engine.chained_rounds import ChainedRounds
from realtime.engine.cuda_graph import DecodeGraphRunner
from realtime.engine.offline import run_engine_offline
from realtime.engine.speculation import SpeculativeConfig, step_tokens_for
from host_phases import add_target_and_drafter_args, load_target_and_drafter  # noqa: E402 (a sibling script)

log = logging.getLogger("round_anatomy")


class Measured(Exception):
    """Raised from inside the engine's first chain once the anatomy is measured: the engine fails the stream with
    it (an engine reports a step's exception on the stream), which ends the run."""


def device_us(fn: Callable[[], None], n: int) -> float:
    """Device microseconds per call of `fn` (graph replays) queued n times back to back."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / n


def host_us(fn: Callable[[], None], n: int) -> float:
    """Host microseconds to queue one call of `fn` (n calls, no wait: the launch queue is deep enough)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    secs = time.perf_counter() - t
    torch.cuda.synchronize()
    return 1e6 * secs / n


def anatomy(ch: ChainedRounds, s, rounds: int, n: int) -> dict:
    sp, k = ch.sp, ch.k
    ch.start(s, ch.last_decodable(s))
    prev0, p0 = sp.prev_pos[s.slot], s.lm_pos
    ch._encode_until(s, prev0, min(p0 + (rounds - 1) * (k + 1) + k + 1, ch.last_decodable(s) + 1))
    snap = ch._init.clone()

    def reset() -> None:
        ch._init.copy_(snap)

    # the six graphs of a round (the unfused path), captured here beside the engine's one-graph round
    g_layout = DecodeGraphRunner(lambda _: ch.layout(), 1, sp.device)
    g_layout.capture()
    g_accept = DecodeGraphRunner(lambda _: ch.accept(), 1, sp.device)
    g_accept.capture()
    reset()
    tc, t = sp.g_catchup.bucket(ch.catchup_rows), sp.g_verify.bucket(k + 1)
    parts: dict[str, Callable[[], None]] = {
        "catchup": lambda: sp.g_catchup.replay(tc),
        "draft_heads": lambda: sp.g_chain.replay(1),
        "verify_inputs": lambda: sp.g_verify_inputs.replay(t),
        "verify": lambda: sp.g_verify.replay(t),
    }

    def six() -> None:
        reset()
        g_layout.replay(1)
        for f in parts.values():
            f()
        g_accept.replay(1)

    def one() -> None:
        reset()
        ch.g_round.replay(1)

    out: dict = {"k": k, "catchup_rows": tc, "verify_rows": t, "replays": n}
    out["reset"] = device_us(reset, n)
    out["layout_plus_reset"] = device_us(lambda: (reset(), g_layout.replay(1)), n)
    reset()
    g_layout.replay(1)
    for name, f in parts.items():  # on the metadata of the round's layout
        out[name] = device_us(f, n)
    out["accept_plus_reset"] = device_us(lambda: (reset(), g_accept.replay(1)), n)
    out["round_six_graphs"] = device_us(six, n)
    out["host_round_six_graphs"] = host_us(six, 16)
    if ch.g_round is not None:
        out["round_one_graph"] = device_us(one, n)
        out["host_round_one_graph"] = host_us(one, 16)
    enc = sp.lookahead
    for c, g in enc.graphs.items():  # the look-ahead encoder's call of c audio tokens (the metadata of its last call)
        out[f"encoder_{c}"] = device_us(lambda g=g: g.replay(1), n)
        out[f"host_encoder_{c}"] = host_us(lambda g=g: g.replay(1), 16)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_and_drafter_args(ap)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--lookahead-chunk", type=int, default=None,
                    help="audio tokens per look-ahead encoder call (SpeculativeConfig.lookahead_chunk; default: "
                         "32, CUDA's)")
    ap.add_argument("--out", default="round_anatomy.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it times CUDA graphs)")
    model, tok, drafter = load_target_and_drafter(args, "cuda", torch.bfloat16)
    rate = model.config.audio.sampling_rate
    reports = []
    for f in args.audio:
        spec = SpeculativeConfig(drafter, num_speculative_tokens=args.k, chained_rounds=8,
                                 lookahead_chunk=args.lookahead_chunk)
        opts = RunnerOptions(max_streams=1, max_batch=1, cuda_graphs=True, max_step_tokens=step_tokens_for(args.k))
        eng = BatchedEngine(model, tok, opts=opts, speculative=spec)
        run_engine_offline(eng, [load_audio_file(f)[: 3 * rate]])  # warm-up: the first shapes
        ch = eng.speculator.chained
        got: dict = {}

        def measure(s, rounds, ch=ch, got=got):
            got.update(anatomy(ch, s, rounds, args.replays))
            raise Measured("measured")

        ch.run = measure
        try:
            run_engine_offline(eng, [load_audio_file(f)[: 20 * rate]])
        except RuntimeError:
            if not got:
                raise
        if not got:
            log.warning("%s: no chain in 20 s of audio", f)
            continue
        rep = {"audio": f, **got}
        reports.append(rep)
        log.info("%s: %s", Path(f).name, {k: round(v, 1) if isinstance(v, float) else v for k, v in rep.items()
                                          if k != "audio"})
    report = {"device": torch.cuda.get_device_name(), "runs": reports}
    if reports:
        keys = [k for k, v in reports[0].items() if isinstance(v, float)]
        report["mean"] = {k: sum(r[k] for r in reports) / len(reports) for k in keys}
        log.info("round_anatomy mean (us): %s", {k: round(v, 1) for k, v in report["mean"].items()})
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
