"""What one server process's host side costs per live stream, with the model taken out.

    python benchmarks/host_path_cost.py [--streams 64 128] [--seconds 20] [--repeats 2] [--out FILE.json]

Why: on a GPU one process's limit is its interpreter, not the device (the forty-second session's burst: the
server at ~110% CPU, its event loop 7-60 ms late at 512 streams, while steps took 2-16 ms). This measures that
host cost alone, on any machine: a real `StreamServer` (websockets, the vLLM dialect, audio parsing, deltas,
admission, metrics) runs in this process in front of `InstantEngine`, which decodes every 80 ms of audio at
once into one empty-text token (what most of a live stream's tokens are), from its own thread as a real engine
does. The load tester (`stream_server.loadtest`, one process) sends N paced real-time streams of 80 ms chunks.
The server's cost is this process's CPU time (the engine thread's share is small and reported apart); the
load tester runs in a child process and its CPU is reported too, so a run where the load tester itself ran out
of CPU can be told apart (on a 2-core box the two share the cores).

Reported per level: server CPU seconds per stream-second of audio, microseconds per audio message (one
`input_audio_buffer.append` in and one `transcription.delta` out), the event loop's median lag (the figure /health
shows, read from the server in this process), and the load tester's emission-delay p50/p99. `1 / (CPU s per stream-second)` is how many streams one core's worth
of this host path carries, an upper bound for one server process before any model work shares its interpreter.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from resource import RUSAGE_CHILDREN, RUSAGE_SELF, getrusage

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from realtime.config import ModelConfig, load_config  # noqa: E402
from realtime.serving import (AdmissionError, EngineStats, EventCallback, StreamDone, StreamError,  # noqa: E402
                              StreamToken)
from stream_server.background import ServerThread  # noqa: E402
from stream_server.settings import ServerSettings  # noqa: E402

log = logging.getLogger("host_path_cost")
MODEL = "instant"


class InstantEngine:
    """A `TranscriptionEngine` with no model: each whole 80 ms of pushed audio becomes one token (the pad
    token, empty text) as soon as its thread wakes; `finish_stream` ends the stream with `StreamDone`."""

    def __init__(self, config: ModelConfig, max_streams: int = 4096) -> None:
        self.config, self.model_name, self.max_streams = config, MODEL, max_streams
        self._per_token = config.samples_per_token
        self._cond = threading.Condition()
        self._streams: dict[int, dict] = {}
        self._dirty: set[int] = set()
        self._next = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self._steps = 0
        self._tokens = 0
        self.thread_cpu_s = 0.0  # the engine thread's own CPU time (time.thread_time), set when it stops

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="instant-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(10)

    def open_stream(self, on_event: EventCallback, *, delay_ms: int | None = None) -> int:
        with self._cond:
            if len(self._streams) >= self.max_streams:
                raise AdmissionError(f"all {self.max_streams} streams are in use")
            self._next += 1
            self._streams[self._next] = {"cb": on_event, "samples": 0, "done_tokens": 0, "finish": False}
            return self._next

    def push_audio(self, stream_id: int, samples: np.ndarray) -> None:
        with self._cond:
            s = self._streams.get(stream_id)
            if s is None or s["finish"]:
                raise StreamError(f"stream {stream_id} is not open for audio")
            s["samples"] += int(samples.size)
            self._dirty.add(stream_id)
            self._cond.notify_all()

    def finish_stream(self, stream_id: int) -> None:
        with self._cond:
            s = self._streams.get(stream_id)
            if s is None:
                raise StreamError(f"unknown stream {stream_id}")
            s["finish"] = True
            self._dirty.add(stream_id)
            self._cond.notify_all()

    def close_stream(self, stream_id: int) -> None:
        with self._cond:
            self._streams.pop(stream_id, None)
            self._dirty.discard(stream_id)

    def pending_audio_seconds(self, stream_id: int) -> float:
        with self._cond:
            s = self._streams.get(stream_id)
            if s is None:
                return 0.0
            return (s["samples"] - s["done_tokens"] * self._per_token) / self.config.audio.sampling_rate

    def stats(self) -> EngineStats:
        with self._cond:
            return EngineStats(active_streams=len(self._streams), max_streams=self.max_streams, steps=self._steps,
                               tokens_emitted=self._tokens)

    def _loop(self) -> None:
        pad = self.config.tokens.streaming_pad
        while True:
            with self._cond:
                while not self._dirty and not self._stop:
                    self._cond.wait(0.25)
                if self._stop:
                    break
                work, self._dirty = self._dirty, set()
                batch = []
                for sid in sorted(work):
                    s = self._streams.get(sid)
                    if s is None:
                        continue
                    new = s["samples"] // self._per_token - s["done_tokens"]
                    first = s["done_tokens"]
                    s["done_tokens"] += new
                    batch.append((s["cb"], sid, first, new, s["finish"]))
                    if s["finish"]:
                        del self._streams[sid]
                self._steps += 1
                self._tokens += sum(b[3] for b in batch)
            # audio token t is decided at LM position t + left pad + 1, which has seen the audio to t's end: the
            # load tester's emission delay is then this host path's own latency (no model delay is simulated)
            shift = self.config.streaming.n_left_pad_tokens + 1
            for cb, sid, first, new, finish in batch:  # callbacks outside the lock, as the real engine's
                for t in range(first, first + new):
                    cb(StreamToken(sid, pad, "", t + shift, self.config.audio_end_ms(t + shift)))
                if finish:
                    cb(StreamDone(sid, "", 0, first + new, False))
        self.thread_cpu_s = time.thread_time()


def recent_lag_ms(srv: ServerThread) -> float:
    """The server's own loop-lag figure (what /health shows), read on its loop."""
    return srv.call(lambda: srv.server.loop_lag.recent_s(time.monotonic()) * 1000)


def lag_sampler(srv: ServerThread, stop: threading.Event, into: list[float]) -> None:
    while not stop.wait(0.5):
        into.append(recent_lag_ms(srv))


def run_level(streams: int, seconds: float, audio: Path, config: ModelConfig, dialect: str = "vllm",
              empty_deltas: bool = True) -> dict:
    engine = InstantEngine(config)
    engine.start()
    settings = ServerSettings(port=0, served_model_names=(MODEL,), max_sessions=streams + 16,
                              vllm_empty_deltas=empty_deltas)
    lags: list[float] = []
    with ServerThread(settings, engine) as srv, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "loadtest.json"
        cmd = [sys.executable, "-m", "stream_server.loadtest", "--url", srv.ws_url, "--model", MODEL,
               "--dialect", dialect, "--files", str(audio), "--ramp", str(streams), "--duration", str(seconds),
               "--processes", "1", "--no-plots", "--quiet", "--out", str(out)]
        stop = threading.Event()
        sampler = threading.Thread(target=lag_sampler, args=(srv, stop, lags), daemon=True)
        r0, c0, t0 = getrusage(RUSAGE_SELF), getrusage(RUSAGE_CHILDREN), time.time()
        sampler.start()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds * 4 + 120)
        stop.set()
        sampler.join()
        r1, c1, wall = getrusage(RUSAGE_SELF), getrusage(RUSAGE_CHILDREN), time.time() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"load tester failed ({proc.returncode}): {proc.stderr[-2000:]}")
        report = json.loads(out.read_text())
        worst = srv.call(lambda: srv.server.loop_lag.worst_s * 1000)
    engine.stop()
    summary = report["levels"][0]["summary"]
    server_cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    tester_cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    audio_s = summary["audio_s"]
    messages = audio_s * 1000 / 80  # one 80 ms append in and one delta out per message (the load tester's chunk)
    # the engine thread's CPU is part of server_cpu; the lag sampler's (two reads a second on the loop) too, small
    return {"streams": streams, "dialect": dialect, "empty_deltas": empty_deltas, "completed": summary["completed"],
            "errors": summary["errors"], "rejected": summary["rejected"], "audio_s": audio_s, "wall_s": round(wall, 1),
            "server_cpu_s": round(server_cpu, 2), "engine_thread_cpu_s": round(engine.thread_cpu_s, 2),
            "server_cpu_per_stream_second": round(server_cpu / audio_s, 5),
            "server_us_per_message": round(server_cpu / messages * 1e6, 1),
            "load_tester_cpu_s": round(tester_cpu, 2),
            "load_tester_cpu_share_of_wall": round(tester_cpu / wall, 2),
            "loop_lag_median_ms": round(float(np.median(lags)), 2) if lags else None,
            "loop_lag_worst_ms": round(worst, 2),
            "emission_delay_p50_ms": rounded(summary.get("delay_p50_ms")),
            "emission_delay_p99_ms": rounded(summary.get("delay_p99_ms"))}


def rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, nargs="+", default=[64, 128])
    p.add_argument("--seconds", type=float, default=20.0, help="audio per stream")
    p.add_argument("--repeats", type=int, default=2, help="runs of each level (alternating the levels)")
    p.add_argument("--audio", type=Path, default=ROOT / "demo" / "samples" / "sample_en.wav")
    p.add_argument("--model", type=Path, default=ROOT / "models" / "default", help="whose config (delays, rates)")
    p.add_argument("--dialect", choices=("vllm", "openai"), default="vllm",
                   help="the protocol the load tester speaks (OpenAI's sends no delta for an empty token, and here "
                        "every token is one: no deltas, so no emission delay)")
    p.add_argument("--no-empty-deltas", action="store_true",
                   help="the server's --no-empty-deltas (vLLM dialect: no event for a token without text; here every "
                        "token is one, so no deltas at all, and no emission delay)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("stream_server", "websockets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = load_config(args.model)
    runs: dict[int, list[dict]] = defaultdict(list)
    for rep in range(args.repeats):
        for n in args.streams:
            row = run_level(n, args.seconds, args.audio, config, args.dialect, not args.no_empty_deltas)
            runs[n].append(row)
            log.info("run %d, %d streams: %s", rep + 1, n, json.dumps(row))
    print("streams  server CPU s / stream-s  us / message  engine thread CPU s  load tester CPU / wall  "
          "loop lag median ms  emission p50 / p99 ms")
    for n, rows in runs.items():
        for r in rows:
            print(f"{n:7d}  {r['server_cpu_per_stream_second']:23.4f}  {r['server_us_per_message']:12.1f}  "
                  f"{r['engine_thread_cpu_s']:19.2f}  {r['load_tester_cpu_share_of_wall']:22.2f}  "
                  f"{r['loop_lag_median_ms']!s:>18}  "
                  f"{r['emission_delay_p50_ms']!s:>7} / {r['emission_delay_p99_ms']!s}")
    if args.out is not None:
        args.out.write_text(json.dumps({"tool": "host_path_cost", "machine": platform.processor() or platform.machine(),
                                        "cpus": os.cpu_count(), "args": {k: str(v) for k, v in vars(args).items()},
                                        "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
