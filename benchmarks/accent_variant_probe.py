"""Is a held-out formant voice hard for its accent or for its variant? WER of accent x variant crossings (CPU).

    python benchmarks/accent_variant_probe.py --voices en-029+m6 en-029+m3 en-us+m6 en-us+m3 \
        --sentences 40 --out probe.json [--model models/default] [--workers 2]

The held-out espeak-ng voices combine an accent and a variant that no training voice uses (en-029+m6,
en-us-nyc+f4; `realtime/train/voices.py`). Crossing them with the training ones (e.g. the held-out accent with a
training variant, a training accent with the held-out variant) tells which of the two the model fails on, and so
which kind of training data could help. Every voice speaks the same test sentences with the same per-utterance
speed and pitch draws (one seed per utterance, as the training pipeline renders them); decoding and scoring are the
training evaluation's (`realtime.train.evaluate.decode_and_score`, 480 ms). Needs espeak-ng and the corpus of
`.train_carry` (`python -m realtime.train.prepare_carry`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from realtime.train.espeak import EspeakError
from realtime.train.evaluate import EvalItem, decode_and_score, normalize_text
from realtime.train.synth import engine_for
from realtime.train.text_corpus import read_corpus
from realtime.train.voices import HELDOUT_ACCENTS, HELDOUT_VARIANTS, TRAIN_ACCENTS, TRAIN_VARIANTS, VoiceSpec

logger = logging.getLogger("benchmarks.accent_variant_probe")


def kind_of(name: str) -> str:
    """'accent seen/held-out, variant seen/held-out' for an espeak-ng voice name ACCENT[+VARIANT][#RULES]."""
    base, _, rules = name.partition("#")
    accent, _, variant = base.partition("+")

    def side(x: str, train: tuple[str, ...], held: tuple[str, ...]) -> str:
        return "train" if x in train else "held-out" if x in held else "neither"

    accent_side = side(accent, TRAIN_ACCENTS, HELDOUT_ACCENTS)
    kind = f"accent {accent_side}, variant {side(variant, TRAIN_VARIANTS, HELDOUT_VARIANTS)}"
    return kind + (f", rewritten: {rules}" if rules else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--voices", nargs="+", required=True,
                    help="espeak-ng voice names, ACCENT[+VARIANT], optionally #RULES+RULES (accents.py rewrites)")
    ap.add_argument("--sentences", type=int, default=40)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "default")
    ap.add_argument("--corpus", type=Path, default=ROOT / ".train_carry" / "corpus.tsv.gz")
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    tests = [s.text for s in read_corpus(args.corpus) if s.split == "test"]
    rng = np.random.default_rng(args.seed)
    texts = [tests[i] for i in rng.permutation(len(tests))[: args.sentences]]
    engine = engine_for("espeak")
    items = []
    skipped: dict[str, int] = {}  # utterances espeak-ng could not time, by voice
    for name in args.voices:
        base, _, rules = name.partition("#")
        voice = VoiceSpec("espeak", base, name, False, 1.0, tuple(rules.split("+")) if rules else ())
        made = 0
        for j, text in enumerate(texts):
            # the same speed and pitch draw for utterance j whatever the voice
            try:
                audio, _ = engine.synthesize(voice.render(np.random.default_rng([args.seed, j])), text.split())
            except EspeakError as exc:  # as the training pipeline does: the utterance is left out, and said so
                logger.warning("%s: utterance %d left out (%s)", name, j, exc)
                skipped[name] = skipped.get(name, 0) + 1
                continue
            items.append(EvalItem("probe", name, 480, normalize_text(text), audio.astype(np.float32)))
            made += 1
        logger.info("%s: %d utterances synthesised", name, made)
    result = decode_and_score(args.model, items, workers=args.workers)
    rows = {v: result["probe"][v]["480"]["wer"] for v in args.voices}
    print(f"{'voice':40s} {'kind':72s} WER")
    for v in args.voices:
        print(f"{v:40s} {kind_of(v):72s} {rows[v]:.1f}%")
    if args.out is not None:
        report = {"model": str(args.model), "sentences": len(texts), "seed": args.seed, "left_out": skipped,
                  "wer": rows, "kinds": {v: kind_of(v) for v in args.voices}, "result": result}
        args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
