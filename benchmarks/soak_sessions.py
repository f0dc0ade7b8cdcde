"""Soak: many short sessions against one in-process server; does anything of a finished session stay behind?

    python benchmarks/soak_sessions.py --model default --files a.wav b.wav --sessions 240 --concurrency 4 \
        [--warmup 40] [--drafter models/default_drafter] [--no-trace] [--out soak.json]

Starts the batched engine and the websocket server in this process (like `python -m stream_server`), runs
`--warmup` sessions, then `--sessions` more in rounds of `--concurrency`, alternating the vLLM and OpenAI dialects
and the files. Each session sends its file at once and waits for the final transcript
(`stream_server.loadtest.transcribe_pcm`). Reported: the
process's resident memory after every round, Python's traced allocations (tracemalloc) grown between the end of the
warm-up and the end, with the largest growth sites, and every session's transcript count and errors. A leak shows
as RSS and traced memory growing with the session count; bounded buffers level off.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import sys
import time
import tracemalloc
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stream_server.background import ServerThread  # noqa: E402
from stream_server.engine_factory import build_engine  # noqa: E402
from stream_server.loadtest import ClientConfig, load_pcm16, transcribe_pcm  # noqa: E402
from stream_server.settings import ServerSettings  # noqa: E402

log = logging.getLogger("soak_sessions")
MODEL = "soak-model"


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


async def one_session(url: str, pcm: bytes, openai: bool) -> str:
    """One utterance in one session, sent at once (the load tester's single-client reference); its transcript."""
    cfg = ClientConfig(url=url, dialect="openai" if openai else "vllm", model=MODEL)
    return (await transcribe_pcm(cfg, pcm)).text


async def rounds(url: str, pcms: list[bytes], first: int, count: int, concurrency: int,
                 on_round=None) -> tuple[int, list[str]]:
    done, errors = 0, []
    for start in range(first, first + count, concurrency):
        ids = range(start, min(start + concurrency, first + count))
        results = await asyncio.gather(*(one_session(url, pcms[i % len(pcms)], i % 2 == 0) for i in ids),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                errors.append(repr(r)[:300])
            else:
                done += 1
        if on_round:
            on_round(start + len(ids) - first)
    return done, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--drafter", default=None, help="an Eagle drafter folder: soak the speculative engine")
    ap.add_argument("--files", nargs="+", required=True, help="WAV/FLAC/Ogg files, sent in turn")
    ap.add_argument("--sessions", type=int, default=240)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (as the server's --threads)")
    ap.add_argument("--no-trace", action="store_true",
                    help="leave tracemalloc off (its own bookkeeping grows RSS with every traced block)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for name in ("websockets", "stream_server", "realtime"):
        logging.getLogger(name).setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    pcms = [load_pcm16(f).astype("<i2").tobytes() for f in args.files]
    engine = build_engine("batched", args.model, model_name=MODEL, device=args.device,
                          max_streams=max(16, args.concurrency), drafter=args.drafter)
    engine.start()
    server = ServerThread(ServerSettings(port=0, served_model_names=(MODEL,)), engine).start()
    try:
        warm_done, warm_errors = asyncio.run(rounds(server.ws_url, pcms, 0, args.warmup, args.concurrency))
        gc.collect()
        if not args.no_trace:
            tracemalloc.start(10)
        before = tracemalloc.take_snapshot() if not args.no_trace else None
        rss0 = rss_kb()
        samples: list[tuple[int, int]] = [(0, rss0)]
        t0 = time.time()

        def sample(n: int) -> None:
            samples.append((n, rss_kb()))

        done, errors = asyncio.run(rounds(server.ws_url, pcms, args.warmup, args.sessions, args.concurrency,
                                          on_round=sample))
        wall = time.time() - t0
        gc.collect()
        growth, top, traced_now, traced_peak = [], [], 0, 0
        if before is not None:
            after = tracemalloc.take_snapshot()
            traced_now, traced_peak = tracemalloc.get_traced_memory()
            skip = [tracemalloc.Filter(False, tracemalloc.__file__)]
            growth = after.filter_traces(skip).compare_to(before.filter_traces(skip), "lineno")
            top = [{"site": str(s.traceback), "bytes": s.size_diff, "blocks": s.count_diff} for s in growth[:8]]
    finally:
        server.stop()
        engine.stop()
    half = samples[len(samples) // 2]
    report = {
        "model": args.model, "drafter": args.drafter, "files": args.files, "concurrency": args.concurrency, "warmup": args.warmup,
        "warmup_completed": warm_done, "warmup_errors": warm_errors,
        "sessions": args.sessions, "completed": done, "errors": errors, "wall_s": wall,
        "rss_kb_start": rss0, "rss_kb_half": half[1], "rss_kb_end": samples[-1][1],
        "rss_kb_per_session_second_half": (samples[-1][1] - half[1]) / max(samples[-1][0] - half[0], 1),
        "traced_bytes_grown": sum(s.size_diff for s in growth), "traced_now": traced_now, "traced_peak": traced_peak,
        "top_growth": top, "rss_samples": samples,
    }
    log.info("%d of %d sessions completed (%d errors) in %.0f s; RSS %d -> %d kB (%+.2f kB a session over the "
             "second half); traced Python allocations grew %d bytes", done, args.sessions, len(errors), wall, rss0,
             samples[-1][1], report["rss_kb_per_session_second_half"], report["traced_bytes_grown"])
    for t in top[:5]:
        log.info("  %+d bytes (%+d blocks) at %s", t["bytes"], t["blocks"], t["site"])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if not errors and not warm_errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
