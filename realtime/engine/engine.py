"""BatchedEngine: many live streams decoded together, one step per tick, on its own thread.

Implements `realtime.serving.TranscriptionEngine`. Client threads only touch small host-side
state under a lock (a stream's inbox of audio, its flags); the engine thread owns the model, the
device buffers and the streams' decoding state, and invokes event callbacks. Streams join
and leave between steps. A joining stream gets its prompt's silent prefix from `PromptPrefixCache`
(with speculation on, the drafter's prefix too: `Speculator.join`) and runs the rest of its prompt
as decode rows, so joins never stall the batch, and the engine with and without speculation start
every stream from the same caches.

    engine = BatchedEngine(model, tokenizer, opts=RunnerOptions(max_streams=64, max_batch=64))
    engine.start()
    sid = engine.open_stream(on_event, delay_ms=480)
    engine.push_audio(sid, samples_16k_float32); ...; engine.finish_stream(sid)
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import numpy as np

from ..audio import IncrementalLogMel, as_mono_float32
from ..model import VoxtralRealtime
from ..serving import (
    AdmissionError,
    EngineStats,
    EventCallback,
    RecentSteps,
    StreamDone,
    StreamError,
    StreamEvent,
    StreamFailed,
    StreamToken,
)
from ..tokenizer import IncrementalDetokenizer, TextTokenizer
from .model_runner import ModelRunner, RunnerOptions, slot_bytes
from .prompt_prefix import PromptPrefixCache
from .scheduler import Scheduler
from .speculation import SpeculativeConfig, Speculator, runner_options_for, speculation_bytes_per_stream
from .staging import TokenCopy
from .stream import EngineStream

logger = logging.getLogger(__name__)


def bytes_per_stream(model: VoxtralRealtime, opts: RunnerOptions, speculative: SpeculativeConfig | None = None) -> int:
    """Worst-case device memory one stream slot of a `BatchedEngine(model, opts=opts,
    speculative=speculative)` reserves: the encoder and LM KV rings and audio embedding rows, and with
    speculation the drafter's KV ring, a tree's scratch blocks and the stash rows. What capacity planning
    divides free memory by; the per-row step buffers (a few tens of KiB per stream) are not counted."""
    if speculative is None:
        return slot_bytes(model, plain_options_for(opts))
    speculative = speculative.on(model.device)
    opts = runner_options_for(opts, speculative)
    return slot_bytes(model, opts) + speculation_bytes_per_stream(model, opts, speculative)


def plain_options_for(opts: RunnerOptions) -> RunnerOptions:
    """The runner options of an engine without speculation. With `encoder_chunk` > 1 its steps encode a stream's
    buffered audio (a file, an upload, a backlog) up to that many tokens a call ahead of the LM (`_encode_plain`):
    the audio ring then holds a chunk beyond the position a step reads."""
    need = opts.encoder_chunk + 1
    return opts if opts.encoder_cache_tokens >= need else replace(opts, encoder_cache_tokens=need)


@dataclass
class _Control:
    """Client-side view of a stream (guarded by the engine lock)."""

    stream: EngineStream
    joined: bool = False
    closed: bool = False


class BatchedEngine:
    fits_step_cost: ClassVar[Literal[True]] = True  # its stats() carry the fitted step-cost line (serving.FitsStepCost)

    def __init__(self, model: VoxtralRealtime, tokenizer: TextTokenizer, *, opts: RunnerOptions | None = None,
                 model_name: str = "default", speculative: SpeculativeConfig | None = None) -> None:
        self.model, self.tokenizer, self.config = model, tokenizer, model.config
        self.model_name = model_name
        self.opts = opts or RunnerOptions()
        if speculative is not None:  # off by default; it needs a deeper audio cache ring
            speculative = speculative.on(model.device)
            self.opts = runner_options_for(self.opts, speculative)
        else:
            self.opts = plain_options_for(self.opts)
        self.runner = ModelRunner(model, self.opts)
        self.speculator = Speculator(self.runner, speculative) if speculative is not None else None
        # a step's output: the runner's next ids, or the speculator's verify argmaxes and inputs
        out = self.opts.max_batch if self.speculator is None else self.speculator.v_out.numel()
        self._token_copy = TokenCopy(out, self.runner.device)
        self.prompt_prefix = PromptPrefixCache(self.runner)
        delay = self.config.delay_tokens()  # the usual delay's prefixes now, not in the first join's step
        if self.speculator is not None:
            self.speculator.prefix(self.prompt_prefix.get(delay), delay)
        else:
            self.prompt_prefix.get(delay)
        self.scheduler = Scheduler(self.opts.max_batch, self.config.streaming.mel_frames_per_token)
        self.bytes_per_stream = bytes_per_stream(model, self.opts, speculative)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._controls: dict[int, _Control] = {}
        # streams a client touched since the engine thread last looked (open, audio, finish, close):
        # between steps the engine visits only these, so a step's host cost follows the streams that
        # changed or run, not every stream admitted (a load test's profile: O(all streams) scans made
        # the engine thread the bottleneck at 512 paced streams, which run many small steps per tick)
        self._dirty: set[int] = set()
        # engine thread only: joined streams that may have work (a decodable frame or their end).
        # A stream's readiness changes only through its client (it becomes dirty) or a step it ran,
        # so a stream leaves this set when neither gives it work and comes back when dirty.
        self._candidates: dict[int, EngineStream] = {}
        self._free_slots = list(range(self.opts.max_streams - 1, -1, -1))
        self._next_id = 1
        self._stop = False
        self._thread: threading.Thread | None = None
        self._stats = EngineStats(max_streams=self.opts.max_streams)
        self._recent = RecentSteps()  # the current load (`EngineStats.recent_step_seconds`)
        self._step = 0
        # tokens decided whose text and event are not sent yet: (stream, token, LM position); `_send_tokens`
        self._unsent: list[tuple[EngineStream, int, int]] = []
        # every stream's detokeniser reads and fills this one (engine thread only: see IncrementalDetokenizer)
        self._text_cache: dict[int, tuple[str, bytes]] = {}
        in_flight = self.opts.send_tokens_in_flight
        self._send_in_flight = self.runner.device.type == "cuda" if in_flight is None else in_flight

    # -- interface (any thread) ------------------------------------------------------------------
    def start(self) -> None:
        # Long-lived model and buffers never need collecting; freezing what is alive now keeps full GC
        # passes (which would stall a step for tens of ms) short. stop() unfreezes.
        gc.collect()
        gc.freeze()
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="batched-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
            gc.unfreeze()

    def open_stream(self, on_event: EventCallback, *, delay_ms: int | None = None) -> int:
        c = self.config
        delay_tokens = c.delay_tokens(delay_ms)  # raises ConfigError for a bad delay
        mel = IncrementalLogMel.for_stream(c)  # outside the lock: the engine thread never waits for it
        with self._lock:
            if not self._free_slots:
                raise AdmissionError(
                    f"engine is full: {self.opts.max_streams} streams admitted, each reserving "
                    f"{self.bytes_per_stream / 2**20:.1f} MiB of KV caches and per-stream state (its worst case)")
            slot = self._free_slots.pop()
            sid = self._next_id
            self._next_id += 1
            stream = EngineStream(sid, slot, delay_tokens, c.prompt_ids(delay_tokens), on_event, mel,
                                  IncrementalDetokenizer(self.tokenizer, self._text_cache),
                                  max_tokens=self.runner.max_tokens)
            self._controls[sid] = _Control(stream)
            self._dirty.add(sid)
            self._stats.active_streams = len(self._controls)
            self._wake.notify_all()
        return sid

    def _control(self, stream_id: int) -> _Control:
        ctl = self._controls.get(stream_id)
        if ctl is None or ctl.closed:
            raise StreamError(f"unknown or closed stream {stream_id}")
        return ctl

    def push_audio(self, stream_id: int, samples: np.ndarray) -> None:
        arr = as_mono_float32(samples, owned=True)  # kept until a step reads it: the caller may reuse its buffer
        with self._lock:
            s = self._control(stream_id).stream
            if s.finish_in_inbox or s.finish_requested:
                raise StreamError(f"stream {stream_id} is finished: no more audio")
            if arr.size:
                s.inbox.append(arr)
                s.inbox_samples += arr.size
                self._dirty.add(stream_id)
                self._wake.notify_all()

    def finish_stream(self, stream_id: int) -> None:
        with self._lock:
            s = self._control(stream_id).stream
            s.finish_in_inbox = True
            self._dirty.add(stream_id)
            self._wake.notify_all()

    def close_stream(self, stream_id: int) -> None:
        with self._lock:
            ctl = self._controls.get(stream_id)
        if ctl is None:
            return
        # first (never holding the engine lock, which a callback may take): an event being delivered finishes, and
        # none follows, even from the step running now
        with ctl.stream.notify_lock:
            ctl.stream.client_closed = True
        with self._lock:
            ctl.closed = True
            if stream_id in self._controls:
                self._dirty.add(stream_id)
                self._wake.notify_all()

    def pending_audio_seconds(self, stream_id: int) -> float:
        """Audio the engine owes this stream: not yet ingested, or decodable and not yet decoded.

        The left padding and the look-ahead tail that waits for more audio are not owed work, so an
        idle client never looks like a stalled engine."""
        c = self.config
        with self._lock:
            ctl = self._controls.get(stream_id)
            if ctl is None or ctl.stream.done:
                return 0.0
            s = ctl.stream
            ready = (s.mel.frames_done + s.mel.available()) // c.streaming.mel_frames_per_token
            owed_tokens = max(0, ready - max(s.lm_pos, s.prompt_len - 1))
            owed = s.inbox_samples + owed_tokens * c.samples_per_token
        return owed / c.audio.sampling_rate

    def stats(self) -> EngineStats:
        with self._lock:
            st = EngineStats(sum(1 for c in self._controls.values() if not c.closed), self.opts.max_streams,
                             self._stats.steps, list(self._stats.step_seconds), self._stats.tokens_emitted,
                             recent_step_seconds=self._recent.median(time.monotonic()),
                             recent_step_streams=self._recent.median_streams(time.monotonic()))
            st.step_fixed_seconds, st.step_seconds_per_stream = self._recent.cost_line()
            if self.speculator is not None:
                m = self.speculator.metrics
                st.spec_rounds, st.spec_drafted, st.spec_accepted = m.rounds, m.drafted, m.accepted
                st.spec_drafted_per_position, st.spec_accepted_per_position = list(m.drafted_at), list(m.accepted_at)
        return st

    # -- engine thread ------------------------------------------------------------------------------
    def _sync_with_clients(self) -> list[EngineStream]:
        """Between steps: joins, leaves, new audio, finish requests of the streams clients touched.
        Returns the streams that may have work (`_candidates`)."""
        joined: list[EngineStream] = []
        self._drop_idle()
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            for sid in sorted(dirty):  # in id order: joins and frees happen in a deterministic order
                ctl = self._controls.get(sid)
                if ctl is None:
                    continue
                s = ctl.stream
                if ctl.closed:
                    s.closed = True
                    if ctl.joined:
                        self.runner.release(s.slot)
                        if self.speculator is not None:
                            self.speculator.release(s.slot)
                    self._free_slots.append(s.slot)
                    del self._controls[sid]
                    self._candidates.pop(sid, None)
                    continue
                if not ctl.joined:
                    self.runner.admit(s.slot)
                    ctl.joined = True
                    joined.append(s)
                chunks = list(s.inbox)
                s.inbox.clear()
                s.inbox_samples = 0
                if chunks:
                    s.ingest(chunks)
                if s.finish_in_inbox and not s.finish_requested:
                    self._apply_finish(s)
                self._candidates[sid] = s
            self._stats.active_streams = len(self._controls)
        # joins from the prefix cache (device copies: outside the lock clients take)
        if joined:
            try:
                self.prompt_prefix.apply(joined)
                if self.speculator is not None:
                    self.speculator.join(joined, self.prompt_prefix)
                # now, not at the next encoder call: that one comes after this step's LM launch, which
                # the encoder's stream would then wait for too
                self.runner.encoder_after_admissions()
            except Exception as exc:  # a failed join fails those streams, never the engine
                logger.exception("joining streams failed")
                for s in joined:
                    self._fail_stream(s, f"joining failed: {type(exc).__name__}: {exc}")
        return list(self._candidates.values())

    def _apply_finish(self, s: EngineStream) -> None:
        pad, s.total_tokens = self.config.finish_padding(s.user_samples, s.delay_tokens)
        s.mel.push(np.zeros(pad, dtype=np.float32))
        s.finish_requested = True

    def _has_pending_work(self) -> bool:
        return bool(self._dirty)

    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._stop:
                    break
            live = self._sync_with_clients()
            ran = self._run_step(live)
            if not ran:
                with self._lock:
                    if not self._stop and not self._has_pending_work():
                        self._wake.wait(timeout=0.25)
        self._send_tokens()  # a stopped engine still delivers the tokens it decided

    def _drop_idle(self) -> None:
        """Streams without work (no decodable frame, not at their end) leave `_candidates` until their
        client touches them again."""
        mpt = self.config.streaming.mel_frames_per_token
        for s in list(self._candidates.values()):
            if s.done or not (s.is_finished() or s.has_frame(mpt)):
                self._candidates.pop(s.stream_id, None)

    def _run_step(self, live: list[EngineStream]) -> bool:
        ended = [s for s in live if not s.done and s.is_finished()]
        for s in ended:
            self._end_stream(s)
        plan = self.scheduler.plan(live, self._step)
        if not plan:
            self._send_tokens()  # no step follows now to hide them behind
            return bool(ended)
        t0 = time.perf_counter()
        mpt = self.config.streaming.mel_frames_per_token
        # a stream alone in the step with audio for several rounds: its speculative rounds chained on the device
        chained = self.speculator.chainable(plan.decode) if self.speculator is not None else 0
        try:
            if chained:
                self._send_tokens()
                decoded = [self.speculator.run_chained(plan.decode[0], chained)]
            else:
                host = self._launch_step(plan.decode, mpt)
        except Exception as exc:  # a failing step fails its streams, never the engine
            logger.exception("engine step failed")
            for s in plan.decode:
                self._fail_stream(s, f"engine step failed: {type(exc).__name__}: {exc}")
            return True
        dt = time.perf_counter() - t0
        if self.speculator is not None and not chained:
            # per stream: its accepted drafts and the target's token after them (one token, no
            # drafts, for a prompt row)
            decoded = self.speculator.accept(plan.decode, host)
        elif not chained:
            decoded = [[tok] for tok in host]
        n_emitted = 0
        for s, toks in zip(plan.decode, decoded):
            for tok in toks:
                s.lm_pos += 1
                if s.lm_pos < s.prompt_len:  # a prompt position ran: the next input is the prompt's own
                    continue
                self._record_token(s, int(tok))
                n_emitted += 1
                if s.is_finished():  # EOS among accepted tokens: nothing after it is kept
                    break
        if not self._send_in_flight:
            self._send_tokens()
        self._step += 1
        with self._lock:
            self._stats.steps += 1
            self._stats.step_seconds.append(dt)
            del self._stats.step_seconds[:-4096]
            self._recent.add(dt, time.monotonic(), len(plan.decode))
            self._stats.tokens_emitted += n_emitted
        for s in plan.decode:
            if s.is_finished() and not s.done:
                self._end_stream(s)
        return True

    def _launch_step(self, streams: list[EngineStream], mpt: int) -> list[int]:
        """One step (plain, or one speculative round) for `streams`: its launches, the next step's look-ahead
        queued behind them, and the step's output on the host."""
        if self.speculator is not None:
            ids = self.speculator.step(streams)  # look-ahead encoding, drafts, verify
        else:
            need_audio = [s for s in streams if s.audio_done <= s.lm_pos]
            if need_audio:
                self._encode_plain(need_audio, ahead=False)
            ids = self.runner.decode_step(streams)
        # the one device -> host transfer of the step, queued now: the host later waits for it alone
        queued = self.runner.fence.mark()
        self._token_copy.start(ids)
        if self.opts.encode_ahead:
            # the next step's audio, where it has arrived, is encoded now, queued behind this step: its
            # host work overlaps the device, the tokens do not wait for it, and the next step has none.
            # Queued as an ahead call (`ModelRunner.on_encoder_stream`): where the runner has an encoder
            # stream (CUDA, not speculating) it runs beside this step, writing ring rows of later
            # positions than this step reads.
            if self.speculator is not None:
                self.speculator.look_ahead_next()
            else:
                ahead = [s for s in streams if s.audio_done == s.lm_pos + 1 <= s.last_position()
                         and s.audio_tokens_ready(mpt)]
                if ahead:
                    self._encode_plain(ahead, ahead=True)
        if self._send_in_flight:
            # the previous step's text and events, while the device runs this one (after the next step's encoder
            # work is queued: the device gets its work first, the clients their tokens a little later)
            self._send_tokens()
        host = self._token_copy.wait()
        self.runner.fence.passed(queued)  # the staging copies queued before the tokens have run
        return host

    def _encode_plain(self, streams: list[EngineStream], ahead: bool) -> None:
        """A plain step's audio: one token a stream, or with `encoder_chunk` > 1 as much of each stream's buffered
        audio as one look-ahead call takes (`LookaheadEncoder.encode_buffered`, bit-exact against one-token calls),
        into ring rows of positions below lm_pos + C (anchor lm_pos - 1: the step reads the row of lm_pos; an ahead
        call starts above it). At batch 1 a call of 32 tokens costs the device about what a call of one does
        (issue 5)."""
        if self.opts.encoder_chunk == 1:
            self.runner.encode_step(streams, ahead=ahead)
        else:
            self.runner.encoder.encode_buffered([(s, s.lm_pos - 1) for s in streams], ahead)

    def _record_token(self, s: EngineStream, tok: int) -> None:
        """A decided token: now, what the next step and the stream's end depend on; its text and event later."""
        s.tokens.append(tok)
        if tok == self.config.tokens.eos:
            s.ended_by_eos = True
        if s.max_tokens is not None and len(s.tokens) >= s.max_tokens and not s.is_finished():
            s.truncated = True
        self._unsent.append((s, tok, len(s.tokens) - 1))

    def _send_tokens(self) -> None:
        """The text and events of the tokens recorded so far, in order. With `send_tokens_in_flight` (CUDA) the
        engine sends a step's tokens while the device runs the next step (`_launch_step`, once that step's launches
        are queued): detokenising and the callbacks took the host about 3 us a token (forty-ninth session, H100 host),
        which the device would otherwise sit out. They go at once where no step follows (an idle engine) and before
        a stream's end or failure, so a client sees every token, in order, before its stream's last event; without
        the option, at the end of their own step. A stream its client closed gets none."""
        unsent, self._unsent = self._unsent, []
        for s, tok, pos in unsent:
            if s.closed:
                continue
            self._emit_token(s, tok, pos)

    def _emit_token(self, s: EngineStream, tok: int, pos: int) -> None:
        text = "" if tok == self.config.tokens.eos else s.detok.push(tok)
        self._notify(s, StreamToken(s.stream_id, tok, text, pos, self.config.audio_end_ms(pos)))

    @staticmethod
    def _notify(s: EngineStream, event: StreamEvent) -> None:
        """One event to its stream's client, unless the client closed it; a callback that raises loses that event
        (logged), nothing else."""
        with s.notify_lock:
            if s.client_closed:
                return
            try:
                s.on_event(event)
            except Exception:  # a client's callback: its failure is its own
                logger.exception("event callback of stream %d failed", s.stream_id)

    def _end_stream(self, s: EngineStream) -> None:
        self._send_tokens()
        s.done = True
        tail = s.detok.flush()
        last = len(s.tokens) - 1
        if tail:
            self._notify(s, StreamToken(s.stream_id, -1, tail, last, self.config.audio_end_ms(last)))
        self._notify(s, StreamDone(s.stream_id, s.detok.text, s.prompt_len, len(s.tokens) - s.prompt_len,
                                   s.ended_by_eos, s.truncated))

    def _fail_stream(self, s: EngineStream, message: str) -> None:
        self._send_tokens()
        s.done = True
        self._notify(s, StreamFailed(s.stream_id, message))
