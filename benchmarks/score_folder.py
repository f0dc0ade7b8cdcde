"""WER of several model folders on a folder of recordings with transcripts (CPU is fine).

    python benchmarks/score_folder.py --folder DIR --models shipped=models/default run27=/tmp/run27 \
        --out docs/results/joe_score.json [--delay-ms 480]

Every `NAME.wav` (any format `realtime.audio.load_audio_file` reads: WAV, FLAC, Ogg) in DIR needs a
`NAME.txt` beside it with its transcript; a recording without one is an error, not skipped. Transcripts
and outputs are normalised as the training evaluation normalises them (`realtime.train.evaluate`), so the
figures compare with the held-out tables. For a user's own recordings, or for voices outside the
training pipeline's evaluation sets (the fourteenth session scored 30 sentences of Piper's joe this way).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import jiwer
import torch

from realtime.audio import load_audio_file
from realtime.model_store import load_model_and_tokenizer
from realtime.session import transcribe
from realtime.train.evaluate import normalize_text as normalize

logger = logging.getLogger("benchmarks.score_folder")
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".opus")


def pairs(folder: Path) -> list[tuple[Path, str]]:
    """(recording, normalised transcript) for every recording in `folder`, sorted by name."""
    out = []
    for audio in sorted(p for p in folder.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES):
        text = audio.with_suffix(".txt")
        if not text.is_file():
            raise FileNotFoundError(f"{audio} has no transcript {text.name} beside it")
        out.append((audio, normalize(text.read_text(encoding="utf-8"))))
    if not out:
        raise FileNotFoundError(f"no recordings ({', '.join(AUDIO_SUFFIXES)}) in {folder}")
    return out


def score(model_dir: str, items: list[tuple[Path, str]], delay_ms: int) -> dict:
    model, tokenizer = load_model_and_tokenizer(model_dir, device="cpu", dtype=torch.float32)
    rate = model.config.audio.sampling_rate
    refs, hyps, examples = [], [], []
    t0 = time.time()
    for audio, ref in items:
        hyp = normalize(transcribe(model, tokenizer, load_audio_file(str(audio), rate), delay_ms=delay_ms).text)
        refs.append(ref)
        hyps.append(hyp)
        examples.append({"file": audio.name, "ref": ref, "hyp": hyp})
    return {"folder": model_dir, "wer": round(100 * jiwer.wer(refs, hyps), 2), "n": len(items),
            "wall_s": round(time.time() - t0, 1), "examples": examples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", required=True)
    ap.add_argument("--models", nargs="+", required=True, help="NAME=FOLDER ...")
    ap.add_argument("--delay-ms", type=int, default=480)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    items = pairs(Path(args.folder))
    report: dict = {"folder": args.folder, "delay_ms": args.delay_ms}
    for spec in args.models:
        name, _, folder = spec.partition("=")
        report[name] = score(folder, items, args.delay_ms)
        logger.info("%s: %.1f%% WER on %d recordings", name, report[name]["wer"], len(items))
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
