"""Offline file transcription as `python -m realtime.transcribe` runs it: its modes side by side.

Modes (alternated in one process, the model loaded once; each run decodes every file given):
- `reference`: the single-stream streaming session (`--reference`, what the command ran before it took the engine);
- `engine`: the batched engine without a drafter (`--drafter none`);
- `drafter`: the engine with the model's default drafter (the command's default for the embedded model);
- `tree24`: the same with a tree of 24 drafts per round (`--tree-nodes 24`).

Reports the median decode time per mode (model loading excluded), the speed in multiples of real time, and whether
every mode printed the reference's transcripts.

    python benchmarks/bench_transcribe_cli.py --files A.wav B.wav --device cpu --repeats 3 --out F.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from realtime.audio import load_audio_file
from realtime.model_store import load_model_and_tokenizer
from realtime.transcribe import build_parser, default_dtype, transcribe_files

MODES = {"reference": ["--reference"], "engine": ["--drafter", "none"], "drafter": [], "tree24": ["--tree-nodes", "24"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--files", nargs="+", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="bench_transcribe_cli.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    modes = args.modes.split(",")
    model, tok = load_model_and_tokenizer(args.model, device=args.device, dtype=default_dtype(args.device))
    audios = [load_audio_file(f, model.config.audio.sampling_rate) for f in args.files]
    seconds = sum(a.size for a in audios) / model.config.audio.sampling_rate
    times: dict[str, list[float]] = {m: [] for m in modes}
    texts: dict[str, list[str]] = {}
    for _ in range(args.repeats):  # alternated, so drift hits every mode alike
        for m in modes:
            cli = build_parser().parse_args(["--model", args.model, "--device", args.device, *MODES[m], *args.files])
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            results = transcribe_files(model, tok, audios, cli)
            times[m].append(time.perf_counter() - t0)
            texts[m] = [r.text for r in results]
    ref = texts.get("reference")
    report = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "torch_threads": torch.get_num_threads(), "files": args.files, "audio_s": seconds, "modes": {}}
    for m in modes:
        med = statistics.median(times[m])
        report["modes"][m] = {"seconds": times[m], "median_s": med, "x_real_time": seconds / med,
                              "same_as_reference": None if ref is None else texts[m] == ref}
        print(f"{m}: {med:.3f} s median ({seconds / med:.1f}x real time)"
              + ("" if ref is None else f", transcripts as the reference: {texts[m] == ref}"))
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
