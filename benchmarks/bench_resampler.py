"""The streaming resampler's cost on the host: milliseconds of CPU per second of audio, and the peak memory of its
temporaries, for 20 ms pushes (a live client) and for one push of a whole minute (a large append or a file block).

    python benchmarks/bench_resampler.py [--seconds 60] [--rates 8000,24000,44100,48000] [--out FILE.json]

Before the fifty-ninth session the outputs of a push were computed in one vectorised piece: a minute at 8 kHz in
one push made [outputs, taps] temporaries of about 1.6 GB and cost 17x more per second of audio than 20 ms pushes.
They are now computed in blocks of `StreamingResampler.OUTPUT_BLOCK` outputs (`--block` tries others; 0 = one
piece, as before).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import tracemalloc
from pathlib import Path

import numpy as np

from realtime.audio import StreamingResampler

log = logging.getLogger("bench_resampler")


def _resample(x: np.ndarray, rate: int, step: int) -> None:
    r = StreamingResampler(rate, 16000)
    for i in range(0, x.size, step):
        r.push(x[i:i + step])
    r.flush()


def run(rate: int, seconds: float, chunk_s: float | None) -> dict[str, float]:
    """The CPU time of 3 untraced passes (the first, and the best: a large allocation's first touch costs page
    faults, which a server pays on every large append), then the peak of memory allocated during another (traced:
    tracemalloc slows the pass, so it is not timed)."""
    x = np.random.default_rng(rate).standard_normal(int(rate * seconds)).astype(np.float32) * 0.1
    step = x.size if chunk_s is None else max(1, int(rate * chunk_s))
    cpu = []
    for _ in range(3):
        t0 = time.process_time()
        _resample(x, rate, step)
        cpu.append(time.process_time() - t0)
    tracemalloc.start()
    _resample(x, rate, step)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"cpu_ms_per_audio_s_first": cpu[0] * 1000 / seconds, "cpu_ms_per_audio_s": min(cpu) * 1000 / seconds,
            "peak_MB": peak / 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rates", default="8000,24000,44100,48000")
    ap.add_argument("--block", type=int, default=None, help="outputs per block (0: all at once)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.block is not None:
        StreamingResampler.OUTPUT_BLOCK = args.block or 1 << 62
    rows = []
    for rate in (int(r) for r in args.rates.split(",")):
        for label, chunk in (("20 ms pushes", 0.02), ("one push", None)):
            row = {"rate": rate, "pushes": label, **run(rate, args.seconds, chunk)}
            rows.append(row)
            log.info("%6d Hz, %-12s: %6.2f ms CPU per s of audio (first pass %6.2f), peak %7.1f MB", rate, label,
                     row["cpu_ms_per_audio_s"], row["cpu_ms_per_audio_s_first"], row["peak_MB"])
    if args.out:
        Path(args.out).write_text(json.dumps({"block": StreamingResampler.OUTPUT_BLOCK, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
