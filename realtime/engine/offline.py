"""Offline transcription of whole files through the batched engine (optionally speculative).

The engine is driven synchronously in the calling thread (no engine thread, no pacing): every
file is pushed at once and finished, so each stream has its whole audio buffered, which is the
case speculation speeds up most (one verify step accepts several tokens). Files beyond
`max_streams` wait for a free slot. Output tokens equal `realtime.session.transcribe`'s.

    python -m realtime.engine.offline --model DIR [--drafter DIR [--k K]] [--device cuda --dtype bf16] FILE...
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..audio import AudioError, as_mono_float32
from ..model import VoxtralRealtime
from ..serving import EngineStats, StreamDone, StreamEvent, StreamFailed, StreamToken
from ..session import TokenEvent, TranscriptionResult
from ..tokenizer import TextTokenizer
from .engine import BatchedEngine
from .model_runner import RunnerOptions
from .speculation import SpeculativeConfig

logger = logging.getLogger(__name__)


@dataclass
class OfflineRun:
    results: list[TranscriptionResult]
    seconds: float
    steps: int
    stats: EngineStats


class _Collector:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.events: list[TokenEvent] = []  # as a streaming session reports them (word timings come from these)
        self.done: StreamDone | StreamFailed | None = None

    def __call__(self, ev: StreamEvent) -> None:
        if isinstance(ev, StreamToken):
            if ev.token_id >= 0:
                self.tokens.append(ev.token_id)
            self.events.append(TokenEvent(ev.token_id, ev.position, ev.text, ev.audio_end_ms))
        else:
            self.done = ev


def run_engine_offline(engine: BatchedEngine, audios: Sequence[np.ndarray], *, delay_ms: int | None = None,
                       max_steps: int = 10_000_000, progress: Callable[[float, float], None] | None = None
                       ) -> OfflineRun:
    """Transcribe `audios` (16 kHz mono float32) on an engine that is not running its own thread.

    progress: called after every step with (seconds of audio decoded so far, seconds in all): a clip counts the audio
    its last token was decided on, a finished clip all of it."""
    if engine._thread is not None:
        raise RuntimeError("run_engine_offline drives the engine itself: do not start() it")
    clips = [as_mono_float32(a) for a in audios]
    for i, a in enumerate(clips):
        if a.size == 0:
            raise AudioError(f"audio #{i} is empty: nothing to transcribe")
    waiting = deque(range(len(clips)))
    open_: dict[int, tuple[int, _Collector]] = {}  # clip index -> (stream id, collector)
    results: dict[int, TranscriptionResult] = {}
    prompt_len = engine.config.prompt_length(engine.config.delay_tokens(delay_ms))
    steps0 = engine._step
    t0 = time.perf_counter()
    rate = engine.config.audio.sampling_rate
    total_s = sum(a.size for a in clips) / rate
    for _ in range(max_steps):
        while waiting and engine._free_slots:
            i = waiting.popleft()
            col = _Collector()
            sid = engine.open_stream(col, delay_ms=delay_ms)
            engine.push_audio(sid, clips[i])
            engine.finish_stream(sid)
            open_[i] = (sid, col)
        for i, (sid, col) in list(open_.items()):
            if col.done is not None:
                engine.close_stream(sid)
                del open_[i]
                if isinstance(col.done, StreamFailed):
                    raise RuntimeError(f"audio #{i} failed: {col.done.message}")
                results[i] = TranscriptionResult(col.done.text, col.tokens, col.events, prompt_len)
        if progress is not None:
            heard_ms = sum(col.events[-1].audio_end_ms for _, col in open_.values() if col.events)
            progress(min(sum(clips[i].size for i in results) / rate + heard_ms / 1000, total_s), total_s)
        if not waiting and not open_:
            break
        # the engine loop body, in this thread (same package: the engine's own step functions)
        engine._run_step(engine._sync_with_clients())
    else:
        raise RuntimeError(f"offline run did not finish in {max_steps} steps")
    engine._sync_with_clients()  # process the closes: slots and KV back
    return OfflineRun([results[i] for i in range(len(clips))], time.perf_counter() - t0, engine._step - steps0,
                      engine.stats())


def transcribe_batch(model: VoxtralRealtime, tokenizer: TextTokenizer, audios: Sequence[np.ndarray], *,
                     delay_ms: int | None = None, opts: RunnerOptions | None = None,
                     speculative: SpeculativeConfig | None = None,
                     progress: Callable[[float, float], None] | None = None) -> OfflineRun:
    """Transcribe several clips at once on a fresh batched engine (`progress`: see `run_engine_offline`)."""
    if opts is None:
        n = max(1, min(len(audios), 64))
        opts = RunnerOptions(max_streams=n, max_batch=n, cuda_graphs=model.device.type == "cuda")
    engine = BatchedEngine(model, tokenizer, opts=opts, speculative=speculative)
    return run_engine_offline(engine, audios, delay_ms=delay_ms, progress=progress)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def default_dtype(device: str) -> torch.dtype:
    """bf16 on CUDA, fp32 elsewhere (the command lines' default)."""
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def speculative_config(model: VoxtralRealtime, drafter_dir: str | Path, *, k: int | None = None,
                       tree_nodes: int | None = None, tree_max_streams: int = 1) -> SpeculativeConfig:
    """Load the drafter in `drafter_dir` for `model` (on its device, in its dtype) and configure speculation: `k`
    drafts per round (None: the drafter kind's default), optionally a tree of `tree_nodes` drafts in steps where
    at most `tree_max_streams` streams draft."""
    from speculative.capability import default_num_speculative_tokens
    from speculative.drafter import load_drafter

    drafter = load_drafter(drafter_dir, target_embedding=model.language_model.embed_tokens.weight,
                           device=model.device, dtype=model.dtype)
    k = default_num_speculative_tokens(drafter) if k is None else k
    return SpeculativeConfig(drafter, num_speculative_tokens=k, tree_nodes=tree_nodes,
                             tree_max_streams=tree_max_streams if tree_nodes else None)


def offline_options(files: int, batch: int, spec: SpeculativeConfig | None, *,
                    cuda_graphs: bool = True, encoder_stream: bool = True) -> RunnerOptions:
    """Engine options for `files` clips decoded `batch` at a time."""
    n = max(1, min(batch, files))
    k = spec.num_speculative_tokens if spec is not None else 0
    return RunnerOptions(max_streams=n, max_batch=n, cuda_graphs=cuda_graphs,  # the runner captures on CUDA only
                         encoder_stream=encoder_stream, max_step_tokens=max(8, k + 1))


def run_summary(run: OfflineRun, audio_seconds: float, spec: SpeculativeConfig | None) -> list[str]:
    """The lines a command line logs after an offline run: speed, and speculation's acceptance."""
    st = run.stats
    lines = [f"{audio_seconds:.1f} s of audio in {run.seconds:.2f} s ({audio_seconds / max(run.seconds, 1e-9):.1f}x "
             f"real time), {run.steps} steps, {st.tokens_emitted} tokens"]
    if spec is not None:
        tree = f", tree of {spec.tree_nodes} nodes" if spec.tree_nodes else ""
        per = [round(a / d, 3) if d else 0 for a, d in zip(st.spec_accepted_per_position, st.spec_drafted_per_position)]
        lines.append(f"speculation (k = {spec.num_speculative_tokens}{tree}): acceptance rate "
                     f"{st.spec_acceptance_rate:.3f}, mean acceptance length {st.spec_mean_acceptance_length:.2f}, "
                     f"per position {per}")
    return lines


def main(argv: list[str] | None = None) -> int:
    from ..audio import load_audio_file
    from ..config import ConfigError
    from ..loader import CheckpointError
    from ..model_store import load_model_and_tokenizer
    from ..tokenizer import TokenizerError

    ap = argparse.ArgumentParser(description="Offline transcription of files on the batched engine.")
    ap.add_argument("--model", default="default", help="checkpoint folder, or 'default'")
    ap.add_argument("--drafter", default=None, help="Eagle drafter folder: turns speculative decoding on")
    ap.add_argument("--k", type=int, default=None,
                    help="draft tokens per step (default: 6 for a parallel or two-pass drafter, 4 for a chained one)")
    ap.add_argument("--tree-nodes", type=int, default=None,
                    help="verify a tree of this many drafts per round instead of one chain (parallel drafters)")
    ap.add_argument("--tree-max-streams", type=int, default=1,
                    help="with --tree-nodes: the tree only in steps where at most this many files draft, the chain "
                         "in the others (default 1)")
    ap.add_argument("--delay-ms", type=int, default=None)
    ap.add_argument("--batch", type=int, default=16, help="streams decoded together")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--no-encoder-stream", action="store_true",
                    help="keep the encoder on the main CUDA stream (RunnerOptions.encoder_stream)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    dtype = DTYPES[args.dtype] if args.dtype else default_dtype(args.device)
    try:
        if args.tree_nodes is not None and not args.drafter:
            raise ValueError("--tree-nodes needs --drafter (a parallel drafter)")
        model, tok = load_model_and_tokenizer(args.model, device=args.device, dtype=dtype)
        spec = None
        if args.drafter:
            spec = speculative_config(model, args.drafter, k=args.k, tree_nodes=args.tree_nodes,
                                      tree_max_streams=args.tree_max_streams)
        audios = [load_audio_file(f, model.config.audio.sampling_rate) for f in args.files]
        opts = offline_options(len(audios), args.batch, spec, cuda_graphs=not args.no_cuda_graphs,
                               encoder_stream=not args.no_encoder_stream)
        run = transcribe_batch(model, tok, audios, delay_ms=args.delay_ms, opts=opts, speculative=spec)
    except (AudioError, ConfigError, CheckpointError, TokenizerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for f, r in zip(args.files, run.results):
        print(f"{f}\t{r.text.strip()}")
    for line in run_summary(run, sum(a.size for a in audios) / model.config.audio.sampling_rate, spec):
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
