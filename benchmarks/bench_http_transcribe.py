"""Throughput and latency of the service's file transcription endpoint (`POST /v1/audio/transcriptions`).

Uploads every file `--repeats` times with `--concurrency` requests in flight (`stream_server.upload_client`, stdlib
only), and reports per request the time to the response (and, with `--stream`, to the first text delta), and over
the run the audio seconds transcribed per wall second. `--expect TSV` (the `FILE<TAB>TRANSCRIPT` lines of
`python -m realtime.transcribe FILE...`) checks every transcript against the offline command's.

    python -m stream_server --device cpu --drafter models/default_drafter --port 8000 &
    python benchmarks/bench_http_transcribe.py --url http://127.0.0.1:8000 --files .bench_audio/heldout_0*.flac \
        --concurrency 5 --out result.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import soundfile as sf

from stream_server.upload_client import UploadError, upload_file

logger = logging.getLogger("bench_http_transcribe")


@dataclass
class Upload:
    file: str
    audio_s: float
    status: int
    seconds: float  # request sent -> response complete
    first_delta_s: float | None  # --stream: request sent -> first transcript.text.delta
    text: str


def upload(url: str, file: Path, *, stream: bool, api_key: str | None, timeout: float) -> Upload:
    """One request through `stream_server.upload_client`; a refused one is reported, not raised."""
    audio_s = sf.info(str(file)).duration
    try:
        r = upload_file(url, file, stream=stream, api_key=api_key, timeout=timeout)
    except UploadError as exc:
        return Upload(str(file), audio_s, exc.status, 0.0, None, str(exc))
    return Upload(str(file), audio_s, 200, r.seconds, r.first_delta_s, r.text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--files", nargs="+", type=Path, required=True)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--stream", action="store_true", help="stream=true: also time the first text delta")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--expect", type=Path, default=None, help="FILE<TAB>TRANSCRIPT lines to compare with")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    jobs = [f for _ in range(args.repeats) for f in args.files]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(lambda f: upload(args.url, f, stream=args.stream, api_key=args.api_key,
                                                 timeout=args.timeout), jobs))
    wall = time.perf_counter() - t0
    failed = [r for r in results if r.status != 200]
    audio = sum(r.audio_s for r in results)
    summary = {"url": args.url, "requests": len(results), "concurrency": args.concurrency, "stream": args.stream,
               "failed": len(failed), "audio_s": round(audio, 2), "wall_s": round(wall, 3),
               "x_real_time": round(audio / wall, 2),
               "median_request_s": round(statistics.median(r.seconds for r in results), 3),
               "max_request_s": round(max(r.seconds for r in results), 3)}
    firsts = [r.first_delta_s for r in results if r.first_delta_s is not None]
    if firsts:
        summary["median_first_delta_s"] = round(statistics.median(firsts), 3)
    if args.expect is not None:
        expected = dict(line.split("\t", 1) for line in args.expect.read_text().splitlines() if "\t" in line)
        same = [r.text == expected.get(r.file) for r in results]
        summary["matches_expected"] = f"{sum(same)}/{len(same)}"
    for r in results:
        logger.info("%s %d %.1f s audio in %.2f s%s", r.file, r.status, r.audio_s, r.seconds,
                    f" (first delta {r.first_delta_s:.2f} s)" if r.first_delta_s is not None else "")
    logger.info(json.dumps(summary))
    if args.out is not None:
        args.out.write_text(json.dumps({"summary": summary, "requests": [asdict(r) for r in results]}, indent=1))
    if failed:
        raise SystemExit(f"{len(failed)} request(s) failed: {failed[0].status} {failed[0].text[:200]}")


if __name__ == "__main__":
    main()
