"""Graceful shutdown under load: N live streams, SIGTERM to the server in the middle of them.

Every stream must still get its final transcript (`transcription.done`), and on the CPU (fp32, the server's own
numerics) that transcript must equal the offline transcript of exactly the audio the server took in: the done
event's `audio_end_ms` says how much (the appends are whole 80 ms chunks, so it is exact).

    python benchmarks/drain_under_load.py --streams 4 --device cpu --out drain.json
    python benchmarks/drain_under_load.py --streams 256 --device cuda --workers 2 --no-check --out drain.json

Reported: streams, finals received, exact matches / checked, the seconds from SIGTERM to the last final and to the
server's exit, its exit status, and the audio each final covered.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stream_server.loadtest import load_pcm16  # noqa: E402

logger = logging.getLogger("drain_under_load")
CHUNK = 1280  # 80 ms at 16 kHz
MODEL = "streamscribe-default"


@dataclass
class StreamOutcome:
    index: int
    offset: int  # first sample of this stream's audio in the shared signal
    sent_samples: int = 0
    done_text: str | None = None
    delta_text: str = ""
    audio_end_ms: int | None = None
    done_at: float | None = None  # monotonic
    error_codes: list[str] = field(default_factory=list)
    close_code: int | None = None
    exact: bool | None = None


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "stream_server", "--model", "default", "--device", args.device, "--port", "0",
           "--drain-timeout", str(args.drain_timeout), "--max-sessions", str(max(64, args.streams)),
           "--log-level", "WARNING", "--workers", str(args.workers)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if "listening on" in line:
            url = next(w for w in line.split() if w.startswith("ws://"))
            return proc, url
    proc.kill()
    raise RuntimeError("the server did not start")


async def run_stream(url: str, audio: np.ndarray, out: StreamOutcome, start_at: float) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - loop.time()))
    try:
        async with websockets.connect(url, max_size=None, open_timeout=60) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "session.update", "model": MODEL}))
            await ws.recv()
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))

            async def send() -> None:
                t0 = loop.time()
                for start in range(0, len(audio) - CHUNK + 1, CHUNK):
                    await asyncio.sleep(max(0.0, t0 + (start + CHUNK) / 16000 - loop.time()))
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(
                        audio[start: start + CHUNK].astype("<i2").tobytes()).decode()}))
                    out.sent_samples = start + CHUNK
                await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))

            sender = asyncio.create_task(send())
            try:
                async for raw in ws:
                    ev = json.loads(raw)
                    if ev["type"] == "transcription.delta":
                        out.delta_text += ev["delta"]
                    elif ev["type"] == "transcription.done":
                        out.done_text, out.audio_end_ms, out.done_at = ev["text"], ev["audio_end_ms"], time.monotonic()
                    elif ev["type"] == "error":
                        out.error_codes.append(ev.get("code", "?"))
            finally:
                sender.cancel()
            out.close_code = ws.close_code
    except (OSError, websockets.WebSocketException) as exc:
        out.error_codes.append(f"connection: {exc}")
        if isinstance(exc, websockets.ConnectionClosed) and exc.rcvd is not None:
            out.close_code = exc.rcvd.code


async def drive(args: argparse.Namespace, url: str, proc: subprocess.Popen, signal_audio: np.ndarray
                ) -> tuple[list[StreamOutcome], float]:
    loop = asyncio.get_running_loop()
    n = args.streams
    outcomes = [StreamOutcome(i, (i * 16000 * 7) % max(1, len(signal_audio) // 2)) for i in range(n)]
    t0 = loop.time() + 0.5
    tasks = [asyncio.create_task(run_stream(url, signal_audio[o.offset:], o, t0 + args.stagger * o.index / n))
             for o in outcomes]
    await asyncio.sleep(max(0.0, t0 + args.signal_after - loop.time()))
    sent_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    logger.info("SIGTERM sent %.1f s into the streams", args.signal_after)
    await asyncio.wait_for(asyncio.gather(*tasks), args.drain_timeout + 120)
    return outcomes, sent_at


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--drain-timeout", type=float, default=1.0)
    ap.add_argument("--signal-after", type=float, default=6.0, help="seconds into the streams")
    ap.add_argument("--stagger", type=float, default=1.0, help="stream starts spread over this long")
    ap.add_argument("--audio", nargs="+", default=[str(ROOT / "demo" / "samples" / "sample_en.wav"),
                                                   str(ROOT / "demo" / "samples" / "heldout_nyc_f4.wav")])
    ap.add_argument("--no-check", action="store_true", help="skip the offline comparison (bf16 GPU servers)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    parts = [load_pcm16(p) for p in args.audio]
    signal_audio = np.concatenate(parts * max(1, int(np.ceil(4 * (args.signal_after + 10) * 16000
                                                             / sum(len(p) for p in parts)))))
    proc, url = start_server(args)
    logger.info("server up at %s", url)
    try:
        outcomes, sent_at = asyncio.run(drive(args, url, proc, signal_audio))
        rc = proc.wait(args.drain_timeout + 120)
        exited = time.monotonic() - sent_at
    finally:
        if proc.poll() is None:
            proc.kill()
    if not args.no_check:
        from realtime.model_store import load_model_and_tokenizer
        from realtime.session import transcribe

        model, tok = load_model_and_tokenizer("default")
        for o in outcomes:
            if o.done_text is not None and o.audio_end_ms is not None:
                heard = signal_audio[o.offset: o.offset + o.audio_end_ms * 16].astype(np.float32) / 32768.0
                o.exact = transcribe(model, tok, heard).text == o.done_text
    finals = [o for o in outcomes if o.done_text is not None]
    report = {
        "streams": len(outcomes), "finals": len(finals),
        "finals_equal_their_deltas": sum(o.done_text == o.delta_text for o in finals),
        "checked": sum(o.exact is not None for o in outcomes), "exact": sum(bool(o.exact) for o in outcomes),
        "signal_to_last_final_s": round(max((o.done_at - sent_at for o in finals), default=float("nan")), 3),
        "signal_to_exit_s": round(exited, 3), "server_rc": rc,
        "close_codes": sorted({o.close_code for o in outcomes}, key=str),
        "error_codes": sorted({c for o in outcomes for c in o.error_codes}),
        "audio_covered_s": [round((o.audio_end_ms or 0) / 1000, 2) for o in outcomes],
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "outcomes": [asdict(o) for o in outcomes],
    }
    summary = {k: v for k, v in report.items() if k not in ("outcomes", "args", "audio_covered_s")}
    print(json.dumps(summary))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))
    ok = report["finals"] == report["streams"] and report["exact"] == report["checked"] and rc == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
