"""Files decoded one after another through one batched engine, offline: what a server's engine does for one upload at
a time, without the server. Reports the time per engine step for engines sized for N streams (a server sizes its
engine for `--max-sessions`), so that a service figure (`bench_http_transcribe.py`) can be split into the engine's
share and the service's.

    python benchmarks/bench_engine_files.py --files A.flac B.flac --device cuda --max-streams 1 256 --repeats 2 \
        [--drafter models/default_drafter] [--out F.json]

The engine of each size is built once (CUDA graphs captured then) and decodes every file, one at a time, per repeat;
the first repeat warms it up and is reported apart.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from realtime.audio import load_audio_file  # noqa: E402
from realtime.engine import BatchedEngine, RunnerOptions  # noqa: E402
from realtime.engine.offline import run_engine_offline, speculative_config  # noqa: E402
from realtime.engine.speculation import step_tokens_for  # noqa: E402
from realtime.model_store import load_model_and_tokenizer  # noqa: E402

logger = logging.getLogger("bench_engine_files")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--files", nargs="+", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-streams", type=int, nargs="+", default=[1, 256])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model, tok = load_model_and_tokenizer(args.model, device=args.device, dtype=dtype)
    spec = speculative_config(model, args.drafter) if args.drafter else None
    audios = [load_audio_file(f) for f in args.files]
    seconds = sum(a.size for a in audios) / 16000
    rows = []
    for n in args.max_streams:
        # the options `stream_server.engine_factory` gives a server of --max-sessions n
        opts = RunnerOptions(max_streams=n, max_batch=n, cuda_graphs=args.device.startswith("cuda"),
                             max_step_tokens=step_tokens_for(spec.num_speculative_tokens if spec else 0))
        engine = BatchedEngine(model, tok, opts=opts, speculative=spec)
        for rep in range(args.repeats):
            t_all, steps, texts = 0.0, 0, []
            for a in audios:
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                run = run_engine_offline(engine, [a])
                t_all += time.perf_counter() - t0
                steps += run.steps
                texts.append(run.results[0].text)
            row = {"max_streams": n, "repeat": rep, "seconds": round(t_all, 4), "steps": steps,
                   "ms_per_step": round(t_all / steps * 1e3, 4), "x_real_time": round(seconds / t_all, 2),
                   "texts": texts}
            rows.append(row)
            logger.info("engine for %d streams, repeat %d%s: %.3f s, %d steps, %.3f ms a step, %.1fx real time", n,
                        rep, " (warm-up)" if rep == 0 else "", t_all, steps, row["ms_per_step"], row["x_real_time"])
    if args.out:
        Path(args.out).write_text(json.dumps({"device": args.device, "files": args.files, "audio_s": seconds,
                                              "drafter": args.drafter, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
