"""Long synthetic speech clips (FLAC, 16 kHz) for the speculative benchmark and drafter distillation.

    python benchmarks/make_speech_clips.py --voices heldout --out .bench_audio --seconds 45
    python benchmarks/make_speech_clips.py --voices train --count 40 --out .drafter_audio --seconds 60
    python benchmarks/make_speech_clips.py --sentence "my children finally got me to buy a computer" \
        --voice espeak:en-us-nyc+f4 --out demo/samples/heldout_nyc_f4.wav

`--sentence`: one sentence by one catalogue voice at its default speed and pitch, 1.0 s of silence
before and 0.5 s after, as a 16 kHz PCM16 WAV (the browser test's held-out sample).

`heldout`: one clip per held-out voice (speakers the default model never heard), spoken from the
corpus's *test* sentences, named `heldout_<i>_<engine>_<voice>.flac`. `train`: `count` clips from
training voices drawn by their weights, spoken from *train* sentences (distillation data), named
`train_<i>_<engine>_<voice>.flac`; `--sentences test` makes training voices speak test sentences instead
(seen speakers, unseen text: the target's own domain). `unseen`: `count` clips from formant voices that
neither half of the catalogue uses (`voices.unseen_formant_voices`), speaking *train* sentences: audio new
to the target that is still not the held-out evaluation. `--speed-warp LO HI` plays each clip at a random
speed factor in that range (resampling: tempo, pitch and formants move together, a cheap new speaker made
from a known one). `--segments` writes each clip's sentences with their spans beside it. `--opus-level L`
writes Ogg Opus at that compression level instead of FLAC (a tenth of the bytes, for the device's transfer
limit). Utterances are joined with 0.25-0.6 s of silence; each is peak-normalised like the training shards. Needs the TTS engines of the training pipeline
(espeak-ng, mbrola voices, flite + the flitew helper) and the corpus file of `.train_carry`.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
import soundfile as sf

from realtime.audio import resample
from realtime.train.espeak import EspeakVoice
from realtime.train.flite import FliteVoice
from realtime.train.synth import engine_for
from realtime.train.text_corpus import read_corpus
from realtime.train.voices import VoiceSpec, available, catalogue, unseen_formant_voices

logger = logging.getLogger(__name__)
RATE = 16000


def make_clip(voice: VoiceSpec, texts: list[str], seconds: float, rng: np.random.Generator,
              segments: list[dict] | None = None) -> np.ndarray:
    """Sentences of `texts` by `voice`, each after 0.25-0.6 s of silence, until `seconds` are filled. With
    `segments` (a list), each spoken sentence is appended to it as {"text", "start_s", "end_s"}."""
    engine = engine_for(voice.engine)
    parts, total = [], 0.0
    for text in texts:
        try:
            audio, _ = engine.synthesize(voice.render(rng), text.split())
        except Exception as exc:  # noqa: BLE001 - an engine quirk on one sentence (the shards skip it too)
            logger.debug("%s: skipped %r: %s", voice.key, text, exc)
            continue
        peak = float(np.abs(audio).max()) if audio.size else 0.0
        if peak < 1e-3:
            continue
        gap = np.zeros(int(RATE * rng.uniform(0.25, 0.6)), np.float32)
        parts += [gap, (audio * (0.7 / peak)).astype(np.float32)]
        if segments is not None:
            start = total + gap.size / RATE
            segments.append({"text": text, "start_s": round(start, 4), "end_s": round(start + audio.size / RATE, 4)})
        total += (gap.size + audio.size) / RATE
        if total >= seconds:
            return np.concatenate(parts)
    raise RuntimeError(f"{voice.key}: ran out of sentences at {total:.1f} s")


def speed_warp(audio: np.ndarray, factor: float) -> tuple[np.ndarray, float]:
    """`audio` played about `factor` times faster (shorter, higher): read as if sampled at RATE * factor
    and resampled to RATE. The factor is rounded to a multiple of 1/160 so the rate ratio stays small;
    returns the audio and the factor applied."""
    in_rate = round(RATE * factor / 100) * 100
    out = audio if in_rate == RATE else resample(audio, in_rate, RATE).astype(np.float32)
    return out, in_rate / RATE


def write_sentence(voice_key: str, text: str, out: Path) -> None:
    train_v, held_v = catalogue()
    voice = next((v for v in train_v + held_v if v.key == voice_key), None)
    if voice is None:
        raise SystemExit(f"no voice {voice_key!r} in the catalogue (keys look like espeak:en-029+m6, flite:awb)")
    engine = engine_for(voice.engine)
    default = FliteVoice(voice.base) if voice.engine == "flite" else EspeakVoice(voice.base)
    audio, _ = engine.synthesize(default, text.split())
    audio = audio * (0.7 / float(np.abs(audio).max()))
    pcm = np.concatenate([np.zeros(RATE, np.float32), audio, np.zeros(RATE // 2, np.float32)])
    out.parent.mkdir(parents=True, exist_ok=True)
    sf.write(out, pcm, RATE, subtype="PCM_16")
    logger.info("%s: %s saying %r, %.2f s", out, voice_key, text, pcm.size / RATE)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--voices", choices=("heldout", "train", "unseen"))
    ap.add_argument("--sentence", help="one sentence into one WAV file (with --voice)")
    ap.add_argument("--voice", help="catalogue voice key for --sentence, e.g. espeak:en-029+m6")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--count", type=int, default=10, help="clips to make from training voices")
    ap.add_argument("--sentences", choices=("train", "test"), default=None,
                    help="corpus split to speak (default: test for held-out voices, train for training voices)")
    ap.add_argument("--corpus", default=".train_carry/corpus.tsv.gz")
    ap.add_argument("--segments", action="store_true",
                    help="also write STEM.segments.json: each sentence's text and its span in the clip (seconds); "
                         "the clips' audio is the same with or without it (benchmarks/long_stream_wer.py reads it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--speed-warp", type=float, nargs=2, metavar=("LO", "HI"), default=None,
                    help="play each clip at a random speed factor in [LO, HI] (resampled)")
    ap.add_argument("--opus-level", type=float, default=None,
                    help="write Ogg Opus at this compression level (0-1) instead of FLAC")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.sentence:
        if not args.voice:
            ap.error("--sentence needs --voice")
        write_sentence(args.voice, args.sentence, Path(args.out))
        return 0
    if not args.voices:
        ap.error("give --voices heldout|train|unseen, or --sentence with --voice")
    train_v, held_v = catalogue()
    pool = {"heldout": held_v, "train": train_v, "unseen": unseen_formant_voices()}[args.voices]
    voices = available(pool, espeak=True, flite=True)
    split = args.sentences or ("test" if args.voices == "heldout" else "train")
    sentences = [s.text for s in read_corpus(Path(args.corpus)) if s.split == split]
    rng = np.random.default_rng(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.voices == "heldout":
        chosen = voices
    else:
        w = np.array([v.weight for v in voices])
        chosen = [voices[i] for i in rng.choice(len(voices), size=args.count, p=w / w.sum())]
    for i, voice in enumerate(chosen):
        texts = [sentences[j] for j in rng.permutation(len(sentences))[:400]]
        segments: list[dict] = []
        clip = make_clip(voice, texts, args.seconds, rng, segments)
        stem = f"{args.voices}_{i:02d}_{voice.engine}_{voice.base.replace('+', '-')}"
        if args.segments:
            if args.speed_warp:
                ap.error("--segments does not follow --speed-warp's time change")
            (out / f"{stem}.segments.json").write_text(json.dumps(segments, indent=1), encoding="utf-8")
        if args.speed_warp:
            clip, factor = speed_warp(clip, float(rng.uniform(*args.speed_warp)))
            stem += f"_x{factor:.4g}"
        if args.opus_level is None:
            sf.write(out / f"{stem}.flac", clip, RATE, format="FLAC")
        else:
            with sf.SoundFile(out / f"{stem}.ogg", "w", RATE, 1, format="OGG", subtype="OPUS",
                              compression_level=args.opus_level) as f:
                f.write(clip)
        logger.info("%s: %.1f s", stem, clip.size / RATE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
