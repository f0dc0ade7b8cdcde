"""Lossless speculative decoding in the batched engine: Eagle drafts with audio, one verify step.

Off by default (`BatchedEngine(..., speculative=SpeculativeConfig(drafter))` turns it on). When on,
streams join exactly as without it (`prompt_prefix`): the target's caches for the prompt's silent
prefix (positions 0..K-1) come from the prefix cache, and so does the drafter's KV there
(`Speculator.join`: computed once per delay from the prefix's audio embeddings and target hidden
states, as a prefill would write it). The remaining prompt positions run as rows of the
speculative step without drafts (their next inputs are prompt tokens, not the target's choice);
their hidden states reach the drafter through the catch-up below like those of any other row.
Every decode step of every scheduled stream goes through `Speculator.step`:

1. Look-ahead encoding (`lookahead.LookaheadEncoder`): streams with buffered audio get several
   audio tokens encoded per step, so the embeddings of positions p .. p+k are in the encoder
   cache ring (`audio_cache`, sized here: `runner_options_for`). With `RunnerOptions.encode_ahead`
   the engine queues the next step's look-ahead right after this step's launches and its token copy
   (`look_ahead_next`), so its host work overlaps the device and the tokens do not wait for it; the
   look-ahead at the start of a step then rarely has work.
2. Drafter catch-up: the drafter's KV is made exact up to p, feeding it the target's hidden
   states of the positions accepted last step (kept in `stash`), whether or not the stream drafts
   now; its last row proposes token p+1.
3. Draft chain: k_s - 1 more single-position drafter steps; step j reads the audio embedding of
   its own position p+j (never past the audio received: k_s <= decodable tokens - 1). A drafter
   that declares `supports_parallel_drafting` has no chain: its catch-up pass also runs rows at
   positions p+1 .. p+k_s-1 (mask token + their own audio + zeros for the target hidden state),
   and the head of every row from p on gives the k_s drafts (one drafter pass per round). A
   drafter that declares `supports_two_pass_drafting` replaces the chain by ONE pass over
   positions p+1 .. p+k_s-1: the first of these rows reads the first draft and the catch-up output
   at p (as chain step 1 does), the others the mask token and zeros; every row its own audio.
4. Verify: the target runs positions p .. p+k_s of every stream in one flattened batch (live
   streams: 1 row; catching-up streams: k_s + 1 rows) and its greedy argmax decides. With
   `tree_nodes` (parallel drafters; `tree`), a drafting stream's rows are instead a fixed tree of
   the drafter's likeliest choices per depth, each node at p + its depth (with `tree_max_streams`,
   only in steps where that few streams draft: busier steps lay out each stream's chain).
5. `accept` (host): accepted prefix of the drafts (the accepted path of a tree) + the target's
   token after it (the bonus).

Why rollback is free: KV entries the target or the drafter wrote at rejected positions are never
read: a query at position q reads keys at positions <= q, and every position >= the new
`lm_pos` is rewritten by the next step before any query at or beyond it runs (the verify/draft
step writes its keys before attending). The rings are sized for `max_step_tokens` >= k + 1
queries per step (the drafter's for its pass: 2k rows per stream when it drafts in parallel), so a
rejected write never lands on a slot a later query still needs.

Lossless: the emitted tokens are the target's own greedy argmaxes at positions whose inputs are
all target-chosen tokens, so they equal non-speculative decoding (up to floating-point
differences between batch shapes, as for any batching).

CUDA graphs (when `RunnerOptions.cuda_graphs` and CUDA): catch-up (bucketed by rows), draft chain
(bucketed by drafting streams, all k-1 steps in one graph) and verify (bucketed by rows) are
captured on padding rows of persistent buffers, like the decode graphs. A step's index metadata
(positions, slot mappings computed on the host from host copies of the rings, cache rows, block
tables; laid out a stream at a time, or for a busy step's chains all at once: `AT_ONCE_MIN_STREAMS`)
arrives in one host-to-device copy per dtype (`staging`); the target's input merge (drafts
into the tokens, gather-add) has graphs of its own, replayed before the verify graph, which stays
captured on dummy input buffers. Eager work per step: that copy; the step's outputs land in one
buffer, brought to the host by one copy. A join writes the drafter's prefix pages and stash row in
place, between steps (as the target's prefix pages are written): no buffer a graph reads moves or changes
shape, and a prompt row is laid out like any row without drafts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from kernels.gather_add import gather_add_embeddings
from kernels.linear import INVARIANT_ROWS
from kernels.paged_attention import write_kv
from speculative.capability import (  # the capability contract (torch-only module)
    drafter_receives_audio,
    supports_parallel_drafting,
    supports_two_pass_drafting,
)

from ..model import VoxtralRealtime
from .attention import PagedAttention
from .chained_rounds import ChainedRounds, chained_audio_rows
from .cuda_graph import DecodeGraphRunner
from .kv_cache import CacheSpec, PagedKVCache
from .lookahead import chunk_sizes
from .model_runner import ModelRunner, RunnerOptions, cache_specs, max_positions
from .prompt_prefix import PromptPrefix, PromptPrefixCache, RecordingAttention, streams_by_delay, write_pages
from .staging import Field, StepMetadata
from .stream import EngineStream
from .tree import DraftTree, TreeLayout, chain_paths, default_tree_paths, walk_tree

if TYPE_CHECKING:
    from speculative.drafter import EagleModel

logger = logging.getLogger(__name__)


MAX_TREE_NODES = 256
# the largest look-ahead encoder call: its conv stem's 256 mel frames are the most rows `linear`'s batch-invariant
# kernel takes (kernels.linear.MAX_INVARIANT_ROWS), which lossless look-ahead needs
MAX_LOOKAHEAD_CHUNK = 32


@dataclass(frozen=True)
class SpeculativeConfig:
    drafter: EagleModel
    num_speculative_tokens: int = 4  # k: most drafts per stream per step (k + 1 <= max_step_tokens)
    min_buffered_tokens: int = 2  # speculate when at least this many audio tokens are decodable
    # audio tokens per look-ahead encoder call, a power of two up to MAX_LOOKAHEAD_CHUNK. None (`on`): 32 on CUDA,
    # where a call's cost hardly grows with its tokens at small batches (the encoder is a chain of small
    # latency-bound kernels: the small default model's call of 1 token keeps an H100 busy 219 us, of 32 tokens
    # 366 us), so a chain of rounds pays for one call where it paid for four (batch 1: 2.34x -> 3.05x, forty-fifth
    # session); elsewhere the largest power of two up to max_step_tokens. Its cost: the encoder's KV ring takes
    # 4 x 32 query frames a call, and the audio ring 32 rows more (the small model: 5.55 MB a stream against 4.65)
    lookahead_chunk: int | None = None
    # tree verification (parallel drafters): the target checks this many draft nodes per round, a
    # static tree of the drafter's likeliest choices at each depth (`tree`), instead of one chain of k
    tree_nodes: int | None = None
    # ... only in steps where at most this many streams draft (None: in every step); in steps with more,
    # each drafting stream verifies the chain of first choices. A tree's extra rows pay at batch 1 but
    # cost more than they gain at batches 16 and 64 (docs/benchmarks.md, issue 5)
    tree_max_streams: int | None = None
    # the rounds of a stream alone in its step, with audio for several of them (a file, a stream past its end, a
    # backlog), run this many at a time with their layout and acceptance on the device (`chained_rounds`): no
    # host round trip between them. Trees keep the host path. 0 or 1: every round through the host. Its cost:
    # an audio ring of R(k+1) + k + chunk rows per stream instead of 3k + 1 + chunk. None (`on`): 8 on CUDA, 0
    # elsewhere: on the CPU the host waits for no device, so a chain gains nothing there, and it would hold the
    # engine for several rounds (tens of ms each) before a new stream's first step
    chained_rounds: int | None = None
    # the most LM rows a step verifies across its streams (a stream's own row and its chain of drafts; a tree's
    # other nodes are not counted): in a step with more, every stream's drafts are cut to
    # max_verify_rows // streams - 1, or to none (a plain row) below MIN_CUT_DRAFTS. Where a step's cost grows with
    # its rows, drafts past that buy fewer tokens than their rows cost: on the 2-core CPU 64 files at once decoded
    # at 32.2x real time with 6 drafts a stream and 78.2x with the cap (CPU_MAX_VERIFY_ROWS). Lossless either way.
    # None (`on`): CPU_MAX_VERIFY_ROWS on the CPU (at least k + 1, so a lone stream drafts all k), no limit
    # elsewhere: on one H100 (bf16, k = 12, the per-stream layout) 64 files decoded at 0.63x plain decoding with a
    # cap of 256 (3 drafts each) and 0.50x with 128 (none), against 1.01-1.36x uncapped (48th session); with the
    # whole-step layout, 0.99x with nothing drafted against 1.38x uncapped (49th; docs/benchmarks.md, issue 5)
    max_verify_rows: int | None = None

    def on(self, device: torch.device) -> SpeculativeConfig:
        """This configuration for an engine on `device`: `chained_rounds` (None: 8 on CUDA, else 0),
        `lookahead_chunk` (None: MAX_LOOKAHEAD_CHUNK on CUDA, else left to `chunk`) and `max_verify_rows` (None:
        CPU_MAX_VERIFY_ROWS on the CPU, else no limit) decided."""
        cuda = device.type == "cuda"
        chained = self.chained_rounds if self.chained_rounds is not None else (8 if cuda else 0)
        chunk = self.lookahead_chunk if self.lookahead_chunk is not None or not cuda else MAX_LOOKAHEAD_CHUNK
        rows = self.max_verify_rows
        if rows is None and device.type == "cpu":
            rows = max(CPU_MAX_VERIFY_ROWS, self.num_speculative_tokens + 1)
        return replace(self, chained_rounds=chained, lookahead_chunk=chunk, max_verify_rows=rows)

    def chunk(self, opts: RunnerOptions) -> int:
        if self.lookahead_chunk is None:
            return chunk_sizes(opts.max_step_tokens)[0]
        return chunk_sizes(self.lookahead_chunk)[0]  # 1..MAX_LOOKAHEAD_CHUNK (`runner_options_for` checks)


# the CPU's max_verify_rows (SpeculativeConfig). The 2-core box, fp32, the shipped drafter (k = 6), forty-seventh
# session (docs/benchmarks.md, issue 5), in x real time. bench_speculative.py, 20 s held-out clips, one run each:
#   streams           1 draft   2 drafts   3 drafts   6 drafts   no drafts (the look-ahead encoder alone)
#   8                 44.4                 49.6       40.9       51.1
#   16                          50.9                  51.2-52.9  59.8-66.7
#   32                          34.5
#   64                                                32.2-33.5  78.2-78.8
# and `realtime.transcribe` on 5 files of 50 s (3 alternating runs): 6 drafts (no cap) 46.4 / 48.9, at most 2 (a cap
# of 16) 42.1 / 44.3. So no cut up to 4 streams (28 rows), 5 drafts at 5, 3 at 7-8 and none from 9 streams on
CPU_MAX_VERIFY_ROWS = 32
# fewer drafts than this a stream, where the cap cuts them, cost a drafter pass for little (1 or 2 above): none instead
MIN_CUT_DRAFTS = 3
# from this many streams in a step on, a chain's rows are laid out for all of them at once (whole-step index arrays)
# instead of a stream at a time: on the 2-core CPU the whole-step layout took ~220 us + ~1.5 us a stream of host
# time, the per-stream one ~105 us + ~11.5 us a stream (benchmarks/host_phases.py --batch 1 to 64, forty-eighth
# session: 64 streams 839-857 -> 306-346 us, 16 streams 287-291 -> 259-262 us, 8 streams 205 -> 243 us); on one
# H100's host 1,091 -> 291 us at 64 streams and 295 -> 190 us at 16 (forty-ninth session)
AT_ONCE_MIN_STREAMS = 12


def step_tokens_for(k: int) -> int:
    """The `RunnerOptions.max_step_tokens` an engine drafting `k` tokens a round is built with: the runner's default,
    or a verify's k + 1 rows when that is more (`runner_options_for` refuses fewer)."""
    return max(RunnerOptions.max_step_tokens, k + 1)


def runner_options_for(opts: RunnerOptions, cfg: SpeculativeConfig) -> RunnerOptions:
    """Runner options that speculation needs: an audio cache ring deep enough for look-ahead.

    A step reads audio rows of positions prev+1 .. p+k (prev: last step's p, p - prev <= k+1). The
    next step's look-ahead is queued after it and could run beside it on an encoder stream
    (`ModelRunner.on_encoder_stream`; off with speculation, below), so it writes only rows
    distinct from those (positions up to prev + C), and it must reach the next step's last position,
    p + 2k + 1 <= prev + 3k + 2, with a whole chunk: C = 3k + 1 + chunk rows.
    """
    k = cfg.num_speculative_tokens
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
    if k + 1 > opts.max_step_tokens:
        raise ValueError(f"num_speculative_tokens {k} needs RunnerOptions.max_step_tokens >= {k + 1} "
                         f"(the KV rings are sized for that many positions per step), got {opts.max_step_tokens}")
    m = cfg.tree_nodes
    if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
        raise ValueError(f"tree_nodes must be an integer >= 1 or None, got {m!r}")
    if m is not None and m > MAX_TREE_NODES:
        raise ValueError(f"tree_nodes {m} exceeds the most a round verifies ({MAX_TREE_NODES})")
    t = cfg.tree_max_streams
    if t is not None and (m is None or isinstance(t, bool) or not isinstance(t, int) or t < 1):
        raise ValueError(f"tree_max_streams must be an integer >= 1 with tree_nodes, got {t!r}"
                         + ("" if m is not None else " without tree_nodes"))
    c = cfg.lookahead_chunk
    if c is not None and (isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_LOOKAHEAD_CHUNK):
        raise ValueError(f"lookahead_chunk must be an integer in 1..{MAX_LOOKAHEAD_CHUNK} or None, got {c!r}")
    if cfg.min_buffered_tokens < 2:
        raise ValueError(f"min_buffered_tokens must be >= 2, got {cfg.min_buffered_tokens}")
    v = cfg.max_verify_rows
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise ValueError(f"max_verify_rows must be an integer >= 1 or None, got {v!r}")
    need = 3 * k + 1 + cfg.chunk(opts)
    r = cfg.chained_rounds
    if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 0):
        raise ValueError(f"chained_rounds must be an integer >= 0 or None, got {r!r}")
    if chains_rounds(cfg):
        need = max(need, chained_audio_rows(k, r, cfg.chunk(opts)))
    if opts.encoder_cache_tokens < need:
        opts = replace(opts, encoder_cache_tokens=need)
    if m is not None:  # scratch slots for every stream's nodes off the chain (blocks outside the rings)
        scratch = opts.max_streams * DraftTree(default_tree_paths(k, m), k).scratch_blocks(opts.block_size)
        if opts.lm_scratch_blocks < scratch:
            opts = replace(opts, lm_scratch_blocks=scratch)
    if opts.one_row_decode is None:
        # a stream's plain steps and its verify steps must round alike, or a near-tie in fp16/bf16 goes one way
        # when its audio is live and another when it is backlogged: the one-row kernels sum in another order
        # than the verify rows' projection, so speculation runs without them (twenty-eighth session, one H200, the
        # look-ahead encoder at one token per call: with them 3 of 5 held-out clips matched plain decoding in bf16,
        # without them 5 of 5). True keeps them, for a user who prefers that speed to bit-exact speculation
        opts = replace(opts, one_row_decode=False)
    if opts.encoder_stream:
        # speculation keeps the encoder on the main stream: its rounds gained nothing measurable from the
        # encoder's own stream (docs/benchmarks.md, issue 5, twenty-second session), and one GPU run of
        # the graphs-against-eager test failed with it, for a reason not found yet (issue 3, same session).
        # The ring above is still sized for a look-ahead beside the round.
        opts = replace(opts, encoder_stream=False)
    return opts if opts.encoder_chunk >= cfg.chunk(opts) else replace(opts, encoder_chunk=cfg.chunk(opts))


def chains_rounds(cfg: SpeculativeConfig) -> bool:
    """Whether rounds are chained on the device (`chained_rounds`): chains of drafts only (a tree's layout stays
    on the host path)."""
    return cfg.chained_rounds is not None and cfg.chained_rounds >= 2 and cfg.tree_nodes is None


def drafter_cache_spec(drafter: EagleModel, k: int, block_size: int) -> CacheSpec:
    """The drafter's KV ring per stream: a parallel drafter's pass holds up to k+1 accepted positions and
    k-1 draft rows of a stream (2k queries), a chained one k+1."""
    dc = drafter.config
    rows_per_stream = 2 * k if supports_parallel_drafting(drafter) else k + 1
    return CacheSpec(dc.num_layers, dc.num_kv_heads, dc.head_dim, block_size, dc.sliding_window,
                     max_q_len=rows_per_stream)


def speculation_bytes_per_stream(model: VoxtralRealtime, opts: RunnerOptions, cfg: SpeculativeConfig) -> int:
    """Device memory speculation adds per stream slot to a runner with options `opts` (already
    `runner_options_for(..., cfg)`): the drafter's KV ring, a tree's scratch blocks in the LM cache and
    the stash rows of the target's hidden states (what `Speculator` allocates per slot)."""
    k, elem = cfg.num_speculative_tokens, torch.empty(0, dtype=model.dtype).element_size()
    _, max_tokens = max_positions(model, opts)
    d_spec = drafter_cache_spec(cfg.drafter, k, opts.block_size)
    out = d_spec.blocks_per_stream(max_tokens) * d_spec.bytes_per_block(model.dtype)
    verify_rows = 1 + k
    if cfg.tree_nodes is not None:
        tree = DraftTree(default_tree_paths(k, cfg.tree_nodes), k)
        verify_rows = 1 + len(tree.paths)
        lm = cache_specs(model, opts)[1]
        out += tree.scratch_blocks(opts.block_size) * lm.bytes_per_block(model.dtype)
    return out + max(k + 1, verify_rows) * model.config.decoder.hidden_size * elem


class RealtimeTarget:
    """The batched engine's target model as the capability check sees it: its encoder cache holds
    one audio embedding per LM position, so it produces multimodal embeddings."""

    produces_multimodal_embeddings: ClassVar[bool] = True

    def __init__(self, model: VoxtralRealtime) -> None:
        self.model = model


@dataclass
class SpeculationMetrics:
    k: int
    rounds: int = 0  # verify steps of a stream with at least one draft
    drafted: int = 0  # drafts verified (with a tree: its nodes)
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # drafts verified at depth i (0-based; a tree's nodes there)
    accepted_at: list[int] = field(default_factory=list)  # ... of which accepted (at most one per round)

    def __post_init__(self) -> None:
        self.drafted_at = self.drafted_at or [0] * self.k
        self.accepted_at = self.accepted_at or [0] * self.k

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verify round that drafted: 1 (the target's own) + accepted drafts."""
        return 1.0 + self.accepted / self.rounds if self.rounds else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    def as_dict(self) -> dict:
        return {"k": self.k, "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": self.per_position_acceptance}


@dataclass(frozen=True)
class DrafterPrefix:
    """The drafter's state after the prompt's silent prefix (positions 0..K-1), the same for every
    stream of a delay: its KV there, and the target's hidden state h_{K-1} that the first catch-up
    (position K) reads."""

    tokens: int  # K
    k: list[torch.Tensor]  # per drafter layer [K, H_kv, D]
    v: list[torch.Tensor]
    last_hidden: torch.Tensor  # [H]: h_{K-1}; zeros when K = 0 (position 0 reads no hidden state)


@dataclass
class _Plan:
    """Host-side layout of one speculative step."""

    order: list[EngineStream]  # drafting streams first (by k_s, descending)
    k_s: list[int]
    p: list[int]
    verify_base: list[int]  # first verify row of each stream
    rows: int  # verify rows
    # per stream (tree verification): its layout and the cache slot each of its rows writes its keys to
    tree: list[tuple[TreeLayout, np.ndarray]] = field(default_factory=list)
    commit: bool = False  # the step first commits the last step's accepted scratch nodes


class Speculator:
    def __init__(self, runner: ModelRunner, cfg: SpeculativeConfig, target: object | None = None) -> None:
        cfg = cfg.on(runner.device)  # what the engine's options were sized for (BatchedEngine resolves it too)
        self.runner, self.cfg = runner, cfg
        model, opts = runner.model, runner.opts
        self.k = k = cfg.num_speculative_tokens
        if runner_options_for(opts, cfg) != opts:
            raise ValueError(f"the runner's audio cache ({runner.cache_len} tokens) is too small for speculation: "
                             "build its options with speculation.runner_options_for")
        d = self.drafter = cfg.drafter
        lm = model.config.decoder
        if (d.config.hidden_size, d.config.vocab_size) != (lm.hidden_size, lm.vocab_size):
            raise ValueError(f"drafter (hidden {d.config.hidden_size}, vocab {d.config.vocab_size}) does not fit the "
                             f"target (hidden {lm.hidden_size}, vocab {lm.vocab_size})")
        if d.device != runner.device or d.dtype != runner.dtype:
            raise ValueError(f"drafter is on {d.device}/{d.dtype}, the target on {runner.device}/{runner.dtype}")
        d.tie_to(model.language_model.embed_tokens.weight)
        # the capability decision, once; the buffers that depend on it come after
        self.target = target if target is not None else RealtimeTarget(model)
        self.drafter_audio = drafter_receives_audio(self.target, d)
        self.metrics = SpeculationMetrics(k)
        self.C = runner.cache_len
        self.mpt = model.config.streaming.mel_frames_per_token
        dev, dt = self.device, self.dtype = runner.device, runner.dtype

        # parallel drafting: a stream's catch-up pass holds up to k+1 accepted positions and k-1 draft rows
        self.parallel = supports_parallel_drafting(d)
        # two-pass drafting: the chain's k-1 positions in one pass (laid out as the chain's rows)
        self.two_pass = supports_two_pass_drafting(d) and not self.parallel
        # tree verification: a static tree of `tree_nodes` rank paths (None: the chain of k first choices)
        self.tree: DraftTree | None = None
        if cfg.tree_nodes is not None:
            if not self.parallel:
                raise ValueError(f"tree verification needs a parallel drafter (its one pass gives every depth's "
                                 f"distribution); {type(d).__name__} drafts a chain")
            self.tree = DraftTree(default_tree_paths(k, cfg.tree_nodes), k)
            # steps with more drafting streams than cfg.tree_max_streams verify the chain: the same
            # buffers and graphs, fewer rows (its drafts sit at the tree's stride among the choices)
            self.chain_tree = DraftTree(chain_paths(k), k, ranks=self.tree.ranks)
        # verify rows per stream: the root and the drafts (a tree's nodes)
        self.verify_rows = 1 + (len(self.tree.paths) if self.tree else k)
        self.stash_stride = max(k + 1, self.verify_rows)  # stash rows per slot: the last verify's hidden states
        rows_per_stream = 2 * k if self.parallel else k + 1
        spec = drafter_cache_spec(d, k, opts.block_size)
        width = spec.blocks_per_stream(runner.max_tokens)
        self.d_cache = PagedKVCache(spec, opts.max_streams * width, opts.max_streams, runner.max_tokens, dev, dt)
        for slot in range(opts.max_streams):  # a fixed ring per slot: nothing to admit or release
            self.d_cache.admit(slot)
        self.kv_bytes_per_stream = width * spec.bytes_per_block(dt)
        self.prev_pos = [0] * opts.max_streams  # per slot: the drafter is exact up to here; stash base
        self._prefixes: dict[int, DrafterPrefix] = {}  # by delay
        self.lookahead = runner.encoder  # built by the runner with this speculation's chunk size
        self.chunk = self.lookahead.max_chunk

        b, h = opts.max_batch, lm.hidden_size
        r = self.max_rows = b * self.verify_rows
        rc = self.max_catchup_rows = b * rows_per_stream
        kc = max(k - 1, 1)  # chain steps (a 1-row placeholder when k == 1)
        self.pad_audio = runner.pad_slot * self.C
        self.pad_stash = runner.pad_slot * self.stash_stride
        # a stash row never written: parallel draft rows read it
        self.zero_stash = (opts.max_streams + 1) * self.stash_stride
        i64, i32 = torch.int64, torch.int32
        fields = {
            # catch-up step (ragged rows: positions prev+1 .. p of every stream, then its parallel draft rows)
            "c_tok": Field((rc,), i64, -1), "c_hid": Field((rc,), i64, self.pad_stash),
            "c_slot_mapping": Field((rc,), i64, -1), "c_pos": Field((rc,), i32, -1), "c_dly": Field((rc,), i32, 0),
            "c_seq": Field((rc,), i32, 0), "d_tables": Field((b, width), i32, 0),
            # the catch-up row of position p per drafting stream (its first draft; parallel: the first of k)
            "c_last": Field((b,), i64, 0),
        }
        if not self.parallel:  # draft chain (one row per drafting stream, steps 1..k-1)
            fields |= {"dr_pos": Field((kc, b), i32, -1), "dr_slot_mapping": Field((kc, b), i64, -1),
                       "dr_dly": Field((b,), i32, 0)}
        fields |= {
            # verify step (ragged rows: positions p .. p+k_s of every stream)
            "v_tok": Field((r,), i64, -1), "v_src": Field((r,), i64, -1), "v_aud": Field((r,), i64, -1),
            "v_slot_mapping": Field((r,), i64, -1), "v_stash": Field((r,), i64, self.pad_stash),
            "v_pos": Field((r,), i32, -1), "v_dly": Field((r,), i32, 0), "v_seq": Field((r,), i32, 0),
            "v_tables": Field((b, runner.lm_cache.width), i32, 0),
        }
        if self.tree:  # each verify row's root and its ancestors' key slots; the last step's commit
            fields |= {"v_root": Field((r,), i32, -1), "v_tslots": Field((r, k), i64, 0),
                       "cm_src": Field((b * k,), i64, 0), "cm_dst": Field((b * k,), i64, -1)}
        if self.drafter_audio:  # audio rows for the drafter exist only if it receives audio
            fields["c_aud"] = Field((rc,), i64, self.pad_audio)
            if not self.parallel:
                fields["dr_aud"] = Field((kc, b), i64, self.pad_audio)
        self.meta = StepMetadata(fields, dev, runner.fence)
        self.m = self.meta.dev
        # device-side state and outputs (fixed addresses)
        self.stash = torch.zeros(self.zero_stash + 1, h, device=dev, dtype=dt)  # target hiddens (+ the zero row)
        self.g_c = torch.zeros(rc, h, device=dev, dtype=dt)  # catch-up drafter outputs
        self.draft_offsets = torch.arange(k, device=dev)
        self.drafts = torch.zeros(b, k, dtype=i64, device=dev)
        self.dr_seq = torch.arange(b, dtype=i32, device=dev)
        # the step's output, one buffer so that one copy brings it to the host: the target's argmax per
        # verify row (first r entries), then the verify rows' input tokens (the drafts; last r entries)
        self.v_out = torch.full((2 * r,), -1, dtype=i64, device=dev)
        self.v_next, self.v_tokens = self.v_out[:r], self.v_out[r:]
        self.v_embeds = torch.zeros(r, h, device=dev, dtype=dt)
        # tree verification: the drafter's first `ranks` choices at each depth, per drafting stream; each
        # slot's scratch slots (cache slots outside every ring) for its nodes off the chain; per slot the
        # stash rows of its last accepted path (root first) and the commit the next step applies
        self._stash_path: dict[int, list[int]] = {}
        self._pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if self.tree:
            self.choices = torch.zeros(b, k, self.tree.ranks, dtype=i64, device=dev)
            lc = runner.lm_cache
            per = self.tree.scratch_blocks(lc.spec.block_size)
            blocks = np.asarray(lc.pool.take(opts.max_streams * per), dtype=np.int64).reshape(opts.max_streams, per)
            self.scratch_slots = ((blocks * lc.spec.block_size)[:, :, None]
                                  + np.arange(lc.spec.block_size)).reshape(opts.max_streams, -1)

        self._plan: _Plan | None = None
        # steps of this many streams or more lay out a chain's rows all at once (`_rows_at_once`; a tree's are
        # always laid out a stream at a time)
        self.at_once_from = AT_ONCE_MIN_STREAMS
        self.g_catchup = self.g_chain = self.g_verify = self.g_verify_inputs = self.g_commit = None
        if opts.cuda_graphs and dev.type == "cuda":
            self._capture()
        self.chained = ChainedRounds(self, cfg.chained_rounds) if chains_rounds(cfg) else None
        logger.info("speculation on: k=%d, drafter %s (%s), encoder look-ahead chunk %d, audio ring %d, "
                    "drafter KV %.1f MiB/stream, verify rows a step %s", k, type(d).__name__,
                    "audio + text" if self.drafter_audio else "text only", self.chunk, self.C,
                    self.kv_bytes_per_stream / 2**20,
                    "unlimited" if cfg.max_verify_rows is None else f"at most {cfg.max_verify_rows}")

    # -- graph-capturable forwards over the persistent buffers -------------------------------------
    def _gather_audio(self, rows: torch.Tensor) -> torch.Tensor:
        return self.runner.audio_cache.index_select(0, rows)

    def _delay(self, delays: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The drafter's delay input for a pass's rows: (None, the layers' scales from its table) when the drafter
        was prepared for inference (`EagleModel.prepare_for_inference`, as `load_drafter` does), else (t_cond, None)."""
        ada = self.drafter.ada_scales_for(delays)
        return (None, ada) if ada is not None else (self.drafter.t_cond(delays)[None], None)

    def _catchup_forward(self, t: int) -> None:
        d, m = self.drafter, self.m
        mm = self._gather_audio(m["c_aud"][:t]) if self.drafter_audio else None
        x = d.embed_input_ids(m["c_tok"][:t], mm)
        hid = self.stash.index_select(0, m["c_hid"][:t])
        pos = m["c_pos"][:t]
        backend = PagedAttention(self.d_cache, m["c_slot_mapping"][:t], m["d_tables"], m["c_seq"][:t], pos)
        t_cond, ada = self._delay(m["c_dly"][:t])
        g = d(x[None], hid[None], pos[None], t_cond, backend, ada)
        self.g_c[:t] = g[0]

    def _chain_forward(self, s: int) -> None:
        d, m = self.drafter, self.m
        if self.parallel:  # the drafts are the heads of the catch-up rows p .. p+k-1 (rows past k_s: unused)
            rows = (m["c_last"][:s, None] + self.draft_offsets).clamp(max=self.max_catchup_rows - 1)
            logits = d.logits(self.g_c[rows])
            if self.tree:  # the tree's nodes take the drafter's r-th choices
                self.choices[:s] = logits.topk(self.tree.ranks, -1).indices
            else:
                self.drafts[:s] = logits.argmax(-1)
            return
        g = self.g_c.index_select(0, m["c_last"][:s])
        self.drafts[:s, 0] = d.logits(g).argmax(-1)
        if self.two_pass:
            self._second_pass(s, g)
            return
        t_cond, ada = self._delay(m["dr_dly"][:s])
        for j in range(1, self.k):
            pos = m["dr_pos"][j - 1, :s]
            mm = self._gather_audio(m["dr_aud"][j - 1, :s]) if self.drafter_audio else None
            x = d.embed_input_ids(self.drafts[:s, j - 1], mm)  # the audio of position p+j itself
            backend = PagedAttention(self.d_cache, m["dr_slot_mapping"][j - 1, :s], m["d_tables"], self.dr_seq[:s],
                                     pos)
            g = d(x[None], g[None], pos[None], t_cond, backend, ada)[0]
            self.drafts[:s, j] = d.logits(g).argmax(-1)

    def _second_pass(self, s: int, g_first: torch.Tensor) -> None:
        """Drafts 2..k of the s drafting streams in one two-pass drafter pass over the chain's rows
        (positions p+1 .. p+k-1; rows past a stream's k_s have position -1 and write no key)."""
        d, m, kc = self.drafter, self.m, self.k - 1
        if kc == 0:
            return
        n = kc * s
        pos = m["dr_pos"][:, :s].reshape(n)
        first = torch.arange(n, device=self.device) < s  # row j*s + i is chain step j+1 of stream i
        tok = torch.where(first, self.drafts[:s, 0].repeat(kc), d.mask_token_id)
        mm = self._gather_audio(m["dr_aud"][:, :s].reshape(n)) if self.drafter_audio else None
        x = d.embed_input_ids(tok, mm)
        hid = torch.where(first[:, None], g_first.repeat(kc, 1), 0.0)
        backend = PagedAttention(self.d_cache, m["dr_slot_mapping"][:, :s].reshape(n), m["d_tables"],
                                 self.dr_seq[:s].repeat(kc), pos)
        t_cond, ada = self._delay(m["dr_dly"][:s].repeat(kc))
        g2 = d(x[None], hid[None], pos[None], t_cond, backend, ada)[0]
        self.drafts[:s, 1:] = d.logits(g2).argmax(-1).view(kc, s).T

    def _verify_inputs(self, t: int) -> None:
        """The target's inputs of the verify rows: the drafts merged into the known tokens, then
        embed(token) + audio of the row's position (gather-add) into the persistent `v_embeds`. With a
        tree, the drafter's choices at the nodes' depths and ranks."""
        m = self.m
        src = m["v_src"][:t]
        drafts = self.choices if self.tree else self.drafts
        torch.where(src >= 0, drafts.view(-1)[src.clamp(min=0)], m["v_tok"][:t], out=self.v_tokens[:t])
        emb = self.runner.model.language_model.embed_tokens.weight
        gather_add_embeddings(self.v_embeds[:t], self.v_tokens[:t], emb, self.runner.audio_cache, m["v_aud"][:t])

    def _commit(self, _: int = 1) -> None:
        """Tree verification: the last step's accepted nodes off the chain, from their scratch slots into
        the ring at their positions (keys and values, every layer), before this step's verify reads them."""
        cache, m = self.runner.lm_cache, self.m
        for layer in range(len(cache.k)):
            kc, vc = cache.k[layer], cache.v[layer]
            write_kv(kc, vc, kc.view(-1, *kc.shape[2:]).index_select(0, m["cm_src"]),
                     vc.view(-1, *vc.shape[2:]).index_select(0, m["cm_src"]), m["cm_dst"])

    def _verify_forward(self, t: int) -> None:
        model, m = self.runner.model, self.m
        pos = m["v_pos"][:t]
        tree = {"tree_root": m["v_root"][:t], "tree_slots": m["v_tslots"][:t]} if self.tree else {}
        backend = PagedAttention(self.runner.lm_cache, m["v_slot_mapping"][:t], m["v_tables"], m["v_seq"][:t], pos,
                                 **tree)
        ada = model.ada_scales_for(m["v_dly"][:t])  # the runner's delay table, when it has one
        t_cond = None if ada is not None else model.t_cond(m["v_dly"][:t])[None]
        # up to 64 rows (a tree of 24 at batch 1, a chain at batch 8) take the batch-invariant kernel, so a verify
        # row rounds as the same position in a plain step does: lossless in fp16/bf16
        with model.lm_rows_invariant_to(INVARIANT_ROWS):
            hidden = model.decode(self.v_embeds[None, :t], pos[None], t_cond, backend, ada)[0]
            self.v_next[:t] = model.logits(hidden).argmax(-1)
        self.stash.index_copy_(0, m["v_stash"][:t], hidden)

    def _capture(self) -> None:
        b, dev = self.runner.opts.max_batch, self.device
        self.g_catchup = DecodeGraphRunner(self._catchup_forward, self.max_catchup_rows, dev)
        self.g_catchup.capture()
        self.g_chain = DecodeGraphRunner(self._chain_forward, b, dev)  # also holds the first draft's head
        self.g_chain.capture()
        self.g_verify_inputs = DecodeGraphRunner(self._verify_inputs, self.max_rows, dev)
        self.g_verify_inputs.capture()
        self.g_verify = DecodeGraphRunner(self._verify_forward, self.max_rows, dev)
        self.g_verify.capture()
        if self.tree:  # one size (the step's most commits), replayed only in steps that commit
            self.g_commit = DecodeGraphRunner(self._commit, 1, dev)
            self.g_commit.capture()
        logger.info("captured speculative graphs: catch-up/verify buckets %s, chain buckets %s",
                    self.g_verify.buckets, self.g_chain.buckets)

    # -- per-stream bookkeeping ----------------------------------------------------------------------
    @torch.no_grad()
    def join(self, streams: list[EngineStream], prefixes: PromptPrefixCache) -> None:
        """Drafter state of newly joined streams, which `prefixes` has just put at position K.

        The state is exactly what a prefill of positions 0..K-1 would leave: their drafter KV
        (one copy per layer for all streams of a delay, as the target's prefix pages), h_{K-1} in
        stash row 0 and prev_pos K-1, so the first step's catch-up runs position K reading h_{K-1}.
        Positions >= K are written by catch-ups before any query reads them, so nothing of a slot's
        previous stream leaks in."""
        for delay, group in streams_by_delay(streams).items():
            p = self.prefix(prefixes.get(delay), delay)
            slots = [s.slot for s in group]
            if p.tokens:
                write_pages(self.d_cache, slots, p.tokens, p.k, p.v)
            rows = torch.tensor(slots, device=self.device) * self.stash_stride
            self.stash.index_copy_(0, rows, p.last_hidden.expand(len(group), -1).contiguous())
            for s in group:
                self.prev_pos[s.slot] = p.tokens - 1

    def release(self, slot: int) -> None:
        """The slot's stream left (the engine calls this as it frees the slot's KV): drop its pending
        commit, whose ring blocks may go to another stream, and its accepted path."""
        self._pending.pop(slot, None)
        self._stash_path.pop(slot, None)

    @torch.no_grad()
    def prefix(self, target: PromptPrefix, delay_tokens: int) -> DrafterPrefix:
        """The drafter's prefix for a delay (computed on first use), from the target's prefix.

        Position q reads x_q = embed(prompt_q) (+ audio_q) and h_{q-1}; position 0 has no h_{-1}
        and reads zeros (as in training)."""
        if delay_tokens in self._prefixes:
            return self._prefixes[delay_tokens]
        d, dev, n = self.drafter, self.device, target.tokens
        if n == 0:
            p = DrafterPrefix(0, [], [], torch.zeros(d.config.hidden_size, device=dev, dtype=self.dtype))
        else:
            pos = torch.arange(n, device=dev)
            ids = torch.tensor(self.runner.cfg.prompt_ids(delay_tokens)[:n], device=dev)
            x = d.embed_input_ids(ids, target.audio if self.drafter_audio else None)
            prev_hidden = torch.cat([torch.zeros_like(target.hidden[:1]), target.hidden[:-1]])
            t_cond, ada = self._delay(torch.full((n,), delay_tokens, device=dev))  # as a step's rows take it
            rec = RecordingAttention(pos, d.config.sliding_window, d.config.num_layers)
            d(x[None], prev_hidden[None], pos[None], t_cond, rec, ada)
            p = DrafterPrefix(n, rec.k, rec.v, target.hidden[-1])
        self._prefixes[delay_tokens] = p
        return p

    # -- one step -------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, streams: list[EngineStream]) -> torch.Tensor:
        """Look-ahead, draft and verify for the scheduled streams. Returns a device tensor for `accept`
        (a view of the output buffer): the target's argmax per verify row at [0, rows), the verify
        input tokens (the drafts) at [max_rows, max_rows + rows)."""
        self.runner.join_encoder()  # drafting and verifying read the rows the last look-ahead wrote
        self._look_ahead(streams)
        plan, n_catchup, n_draft = self._layout(streams)
        self._run(plan, n_catchup, n_draft)
        return self.v_out[: self.max_rows + plan.rows]

    def chainable(self, streams: list[EngineStream]) -> int:
        """Rounds to chain on the device for this step's streams (`chained_rounds`); 0: `step` as usual."""
        return 0 if self.chained is None else self.chained.rounds_for(streams)

    def run_chained(self, s: EngineStream, rounds: int) -> list[int]:
        """`rounds` rounds of the one scheduled stream `s`, chained on the device; its tokens in order."""
        assert self._plan is None and not self._pending
        self.runner.join_encoder()
        return self.chained.run(s, rounds)

    def look_ahead_next(self) -> None:
        """After `step` (and after the step's tokens were queued for the host, so that they do not wait
        for it): queue the next step's look-ahead (`_look_ahead_next`)."""
        assert self._plan is not None, "look_ahead_next follows step"
        self._look_ahead_next(self._plan)

    def _look_ahead(self, streams: list[EngineStream]) -> None:
        """Encode audio ahead of the LM: up to `chunk` tokens for a stream with fewer than k+1 ready.
        Ring rows of positions > prev (last step's p) are still read by this step."""
        self._encode_ahead([(s, self.prev_pos[s.slot], s.lm_pos + self.k + 1) for s in streams])

    def _look_ahead_next(self, plan: _Plan) -> None:
        """The next step's look-ahead, queued after this step's launches, so that its host work (sample
        windows, metadata, a graph launch) runs while the device verifies instead of before the next
        step's launches (at batch 1 that host work was ~50 us of a ~0.55 ms round). It is queued as an
        ahead call (`ModelRunner.on_encoder_stream`), so that with an encoder stream it could run beside
        this step; `runner_options_for` keeps that stream off for now.

        The next step reads audio rows of positions p+1 .. p'+k (p' <= p + k + 1, its root): a stream
        with fewer than 2k + 2 tokens encoded past p gets a chunk now. This step still reads the rows
        of positions above prev (its catch-up's first), so the writes stay below prev + 1 + C (anchor
        prev, not yet updated: `accept` comes later), which reaches p + 2k + 1 with a whole chunk
        (`runner_options_for`)."""
        self._encode_ahead([(s, self.prev_pos[s.slot], p + 2 * self.k + 2) for s, p in zip(plan.order, plan.p)],
                           ahead=True)

    def _encode_ahead(self, wants: list[tuple[EngineStream, int, int]], ahead: bool = False) -> None:
        """For each (stream, anchor, want): more audio tokens if fewer than `want` are encoded
        (`LookaheadEncoder.encode_buffered`: never past the audio received, the stream's last position, or
        position anchor + C)."""
        self.lookahead.encode_buffered([(s, anchor) for s, anchor, want in wants if s.audio_done < want], ahead)

    def _layout(self, streams: list[EngineStream]) -> tuple[_Plan, int, int]:
        """Draft lengths, and the step's rows written into the host staging of the metadata."""
        k = self.k
        k_s = {}
        for s in streams:
            decodable = min(s.audio_done, s.last_position() + 1) - s.lm_pos
            assert decodable >= 1, "scheduled stream without audio for its position"
            k_s[s.stream_id] = min(k, decodable - 1) if decodable >= self.cfg.min_buffered_tokens else 0
            if s.lm_pos < s.prompt_len:
                # a prompt row: its input is the prompt's token (s.tokens holds the prompt) and it drafts
                # nothing, not from the last prompt position either, so that drafting starts at
                # position prompt_len, where it started after an eager prefill
                k_s[s.stream_id] = 0
        cap = self.cfg.max_verify_rows
        if cap is not None and len(streams) + sum(k_s.values()) > cap:
            per = cap // len(streams) - 1  # every stream's drafts cut alike (the first ones are likeliest)
            per = per if per >= MIN_CUT_DRAFTS else 0
            k_s = {sid: min(n, per) for sid, n in k_s.items()}
        order = sorted(streams, key=lambda s: -k_s[s.stream_id])  # drafting streams first
        plan = _Plan(order, [k_s[s.stream_id] for s in order], [s.lm_pos for s in order], [], 0)
        n_draft = sum(1 for x in plan.k_s if x > 0)
        tree = self.tree
        if tree is not None and self.cfg.tree_max_streams is not None and n_draft > self.cfg.tree_max_streams:
            tree = self.chain_tree
        h = self.meta.begin()
        if tree is None and len(order) >= self.at_once_from:
            c = self._rows_at_once(h, plan)
        else:
            c = self._rows_per_stream(h, plan, tree)
        if self._pending:  # last step's accepted scratch nodes: committed before this step's verify
            src, dst = (np.concatenate(x) for x in zip(*self._pending.values()))
            h["cm_src"][: len(src)], h["cm_dst"][: len(dst)] = src, dst
            self._pending.clear()
            plan.commit = True
        self.meta.upload()
        return plan, c, n_draft

    def _rows_per_stream(self, h: dict[str, np.ndarray], plan: _Plan, tree: DraftTree | None) -> int:
        """Lays out the step's catch-up, chain and verify rows into `h`, a stream at a time (any tree);
        sets `plan.rows` and `plan.verify_base`; returns the catch-up rows."""
        k, C, stride = self.k, self.C, self.stash_stride
        c = v = 0  # rows used so far in the catch-up / verify layouts
        for i, s in enumerate(plan.order):
            p, prev, slot, ks = s.lm_pos, self.prev_pos[s.slot], s.slot, plan.k_s[i]
            h["d_tables"][i] = self.d_cache.tables_host[slot]
            h["v_tables"][i] = self.runner.lm_cache.tables_host[slot]
            # catch-up: positions prev+1 .. p, each reading h_{q-1} from the stash (rows 0 .. p-prev-1)
            # (the stash rows of the positions accepted last step: with a tree, its accepted path's rows)
            path = self._stash_path.get(slot) if self.tree else None
            # parallel drafting: rows p+1 .. p+ks-1 follow (mask token, own audio, zero hidden state); row
            # p drafts token p+1 and the mask rows the rest. All these positions are consecutive, so the
            # rows' positions, cache slots and audio rows are laid out in one go (at batch 1 the layout's
            # cost is the number of small numpy operations)
            n_acc, n_mask = p - prev, (ks - 1 if ks and self.parallel else 0)
            c = self._catchup_rows(h, c, i, s, np.arange(prev + 1, p + 1 + n_mask))
            h["c_tok"][c - n_acc - n_mask: c - n_mask] = s.tokens[prev + 1: p + 1]
            h["c_hid"][c - n_acc - n_mask: c - n_mask] = slot * stride + (
                np.arange(n_acc) if path is None else np.array(path[:n_acc]))
            if ks:
                h["c_last"][i] = c - n_mask - 1
            if n_mask:
                h["c_tok"][c - n_mask: c] = self.drafter.mask_token_id
                h["c_hid"][c - n_mask: c] = self.zero_stash
            elif ks and not self.parallel:
                # chain step j drafts token p+j+1 at position p+j, reading that position's own audio
                h["dr_dly"][i] = s.delay_tokens
                if ks > 1:
                    q = np.arange(p + 1, p + ks)
                    h["dr_pos"][: ks - 1, i] = q
                    h["dr_slot_mapping"][: ks - 1, i] = self.d_cache.host_slots(slot, q)
                    if self.drafter_audio:
                        h["dr_aud"][: ks - 1, i] = slot * C + q % C
            # verify: row 0 at p carries the known token, the drafts (chain: rows 1..k_s at p+1..p+k_s;
            # tree: its nodes of depth <= k_s, each at p + its depth) the drafter's choices
            plan.verify_base.append(v)
            h["v_tok"][v] = s.tokens[p]
            if tree is not None:
                lay = tree.layouts[ks]
                n = 1 + len(lay.depth)
                q = p + lay.row_depth
                # a node off the chain writes its keys to its scratch slot; its ancestors' slots are listed
                wslot = self.runner.lm_cache.host_slots(slot, q)
                wslot[lay.off_rows] = self.scratch_slots[slot][lay.off_scratch]
                h["v_src"][v + 1: v + n] = i * k * tree.ranks + lay.choice_offset
                h["v_root"][v: v + n] = p
                h["v_tslots"][v + 1: v + n] = wslot[lay.ancestor_take] * lay.ancestor_mask
                plan.tree.append((lay, wslot))
            else:
                n = ks + 1
                q = np.arange(p, p + n)
                wslot = self.runner.lm_cache.host_slots(slot, q)
                h["v_src"][v + 1: v + n] = i * k + np.arange(ks)
            sl = slice(v, v + n)
            h["v_aud"][sl] = slot * C + q % C
            h["v_slot_mapping"][sl] = wslot
            h["v_stash"][sl] = slot * stride + np.arange(n)
            h["v_pos"][sl] = q
            h["v_dly"][sl] = s.delay_tokens
            h["v_seq"][sl] = i
            v += n
        plan.rows = v
        return c

    def _rows_at_once(self, h: dict[str, np.ndarray], plan: _Plan) -> int:
        """`_rows_per_stream` for a chain of drafts (no tree), every stream at once: the same values in the
        same rows, from whole-step index arrays instead of ~20 small numpy writes a stream (AT_ONCE_MIN_STREAMS)."""
        order, k, C, stride = plan.order, self.k, self.C, self.stash_stride
        b = len(order)
        slots = np.fromiter((s.slot for s in order), np.int64, b)
        p = np.asarray(plan.p, dtype=np.int64)
        ks = np.asarray(plan.k_s, dtype=np.int64)
        prev = np.fromiter((self.prev_pos[s.slot] for s in order), np.int64, b)
        dly = np.fromiter((s.delay_tokens for s in order), np.int64, b)
        h["d_tables"][:b] = self.d_cache.tables_host[slots]
        h["v_tables"][:b] = self.runner.lm_cache.tables_host[slots]
        # catch-up: per stream its accepted positions prev+1 .. p, then (parallel drafting) its mask rows
        # p+1 .. p+k_s-1; `row` counts each stream's rows from 0
        n_acc = p - prev
        n_mask = np.maximum(ks - 1, 0) if self.parallel else np.zeros(b, np.int64)
        n_c = n_acc + n_mask
        c_end = np.cumsum(n_c)
        c = int(c_end[-1]) if b else 0
        seq = np.repeat(np.arange(b), n_c)
        row = np.arange(c) - np.repeat(c_end - n_c, n_c)
        q, sl = prev[seq] + 1 + row, slots[seq]
        mask = row >= n_acc[seq]
        h["c_slot_mapping"][:c] = self.d_cache.host_slots_rows(sl, q[:, None])[:, 0]
        h["c_pos"][:c], h["c_dly"][:c], h["c_seq"][:c] = q, dly[seq], seq
        if self.drafter_audio:
            h["c_aud"][:c] = sl * C + q % C
        tok = np.fromiter((t for s, a, z in zip(order, prev, p) for t in s.tokens[a + 1: z + 1]), np.int64,
                          int(n_acc.sum()))
        h["c_tok"][:c][~mask] = tok
        if self.parallel:  # (other drafters have no mask rows)
            h["c_tok"][:c][mask] = self.drafter.mask_token_id
        h["c_hid"][:c] = np.where(mask, self.zero_stash, sl * stride + row)
        drafting = ks > 0
        h["c_last"][:b][drafting] = (c_end - n_mask - 1)[drafting]
        if not self.parallel:  # chain step j (1 .. k_s-1) drafts token p+j+1 at position p+j
            h["dr_dly"][:b][drafting] = dly[drafting]
            j = np.arange(1, h["dr_pos"].shape[0] + 1)[:, None]
            use = j < ks[None, :]
            qd = (p[None, :] + j)[use]
            h["dr_pos"][:, :b][use] = qd
            sd = np.broadcast_to(slots[None, :], use.shape)[use]
            h["dr_slot_mapping"][:, :b][use] = self.d_cache.host_slots_rows(sd, qd[:, None])[:, 0]
            if self.drafter_audio:
                h["dr_aud"][:, :b][use] = sd * C + qd % C
        # verify: per stream its root p (the known token) and its drafts at p+1 .. p+k_s
        n_v = ks + 1
        v_end = np.cumsum(n_v)
        v = int(v_end[-1]) if b else 0
        base = v_end - n_v
        seq = np.repeat(np.arange(b), n_v)
        depth = np.arange(v) - base[seq]
        q, sl = p[seq] + depth, slots[seq]
        h["v_tok"][base] = np.fromiter((s.tokens[z] for s, z in zip(order, plan.p)), np.int64, b)
        drafted = depth > 0
        h["v_src"][:v][drafted] = (seq * k + depth - 1)[drafted]
        h["v_aud"][:v] = sl * C + q % C
        h["v_slot_mapping"][:v] = self.runner.lm_cache.host_slots_rows(sl, q[:, None])[:, 0]
        h["v_stash"][:v] = sl * stride + depth
        h["v_pos"][:v], h["v_dly"][:v], h["v_seq"][:v] = q, dly[seq], seq
        plan.verify_base = base.tolist()
        plan.rows = v
        return c

    def _catchup_rows(self, h: dict[str, np.ndarray], c: int, i: int, s: EngineStream, q: np.ndarray) -> int:
        """Lays out drafter rows at positions `q` of stream `s` (the i-th of the step) from catch-up row
        `c` on (all but their tokens and hidden-state rows); returns the next free row."""
        sl = slice(c, c + len(q))
        h["c_slot_mapping"][sl] = self.d_cache.host_slots(s.slot, q)
        h["c_pos"][sl] = q
        h["c_dly"][sl] = s.delay_tokens
        h["c_seq"][sl] = i
        if self.drafter_audio:
            h["c_aud"][sl] = s.slot * self.C + q % self.C
        return c + len(q)

    def _run(self, plan: _Plan, t0: int, n_draft: int) -> None:
        """Catch-up, chain and verify on the device (graph replays when captured)."""
        t = plan.rows
        graphs = self.g_verify is not None
        if plan.commit:
            self.g_commit.replay(1) if graphs else self._commit()
        if graphs:
            self.g_catchup.replay(self.g_catchup.bucket(t0))
        else:
            self._catchup_forward(t0)
        if n_draft:
            if graphs:
                self.g_chain.replay(self.g_chain.bucket(n_draft))
            else:
                self._chain_forward(n_draft)
        # verify: merge the drafts into the input tokens, gather-add, then the target
        if graphs:
            run_t = self.g_verify.bucket(t)
            self.g_verify_inputs.replay(run_t)
            self.g_verify.replay(run_t)
        else:
            self._verify_inputs(t)
            self._verify_forward(t)
        self._plan = plan

    def accept(self, streams: list[EngineStream], host: list[int]) -> list[list[int]]:
        """Greedy acceptance from `step`'s output (on the host): per stream (in `streams` order) the
        tokens to emit: the accepted drafts and the target's token after them."""
        plan = self._plan
        assert plan is not None and len(host) == self.max_rows + plan.rows
        nxt, inp = host[: plan.rows], host[self.max_rows:]
        out: dict[int, list[int]] = {}
        m = self.metrics
        for i, (s, ks, p, base) in enumerate(zip(plan.order, plan.k_s, plan.p, plan.verify_base)):
            if self.tree:
                lay, wslot = plan.tree[i]
                path = walk_tree(nxt, inp, base, lay)
                n_acc = len(path) - 1
                out[s.stream_id] = [nxt[base + j] for j in path]
                self._stash_path[s.slot] = path
                off = [j for j in path if lay.row_off_chain[j]]  # accepted rows whose keys sit in scratch
                if off:
                    self._pending[s.slot] = (wslot[off], self.runner.lm_cache.host_slots(s.slot, p + lay.row_depth[off]))
                drafted_at = lay.per_depth
            else:
                n_acc = 0
                while n_acc < ks and inp[base + 1 + n_acc] == nxt[base + n_acc]:
                    n_acc += 1
                out[s.stream_id] = nxt[base: base + n_acc + 1]
                drafted_at = [1] * ks
            self.prev_pos[s.slot] = p
            if ks:
                m.rounds += 1
                m.drafted += sum(drafted_at)
                m.accepted += n_acc
                for j, n in enumerate(drafted_at):
                    m.drafted_at[j] += n
                for j in range(n_acc):
                    m.accepted_at[j] += 1
        self._plan = None
        return [out[s.stream_id] for s in streams]
