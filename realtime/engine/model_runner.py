"""Runs the network for a batch of streams: persistent buffers, paged caches, encoder and LM steps.

Per step (DESIGN §4): the new 80 ms audio token of every scheduled stream goes through the
batched incremental encoder (conv stem with per-stream state, paged sliding-window attention), its
embedding lands in the encoder cache, one gather-add kernel writes `embed(token) + audio` of each
scheduled stream into the persistent `inputs_embeds`, the LM step runs (replayed from a CUDA graph
when enabled), and greedy argmax happens on the device; only token ids reach the host.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from kernels.gather_add import gather_add_embeddings
from kernels.linear import INVARIANT_ROWS, MAX_INVARIANT_ROWS, MAX_ROWS

from ..audio import LogMel
from ..model import VoxtralRealtime
from .attention import PagedAttention
from .cuda_graph import DecodeGraphRunner, high_priority_stream
from .kv_cache import CacheSpec, PagedKVCache
from .lookahead import LookaheadEncoder
from .staging import CopyFence, Field, StepMetadata
from .stream import EngineStream

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerOptions:
    max_streams: int = 16
    max_batch: int = 16
    block_size: int = 16
    max_session_seconds: float | None = None  # bounds each stream's KV when the window is larger
    cuda_graphs: bool = True
    encoder_cache_tokens: int = 8  # audio embeddings kept per stream ahead of the LM
    max_step_tokens: int = 8  # most LM positions one stream runs in a step (speculative verify: k + 1)
    # most audio tokens per stream per encoder call (speculation raises it). Above 1 in an engine without a drafter,
    # its steps encode a stream's buffered audio (files, uploads, backlogs) that many tokens a call ahead of the LM
    # (`BatchedEngine._encode_plain`); live audio still comes one token a step
    encoder_chunk: int = 1
    lm_scratch_blocks: int = 0  # LM cache blocks outside every ring (tree verification's scratch)
    # encode the next step's audio (where it has arrived) right after launching this step, so that the
    # encoder's host work overlaps the device. Off: the encoder runs only for what a step needs, as
    # before; outputs are the same up to the rounding of other encoder batchings (bf16)
    encode_ahead: bool = True
    # CUDA: the encoder runs on a CUDA stream of its own, so that the next step's audio (encode_ahead) is
    # encoded while the device runs this step's LM; both are chains of small latency-bound kernels at
    # small batches, and side by side they hide part of each other's fixed per-kernel costs. Outputs
    # are the same as with one stream (the same kernels on the same inputs)
    encoder_stream: bool = True
    # a step's token texts and events are sent while the device runs the next step (`BatchedEngine._send_tokens`):
    # detokenising and the callbacks (about 3 us a token) overlap the device instead of delaying the next launch,
    # and each token reaches its client that next step's host work later. None: on CUDA only (on the CPU the
    # "device" is the host: nothing would overlap, and a token would wait a whole step)
    send_tokens_in_flight: bool | None = None
    # CUDA with an encoder stream: the encoder's kernels run in a green context of this many SMs
    # (`torch.cuda.green_contexts`), so that they cannot spread over the SMs the LM's chain needs; the LM keeps
    # every SM. None: STREAMSCRIBE_ENCODER_SMS if set, else all SMs. Measured slower at every count tried (full-size
    # B1 on an H200, twenty-sixth session: 3.15 ms with all SMs, 3.40 / 4.11 / 5.76 ms with 64 / 32 / 16): the
    # encoder's own chain needs the SMs more than the LM's chain loses to it. Kept as a tested knob for other GPUs
    encoder_sms: int | None = None
    # CUDA graphs: which chain's kernels the block scheduler favours when both have blocks waiting for an SM
    # ("encoder": the encoder's graphs, "lm": the LM step's graphs, "none": neither). A captured kernel keeps the
    # priority of the stream it was captured on (torch instantiates graphs with per-node priorities), so the
    # favoured graphs are captured on a stream of the highest priority. None: STREAMSCRIBE_STREAM_PRIORITY if set,
    # else "none". Outputs do not change (the same kernels on the same inputs, only their order on the SMs).
    # Measured no gain (full-size B1 on an H200, twenty-ninth session: 2.965 / 2.971 / 3.143 ms for none / encoder /
    # lm); kept as a tested knob, like encoder_sms
    stream_priority: str | None = None
    # steps of ONE stream run the LM through the fused one-row kernels (`kernels.one_row`: 8 kernels a layer
    # instead of 11; B1 on an H200 0.13-0.2 ms faster, docs/benchmarks.md). None: on CUDA in fp16/bf16 unless
    # STREAMSCRIBE_ONE_ROW=0; True forces it (on the CPU the references run, equal to the unfused path bit
    # for bit); False: never. Its kernels sum in another order than the multi-row projection (which gives a
    # row the same result in any batch of up to 16 rows), so in fp16/bf16 a token at a near-tie can differ
    # between a batch-1 step and a larger batch; a speculative engine therefore leaves None as False (lossless
    # speculation: `speculation.runner_options_for`); fp32 is exact either way
    one_row_decode: bool | None = None
    # the most rows of an audio-encoder projection that go to `linear`'s batch-invariant kernel (16..256; more go to
    # cuBLAS). None: 64 (`kernels.linear.INVARIANT_ROWS`) when the runner encodes look-ahead chunks
    # (encoder_chunk > 1: speculation, whose 8-token chunks must give the bits of 8 one-token steps; its calls of
    # more than one token take up to their conv stem's rows at the largest chunk, `LookaheadEncoder.chunk_rows`),
    # else 16: at 5-16 streams a plain step is faster with cuBLAS for the rest (full-size model, H200, twenty-ninth
    # session: 16 streams 4.98 against 5.80 ms). A row's bits are the same either way where its call takes the
    # kernel (up to 16 rows: a plain step of up to 4 streams, 2 in the conv stem). STREAMSCRIBE_ENCODER_ROWS sets it
    # where it is None (A/B runs)
    encoder_rows: int | None = None


def one_row_by_default(device: torch.device, dtype: torch.dtype) -> bool:
    """`RunnerOptions.one_row_decode=None`: the one-row path on CUDA in fp16/bf16, unless STREAMSCRIBE_ONE_ROW=0
    (read when a runner is made)."""
    return (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
            and os.environ.get("STREAMSCRIBE_ONE_ROW", "1") != "0")


STREAM_PRIORITIES = ("none", "encoder", "lm")


def favoured_chain(opts: RunnerOptions) -> str:
    """`RunnerOptions.stream_priority`, or STREAMSCRIBE_STREAM_PRIORITY where it is None (read when a runner is
    made): "none", "encoder" or "lm"."""
    choice = opts.stream_priority
    source = "stream_priority"
    if choice is None:
        choice, source = os.environ.get("STREAMSCRIBE_STREAM_PRIORITY", "none"), "STREAMSCRIBE_STREAM_PRIORITY"
    if choice not in STREAM_PRIORITIES:
        raise ValueError(f"{source} must be one of {', '.join(STREAM_PRIORITIES)}, got {choice!r}")
    return choice


def encoder_rows_for(opts: RunnerOptions) -> int:
    """`RunnerOptions.encoder_rows`; where None, STREAMSCRIBE_ENCODER_ROWS if set (read when a runner is made), else
    the default for the runner's encoder chunk; checked."""
    rows, source = opts.encoder_rows, "encoder_rows"
    if rows is None and os.environ.get("STREAMSCRIBE_ENCODER_ROWS"):
        rows, source = os.environ["STREAMSCRIBE_ENCODER_ROWS"], "STREAMSCRIBE_ENCODER_ROWS"
        rows = int(rows) if rows.isdigit() else rows
    if rows is None:
        return INVARIANT_ROWS if opts.encoder_chunk > 1 else MAX_ROWS
    if isinstance(rows, bool) or not isinstance(rows, int) or not MAX_ROWS <= rows <= MAX_INVARIANT_ROWS:
        raise ValueError(f"{source} must be an integer in {MAX_ROWS}..{MAX_INVARIANT_ROWS}, got {rows!r}")
    return rows


def kv_bytes_per_stream(model: VoxtralRealtime, opts: RunnerOptions) -> tuple[int, int]:
    """(encoder, LM) KV bytes one admitted stream reserves."""
    enc, lm = cache_specs(model, opts)
    e_pos, l_pos = max_positions(model, opts)
    return (enc.blocks_per_stream(e_pos) * enc.bytes_per_block(model.dtype),
            lm.blocks_per_stream(l_pos) * lm.bytes_per_block(model.dtype))


def slot_bytes(model: VoxtralRealtime, opts: RunnerOptions) -> int:
    """Device memory one stream slot of a runner reserves: its encoder and LM KV rings and its rows of
    the audio embedding ring (the conv states, a few KiB, are not counted)."""
    enc, lm = kv_bytes_per_stream(model, opts)
    elem = torch.empty(0, dtype=model.dtype).element_size()
    return enc + lm + opts.encoder_cache_tokens * model.config.decoder.hidden_size * elem


def cache_specs(model: VoxtralRealtime, opts: RunnerOptions) -> tuple[CacheSpec, CacheSpec]:
    """(encoder, LM) cache layouts of a runner with these options."""
    c = model.config
    fpt = c.streaming.downsample_factor
    # the prompt prefix is computed densely and copied in, so the rings only cover decode-step queries
    enc = CacheSpec(c.encoder.num_layers, c.encoder.num_heads, c.encoder.head_dim, opts.block_size,
                    c.encoder.sliding_window, max_q_len=fpt * max(opts.max_step_tokens, opts.encoder_chunk))
    lm = CacheSpec(c.decoder.num_layers, c.decoder.num_kv_heads, c.decoder.head_dim, opts.block_size,
                   c.decoder.sliding_window, max_q_len=opts.max_step_tokens)
    return enc, lm


def max_positions(model: VoxtralRealtime, opts: RunnerOptions) -> tuple[int | None, int | None]:
    """(encoder frames, LM positions) a stream may reach: None without `max_session_seconds`."""
    if opts.max_session_seconds is None:
        return None, None
    c = model.config
    tokens = c.prompt_length(30) + math.ceil(opts.max_session_seconds * 1000 / c.token_duration_ms) + \
        c.right_pad_tokens(30) + 1
    return tokens * c.streaming.downsample_factor, tokens


# Green contexts live as long as the process: destroying one while a CUDA graph captured on its stream, or the
# caching allocator's blocks used there, still exist aborts the process (cudaErrorContextIsDestroyed in a
# destructor, seen on an H200 when a test dropped its runner; twenty-sixth session). There are at most a few (one
# per device and SM count), and a later runner with the same count reuses the context and its stream.
_GREEN_CONTEXTS: dict[tuple[int, int], tuple[object, object]] = {}


def _green_context_stream(green_contexts: object, device_index: int, sms: int) -> tuple[object, object]:
    """The (green context, its stream) of `sms` SMs on the device, created once per process."""
    key = (device_index, sms)
    if key not in _GREEN_CONTEXTS:
        ctx = green_contexts.GreenContext.create(sms, device_index)  # type: ignore[attr-defined]
        _GREEN_CONTEXTS[key] = (ctx, ctx.Stream())
    return _GREEN_CONTEXTS[key]


class ModelRunner:
    def __init__(self, model: VoxtralRealtime, opts: RunnerOptions) -> None:
        self.model, self.opts = model, opts
        c = self.cfg = model.config
        dev, dt = self.device, self.dtype = model.device, model.dtype
        enc_spec, lm_spec = cache_specs(model, opts)
        e_pos, l_pos = max_positions(model, opts)
        if lm_spec.window is None and l_pos is None:
            raise ValueError("this model's LM has no sliding window: set max_session_seconds")
        self.enc_cache = PagedKVCache(enc_spec, opts.max_streams * enc_spec.blocks_per_stream(e_pos), opts.max_streams,
                                      e_pos, dev, dt)
        self.lm_cache = PagedKVCache(lm_spec, opts.max_streams * lm_spec.blocks_per_stream(l_pos) + opts.lm_scratch_blocks,
                                     opts.max_streams, l_pos, dev, dt)
        self.max_tokens = l_pos
        self.mel = LogMel(c.audio)
        conv = model.audio_tower.embedder
        # one extra row (index max_streams) absorbs the writes of padding rows in graph buckets
        self.pad_slot = opts.max_streams
        self.conv1_state = torch.zeros(opts.max_streams + 1, conv.conv1.in_channels, 2, device=dev, dtype=dt)
        self.conv2_state = torch.zeros(opts.max_streams + 1, conv.conv2.in_channels, 1, device=dev, dtype=dt)
        # EncoderCache: per-stream ring of audio embeddings, row slot * C + position % C
        self.cache_len = opts.encoder_cache_tokens
        self.audio_cache = torch.zeros((opts.max_streams + 1) * self.cache_len, c.decoder.hidden_size, device=dev,
                                       dtype=dt)

        # persistent decode-step buffers (fixed addresses for CUDA graphs); the per-step index
        # metadata is built on the host and arrives in one copy per dtype (staging.StepMetadata)
        b = opts.max_batch
        i64, i32 = torch.int64, torch.int32
        # the host's waits for the device (the engine's per-step token copy): staging reuse (`staging`)
        self.fence = CopyFence(dev)
        self.meta = StepMetadata({
            "token_ids": Field((b,), i64, -1),  # padding rows: no token, zero input
            "audio_rows": Field((b,), i64, -1),
            "positions": Field((b,), i32, -1),  # padding rows: no KV read
            "delays": Field((b,), i32, 0),
            "slot_mapping": Field((b,), i64, -1),  # padding rows: no KV write
            "block_tables": Field((b, self.lm_cache.width), i32, 0),
        }, dev, self.fence)
        self.inputs_embeds = torch.zeros(b, c.decoder.hidden_size, device=dev, dtype=dt)
        # the encoder's CUDA stream (`on_encoder_stream`); None: encoder work is queued like the rest
        self.enc_green: object | None = None  # the encoder's green context (`RunnerOptions.encoder_sms`)
        self.favoured = favoured_chain(opts)
        self.encoder_rows = encoder_rows_for(opts)
        self.enc_stream = self._encoder_stream(opts) if opts.encoder_stream and dev.type == "cuda" else None
        self._enc_done = torch.cuda.Event() if self.enc_stream is not None else None
        self._enc_pending = False  # an ahead encoder call the main stream has not waited for yet
        self._enc_waits_main = False  # main-stream writes (admission) the encoder stream must wait for
        self.one_row_decode = self._wants_one_row_decode()
        self.seq_ids = torch.arange(b, dtype=i32, device=dev)
        self.next_ids = torch.zeros(b, dtype=i64, device=dev)
        # the encoder step (one audio token per stream; several when speculation looks ahead)
        self.encoder = LookaheadEncoder(self, opts.encoder_chunk)
        self.graphs: DecodeGraphRunner | None = None
        self.input_graphs: DecodeGraphRunner | None = None
        if opts.cuda_graphs and dev.type == "cuda":
            lm_capture = high_priority_stream(dev) if self.favoured == "lm" else None
            self.graphs = DecodeGraphRunner(self._decode_forward, opts.max_batch, dev, lm_capture)
            self.graphs.capture()
            # the input merge gets graphs of its own: launched eagerly, a Triton kernel costs more host
            # time than a graph replay, and the LM graphs stay captured on dummy input buffers
            self.input_graphs = DecodeGraphRunner(self._merge_inputs, opts.max_batch, dev, lm_capture)
            self.input_graphs.capture()

    def _encoder_stream(self, opts: RunnerOptions) -> torch.cuda.Stream:
        """The encoder's CUDA stream: an ordinary one, or one of a green context of `encoder_sms` SMs."""
        sms = opts.encoder_sms
        if sms is None and os.environ.get("STREAMSCRIBE_ENCODER_SMS"):
            try:
                sms = int(os.environ["STREAMSCRIBE_ENCODER_SMS"])
            except ValueError:
                raise ValueError(f"STREAMSCRIBE_ENCODER_SMS must be a number of SMs, got "
                                 f"{os.environ['STREAMSCRIBE_ENCODER_SMS']!r}") from None
        if sms is None:
            return high_priority_stream(self.device) if self.favoured == "encoder" else torch.cuda.Stream(self.device)
        if self.favoured != "none":
            raise ValueError("stream_priority and encoder_sms cannot be combined: a green context's stream has the "
                             "default priority")
        total = torch.cuda.get_device_properties(self.device).multi_processor_count
        if not 1 <= sms <= total:
            raise ValueError(f"encoder_sms must be in 1..{total} (this GPU's SMs), got {sms}")
        from torch.cuda import green_contexts

        if not green_contexts.SUPPORTED:
            raise RuntimeError("encoder_sms needs CUDA green contexts, which this PyTorch build lacks")
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.enc_green, s = _green_context_stream(green_contexts, index, sms)
        logger.info("encoder stream in a green context of %d of %d SMs", sms, total)
        if isinstance(s, torch.cuda.Stream):
            return s
        return torch.cuda.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)

    def _wants_one_row_decode(self) -> bool:
        model, choice = self.model, self.opts.one_row_decode
        if choice is False or not model.supports_one_row_decode() or getattr(model, "ada_table", None) is None:
            return False
        return one_row_by_default(self.device, self.dtype) if choice is None else True

    # -- admission -----------------------------------------------------------------------------
    def can_admit(self) -> bool:
        return self.enc_cache.can_admit() and self.lm_cache.can_admit()

    def admit(self, slot: int) -> None:
        # the slot's last stream may still have encoder work queued: the writes below come after it,
        # and the encoder's next call after them (and after the prompt prefix copied in with them)
        self.join_encoder()
        self._enc_waits_main = self.enc_stream is not None
        self.enc_cache.admit(slot)
        self.lm_cache.admit(slot)
        self.conv1_state[slot].zero_()
        self.conv2_state[slot].zero_()

    def release(self, slot: int) -> None:
        self.enc_cache.release(slot)
        self.lm_cache.release(slot)

    # -- the encoder's CUDA stream ---------------------------------------------------------------
    @contextmanager
    def on_encoder_stream(self, ahead: bool) -> Iterator[None]:
        """Queue the encoder work of the block on the encoder's stream (CUDA; elsewhere as usual).

        The encoder owns its state (conv states, encoder KV, sample buffers, its metadata staging); the
        LM reads only the audio cache rows it writes. A call for the current step (`ahead=False`)
        makes the main stream wait for it right away, as one stream would. An ahead call (the next
        step's audio) is waited for by the next user of its rows (`join_encoder`): LM steps, look-ahead,
        admission. It may run beside work already queued on the main stream because that work reads
        other ring rows (positions below the ones written: see `runner_options_for` in `speculation`)
        and the host has waited for every earlier step's tokens. Staging copies stay safe: every
        encoder call is waited for by the main stream before the next step's token copy is queued
        (`CopyFence` tickets), and `CopyFence.wait` synchronises the device. The encoder's graphs are
        captured on a stream of their own (`LookaheadEncoder`): graphs captured on one stream share a
        cuBLAS workspace and must not run side by side."""
        if self.enc_stream is None:
            yield
            return
        main = torch.cuda.current_stream(self.device)
        self.encoder_after_admissions()
        with torch.cuda.stream(self.enc_stream):
            yield
        assert self._enc_done is not None
        self._enc_done.record(self.enc_stream)
        if ahead:
            self._enc_pending = True
        else:
            main.wait_event(self._enc_done)
            self._enc_pending = False

    def encoder_after_admissions(self) -> None:
        """The encoder's stream waits for the main-stream writes of admissions so far (zeroed conv states,
        prompt prefixes copied in). The engine calls it right after a step's joins, so that the wait
        covers only those; otherwise the next encoder call makes it, waiting for all queued main work."""
        if self._enc_waits_main:
            assert self.enc_stream is not None
            self.enc_stream.wait_stream(torch.cuda.current_stream(self.device))
            self._enc_waits_main = False

    def join_encoder(self) -> None:
        """The main stream waits for the encoder's last ahead call (if any is not waited for yet)."""
        if self._enc_pending:
            assert self._enc_done is not None
            torch.cuda.current_stream(self.device).wait_event(self._enc_done)
            self._enc_pending = False

    # -- audio ---------------------------------------------------------------------------------
    def log_mel(self, windows: torch.Tensor, frames: int) -> torch.Tensor:
        """Host sample windows [B, N] float32 -> log-mel [B, n_mels, frames] on the device, model dtype.
        Only the raw samples cross to the device; the FFT runs there (see `LogMel`)."""
        if self.device.type == "cuda":
            windows = windows.pin_memory().to(self.device, non_blocking=True)
        return self.mel.from_padded(windows, frames).to(self.dtype)

    def encode_step(self, streams: list[EngineStream], ahead: bool = False) -> None:
        """One new audio token for each stream (all joined) -> the encoder cache; `ahead`: for the next
        step (`on_encoder_stream`)."""
        self.encoder.encode([(s, 1) for s in streams], ahead)

    # -- LM decode step ------------------------------------------------------------------------
    def _merge_inputs(self, b: int) -> None:
        """The one place embeddings are merged: embed(token) + audio of its position, written into the
        persistent inputs_embeds that the (dummy-captured) LM graph reads; padding rows become zeros."""
        m = self.meta.dev
        gather_add_embeddings(self.inputs_embeds[:b], m["token_ids"][:b], self.model.language_model.embed_tokens.weight,
                              self.audio_cache, m["audio_rows"][:b])

    def _decode_forward(self, b: int) -> None:
        """The LM step over the first `b` rows of the persistent buffers (graph-capturable)."""
        m = self.meta.dev
        backend = PagedAttention(self.lm_cache, m["slot_mapping"][:b], m["block_tables"][:b], self.seq_ids[:b],
                                 m["positions"][:b])
        ada = self.model.ada_scales_for(m["delays"][:b])
        if b == 1 and self.one_row_decode and ada is not None:
            logits = self.model.one_row_logits(self.inputs_embeds[0], m["positions"][:1], ada.reshape(ada.shape[0], -1),
                                               backend)
            self.next_ids[:1] = logits.argmax(-1)
            return
        t_cond = None if ada is not None else self.model.t_cond(m["delays"][:b])[None]
        hidden = self.model.decode(self.inputs_embeds[None, :b], m["positions"][None, :b], t_cond, backend, ada)
        self.next_ids[:b] = self.model.logits(hidden[0]).argmax(-1)

    @torch.no_grad()
    def decode_step(self, streams: list[EngineStream]) -> torch.Tensor:
        """One LM position for each stream; returns next token ids [B] (device)."""
        return self.decode([s.slot for s in streams], [s.lm_pos for s in streams],
                           [s.tokens[s.lm_pos] for s in streams], [s.delay_tokens for s in streams])

    @torch.no_grad()
    def decode(self, slots: list[int], positions: list[int], tokens: list[int], delays: list[int]) -> torch.Tensor:
        """LM position `positions[i]` of the stream in cache slot `slots[i]`, whose input token is
        `tokens[i]`; the merge `embed(token) + audio` runs inside the step (gather-add kernel)."""
        b = len(slots)
        self.join_encoder()  # the merge reads the audio rows an ahead encoder call wrote
        h = self.meta.begin()  # every row starts as padding: rows b.. of a graph bucket stay padding
        pos = np.asarray(positions, dtype=np.int64)
        slot_a = np.asarray(slots, dtype=np.int64)
        h["token_ids"][:b] = tokens
        h["audio_rows"][:b] = slot_a * self.cache_len + pos % self.cache_len
        h["positions"][:b] = pos
        h["delays"][:b] = delays
        h["block_tables"][:b] = self.lm_cache.tables_host[slot_a]
        h["slot_mapping"][:b] = self.lm_cache.host_slots_rows(slot_a, pos[:, None])[:, 0]
        self.meta.upload()
        if self.graphs is not None and self.input_graphs is not None:
            run_b = self.graphs.bucket(b)
            self.input_graphs.replay(run_b)
            self.graphs.replay(run_b)
        else:
            self._merge_inputs(b)
            self._decode_forward(b)
        return self.next_ids[:b]
