"""Does a model's accuracy hold over a long stream? WER by time in the stream against the same sentences alone.

    python benchmarks/make_speech_clips.py --voices heldout --seconds 180 --segments --out /tmp/long
    python benchmarks/long_stream_wer.py --clips /tmp/long --out long_stream.json [--model default]
        [--delay-ms 480] [--bucket-seconds 30] [--device cpu]

Each clip (with the `STEM.segments.json` that `make_speech_clips.py --segments` writes: each sentence's text and
span) is transcribed whole, as one stream, and every sentence is transcribed again alone, cut out with the silence
around it (up to the middle of the gaps to its neighbours). The whole clip's words (`realtime.timestamps`: the
times a streaming client gets) go to the sentence whose span, widened to those gap middles, holds their start. Per
time bucket of the stream (by the sentence's start), the WER of the sentences in it is reported both ways, with the
training evaluation's text normalisation. A model that degrades late in a stream (for instance past the stream
lengths it was trained on: the default model saw streams of at most 20 s) shows as a gap between the two that grows
with the bucket; a voice that is simply hard shows in both alike.

Decoding is the offline engine at batch 1 for the streams and batched for the sentences alone; with the embedded
model on the CPU its drafter speeds both up (speculation is lossless: the same tokens).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import jiwer
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from realtime.audio import load_audio_file
from realtime.engine.offline import offline_options, speculative_config, transcribe_batch
from realtime.model_store import default_drafter_dir, load_model_and_tokenizer
from realtime.timestamps import TokenClock, words_of_tokens
from realtime.train.evaluate import normalize_text

logger = logging.getLogger("benchmarks.long_stream_wer")


@dataclass
class Sentence:
    clip: str
    index: int
    text: str  # normalised reference
    start_s: float
    lo_s: float  # its share of the clip: from the middle of the gap before it to the middle of the gap after it
    hi_s: float
    in_stream: str = ""  # normalised hypothesis words of the whole-clip transcript
    alone: str = ""  # normalised transcript of the sentence cut out by itself


def sentences_of(clip: Path, duration_s: float) -> list[Sentence]:
    """The clip's sentences with their shares of the clip (gap middles as bounds)."""
    segs = json.loads(clip.with_name(clip.name.split(".")[0] + ".segments.json").read_text(encoding="utf-8"))
    if not segs:
        raise ValueError(f"{clip}: no sentences in its segments file")
    out = []
    for i, s in enumerate(segs):
        lo = 0.0 if i == 0 else (segs[i - 1]["end_s"] + s["start_s"]) / 2
        hi = duration_s if i == len(segs) - 1 else (s["end_s"] + segs[i + 1]["start_s"]) / 2
        out.append(Sentence(clip.name, i, normalize_text(s["text"]), s["start_s"], lo, hi))
    return out


def assign_words(sentences: list[Sentence], words: list[tuple[str, float]]) -> None:
    """Each (word, start second) to the sentence whose share holds its start (a word before the first share's
    start or after the last one's end goes to the nearest)."""
    bounds = np.array([s.lo_s for s in sentences[1:]])
    parts: list[list[str]] = [[] for _ in sentences]
    for word, start in words:
        parts[int(np.searchsorted(bounds, start, side="right"))].append(word)
    for s, p in zip(sentences, parts):
        s.in_stream = normalize_text(" ".join(p))


def wer(refs: list[str], hyps: list[str]) -> dict:
    """Corpus WER of the pairs (an empty hypothesis counts its reference's words as deletions)."""
    out = jiwer.process_words(refs, [h if h else "" for h in hyps])
    words = sum(len(r.split()) for r in refs)
    errors = out.substitutions + out.deletions + out.insertions
    return {"wer": round(100 * errors / max(words, 1), 2), "words": words, "sentences": len(refs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=Path, required=True, help="folder of clips with STEM.segments.json beside them")
    ap.add_argument("--model", default="default")
    ap.add_argument("--drafter", default=None, help="drafter folder, or 'none' (default: the embedded model's own)")
    ap.add_argument("--delay-ms", type=int, default=480)
    ap.add_argument("--bucket-seconds", type=float, default=30.0)
    ap.add_argument("--batch", type=int, default=16, help="sentences decoded at once when alone")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    model, tok = load_model_and_tokenizer(args.model, device=args.device,
                                          dtype=torch.float32 if args.device == "cpu" else torch.bfloat16)
    cfg = model.config
    rate = cfg.audio.sampling_rate
    drafter = default_drafter_dir(args.model) if args.drafter is None else (
        None if args.drafter == "none" else Path(args.drafter))
    spec = speculative_config(model, drafter) if drafter is not None else None
    clips = sorted(p for p in args.clips.iterdir() if p.suffix in (".flac", ".wav", ".ogg"))
    if not clips:
        raise SystemExit(f"no clips in {args.clips}")
    clock = TokenClock(cfg.streaming.n_left_pad_tokens, cfg.delay_tokens(args.delay_ms), cfg.token_duration_ms)
    all_sentences: list[Sentence] = []
    cuts: list[np.ndarray] = []
    for clip in clips:
        audio = load_audio_file(str(clip), rate)
        sentences = sentences_of(clip, audio.size / rate)
        run = transcribe_batch(model, tok, [audio], delay_ms=args.delay_ms,
                               opts=offline_options(1, 1, spec), speculative=spec)
        words = words_of_tokens(((ev.position, ev.text) for ev in run.results[0].events), clock,
                                audio.size * 1000 // rate)
        assign_words(sentences, [(w.word, w.start_ms / 1000) for w in words])
        cuts += [audio[int(s.lo_s * rate): int(s.hi_s * rate)] for s in sentences]
        all_sentences += sentences
        logger.info("%s: %.1f s, %d sentences, stream WER %.1f%%", clip.name, audio.size / rate, len(sentences),
                    wer([s.text for s in sentences], [s.in_stream for s in sentences])["wer"])
    for i in range(0, len(cuts), args.batch):
        chunk = cuts[i: i + args.batch]
        run = transcribe_batch(model, tok, chunk, delay_ms=args.delay_ms,
                               opts=offline_options(len(chunk), args.batch, spec), speculative=spec)
        for s, r in zip(all_sentences[i: i + args.batch], run.results):
            s.alone = normalize_text(r.text)
    buckets: dict[int, list[Sentence]] = {}
    for s in all_sentences:
        buckets.setdefault(int(s.start_s // args.bucket_seconds), []).append(s)
    table = []
    for b in sorted(buckets):
        group = buckets[b]
        refs = [s.text for s in group]
        row = {"from_s": b * args.bucket_seconds, "to_s": (b + 1) * args.bucket_seconds,
               "in_stream": wer(refs, [s.in_stream for s in group]), "alone": wer(refs, [s.alone for s in group])}
        table.append(row)
    refs = [s.text for s in all_sentences]
    report = {"model": str(args.model), "drafter": str(drafter) if drafter else None, "delay_ms": args.delay_ms,
              "device": args.device, "clips": [c.name for c in clips], "bucket_seconds": args.bucket_seconds,
              "all": {"in_stream": wer(refs, [s.in_stream for s in all_sentences]),
                      "alone": wer(refs, [s.alone for s in all_sentences])},
              "by_time": table,
              "per_clip": {c.name: {"in_stream": wer([s.text for s in all_sentences if s.clip == c.name],
                                                     [s.in_stream for s in all_sentences if s.clip == c.name]),
                                    "alone": wer([s.text for s in all_sentences if s.clip == c.name],
                                                 [s.alone for s in all_sentences if s.clip == c.name])}
                           for c in clips},
              "sentences": [s.__dict__ for s in all_sentences]}
    print(f"{'stream time':>14}  {'sentences':>9}  {'words':>6}  {'WER in stream':>13}  {'WER alone':>9}")
    for row in table:
        print(f"{row['from_s']:6.0f}-{row['to_s']:<6.0f} s  {row['in_stream']['sentences']:9d}  "
              f"{row['in_stream']['words']:6d}  {row['in_stream']['wer']:12.1f}%  {row['alone']['wer']:8.1f}%")
    print(f"{'all':>14}  {len(all_sentences):9d}  {report['all']['in_stream']['words']:6d}  "
          f"{report['all']['in_stream']['wer']:12.1f}%  {report['all']['alone']['wer']:8.1f}%")
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
