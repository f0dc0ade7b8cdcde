"""WER of several model folders on a folder of recordings with transcripts (CPU is fine).

    python benchmarks/score_folder.py --folder DIR --models shipped=models/default run27=/tmp/run27 \
        --out docs/results/joe_score.json [--delay-ms 480]

Every `NAME.wav` (any format `realtime.audio.load_audio_file` reads: WAV, FLAC, Ogg) in DIR needs a
`NAME.txt` beside it with its transcript; a recording without one is an error, not skipped. Decoding and
scoring are the training evaluation's own (`realtime.train.evaluate.decode_and_score`: the same
normalisation and jiwer figures as the held-out tables), over all recordings ("*") and per recording.
For a user's own recordings, or for voices outside the training pipeline's evaluation sets (the
fourteenth session scored 30 sentences of Piper's joe this way).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from realtime.audio import load_audio_file
from realtime.train.evaluate import EvalItem, decode_and_score, normalize_text

logger = logging.getLogger("benchmarks.score_folder")
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".opus")
GROUP = "folder"  # the EvalItem group of every recording; its voice is the file name


def pairs(folder: Path) -> list[tuple[Path, str]]:
    """(recording, normalised transcript) for every recording in `folder`, sorted by name."""
    out = []
    for audio in sorted(p for p in folder.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES):
        text = audio.with_suffix(".txt")
        if not text.is_file():
            raise FileNotFoundError(f"{audio} has no transcript {text.name} beside it")
        out.append((audio, normalize_text(text.read_text(encoding="utf-8"))))
    if not out:
        raise FileNotFoundError(f"no recordings ({', '.join(AUDIO_SUFFIXES)}) in {folder}")
    return out


def speaker_of(audio: Path) -> str:
    """The speaker of an evaluation folder's recording: its name without the _NN index ("bf_emma_07.wav" -> "bf_emma")."""
    stem, sep, index = audio.stem.rpartition("_")
    if not sep or not index.isdigit():
        raise ValueError(f"{audio.name}: not SPEAKER_NN.wav, so --by-speaker cannot tell its speaker")
    return stem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", required=True)
    ap.add_argument("--models", nargs="+", required=True, help="NAME=FOLDER ...")
    ap.add_argument("--delay-ms", type=int, default=480)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--by-speaker", action="store_true",
                    help="score per speaker, not per recording: SPEAKER_NN.wav counts as SPEAKER (a folder of several "
                         "speakers' evaluation sets, e.g. realtime.train.kokoro's, linked into one)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    # the training evaluation's own decoding and scoring (realtime.train.evaluate): WER over all the
    # recordings ("*") and per recording, with the same normalisation as the held-out tables
    items = [EvalItem(GROUP, speaker_of(audio) if args.by_speaker else audio.name, args.delay_ms, ref,
                      load_audio_file(str(audio), 16000))
             for audio, ref in pairs(Path(args.folder))]
    report: dict = {"folder": args.folder, "delay_ms": args.delay_ms}
    for spec in args.models:
        name, _, folder = spec.partition("=")
        result = decode_and_score(Path(folder), items, workers=args.workers)
        report[name] = {"folder": folder, "wer": result[GROUP]["*"][str(args.delay_ms)]["wer"], **result}
        logger.info("%s: %.1f%% WER on %d recordings", name, report[name]["wer"], len(items))
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
