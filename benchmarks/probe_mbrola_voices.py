"""Which mbrola databases can speak English through espeak-ng? (the probe behind realtime/train/mbrola_en.py)

    python benchmarks/probe_mbrola_voices.py --candidates fr2 fr3 nl1 it3 ... [--sentences 8] [--model models/default]

For each candidate database (installed from Debian as mbrola-<v>) this writes an English entry from the native
entry's gender, pitch range and phoneme table into a private espeak-ng data folder, synthesises `--sentences`
test-split sentences, transcribes them with the model at 480 ms, and counts mbrola's "unknown diphone" warnings
(phonemes it replaced by silence) while speaking 40 training sentences with the espeak-ng command line. The
reference voices (`--references`, by default the held-out us3 and the training voices fr1-en and de1-en) read
the same sentences. Prints one line per voice and writes the table as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import subprocess
import tempfile
from pathlib import Path

from realtime.train.mbrola_en import MbrolaEnglish

logger = logging.getLogger("probe_mbrola_voices")


def english_from_native(data: Path, voice: str) -> MbrolaEnglish:
    """An English entry from the native one's gender, pitch range, voicing and mbrola line."""
    fields = dict(ln.split(None, 1) for ln in (data / "voices" / "mb" / f"mb-{voice}").read_text().splitlines()
                  if re.match(r"(gender|pitch|voicing|mbrola)\s", ln))
    pitch = tuple(int(x) for x in fields.get("pitch", "82 117").split()[:2])
    db, table, *rate = fields["mbrola"].split()
    return MbrolaEnglish(db, fields.get("gender", "male").startswith("female"), pitch, table,
                         rate=int(rate[0]) if rate else None,
                         voicing=int(fields["voicing"]) if "voicing" in fields else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidates", nargs="+", required=True, help="mbrola databases, e.g. fr2 nl1")
    ap.add_argument("--references", nargs="*", default=["mb-us3", "mb-fr1-en", "mb-de1-en"])
    ap.add_argument("--corpus", default=".train_carry/corpus.tsv.gz")
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--sentences", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import jiwer
    import torch

    from realtime.model_store import load_model_and_tokenizer
    from realtime.session import transcribe
    from realtime.train.espeak import EspeakSynth, EspeakVoice, default_library
    from realtime.train.mbrola_en import SYSTEM_ESPEAK_DATA, english_mbrola_data
    from realtime.train.text_corpus import read_corpus

    torch.set_num_threads(1)
    sentences = read_corpus(Path(args.corpus))
    test = [s for s in sentences if s.split == "test" and 5 <= len(s.words) <= 14]
    random.Random(3).shuffle(test)
    train_text = " ".join([s.text for s in sentences if s.split == "train"][:40])
    model, tok = load_model_and_tokenizer(args.model)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = english_mbrola_data(Path(tmp) / "espeak-ng-data")
        for v in args.candidates:
            (data / "voices" / "mb" / f"mb-{v}-en").write_text(english_from_native(SYSTEM_ESPEAK_DATA, v).entry())
        synth = EspeakSynth(default_library()[0], str(data))
        for name in args.references + [f"mb-{v}-en" for v in args.candidates]:
            refs, hyps, failed = [], [], 0
            for s in test[: args.sentences]:
                try:
                    audio, _ = synth.synthesize(EspeakVoice(name, rate_wpm=160), s.words)
                except Exception:  # noqa: BLE001 - a voice that cannot speak a sentence is what we count
                    failed += 1
                    continue
                refs.append(s.text)
                hyps.append(transcribe(model, tok, audio, delay_ms=480).text)
            cli = subprocess.run(["espeak-ng", f"--path={data.parent}", "-v", name, "-w", str(Path(tmp) / "x.wav"),
                                  train_text], capture_output=True, text=True, check=False)
            unknown = cli.stderr.count("unknown")
            wer = round(jiwer.wer(refs, hyps) * 100, 1) if refs else None
            results[name] = {"wer": wer, "failed": failed, "unknown_diphones": unknown}
            logger.info("%-12s WER %5s%%  failed %d  unknown diphones %d", name, wer, failed, unknown)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
