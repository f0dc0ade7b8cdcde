"""CPU cost of decoding: the batched engine against one streaming session per stream.

    python benchmarks/bench_cpu_engine.py [--model default] [--streams 4] [--seconds 20] [--threads 1 2]
        [--audio FILE] [--out bench_cpu_engine.json]

Each run transcribes `--streams` clips of `--seconds` (offsets of one file, or the synthetic test
signal) offline, so the figure is compute only, without the service's network side. It reports CPU
seconds per stream-second of audio (wall time × threads / audio seconds: below 1 / streams per
core, that many live streams fit) and the real-time factor of the streams together. The service's
live figure comes from `python -m stream_server.loadtest` against `python -m stream_server --device cpu`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from realtime.audio import load_audio_file  # noqa: E402
from realtime.engine import BatchedEngine, RunnerOptions  # noqa: E402
from realtime.engine.offline import run_engine_offline  # noqa: E402
from realtime.model_store import load_model_and_tokenizer  # noqa: E402
from realtime.session import transcribe  # noqa: E402

log = logging.getLogger("bench_cpu_engine")


def clips_for(audio: str | None, streams: int, seconds: float) -> list[np.ndarray]:
    n = int(seconds * 16000)
    if audio:
        a = load_audio_file(audio)
    else:
        from conftest import synthetic_audio

        a = synthetic_audio(seconds + streams, seed=0)
    a = np.tile(a, -(-(n + 8000 * streams) // a.size))
    return [a[8000 * i: 8000 * i + n] for i in range(streams)]  # offsets: the streams differ


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--audio", default=None)
    ap.add_argument("--out", default="bench_cpu_engine.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    model, tok = load_model_and_tokenizer(args.model, device="cpu")
    clips = clips_for(args.audio, args.streams, args.seconds)
    audio_s = sum(c.size for c in clips) / 16000
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for kind in ("batched engine", "sessions"):
            t0 = time.perf_counter()
            if kind == "batched engine":
                eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=len(clips), max_batch=len(clips),
                                                                   cuda_graphs=False))
                run_engine_offline(eng, clips)
            else:
                for c in clips:
                    transcribe(model, tok, c)
            wall = time.perf_counter() - t0
            row = {"kind": kind, "threads": threads, "wall_s": wall,
                   "cpu_s_per_stream_s": wall * threads / audio_s, "rtf_all_streams": wall / (audio_s / len(clips))}
            log.info("%s, %d thread(s): %.3f CPU-s per stream-second, RTF of %d streams %.2f", kind, threads,
                     row["cpu_s_per_stream_s"], len(clips), row["rtf_all_streams"])
            rows.append(row)
    report = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
              "model": args.model, "streams": len(clips), "seconds": args.seconds, "runs": rows}
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
