"""Offline transcription of an audio file: the transcript alone on stdout, logs on stderr.

    python -m realtime.transcribe --model DIR|default FILE.wav [--delay-ms 480] [--device cpu] [--dtype fp32]
        [--srt OUT.srt] [--words OUT.json]

`--words` writes every word with its audio span (`[{"word", "start_ms", "end_ms"}, ...]`, the conventions of
`realtime/timestamps.py`: the same words a streaming server reports), `--srt` SubRip subtitles from them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

from .audio import AudioError, load_audio_file
from .config import ConfigError
from .loader import CheckpointError
from .model_store import load_model_and_tokenizer
from .session import transcribe
from .subtitles import to_srt
from .timestamps import TokenClock, words_of_tokens
from .tokenizer import TokenizerError

logger = logging.getLogger("realtime.transcribe")

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Transcribe a WAV/FLAC/Ogg file with a Voxtral-Realtime-style model.")
    ap.add_argument("--model", default="default", help="checkpoint folder, or 'default' for the embedded model")
    ap.add_argument("--delay-ms", type=int, default=None, help="transcription delay (multiple of 80 ms)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default="fp32")
    ap.add_argument("--srt", type=Path, default=None, help="also write SubRip subtitles from the word timings")
    ap.add_argument("--words", type=Path, default=None, help="also write the words and their times (JSON)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("file", help="audio file (WAV, FLAC or Ogg Vorbis/Opus, any sample rate, mono or multi-channel)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        model, tokenizer = load_model_and_tokenizer(args.model, device=args.device, dtype=_DTYPES[args.dtype])
        audio = load_audio_file(args.file, model.config.audio.sampling_rate)
        t0 = time.perf_counter()
        result = transcribe(model, tokenizer, audio, delay_ms=args.delay_ms)
        dt = time.perf_counter() - t0
    except (AudioError, ConfigError, CheckpointError, TokenizerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logger.info("%.2f s of audio in %.2f s (%d tokens)", audio.size / model.config.audio.sampling_rate, dt,
                len(result.token_ids))
    print(result.text.strip())
    if args.srt is not None or args.words is not None:
        cfg = model.config
        clock = TokenClock(cfg.streaming.n_left_pad_tokens, cfg.delay_tokens(args.delay_ms), cfg.token_duration_ms)
        audio_ms = audio.size * 1000 // cfg.audio.sampling_rate
        words = words_of_tokens(((ev.position, ev.text) for ev in result.events), clock, audio_ms)
        if args.words is not None:
            args.words.write_text(json.dumps([w.to_json() for w in words], indent=1), encoding="utf-8")
        if args.srt is not None:
            args.srt.write_text(to_srt(words), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
