"""Speculative rounds chained on the device: one stream's rounds without a host round trip each.

Why: a round's layout (the catch-up positions, the tokens the drafter catches up on, where the verify
rows start) depends on how many drafts the round before accepted, so the host path (`Speculator.step`,
then `Speculator.accept` on the host) waits for every round's tokens before it lays out the next, and the
device idles through the host's acceptance, token callbacks and next layout. Chaining takes that out from
between the rounds: at batch 1 on one H100, 2.56x against 2.40x for the same rounds through the host (in
the same run; docs/benchmarks.md, issue 5, forty-fourth session). The rounds are then bound by the device: a round
is one CUDA graph (about 222 us of an H100's time), and its audio comes in look-ahead calls of up to 32 tokens
(`SpeculativeConfig.lookahead_chunk`), which made it 2.99-3.05x (forty-fifth session).

What: for one scheduled stream with audio for several rounds (a file, a stream past its end, a live stream catching
up on a backlog), the round's state lives on the device. Per round, one kernel (`layout`, `kernels.spec_round`)
writes the speculator's step metadata from the device state (position p, the position `prev` the drafter is exact up
to, the last position the stream may run, and a ring of the input tokens of recent positions); the speculator's
catch-up, chain and verify forwards run on it unchanged; a second kernel (`accept`) does greedy acceptance (the
longest prefix of drafts equal to the target's argmaxes, within the drafts the round may make), advances the state
and logs the round. On CUDA the whole round is one graph (`one_graph_rounds`). (Written as torch ops, layout
and acceptance were ~110 tiny kernels a round, which made a chained round slower than a host round on the H100:
docs/benchmarks.md, issue 5.) The host queues R rounds back to back (their look-ahead
encoder calls too: which audio they need does not depend on acceptance, only how much at most) and reads the log
once. It stays at most two rounds ahead of the device (`_HOST_LEAD`), so the look-ahead's staging buffers, a ring of
two, never make it wait for the whole device.

Every row is laid out exactly as the host path would lay it out for the same (p, prev), plus padding
rows (position -1, no key written) up to k+1 catch-up and verify rows, the sizes the graphs replay at;
the emitted tokens are the target's greedy choices at positions whose inputs are all target-chosen,
as in the host path, so chaining is as lossless as speculation itself (tests/test_speculative.py).

R is chosen so that every chained round surely runs (the stream has audio for at least R * (k+1) more
positions; audio that arrives during a chain waits for the next step); a stream that ends by EOS inside a chain
wastes the rest of it, which is discarded on the host.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
import torch

from kernels.spec_round import (
    DELAY,
    LAST,
    P,
    PREV,
    ROUNDS,
    SLOT,
    STATE_LEN,
    RoundConstants,
    RoundLayout,
    round_accept,
    round_layout,
)

from .cuda_graph import DecodeGraphRunner
from .stream import EngineStream

if TYPE_CHECKING:
    from .speculation import Speculator

# the host queues round r only after round r - _HOST_LEAD has run on the device: enough to keep the device
# busy, and the staging rings (two sets each) of the look-ahead encoder calls never wait for the whole device
_HOST_LEAD = 2


def one_graph_rounds() -> bool:
    """Whether a chained round is one CUDA graph (the default) or the speculator's graphs with layout's and
    accept's between them (STREAMSCRIBE_ROUND_GRAPH=0, for A/B runs; read when an engine is made)."""
    value = os.environ.get("STREAMSCRIBE_ROUND_GRAPH", "1")
    if value not in ("0", "1"):
        raise ValueError(f"STREAMSCRIBE_ROUND_GRAPH must be 0 or 1, got {value!r}")
    return value == "1"


def chained_audio_rows(k: int, rounds: int, chunk: int) -> int:
    """Audio cache rows a stream needs to chain `rounds` rounds: a chain starting at p (prev >= p - k - 1)
    reads audio up to p + (rounds - 1)(k + 1) + k, and the look-ahead writes whole chunks, never over a
    row of a position above prev."""
    return rounds * (k + 1) + k + chunk


class ChainedRounds:
    """Device-side layout and acceptance of a chain of speculative rounds of one stream (batch 1)."""

    def __init__(self, sp: Speculator, max_rounds: int) -> None:
        self.sp, self.max_rounds = sp, max_rounds
        k, dev = sp.k, sp.device
        self.k = k
        self.ring = 2 * (k + 1)  # token ring: a round reads prev+1 .. p and writes p+1 .. p+k+1
        i64 = torch.int64
        # one tensor for the state and the token ring, so a chain starts with one host -> device copy
        self._init = torch.zeros(STATE_LEN + self.ring, dtype=i64, device=dev)
        self.state, self.tokens = self._init[:STATE_LEN], self._init[STATE_LEN:]
        # catch-up rows: k+1 accepted positions at most, and a parallel drafter's k-1 mask rows; a chain drafter's
        # single-position steps
        self.catchup_rows = rows = 2 * k if sp.parallel else k + 1
        chain = k - 1 if not sp.parallel else 0
        # per round: the drafts allowed, the drafts accepted, the target's argmax at rows 0..k
        self.log = torch.zeros(max_rounds, k + 3, dtype=i64, device=dev)
        self.cuda = dev.type == "cuda"
        self._log_host = torch.empty(max_rounds, k + 3, dtype=i64, pin_memory=self.cuda)
        self._events = [torch.cuda.Event() for _ in range(max_rounds + 1)] if self.cuda else []
        self.discarded_rounds = 0  # rounds run after their stream's EOS in a chain (wasted device work)
        self.consts = RoundConstants(
            k=k, ring=self.ring, catchup_rows=rows, parallel=sp.parallel, chain_steps=chain,
            stash_stride=sp.stash_stride, audio_rows=sp.C, pad_stash=sp.pad_stash, zero_stash=sp.zero_stash,
            pad_audio=sp.pad_audio,
            mask_token=sp.drafter.mask_token_id if sp.parallel else -1, min_buffered=sp.cfg.min_buffered_tokens,
            d_block=sp.d_cache.spec.block_size, d_width=sp.d_cache.width,
            lm_block=sp.runner.lm_cache.spec.block_size, lm_width=sp.runner.lm_cache.width)
        m = sp.m
        self.views = RoundLayout(
            *(m[n][:rows] for n in ("c_tok", "c_hid", "c_slot_mapping", "c_pos", "c_dly")), m["c_last"][:1],
            *(m[n][: k + 1] for n in ("v_tok", "v_src", "v_aud", "v_slot_mapping", "v_stash", "v_pos", "v_dly")),
            c_aud=m["c_aud"][:rows] if sp.drafter_audio else None,
            dr_pos=m["dr_pos"][:chain, 0] if chain else None,
            dr_slot_mapping=m["dr_slot_mapping"][:chain, 0] if chain else None,
            dr_aud=m["dr_aud"][:chain, 0] if chain and sp.drafter_audio else None)
        self.g_layout = self.g_accept = self.g_round = None
        if sp.g_verify is not None:  # the speculator captured its graphs
            if one_graph_rounds():
                # the whole round in one graph: one launch a round instead of six, no gap between them on the
                # device. Its kernels all ran at these shapes in the speculator's warm-ups but layout's and
                # accept's: run those two here (on the zero state: they write only the metadata and the state)
                # and capture without a warm-up, whose catch-up and verify would write KV at the rows layout laid
                self.layout()
                self.accept()
                self._init.zero_()
                rows = (sp.g_catchup.bucket(self.catchup_rows), sp.g_verify.bucket(k + 1))
                self.g_round = DecodeGraphRunner(lambda _: self._round(*rows), 1, dev)
                self.g_round.capture(warmup=False)
            else:
                self.g_layout = DecodeGraphRunner(lambda _: self.layout(), 1, dev)
                self.g_layout.capture()
                self.g_accept = DecodeGraphRunner(lambda _: self.accept(), 1, dev)
                self.g_accept.capture()

    def last_decodable(self, s: EngineStream) -> int:
        """The last position stream `s` can run with the audio it has now (all of it is there once it is finished:
        then its last position)."""
        return int(min(s.last_position(), s.audio_done + s.audio_tokens_ready(self.sp.mpt) - 1))

    def rounds_for(self, streams: list[EngineStream]) -> int:
        """How many rounds to chain for this step's streams (0: take the host path): the step's one stream, past its
        prompt, when it has audio for at least two rounds of k+1 positions (a file, the end of a stream, or a live
        stream with a backlog). Every chained round then surely runs."""
        if len(streams) != 1:
            return 0
        s = streams[0]
        if s.lm_pos < s.prompt_len or s.is_finished():
            return 0  # a prompt row runs (no drafts)
        p, prev = s.lm_pos, self.sp.prev_pos[s.slot]
        if not 1 <= p - prev <= self.k + 1:
            return 0
        rounds = min(self.max_rounds, (self.last_decodable(s) - p + 1) // (self.k + 1))
        return rounds if rounds >= 2 else 0

    # -- graph-capturable device work (one kernel each on CUDA: kernels/spec_round.py) -------------------------
    def layout(self) -> None:
        """The speculator's step metadata for one round of stream `state[SLOT]` at position `state[P]`: what
        `Speculator._layout` writes for the same positions (rows past the round's own are padding)."""
        sp = self.sp
        round_layout(self.consts, self.state, self.tokens, sp.d_cache.tables, sp.runner.lm_cache.tables, self.views)

    def accept(self) -> None:
        """Greedy acceptance on the device; advances the state and logs the round."""
        round_accept(self.consts, self.state, self.tokens, self.sp.v_next, self.sp.v_tokens, self.log)

    def _round(self, catchup_rows: int, verify_rows: int) -> None:
        """One round, its catch-up and verify over that many rows (eager: the round's own; the one-graph round:
        padded to the buckets the speculator's graphs replay, so that it computes what the six graphs do)."""
        sp = self.sp
        self.layout()
        sp._catchup_forward(catchup_rows)
        sp._chain_forward(1)
        sp._verify_inputs(verify_rows)
        sp._verify_forward(verify_rows)
        self.accept()

    # -- one chain --------------------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, s: EngineStream, rounds: int) -> list[int]:
        """Chains `rounds` rounds of stream `s` (as `rounds_for` chose) and returns its tokens in order (the
        accepted drafts and the target's token after them, round after round). Updates the speculator's
        metrics and its prev_pos; the caller emits the tokens and advances the stream."""
        sp, k = self.sp, self.k
        p0, prev0, last = s.lm_pos, sp.prev_pos[s.slot], self.last_decodable(s)
        self.start(s, last)
        fence = sp.runner.fence
        marks = []
        t, t_c = k + 1, self.catchup_rows
        for r in range(rounds):
            if r >= _HOST_LEAD and self.cuda:
                self._events[r - _HOST_LEAD].synchronize()
                fence.passed(marks[r - _HOST_LEAD])
            # round r reads audio up to p_r + k <= p0 + r(k+1) + k
            self._encode_until(s, prev0, min(p0 + r * (k + 1) + k + 1, last + 1))
            if self.g_round is not None:
                self.g_round.replay(1)
            elif self.g_layout is not None:
                self.g_layout.replay(1)
                sp.g_catchup.replay(sp.g_catchup.bucket(t_c))
                sp.g_chain.replay(sp.g_chain.bucket(1))
                run_t = sp.g_verify.bucket(t)
                sp.g_verify_inputs.replay(run_t)
                sp.g_verify.replay(run_t)
                self.g_accept.replay(1)
            else:
                self._round(t_c, t)
            marks.append(fence.mark())
            if self.cuda:
                self._events[r].record()
        done = fence.mark()
        self._log_host[:rounds].copy_(self.log[:rounds], non_blocking=self.cuda)
        if self.cuda:
            self._events[rounds].record()
            self._events[rounds].synchronize()
        fence.passed(done)
        return self._replay_log(s, self._log_host[:rounds].tolist())

    def start(self, s: EngineStream, last: int) -> None:
        """The device state of a chain of stream `s` that may run up to position `last` (one copy), and the
        metadata that stays fixed through the chain (block tables, the drafter's delay) in one staging upload; the
        other rows are padding until `layout` writes them."""
        sp = self.sp
        p, prev = s.lm_pos, sp.prev_pos[s.slot]
        init = np.zeros(STATE_LEN + self.ring, dtype=np.int64)
        init[[P, PREV, LAST, SLOT, DELAY, ROUNDS]] = p, prev, last, s.slot, s.delay_tokens, 0
        init[STATE_LEN + np.arange(prev + 1, p + 1) % self.ring] = s.tokens[prev + 1: p + 1]
        self._init.copy_(torch.from_numpy(init))
        h = sp.meta.begin()
        h["d_tables"][0] = sp.d_cache.tables_host[s.slot]
        h["v_tables"][0] = sp.runner.lm_cache.tables_host[s.slot]
        if "dr_dly" in h:
            h["dr_dly"][0] = s.delay_tokens
        sp.meta.upload()

    def _encode_until(self, s: EngineStream, anchor: int, want: int) -> None:
        """Look-ahead encoding until `want` audio tokens are encoded, in whole chunks where the ring allows."""
        sp = self.sp
        while s.audio_done < want:
            before = s.audio_done
            sp._encode_ahead([(s, anchor, before + sp.chunk)])
            if s.audio_done == before:
                raise RuntimeError(f"stream {s.stream_id}: the look-ahead cannot encode position {before} "
                                   f"(audio ring {sp.C}, anchor {anchor}): the ring is too small to chain")

    def _replay_log(self, s: EngineStream, log: list[list[int]]) -> list[int]:
        """The chain's tokens for the host, and the metrics and prev_pos the host path would have kept."""
        sp, m = self.sp, self.sp.metrics
        out: list[int] = []
        p = s.lm_pos
        eos = sp.runner.cfg.tokens.eos
        for r, (ks, n_acc, *nxt) in enumerate(log):
            if ks:
                m.rounds += 1
                m.drafted += ks
                m.accepted += n_acc
                for i in range(ks):
                    m.drafted_at[i] += 1
                for i in range(n_acc):
                    m.accepted_at[i] += 1
            sp.prev_pos[s.slot] = p
            kept = nxt[: n_acc + 1]
            out += kept
            p += n_acc + 1
            if eos in kept:  # the stream ends there: the chain's later rounds are discarded
                self.discarded_rounds += len(log) - 1 - r
                break
        return out
