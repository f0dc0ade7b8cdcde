"""The encoder step: new audio tokens of a batch of streams into the encoder cache.

Live decoding encodes one audio token per stream per step (n = 1). Speculating k tokens at LM
position p needs the audio embeddings of positions p .. p+k, so the encoder must then run ahead
of the LM, several tokens per call. One call encodes `n` consecutive audio tokens for each stream of
a batch (n a power of two up to the largest chunk): the raw sample windows [B, samples for 8n mel
frames] through the log-mel front-end (float64 FFT on the device), the conv stem (per stream state),
the encoder layers (paged sliding-window attention, 4n query frames per stream: the encoder ring is
sized for `fpt * max(max_step_tokens, encoder_chunk)` queries) and the adapter; the n
embeddings of each stream land in the runner's `audio_cache` ring at rows `slot * C + position % C`. A stream that needs 7 tokens runs in the 4-, 2- and 1-token calls of
the step, in that order (its tokens stay in sequence: each call starts where the last ended).

Buffers are persistent (their index metadata comes in one host copy per call, `staging`; the
sample windows in one more, from a pinned buffer) and, on CUDA, each chunk size has graphs per batch
bucket, captured on padding rows like the decode graphs; the eager path runs the same code on the
exact batch. The log-mel runs inside the graph: eagerly it was ~15 launches per call, which at batch
1 cost more host time than the rest of the encoder step's launch (one graph replay).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from kernels.linear import MAX_INVARIANT_ROWS
from kernels.paged_attention import splits_for_streams

from .attention import PagedAttention
from .cuda_graph import DecodeGraphRunner, high_priority_stream
from .staging import Field, StagingRing, StepMetadata
from .stream import EngineStream

if TYPE_CHECKING:  # the runner owns this encoder step
    from .model_runner import ModelRunner

logger = logging.getLogger(__name__)


def chunk_sizes(max_chunk: int) -> list[int]:
    """Powers of two up to `max_chunk`, largest first."""
    sizes, n = [], 1
    while n <= max_chunk:
        sizes.append(n)
        n *= 2
    return sizes[::-1]


class LookaheadEncoder:
    def __init__(self, runner: ModelRunner, max_chunk: int) -> None:
        c = runner.cfg
        ring_tokens = runner.enc_cache.spec.max_q_len // c.streaming.downsample_factor
        if max_chunk > ring_tokens:
            raise ValueError(f"encoder chunk {max_chunk} exceeds the {ring_tokens} audio tokens a call may query "
                             "(the encoder KV ring is sized for max(max_step_tokens, encoder_chunk) tokens per call)")
        if max_chunk > runner.cache_len:
            raise ValueError(f"encoder chunk {max_chunk} exceeds the audio cache ring ({runner.cache_len} tokens)")
        self.runner = runner
        self.sizes = chunk_sizes(max_chunk)
        self.max_chunk = self.sizes[0]
        self.fpt = fpt = c.streaming.downsample_factor
        self.mpt = c.streaming.mel_frames_per_token
        # the most rows a call of several tokens sends to `linear`'s batch-invariant kernel: the conv stem's rows of
        # one stream at the largest chunk (256 at 32 tokens), so that it gives the bits of one-token calls. One-token
        # calls keep the runner's `encoder_rows` (64), as a plain runner's steps do: at 16 streams and more both
        # take cuBLAS, whose bits agree across row counts far more often than the kernel's and cuBLAS's do (batch
        # 16, bf16: 10 of 16 streams equal to plain decoding against 3 with 256 for every call; forty-fifth session)
        self.chunk_rows = max(runner.encoder_rows, min(MAX_INVARIANT_ROWS, self.mpt * self.max_chunk))
        # a step's own need: calls of up to this many tokens take any number of streams
        self.step_chunk = min(self.max_chunk, chunk_sizes(runner.opts.max_step_tokens)[0])
        dev, width = runner.device, runner.enc_cache.width
        # the most streams a call of n tokens takes (`tokens_per_call`): all of a step's for n <= step_chunk, else as
        # many as keep its conv rows within chunk_rows (one stream at 32 tokens). Its buffers and graphs are sized
        # to that: a server of hundreds of streams captures no 32-token graph for hundreds of them
        self.max_streams = {n: runner.opts.max_batch if n <= self.step_chunk else
                            max(1, min(runner.opts.max_batch, self.chunk_rows // (self.mpt * n))) for n in self.sizes}
        # sample windows of each call: filled on the host (pinned) and copied once per call
        need = {n: runner.mel.samples_needed(self.mpt * n) for n in self.sizes}
        bs = self.max_streams
        self.samples = {n: torch.zeros(bs[n], need[n], device=dev, dtype=torch.float32) for n in self.sizes}
        # CUDA: the windows go through pinned staging rows (a ring per chunk size, see `staging`)
        self._rings = {n: StagingRing(runner.fence) for n in self.sizes} if dev.type == "cuda" else {}
        self._staging = {n: [torch.zeros(bs[n], need[n], dtype=torch.float32, pin_memory=True)
                             for _ in range(ring.depth)] for n, ring in self._rings.items()}
        self._staging_np = {n: [t.numpy() for t in ts] for n, ts in self._staging.items()}
        # which stream (row of `tables`) each query frame belongs to, per chunk size (constant)
        self.seq = {n: torch.arange(bs[n], dtype=torch.int32, device=dev).repeat_interleave(fpt * n)
                    for n in self.sizes}
        pad_row = runner.pad_slot * runner.cache_len
        self.meta = {n: StepMetadata({
            "slots": Field((bs[n],), torch.int64, runner.pad_slot),  # conv-state row (pad row for padding)
            "pos": Field((bs[n] * fpt * n,), torch.int32, -1),  # encoder frame positions (-1: padding)
            "slot_mapping": Field((bs[n] * fpt * n,), torch.int64, -1),
            "tables": Field((bs[n], width), torch.int32, 0),
            "rows": Field((bs[n] * n,), torch.int64, pad_row),  # audio cache rows of the new embeddings
        }, dev, runner.fence) for n in self.sizes}
        self.graphs: dict[int, DecodeGraphRunner] = {}
        if runner.opts.cuda_graphs and dev.type == "cuda":
            # with an encoder stream these graphs run beside the LM's: captured on a stream of their own,
            # so that their GEMMs get a cuBLAS workspace of their own (`DecodeGraphRunner.capture_stream`). In a
            # green context (`RunnerOptions.encoder_sms`) that is the encoder's stream itself: a kernel node keeps
            # the context it was captured in, so only a capture there confines the replays to its SMs
            capture = None
            if runner.enc_stream is not None:
                capture = runner.enc_stream if runner.enc_green is not None else (
                    high_priority_stream(dev) if runner.favoured == "encoder" else torch.cuda.Stream(dev))
            for n in self.sizes:
                g = DecodeGraphRunner(lambda bb, n=n: self._forward(n, bb), bs[n], dev, capture)
                g.capture()
                self.graphs[n] = g
            logger.info("captured look-ahead encoder graphs for chunks %s", self.sizes)

    def tokens_per_call(self, streams: int) -> int:
        """The most audio tokens a stream gets in a look-ahead call of `streams` streams: `max_chunk`, as far as the
        call's conv-stem rows (mel frames) stay within `chunk_rows` on `linear`'s batch-invariant kernel, so that it
        gives the bits of one-token calls; never below `step_chunk` (more streams than that keeps on the kernel take
        cuBLAS as before 32-token calls). With 32-token chunks: one stream (batch 1, a chain's calls) 32 tokens, two
        16, four or more 8."""
        fit = chunk_sizes(max(1, self.chunk_rows // (self.mpt * max(1, streams))))[0]
        return min(self.max_chunk, max(fit, self.step_chunk))

    @torch.no_grad()
    def encode_buffered(self, work: list[tuple[EngineStream, int]], ahead: bool = False) -> None:
        """For each (stream, anchor): as much of its buffered audio as one call gives a stream
        (`tokens_per_call`), never past the audio received, the stream's last position, or position anchor + C
        (ring rows of positions above the anchor are still to be read). Streams with none are left out."""
        most, ring = self.tokens_per_call(len(work)), self.runner.cache_len
        counts = []
        for s, anchor in work:
            bound = min(anchor + 1 + ring, s.last_position() + 1)
            if bound <= s.audio_done:  # (before the costlier count of the audio received: many streams stop here)
                continue
            upper = min(s.audio_done + s.audio_tokens_ready(self.mpt), bound)
            if upper > s.audio_done:
                counts.append((s, int(min(upper - s.audio_done, most))))
        self.encode(counts, ahead)

    def _forward(self, n: int, b: int) -> None:
        """Encode `n` tokens for the first `b` rows of the buffers (graph-capturable), the encoder's projections
        sending up to the runner's `encoder_rows` rows (`chunk_rows` for several tokens) to the batch-invariant
        kernel."""
        with self.runner.model.encoder_rows(self.runner.encoder_rows if n == 1 else self.chunk_rows):
            self._encode(n, b)

    def _encode(self, n: int, b: int) -> None:
        r, m = self.runner, self.meta[n].dev
        rows = b * self.fpt * n
        slots = m["slots"][:b]
        state = (r.conv1_state.index_select(0, slots), r.conv2_state.index_select(0, slots))
        mel = r.mel.from_padded(self.samples[n][:b], self.mpt * n).to(r.dtype)  # [b, n_mels, 8n]
        frames, (s1, s2) = r.model.audio_tower.embedder(mel, state)
        r.conv1_state.index_copy_(0, slots, s1)
        r.conv2_state.index_copy_(0, slots, s2)
        pos = m["pos"][:rows]
        # each audio token's 4 frames are consecutive rows of one stream: one key read per 4 queries; key splits
        # by the streams, not the runs, so n tokens in one call give each stream the bits of n one-token calls
        spec = r.enc_cache.spec
        splits = splits_for_streams(b, spec.kv_heads, spec.window, self.fpt, r.device)
        backend = PagedAttention(r.enc_cache, m["slot_mapping"][:rows], m["tables"], self.seq[n][:rows], pos,
                                 tokens_per_run=self.fpt, num_splits=splits)
        hidden = r.model.audio_tower(frames.reshape(1, rows, -1), pos[None], backend)
        # the adapter stacks 4 consecutive frames: each stream's 4n frames are contiguous and aligned
        r.audio_cache.index_copy_(0, m["rows"][: b * n], r.model.multi_modal_projector(hidden)[0])

    @torch.no_grad()
    def encode(self, work: list[tuple[EngineStream, int]], ahead: bool = False) -> None:
        """Encode `count` more audio tokens for each (stream, count); advances `stream.audio_done`.
        `ahead`: for the next step, which waits for it (`ModelRunner.on_encoder_stream`)."""
        top = self.max_chunk
        # counts above the largest chunk take several full-chunk calls; the rest is binary
        for i in range(max((count // top for _, count in work), default=0)):
            self._encode_group([s for s, count in work if count // top > i], top, ahead)
        for n in self.sizes[1:]:
            self._encode_group([s for s, count in work if count & n], n, ahead)

    def _encode_group(self, group: list[EngineStream], n: int, ahead: bool) -> None:
        most = self.max_streams[n]
        if len(group) > most:  # more streams than a call of n tokens takes (`tokens_per_call` keeps under it)
            for i in range(0, len(group), most):
                self._encode_group(group[i: i + most], n, ahead)
            return
        if not group:
            return
        frames = self.mpt * n
        windows = [s.mel.window_samples(frames) for s in group]  # views of each stream's sample buffer
        self.run(n, windows, [s.slot for s in group], [s.audio_done for s in group], ahead)
        for s in group:
            s.mel.advance(frames)
            s.audio_done += n

    @torch.no_grad()
    def run(self, n: int, windows: Sequence[np.ndarray | torch.Tensor], slots: list[int], audio_done: list[int],
            ahead: bool = False) -> None:
        """Encode `n` tokens per stream from its host sample window (the samples its next 8n mel
        frames read, `IncrementalLogMel.window_samples`; a CPU tensor also does): stream i (cache slot
        `slots[i]`) at audio token index `audio_done[i]`, on the encoder's stream
        (`ModelRunner.on_encoder_stream`: `ahead` for the next step's audio). (Benchmarks drive the encoder
        through this directly.)"""
        with self.runner.on_encoder_stream(ahead):
            self._run(n, windows, slots, audio_done)

    def _run(self, n: int, windows: Sequence[np.ndarray | torch.Tensor], slots: list[int],
             audio_done: list[int]) -> None:
        r, fpt = self.runner, self.fpt
        b = len(slots)
        if b > self.max_streams[n]:
            raise ValueError(f"a look-ahead call of {n} tokens takes at most {self.max_streams[n]} streams (its rows "
                             f"on the batch-invariant kernel), got {b}")
        h = self.meta[n].begin()
        cl = r.cache_len
        # every stream's rows at once (whole-array numpy: the host cost of a step with hundreds of
        # streams stays a few array operations, not a few per stream)
        slot_a = np.asarray(slots, dtype=np.int64)
        done_a = np.asarray(audio_done, dtype=np.int64)
        frames = done_a[:, None] * fpt + np.arange(fpt * n)  # [b, 4n] encoder frame positions
        h["slots"][:b] = slot_a
        h["pos"][: b * fpt * n] = frames.ravel()
        h["slot_mapping"][: b * fpt * n] = r.enc_cache.host_slots_rows(slot_a, frames).ravel()
        h["tables"][:b] = r.enc_cache.tables_host[slot_a]
        h["rows"][: b * n] = (slot_a[:, None] * cl + (done_a[:, None] + np.arange(n)) % cl).ravel()
        self.meta[n].upload()
        ring = self._rings.get(n)
        if ring is not None:  # CUDA: through pinned staging rows, one non-blocking copy
            j = ring.acquire()
            rows = self._staging_np[n][j]
            for i, w in enumerate(windows):
                rows[i] = w
            self.samples[n][:b].copy_(self._staging[n][j][:b], non_blocking=True)
            ring.mark_copied(j)
        else:  # (the host's own buffer: numpy writes into it in place)
            np.stack(windows, out=self.samples[n][:b].numpy())
        graphs = self.graphs.get(n)
        if graphs is not None:
            graphs.replay(graphs.bucket(b))
        else:
            self._forward(n, b)
