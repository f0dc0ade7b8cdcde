"""Offline transcription of audio files: the transcripts alone on stdout, logs on stderr.

    python -m realtime.transcribe [--model DIR|default] FILE... [--delay-ms 480] [--device cpu|cuda] [--dtype fp32]
        [--drafter DIR|none] [--k K] [--tree-nodes M [--tree-max-streams S]] [--max-verify-rows R]
        [--encoder-chunk N] [--batch N] [--srt OUT.srt]
        [--words OUT.json] [--progress] [--no-cuda-graphs] [--no-encoder-stream] [--reference]

One file: its transcript alone; several: one `FILE<TAB>TRANSCRIPT` line each, in the order given (line breaks in a
transcript become spaces there). A file that cannot be read is named on stderr and the others are still transcribed
(exit status 1; 2 when nothing could be transcribed).

The files go through the batched engine (`realtime/engine/offline.py`): whole files are backlogged audio, so with a
drafter every step verifies several frames (lossless speculative decoding: the tokens are the ones decoding without
it gives; issue 5). On the CPU the embedded model uses its embedded drafter unless `--drafter none`; other
checkpoints, and every model on CUDA (where setting the speculative engine up costs more than it saves on files of a
few minutes), decode without one unless `--drafter DIR` names one distilled for the model. Without a drafter, on the
CPU each step encodes up to 32 tokens of a file's buffered audio a call (`--encoder-chunk`; the same tokens, about
2.6x faster than one token a step there). `--reference` runs the
single-stream streaming session instead (`realtime/session.py`, the engine's correctness reference: the same
tokens in fp32, slower; in bf16 the two round differently, so a near-tie can decode otherwise).

`--words` writes every word with its audio span (`[{"word", "start_ms", "end_ms"}, ...]`, the conventions of
`realtime/timestamps.py`: the same words a streaming server reports), `--srt` SubRip subtitles from them (one file).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .audio import AudioError, load_audio_file
from .config import ConfigError
from .engine.offline import CPU_PLAIN_ENCODER_CHUNK, offline_options, run_summary, speculative_config, transcribe_batch
from .engine.speculation import MAX_LOOKAHEAD_CHUNK
from .loader import CheckpointError
from .model import VoxtralRealtime
from .model_store import default_drafter_dir, load_model_and_tokenizer
from .session import TranscriptionResult, transcribe
from .subtitles import to_srt
from .timestamps import TokenClock, words_of_tokens
from .tokenizer import TextTokenizer, TokenizerError

logger = logging.getLogger("realtime.transcribe")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def default_dtype(device: str) -> torch.dtype:
    """bf16 on CUDA, fp32 elsewhere."""
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Transcribe WAV/FLAC/Ogg/MP3 files with a Voxtral-Realtime-style model.")
    ap.add_argument("--model", default="default", help="checkpoint folder, or 'default' for the embedded model")
    ap.add_argument("--delay-ms", type=int, default=None, help="transcription delay (multiple of 80 ms)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cpu or cuda[:N] (default: cuda when available)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on CUDA, fp32 on the CPU")
    ap.add_argument("--drafter", default=None,
                    help="Eagle drafter folder for lossless speculative decoding, or 'none' (default: on the CPU the "
                         "embedded drafter with the embedded model; none on CUDA and with other checkpoints)")
    ap.add_argument("--k", type=int, default=None,
                    help="drafts per round (default: on a GPU the count the drafter's config records for GPUs, else "
                         "the drafts it was trained for; on the CPU the latter, at most 6; 6 for older parallel or "
                         "two-pass drafters, 4 for chained ones)")
    ap.add_argument("--encoder-chunk", type=int, default=None,
                    help="without a drafter: audio tokens a step encodes per call from a file's buffered audio, 1..32 "
                         "(default: 32 on the CPU, where it decoded 2.6x faster with the same tokens; 1 on CUDA, not "
                         "measured there yet). A drafter's look-ahead sets its own")
    ap.add_argument("--tree-nodes", type=int, default=None,
                    help="verify a tree of this many drafts per round instead of a chain (parallel drafters)")
    ap.add_argument("--tree-max-streams", type=int, default=1,
                    help="with --tree-nodes: the tree only in steps where at most this many files draft, the chain "
                         "in the others (default 1)")
    ap.add_argument("--max-verify-rows", type=int, default=None,
                    help="with a drafter: the most verify rows a step takes across its files; in busier steps every "
                         "file drafts fewer, or none (default: 32 on the CPU, no limit on CUDA)")
    ap.add_argument("--batch", type=int, default=16, help="files decoded together (default 16)")
    ap.add_argument("--no-cuda-graphs", action="store_true", help="run the engine's steps eagerly on CUDA")
    ap.add_argument("--no-encoder-stream", action="store_true",
                    help="keep the encoder on the main CUDA stream (RunnerOptions.encoder_stream)")
    ap.add_argument("--reference", action="store_true",
                    help="the single-stream streaming session instead of the batched engine (same tokens, slower)")
    ap.add_argument("--srt", type=Path, default=None, help="also write SubRip subtitles from the word timings")
    ap.add_argument("--words", type=Path, default=None, help="also write the words and their times (JSON)")
    ap.add_argument("--progress", action="store_true",
                    help="report the seconds decoded on stderr about once a second (the engine; not --reference)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("files", nargs="+",
                    help="audio files (WAV, FLAC, Ogg Vorbis/Opus or MP3, any sample rate, mono or multi-channel)")
    return ap


def _check(args: argparse.Namespace) -> None:
    if (args.srt is not None or args.words is not None) and len(args.files) != 1:
        raise ValueError("--srt and --words take one input file")
    if args.batch < 1:
        raise ValueError(f"--batch must be at least 1, got {args.batch}")
    if args.k is not None and args.k < 1:
        raise ValueError(f"--k must be at least 1, got {args.k}")
    if args.max_verify_rows is not None and args.max_verify_rows < 1:
        raise ValueError(f"--max-verify-rows must be at least 1, got {args.max_verify_rows}")
    if args.encoder_chunk is not None and not 1 <= args.encoder_chunk <= MAX_LOOKAHEAD_CHUNK:
        raise ValueError(f"--encoder-chunk must be 1..{MAX_LOOKAHEAD_CHUNK}, got {args.encoder_chunk}")
    if str(args.device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: this machine has no CUDA device (use --device cpu)")
    for flag, path in (("--srt", args.srt), ("--words", args.words)):  # before the decoding, not after it
        if path is not None and not Path(path).parent.is_dir():
            raise ValueError(f"{flag} {path}: its folder does not exist")
    if args.reference and (args.drafter not in (None, "none") or args.k is not None or args.tree_nodes is not None
                           or args.progress or args.encoder_chunk is not None or args.max_verify_rows is not None):
        raise ValueError("--reference decodes one file at a time in the streaming session: it takes no --drafter, "
                         "--k, --tree-nodes, --encoder-chunk, --max-verify-rows or --progress")


def one_line(text: str) -> str:
    """A transcript on one line of the several-files output (line breaks a model may emit become spaces)."""
    return text.strip().replace("\r\n", " ").replace("\r", " ").replace("\n", " ")


class ProgressReport:
    """`--progress`: a line on stderr at most every `interval` seconds while the engine decodes, and one at the end."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval, self.t0 = interval, time.perf_counter()
        self.last = self.t0  # the first line after one interval
        self.ended = False

    def __call__(self, done_s: float, total_s: float) -> None:
        now = time.perf_counter()
        if self.ended:
            return
        if now - self.last >= self.interval or done_s >= total_s:
            self.last, self.ended = now, done_s >= total_s
            speed = done_s / max(now - self.t0, 1e-9)
            print(f"transcribed {done_s:.1f} of {total_s:.1f} s ({speed:.1f}x real time)", file=sys.stderr, flush=True)


def drafter_for(args: argparse.Namespace) -> str | Path | None:
    """The drafter folder the run uses: --drafter, or on the CPU the model's own (`model_store.default_drafter_dir`).

    On CUDA none by default: there the speculative engine's setup (its CUDA graphs: catch-up, verify and look-ahead
    buckets) cost more than its faster steps saved on files of up to 230 s (H100: 2.7 s against 1.8 s without a
    drafter for one 230 s file, 3.0 against 1.0 s for five files; docs/benchmarks.md, issue 5, thirty-sixth
    session); `--drafter DIR` still turns it on, for long files."""
    if args.reference or args.drafter == "none":
        return None
    if args.drafter is not None:
        return args.drafter
    return None if str(args.device).startswith("cuda") else default_drafter_dir(args.model)


def transcribe_files(model: VoxtralRealtime, tokenizer: TextTokenizer, audios: list[np.ndarray],
                     args: argparse.Namespace) -> list[TranscriptionResult]:
    t0 = time.perf_counter()
    if args.reference:
        results = [transcribe(model, tokenizer, a, delay_ms=args.delay_ms) for a in audios]
        seconds = sum(a.size for a in audios) / model.config.audio.sampling_rate
        dt = time.perf_counter() - t0
        logger.info("%.2f s of audio in %.2f s (%.1fx real time, reference session), %d tokens", seconds, dt,
                    seconds / max(dt, 1e-9), sum(len(r.token_ids) for r in results))
        return results
    drafter = drafter_for(args)
    if args.tree_nodes is not None and drafter is None:
        raise ValueError("--tree-nodes needs a drafter (a parallel one)")
    if args.max_verify_rows is not None and drafter is None:
        raise ValueError("--max-verify-rows needs a drafter")
    if args.encoder_chunk is not None and drafter is not None:
        raise ValueError("--encoder-chunk sets the encoder calls of a run without a drafter; a drafter's look-ahead "
                         "sets its own (--drafter none to use --encoder-chunk)")
    spec, chunk = None, 1
    if drafter is not None:
        spec = speculative_config(model, drafter, k=args.k, tree_nodes=args.tree_nodes,
                                  tree_max_streams=args.tree_max_streams, max_verify_rows=args.max_verify_rows)
        logger.info("drafter %s (%s, k = %d)", drafter, type(spec.drafter).__name__, spec.num_speculative_tokens)
    else:
        chunk = args.encoder_chunk or (CPU_PLAIN_ENCODER_CHUNK if model.device.type == "cpu" else 1)
    opts = offline_options(len(audios), args.batch, spec, cuda_graphs=not args.no_cuda_graphs,
                           encoder_stream=not args.no_encoder_stream, encoder_chunk=chunk)
    if spec is None:
        logger.info("no drafter; encoder calls of up to %d audio tokens", opts.encoder_chunk)
    run = transcribe_batch(model, tokenizer, audios, delay_ms=args.delay_ms, opts=opts, speculative=spec,
                           progress=ProgressReport() if args.progress else None)
    for line in run_summary(run, sum(a.size for a in audios) / model.config.audio.sampling_rate, spec):
        logger.info("%s", line)
    return run.results


def load_inputs(files: list[str], rate: int) -> tuple[list[tuple[str, np.ndarray]], list[str]]:
    """Each file's samples at `rate`, or its error message (the message names the file): one unreadable file does
    not stop the others."""
    loaded, errors = [], []
    for f in files:
        try:
            loaded.append((f, load_audio_file(f, rate)))
        except AudioError as exc:
            errors.append(str(exc))
    return loaded, errors


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0, every file transcribed; 1, some files could not be read (each named on stderr; the others are
    transcribed); 2, nothing transcribed (bad arguments, model, or no readable file)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        _check(args)
        dtype = DTYPES[args.dtype] if args.dtype else default_dtype(args.device)
        model, tokenizer = load_model_and_tokenizer(args.model, device=args.device, dtype=dtype)
        loaded, errors = load_inputs(args.files, model.config.audio.sampling_rate)
        for message in errors:
            print(f"error: {message}", file=sys.stderr)
        if not loaded:
            return 2
        results = transcribe_files(model, tokenizer, [a for _, a in loaded], args)
    except (AudioError, ConfigError, CheckpointError, TokenizerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing was transcribed", file=sys.stderr)
        return 130
    if len(args.files) == 1:
        print(results[0].text.strip())
    else:
        for (f, _), r in zip(loaded, results):
            print(f"{f}\t{one_line(r.text)}")
    if args.srt is not None or args.words is not None:
        cfg, result, audio = model.config, results[0], loaded[0][1]
        clock = TokenClock(cfg.streaming.n_left_pad_tokens, cfg.delay_tokens(args.delay_ms), cfg.token_duration_ms)
        audio_ms = audio.size * 1000 // cfg.audio.sampling_rate
        words = words_of_tokens(((ev.position, ev.text) for ev in result.events), clock, audio_ms)
        try:
            if args.words is not None:
                args.words.write_text(json.dumps([w.to_json() for w in words], indent=1), encoding="utf-8")
            if args.srt is not None:
                args.srt.write_text(to_srt(words), encoding="utf-8")
        except OSError as exc:  # the transcript is printed above; the files are what failed
            print(f"error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
            return 1
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
