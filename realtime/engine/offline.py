"""Offline transcription of whole files through the batched engine (optionally speculative).

The engine is driven synchronously in the calling thread (no engine thread, no pacing): every
file is pushed at once and finished, so each stream has its whole audio buffered, which is the
case speculation speeds up most (one verify step accepts several tokens). Files beyond
`max_streams` wait for a free slot. Output tokens equal `realtime.session.transcribe`'s.

The command line on top of it is `python -m realtime.transcribe` (`realtime/transcribe.py`).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..audio import AudioError, as_mono_float32
from ..model import VoxtralRealtime
from ..serving import EngineStats, StreamDone, StreamEvent, StreamFailed, StreamToken
from ..session import TokenEvent, TranscriptionResult
from ..tokenizer import TextTokenizer
from .engine import BatchedEngine
from .model_runner import RunnerOptions
from .speculation import SpeculativeConfig, step_tokens_for

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
        opts = offline_options(len(audios), 64, speculative, cuda_graphs=model.device.type == "cuda")
    engine = BatchedEngine(model, tokenizer, opts=opts, speculative=speculative)
    return run_engine_offline(engine, audios, delay_ms=delay_ms, progress=progress)


def speculative_config(model: VoxtralRealtime, drafter_dir: str | Path, *, k: int | None = None,
                       tree_nodes: int | None = None, tree_max_streams: int | None = 1,
                       max_verify_rows: int | None = None) -> SpeculativeConfig:
    """Load the drafter in `drafter_dir` for `model` (on its device, in its dtype) and configure speculation: `k`
    drafts per round (None: the drafter's default on this device), optionally a tree of `tree_nodes` drafts in steps
    where at most `tree_max_streams` streams draft; `max_verify_rows` caps a step's verify rows (None: the device's
    default, `SpeculativeConfig.max_verify_rows`)."""
    from speculative.capability import default_num_speculative_tokens
    from speculative.drafter import load_drafter

    drafter = load_drafter(drafter_dir, target_embedding=model.language_model.embed_tokens.weight,
                           device=model.device, dtype=model.dtype)
    k = default_num_speculative_tokens(drafter, model.device) if k is None else k
    return SpeculativeConfig(drafter, num_speculative_tokens=k, tree_nodes=tree_nodes,
                             tree_max_streams=tree_max_streams if tree_nodes else None,
                             max_verify_rows=max_verify_rows)


# a drafter-less offline run's audio tokens per encoder call on the CPU: the 5 held-out clips (20 s each, fp32, batch 1)
# decoded 2.57-2.70x faster with 32-token calls than with one token a step on the 2-core box, token for token the same
# (docs/benchmarks.md, issue 5, forty-fifth and forty-sixth sessions). CUDA keeps 1: there 32-token calls were 1.77x
# faster at batch 1 (one H100, bf16) but gave the one-token engine's tokens on only 1 of 5 clips (bf16 rounds a
# 32-row call differently), and a file's transcript should be the one a live stream of it gets (48th session)
CPU_PLAIN_ENCODER_CHUNK = 32


def offline_options(files: int, batch: int, spec: SpeculativeConfig | None, *,
                    cuda_graphs: bool = True, encoder_stream: bool = True, encoder_chunk: int = 1) -> RunnerOptions:
    """Engine options for `files` clips decoded `batch` at a time; `encoder_chunk` > 1 (runs without a drafter,
    whose look-ahead sets its own): a step encodes up to that many buffered audio tokens a call ahead of the LM."""
    if spec is not None and encoder_chunk != 1:
        raise ValueError("encoder_chunk is for runs without a drafter: a drafter's look-ahead sets its own chunks")
    n = max(1, min(batch, files))
    k = spec.num_speculative_tokens if spec is not None else 0
    return RunnerOptions(max_streams=n, max_batch=n, cuda_graphs=cuda_graphs,  # the runner captures on CUDA only
                         encoder_stream=encoder_stream, max_step_tokens=step_tokens_for(k), encoder_chunk=encoder_chunk)


def run_summary(run: OfflineRun, audio_seconds: float, spec: SpeculativeConfig | None) -> list[str]:
    """The lines a command line logs after an offline run: speed, and speculation's acceptance."""
    st = run.stats
    lines = [f"{audio_seconds:.1f} s of audio in {run.seconds:.2f} s ({audio_seconds / max(run.seconds, 1e-9):.1f}x "
             f"real time), {run.steps} steps, {st.tokens_emitted} tokens"]
    if spec is not None:
        tree = f", tree of {spec.tree_nodes} nodes" if spec.tree_nodes else ""
        per = [round(r, 3) for r in st.spec_acceptance_per_position]
        lines.append(f"speculation (k = {spec.num_speculative_tokens}{tree}): acceptance rate "
                     f"{st.spec_acceptance_rate:.3f}, mean acceptance length {st.spec_mean_acceptance_length:.2f}, "
                     f"per position {per}")
    return lines


if __name__ == "__main__":  # the command line this module had moved to realtime.transcribe (thirty-sixth session)
    print("error: use python -m realtime.transcribe (it takes every flag this module's command line took)",
          file=sys.stderr)
    raise SystemExit(2)
