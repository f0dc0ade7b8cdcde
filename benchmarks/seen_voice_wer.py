"""WER of training voices on sentences they never spoke, and on the utterances they were trained on.

    python benchmarks/seen_voice_wer.py --models shipped=models/default run58=/tmp/run58 \
        --voices espeak:mb-us1 espeak:mb-us2 espeak:mb-de1-en espeak:mb-us3 --per-voice 30 \
        --carried .train_full/ps_A --out /tmp/seen_voices.json

The held-out draws score five held-out voices and three flite training voices. This scores any catalogue voices
(training or held-out) on `--per-voice` test-split sentences, synthesised here with a fixed seed (kept in
`--shards`, so later calls reuse them), and with `--carried DIR` also on one carried pre-synthesised shard of
each voice that has one (sentences the model was trained on). A voice that is much better on its training
utterances than on new sentences has been memorised, not learned: the fifty-second session found the carried
mbrola speakers at 0-4% on their training utterances and 21-25% on new sentences, against 5% for the flite voices
that every call synthesises afresh. `--opus-level L` also scores the new sentences after the carry's Opus round trip
(`presynth`'s codec at level L), to tell the codec's part from the speakers'. Decoding is on the CPU, fp32, 480 ms.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

import numpy as np

from realtime.train.evaluate import evaluate
from realtime.train.presynth import SUFFIX, pack_shard, read_packed_meta, unpack_shard
from realtime.train.synth import Task, synthesize
from realtime.train.text_corpus import read_corpus
from realtime.train.voices import catalogue

logger = logging.getLogger("benchmarks.seen_voice_wer")


def new_sentence_tasks(corpus: Path, keys: list[str], per_voice: int, seed: int) -> list[Task]:
    """One task per voice: `per_voice` test-split sentences drawn with `seed` (named so evaluate() scores them)."""
    train_v, held_v = catalogue()
    by_key = {v.key: v for v in train_v + held_v}
    unknown = [k for k in keys if k not in by_key]
    if unknown:
        raise SystemExit(f"not catalogue voices: {unknown}")
    test = [s.text for s in read_corpus(corpus) if s.split == "test"]
    rng = np.random.default_rng(seed)
    tasks = []
    for i, key in enumerate(keys):
        idx = rng.choice(len(test), size=min(per_voice, len(test)), replace=False)
        tasks.append(Task(f"heldout-{i:02d}", by_key[key], "heldout", tuple(test[j] for j in idx), seed + 7919 * i))
    return tasks


def carried_utterances(folder: Path, keys: list[str], out: Path) -> list[str]:
    """The first carried shard of each voice in `keys` (a `presynth` part), unpacked into `out` under a name and
    split evaluate() scores; returns the voices found."""
    out.mkdir(parents=True, exist_ok=True)
    found: list[str] = []
    for path in sorted(folder.glob("*" + SUFFIX)):
        meta = read_packed_meta(path)
        if meta["voice"] in keys and meta["voice"] not in found and meta["split"] == "train":
            unpack_shard(path, out, name=f"heldout-{len(found):02d}", split="heldout")
            found.append(meta["voice"])
    return found


def opus_round_trip(src: Path, dst: Path, level: float) -> None:
    """Every shard of `src` into `dst` through the carry's own path (`presynth` pack at `level`, then unpack)."""
    dst.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(src.glob("*.npz")):
            packed = Path(tmp) / (path.stem + SUFFIX)
            pack_shard(path, packed, level)
            unpack_shard(packed, dst)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True, help="NAME=FOLDER ...")
    ap.add_argument("--voices", nargs="+", required=True, help="catalogue keys, e.g. espeak:mb-us1 flite:slt")
    ap.add_argument("--per-voice", type=int, default=30)
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--corpus", default=".train_carry/corpus.tsv.gz")
    ap.add_argument("--carried", default=None, help="a folder of pre-synthesised training shards (e.g. ps_A)")
    ap.add_argument("--opus-level", type=float, default=None, help="also score the new sentences through Opus")
    ap.add_argument("--shards", default=None, help="default: /tmp/streamscribe-seen-voices-seed<N>")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    root = Path(args.shards or f"/tmp/streamscribe-seen-voices-seed{args.seed}")
    new = root / "new"
    if not new.exists():
        synthesize(new_sentence_tasks(Path(args.corpus), args.voices, args.per_voice, args.seed), new,
                   workers=args.workers)
    sets = {"new_sentences": new}
    if args.opus_level is not None:
        coded = root / f"new-opus-{args.opus_level}"
        if not coded.exists():
            opus_round_trip(new, coded, args.opus_level)
        sets[f"new_sentences_opus_{args.opus_level}"] = coded
    if args.carried:
        carried = root / ("carried-" + Path(args.carried).name)
        if not carried.exists():
            logger.info("carried shards of %s: %s", args.carried,
                        carried_utterances(Path(args.carried), args.voices, carried))
        sets["trained_utterances"] = carried
    report: dict = {"voices": args.voices, "per_voice": args.per_voice, "seed": args.seed, "delay_ms": 480}
    for spec in args.models:
        name, _, folder = spec.partition("=")
        report[name] = {}
        for what, data in sets.items():
            result = evaluate(Path(folder), data, delays=[480], per_voice=args.per_voice, sweep_per_voice=0,
                              real_dir=None, workers=args.workers)
            report[name][what] = {v: cell["480"] for v, cell in result.get("heldout", {}).items()}
            logger.info("%s %s: %s", name, what, {v: c["wer"] for v, c in report[name][what].items()})
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
