"""Speculative decoding (issue 5): capability contract, lossless outputs in every mode, look-ahead gather.

Every scenario compares the batched engine with speculation to the single-stream session (the
oracle) or to the batched engine without speculation, token by token; joins are checked against
what an eager prefill of the prompt gave the drafter. Drafters:
- `trained`: distilled (briefly) from the tiny target on some clips; on those clips it is mostly
  right, on unseen clips mostly wrong, so acceptance is strictly between 0 and 1.
- `trained_parallel`: the same, as a `ParallelEagleDrafter` (all drafts of a round in one pass).
- `trained_two_pass`: the same, as a `TwoPassEagleDrafter` (the first draft, then the rest in one pass).
- `tree`: `trained_parallel` with tree verification (`TreeDrafting`: the target checks the drafter's best
  5 nodes per round, not one chain).
- `echo`: constructed so that its prediction depends only on its own position's fused input
  `embed(token) + audio`: fc = [I, 0], layers with zero residual branches, the target's final
  norm. Against a target whose layers are also zeroed it is exactly the target, so acceptance is
  1.0 with the correct audio gather and collapses with an off-by-one or missing one.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import single_thread, synthetic_audio
from test_engine import Recorder, assert_whole_clips_transcribed, drive

from realtime.config import load_config
from realtime.engine import BatchedEngine, RunnerOptions
from realtime.engine import speculation
from realtime.engine.chained_rounds import one_graph_rounds
from realtime.engine.offline import transcribe_batch
from realtime.engine.prompt_prefix import RecordingAttention, silent_prefix_tokens
from realtime.engine.speculation import RealtimeTarget, SpeculativeConfig, Speculator, runner_options_for
from realtime.engine.tree import default_tree_paths
from realtime.loader import CheckpointError, load_model
from realtime.serving import StreamDone
from realtime.session import transcribe
from realtime.tokenizer import load_tokenizer
from speculative import (
    CPU_MAX_DEFAULT_DRAFTS,
    DrafterConfig,
    EagleDrafter,
    EagleModel,
    ParallelEagleDrafter,
    SupportsMultiModalEmbeddings,
    TwoPassEagleDrafter,
    default_num_speculative_tokens,
    drafter_receives_audio,
    load_drafter,
    save_drafter,
    supports_multimodal_embeddings,
    supports_parallel_drafting,
    supports_two_pass_drafting,
)
from speculative.train import TrainConfig, teacher_forced, train_drafter

SEEN = [synthetic_audio(3.0, seed=200 + i) for i in range(3)]  # the trained drafter's training clips
UNSEEN = [synthetic_audio(2.5, seed=300 + i) for i in range(3)]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(tiny_ckpt):
    path = tiny_ckpt(seed=1)
    model, _ = load_model(path)
    return model, load_tokenizer(path)


def _distil(target, tmp_path_factory, name: str, **kinds) -> EagleModel:
    """A drafter distilled briefly from the tiny target on SEEN (`kinds`: parallel=True or two_pass=True)."""
    model, _ = target
    out = tmp_path_factory.mktemp(name)
    unroll = 4 if kinds else 2
    with single_thread():  # module fixtures run outside the per-test one_thread
        train_drafter(model, SEEN, out, TrainConfig(steps=60, batch=8, seq_len=64, lr=3e-3, unroll=unroll,
                                                    log_every=1000, **kinds), eval_audios=[])
    return load_drafter(out, target_embedding=model.language_model.embed_tokens.weight)


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    return _distil(target, tmp_path_factory, "drafter")


@pytest.fixture(scope="module")
def trained_parallel(target, tmp_path_factory):
    d = _distil(target, tmp_path_factory, "parallel_drafter", parallel=True)
    assert type(d) is ParallelEagleDrafter
    return d


@pytest.fixture(scope="module")
def trained_two_pass(target, tmp_path_factory):
    d = _distil(target, tmp_path_factory, "two_pass_drafter", two_pass=True)
    assert type(d) is TwoPassEagleDrafter
    return d


@dataclasses.dataclass(frozen=True)
class TreeDrafting:
    """A drafter to run with tree verification of `nodes` nodes per round."""

    drafter: EagleModel
    nodes: int


def spec_config(drafter: EagleModel | TreeDrafting, k: int, **kw) -> SpeculativeConfig:
    if isinstance(drafter, TreeDrafting):
        return SpeculativeConfig(drafter.drafter, num_speculative_tokens=k, tree_nodes=drafter.nodes, **kw)
    return SpeculativeConfig(drafter, num_speculative_tokens=k, **kw)


@pytest.fixture(scope="module")
def tree(trained_parallel):
    return TreeDrafting(trained_parallel, 5)


DRAFTER_FIXTURES = {"chained": "trained", "parallel": "trained_parallel", "two_pass": "trained_two_pass",
                    "tree": "tree"}


@pytest.fixture(params=sorted(DRAFTER_FIXTURES))
def drafter_kind(request):
    """Each lossless scenario runs with the chained drafter, the one-pass parallel drafter (with chain
    and with tree verification) and the two-pass drafter."""
    return request.getfixturevalue(DRAFTER_FIXTURES[request.param])


_refs: dict[tuple, list[int]] = {}


def reference(model, tok, audio, delay_ms=None) -> list[int]:
    key = (id(model), hashlib.sha1(audio.tobytes()).hexdigest(), delay_ms)
    if key not in _refs:
        _refs[key] = transcribe(model, tok, audio, delay_ms=delay_ms).token_ids
    return _refs[key]


def echo_drafter(model, cls=EagleDrafter, window: int | None = None) -> EagleModel:
    cfg = DrafterConfig.for_target(model.config, **({"sliding_window": window} if window else {}))
    d = cls(cfg)
    h = cfg.hidden_size
    with torch.no_grad():
        for p in d.parameters():
            p.zero_()
        d.fc.weight[:, :h] = torch.eye(h)
        for layer in d.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        d.norm.weight.copy_(model.language_model.norm.weight)
    emb = model.language_model.embed_tokens.weight
    return d.to(emb.device, emb.dtype).eval().tie_to(emb)


def scaled_target(model, alpha: float):
    """The target with its LM layers' residual branches scaled by alpha (0: no context at all)."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for layer in m.language_model.layers:
            layer.self_attn.o_proj.weight.mul_(alpha)
            layer.mlp.down_proj.weight.mul_(alpha)
    return m


def run_scenario(model, tok, drafter, clips, schedules, *, k=4, opts=None, delays=None, lookahead_chunk=None,
                 spec_target=None):
    """Streams fed by `schedules[i]`: a list of sample counts pushed per engine step (then finish);
    every stream's tokens must be the single-stream session's."""
    delays = delays or [None] * len(clips)
    eng, tokens = run_streams(model, tok, drafter, clips, schedules, k=k, opts=opts, delays=delays,
                              lookahead_chunk=lookahead_chunk, spec_target=spec_target)
    for i, got in enumerate(tokens):
        assert got == reference(model, tok, clips[i], delays[i]), f"stream {i}"
    return eng, eng.stats()


def run_streams(model, tok, drafter, clips, schedules, *, k=4, opts=None, delays=None, lookahead_chunk=None,
                spec_target=None):
    """`run_scenario` without the reference: (the engine, each stream's tokens); drafter None: no speculation;
    `spec_target`: the target as the speculator's capability check sees it (default: the engine's own)."""
    opts = opts or RunnerOptions(max_streams=len(clips), max_batch=len(clips), cuda_graphs=False)
    spec = spec_config(drafter, k, lookahead_chunk=lookahead_chunk) if drafter else None
    eng = BatchedEngine(model, tok, opts=opts, speculative=spec)
    if spec_target is not None:
        eng.speculator = Speculator(eng.runner, spec, target=spec_target)
    rec = Recorder()
    delays = delays or [None] * len(clips)
    sids = [eng.open_stream(rec, delay_ms=d) for d in delays]
    pos = [0] * len(clips)
    step = 0
    while any(rec.done(s) is None for s in sids):
        for i, sid in enumerate(sids):
            if pos[i] < clips[i].size:
                n = schedules[i][step] if step < len(schedules[i]) else clips[i].size
                eng.push_audio(sid, clips[i][pos[i]: pos[i] + n])
                pos[i] += n
                if pos[i] >= clips[i].size:
                    eng.finish_stream(sid)
        eng._run_step(eng._sync_with_clients())
        step += 1
        assert step < 5000
    for sid in sids:
        assert isinstance(rec.done(sid), StreamDone)
        eng.close_stream(sid)
    eng._sync_with_clients()
    return eng, [rec.tokens(sid) for sid in sids]


def assert_partial_acceptance(st) -> None:
    assert st.spec_drafted > 0
    assert 0 < st.spec_accepted < st.spec_drafted, (st.spec_accepted, st.spec_drafted)
    assert 0.0 < st.spec_acceptance_rate < 1.0
    assert st.spec_mean_acceptance_length == pytest.approx(1 + st.spec_accepted / st.spec_rounds)
    assert sum(st.spec_drafted_per_position) == st.spec_drafted
    assert sum(st.spec_accepted_per_position) == st.spec_accepted
    # acceptance at depth i implies acceptance at every shallower depth of that round
    assert all(a >= b for a, b in zip(st.spec_accepted_per_position, st.spec_accepted_per_position[1:]))


# ---------------------------------------------------------------------------------------------
# Capability contract
# ---------------------------------------------------------------------------------------------
class TextOnlyTarget(RealtimeTarget):
    produces_multimodal_embeddings = False


class LookAlike(torch.nn.Module):
    """Has an embed_input_ids with the protocol's signature but declares nothing."""

    def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):
        return input_ids


class TruthyFlag(LookAlike):
    supports_multimodal_embeddings = 1  # not the literal True


class Declared(LookAlike, SupportsMultiModalEmbeddings):
    pass


def test_capability_matrix(target, caplog):
    model, _ = target
    cfg = DrafterConfig.for_target(model.config)
    audio_target, text_target = RealtimeTarget(model), TextOnlyTarget(model)
    assert supports_multimodal_embeddings(EagleDrafter(cfg)) and supports_multimodal_embeddings(Declared())
    assert not supports_multimodal_embeddings(EagleModel(cfg))
    assert not supports_multimodal_embeddings(TruthyFlag())
    cases = [
        (audio_target, EagleDrafter(cfg), True, None),
        (audio_target, Declared(), True, None),
        (audio_target, EagleModel(cfg), False, "EagleModel"),
        (audio_target, LookAlike(), False, "LookAlike"),
        (audio_target, TruthyFlag(), False, "TruthyFlag"),
        (text_target, EagleDrafter(cfg), False, None),
        (text_target, EagleModel(cfg), False, None),
        (object(), EagleDrafter(cfg), False, None),  # a target that declares nothing
    ]
    for tgt, drafter, want, warned in cases:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="speculative.capability"):
            assert drafter_receives_audio(tgt, drafter) is want, (type(tgt).__name__, type(drafter).__name__)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        if warned:
            assert len(warnings) == 1 and warned in warnings[0].getMessage()
            assert "signature is not a declaration" in warnings[0].getMessage()
        else:
            assert not warnings


class SpyDrafter(EagleDrafter):
    calls: list

    def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):
        self.calls.append(multimodal_embeddings is not None)
        return super().embed_input_ids(input_ids, multimodal_embeddings, is_multimodal=is_multimodal)


@pytest.mark.parametrize("text_only_target", [False, True])
def test_engine_passes_audio_only_when_both_declare(target, caplog, text_only_target):
    model, tok = target
    d = SpyDrafter(DrafterConfig.for_target(model.config)).eval()
    d.calls = []
    cfg = SpeculativeConfig(d, num_speculative_tokens=3)
    opts = runner_options_for(RunnerOptions(max_streams=1, max_batch=1, cuda_graphs=False), cfg)
    eng = BatchedEngine(model, tok, opts=opts)
    with caplog.at_level(logging.WARNING):
        eng.speculator = Speculator(eng.runner, cfg, target=TextOnlyTarget(model) if text_only_target else None)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]  # a declared drafter: no warning
    sp = eng.speculator
    assert sp.drafter_audio is (not text_only_target)
    # buffers that depend on the decision exist only when audio flows
    assert ("c_aud" in sp.m and "dr_aud" in sp.m) is (not text_only_target)
    rec = Recorder()
    sid = eng.open_stream(rec)
    eng.push_audio(sid, SEEN[0])
    eng.finish_stream(sid)
    for _ in range(1000):
        if rec.done(sid) is not None:
            break
        eng._run_step(eng._sync_with_clients())
    assert rec.tokens(sid) == reference(model, tok, SEEN[0])
    assert d.calls and all(c is (not text_only_target) for c in d.calls)
    assert eng.stats().spec_drafted > 0


def test_undeclared_drafter_drafts_text_only_with_one_warning(target, caplog):
    model, tok = target
    d = echo_drafter(model, cls=EagleModel)
    with caplog.at_level(logging.WARNING):
        run = transcribe_batch(model, tok, UNSEEN[:1], opts=RunnerOptions(1, 1, cuda_graphs=False),
                               speculative=SpeculativeConfig(d, 4))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "EagleModel" in warnings[0]
    assert run.results[0].token_ids == reference(model, tok, UNSEEN[0])


# ---------------------------------------------------------------------------------------------
# Lossless in every mode (mixed batches: streams that draft and streams that do not share steps)
# ---------------------------------------------------------------------------------------------
def _live(clip, rng, lo=600, hi=2200):
    return [int(x) for x in rng.integers(lo, hi, size=clip.size // lo + 2)]


SCHEDULES = {
    # paced small chunks around one 80 ms token per step: sometimes 2-3 tokens are buffered
    "live": lambda clip, rng: _live(clip, rng),
    # stalls of 12 steps, then 1 s at once
    "catch-up": lambda clip, rng: ([0] * 12 + [16000]) * 40,
    # exactly one token per step, then finish: the delay + 11 right-pad tokens at once
    "flush": lambda clip, rng: [1280] * 400,
}


@pytest.mark.parametrize("mode", sorted(SCHEDULES))
def test_lossless_per_mode(target, drafter_kind, mode):
    """Two streams (audio the drafter was trained on, and unseen audio) in one engine."""
    model, tok = target
    rng = np.random.default_rng(1)
    clips = [SEEN[1], UNSEEN[1]]
    _, st = run_scenario(model, tok, drafter_kind, clips, [SCHEDULES[mode](c, rng) for c in clips])
    assert_partial_acceptance(st)


@pytest.mark.parametrize("chunk", [None, 32])
def test_live_catchup_flush_and_whole_streams_together(target, drafter_kind, chunk):
    """One engine, four streams with different delays in mixed batches: live, catch-up, flush and
    one pushed whole; once closed, every KV ring is back in the pool. Also with look-ahead calls of up to 32
    tokens (CUDA's default: 32 for a stream alone in a call, 16 for two, 8 for more)."""
    model, tok = target
    rng = np.random.default_rng(0)
    clips = [SEEN[0], UNSEEN[0], SEEN[2], UNSEEN[2]]
    schedules = [SCHEDULES["live"](clips[0], rng), SCHEDULES["catch-up"](clips[1], rng),
                 SCHEDULES["flush"](clips[2], rng), [clips[3].size]]
    eng, st = run_scenario(model, tok, drafter_kind, clips, schedules, delays=[480, 160, 480, 1200],
                           lookahead_chunk=chunk)
    assert_partial_acceptance(st)
    pool = eng.runner.lm_cache.pool  # closed: every ring returned (a tree's scratch blocks stay with the engine)
    assert pool.free == pool.num_blocks - eng.opts.lm_scratch_blocks
    assert (eng.opts.lm_scratch_blocks > 0) is isinstance(drafter_kind, TreeDrafting)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_offline_batch_equals_sessions(target, drafter_kind, k):
    model, tok = target
    clips = [SEEN[2], UNSEEN[2], SEEN[0][:9000], UNSEEN[0][:700]]
    run = transcribe_batch(model, tok, clips, opts=RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False),
                           speculative=spec_config(drafter_kind, k))
    for clip, res in zip(clips, run.results):
        assert res.token_ids == reference(model, tok, clip)
    assert_partial_acceptance(run.stats)
    assert len(run.stats.spec_drafted_per_position) == k
    plain = transcribe_batch(model, tok, clips, opts=RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False))
    assert [r.text for r in plain.results] == [r.text for r in run.results]
    if k > 1:
        assert run.steps < plain.steps  # accepted drafts save steps


def test_verify_rows_cap_cuts_the_drafts_of_crowded_steps_and_stays_lossless(target, trained_parallel, monkeypatch):
    """`max_verify_rows`: a step with more verify rows than the cap cuts every stream's drafts to cap // streams - 1,
    to none below MIN_CUT_DRAFTS (on the 2-core CPU 64 files decoded 2.43x faster with the cap than with 6 each); the
    tokens are the reference's either way. The CPU's default is CPU_MAX_VERIFY_ROWS (at least k + 1, so a lone
    stream drafts all k); elsewhere there is no cap unless given. Bad caps are refused."""
    from realtime.engine.speculation import CPU_MAX_VERIFY_ROWS, MIN_CUT_DRAFTS

    model, tok = target
    assert SpeculativeConfig(trained_parallel, 6).on(torch.device("cpu")).max_verify_rows == CPU_MAX_VERIFY_ROWS == 32
    assert SpeculativeConfig(trained_parallel, 40).on(torch.device("cpu")).max_verify_rows == 41
    assert SpeculativeConfig(trained_parallel, 6).on(torch.device("cuda")).max_verify_rows is None
    assert SpeculativeConfig(trained_parallel, 6, max_verify_rows=40).on(torch.device("cpu")).max_verify_rows == 40
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="max_verify_rows must be an integer >= 1 or None"):
            BatchedEngine(model, tok, opts=RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False),
                          speculative=SpeculativeConfig(trained_parallel, 4, max_verify_rows=bad))
    seen: list[tuple[int, list[int]]] = []
    layout = Speculator._layout

    def spy(self, streams):
        out = layout(self, streams)
        seen.append((len(streams), list(out[0].k_s)))
        return out

    monkeypatch.setattr(Speculator, "_layout", spy)
    clips = [SEEN[2], UNSEEN[2], SEEN[0][:30000], UNSEEN[0][:14000]]  # 4 streams in a step, then fewer
    opts = RunnerOptions(max_streams=4, max_batch=4, cuda_graphs=False)
    full: dict[int, int] = {}  # streams in a step -> the most verify rows such a step took without a cap
    for cap in (10**6, 16, 12):
        seen.clear()
        run = transcribe_batch(model, tok, clips, opts=opts, speculative=SpeculativeConfig(trained_parallel, 6,
                                                                                            max_verify_rows=cap))
        assert [r.token_ids for r in run.results] == [reference(model, tok, c) for c in clips]
        for n, k_s in seen:
            rows = n + sum(k_s)
            if cap == 10**6:
                full[n] = max(full.get(n, 0), rows)
                continue
            assert rows <= cap, (cap, n, k_s)
        if cap == 10**6:
            assert full[4] == 4 * 7 and full[1] == 7  # without a cap: 6 drafts each, 4 streams at once
        else:  # the cap is what held the 4-stream steps: 16 // 4 - 1 = 3 drafts each; 12 // 4 - 1 = 2, so none
            assert max(max(k_s) for n, k_s in seen if n == 4) == (3 if cap == 16 else 0)
    assert 12 // 4 - 1 < MIN_CUT_DRAFTS <= 16 // 4 - 1


@pytest.mark.parametrize(("cls", "tree_nodes"), [(EagleDrafter, None), (ParallelEagleDrafter, None),
                                                 (TwoPassEagleDrafter, None), (ParallelEagleDrafter, 7)])
def test_small_windows_rings_with_speculation(tiny_ckpt, cls, tree_nodes):
    """Encoder window 8, LM window 6, drafter window 6, block size 4: every ring wraps many times
    while verify steps write (and roll back) several positions per stream (a parallel drafter's
    pass writes up to 2k positions per stream: its ring is sized for them). With a tree, the
    context gathered from the ring is the window's last 5 positions, and the commits wrap too."""
    path = tiny_ckpt(seed=1, small_windows=True)
    base, _ = load_model(path)
    tok = load_tokenizer(path)
    model = scaled_target(base, 0.03)
    drafter = echo_drafter(model, cls=cls, window=6)
    if tree_nodes:
        drafter = TreeDrafting(drafter, tree_nodes)
    clips = [synthetic_audio(6.0, seed=400), synthetic_audio(4.0, seed=401)]
    opts = RunnerOptions(max_streams=2, max_batch=2, block_size=4, cuda_graphs=False)
    _, st = run_scenario(model, tok, drafter, clips, [[3000] * 100, ([0] * 6 + [12000]) * 20], k=5, opts=opts)
    assert_partial_acceptance(st)


def check_whole_step_layouts(monkeypatch) -> list[tuple[int, int, int]]:
    """From here on every `Speculator._rows_at_once` (a chain's layout of all streams at once) is compared with
    `_rows_per_stream` (a stream at a time) on the same step: every staged array, the catch-up and verify row
    counts and each stream's first verify row must be equal. Returns the list of (streams, drafting streams,
    drafts) of the steps compared."""
    at_once = Speculator._rows_at_once
    seen: list[tuple[int, int, int]] = []

    def compared(self, h, plan):
        ref = {n: a.copy() for n, a in h.items()}  # the staging as the step found it (its padding)
        ref_plan = dataclasses.replace(plan, verify_base=[], rows=0)
        ref_c = self._rows_per_stream(ref, ref_plan, None)
        c = at_once(self, h, plan)
        assert (c, plan.rows, plan.verify_base) == (ref_c, ref_plan.rows, ref_plan.verify_base)
        for name in h:
            np.testing.assert_array_equal(h[name], ref[name], err_msg=name)
        seen.append((len(plan.order), sum(1 for n in plan.k_s if n), sum(plan.k_s)))
        return c

    monkeypatch.setattr(Speculator, "_rows_at_once", compared)
    monkeypatch.setattr(speculation, "AT_ONCE_MIN_STREAMS", 1)  # at any batch (the default takes it from 12 on)
    return seen


def test_whole_step_layout_is_the_per_stream_layout(target, drafter_kind, monkeypatch):
    """The four-stream mixed scenario (live, catch-up, flush, whole; different delays, so prompt rows in drafting
    steps) with every step's whole-step layout checked against the per-stream one; tokens equal the sessions'. A
    tree keeps the per-stream layout."""
    seen = check_whole_step_layouts(monkeypatch)
    model, tok = target
    rng = np.random.default_rng(0)
    clips = [SEEN[0], UNSEEN[0], SEEN[2], UNSEEN[2]]
    schedules = [SCHEDULES["live"](clips[0], rng), SCHEDULES["catch-up"](clips[1], rng),
                 SCHEDULES["flush"](clips[2], rng), [clips[3].size]]
    run_scenario(model, tok, drafter_kind, clips, schedules, delays=[480, 160, 480, 1200])
    if isinstance(drafter_kind, TreeDrafting):
        assert not seen
        return
    # steps of 4 streams where some draft and some do not, and steps where every stream drafts
    assert any(n == 4 and 0 < d < 4 for n, d, _ in seen) and any(d == n > 1 for n, d, _ in seen)


@pytest.mark.parametrize(("cls", "text_only"), [(EagleDrafter, False), (EagleDrafter, True),
                                                (ParallelEagleDrafter, False), (ParallelEagleDrafter, True),
                                                (TwoPassEagleDrafter, False)])
def test_whole_step_layout_with_wrapping_rings(tiny_ckpt, monkeypatch, cls, text_only):
    """The same check where every ring wraps many times (positions far past the rings' sizes: slot mappings, audio
    rows) and, for a text-only target, without the drafter's audio rows."""
    seen = check_whole_step_layouts(monkeypatch)
    path = tiny_ckpt(seed=1, small_windows=True)
    base, _ = load_model(path)
    tok = load_tokenizer(path)
    model = scaled_target(base, 0.03)
    clips = [synthetic_audio(6.0, seed=400), synthetic_audio(4.0, seed=401), synthetic_audio(3.0, seed=402)]
    opts = RunnerOptions(max_streams=3, max_batch=3, block_size=4, cuda_graphs=False)
    eng, _ = run_scenario(model, tok, echo_drafter(model, cls=cls, window=6), clips,
                          [[3000] * 100, ([0] * 6 + [12000]) * 20, [1280] * 100], k=5, opts=opts,
                          spec_target=TextOnlyTarget(model) if text_only else None)
    assert eng.speculator.drafter_audio is not text_only
    assert any(drafting > 1 for _, drafting, _ in seen) and max(drafts for *_, drafts in seen) >= 10


def test_speculation_is_off_by_default(target):
    model, tok = target
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=1, max_batch=1, cuda_graphs=False))
    assert eng.speculator is None
    st = eng.stats()
    assert (st.spec_drafted, st.spec_rounds, st.spec_acceptance_rate, st.spec_mean_acceptance_length) == (0, 0, 0, 0)


def test_bad_speculative_settings(target):
    model, tok = target
    d = echo_drafter(model)
    with pytest.raises(ValueError, match="max_step_tokens >= 9"):
        BatchedEngine(model, tok, opts=RunnerOptions(1, 1, cuda_graphs=False, max_step_tokens=8),
                      speculative=SpeculativeConfig(d, num_speculative_tokens=8))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        BatchedEngine(model, tok, speculative=SpeculativeConfig(d, num_speculative_tokens=0))
    for bad in (0, 33, 2.0, True):
        with pytest.raises(ValueError, match=rf"lookahead_chunk must be an integer in 1..32 or None, got {bad!r}"):
            BatchedEngine(model, tok, opts=RunnerOptions(1, 1, cuda_graphs=False),
                          speculative=SpeculativeConfig(d, 4, lookahead_chunk=bad))
    # a look-ahead chunk larger than a step's LM rows: the encoder's KV ring is sized for its queries
    big = BatchedEngine(model, tok, opts=RunnerOptions(1, 1, cuda_graphs=False),
                        speculative=SpeculativeConfig(d, 4, lookahead_chunk=32))
    fpt = model.config.streaming.downsample_factor
    assert big.runner.encoder.max_chunk == 32 and big.runner.enc_cache.spec.max_q_len == 32 * fpt
    assert big.runner.encoder.chunk_rows == 32 * model.config.streaming.mel_frames_per_token
    small = RunnerOptions(1, 1, cuda_graphs=False, encoder_cache_tokens=8)
    with pytest.raises(ValueError, match="audio cache"):
        Speculator(BatchedEngine(model, tok, opts=small).runner, SpeculativeConfig(d, 4))
    # the engine deepens the audio ring itself
    assert BatchedEngine(model, tok, opts=small, speculative=SpeculativeConfig(d, 4)).runner.cache_len >= 2 * 4 + 8


def test_look_ahead_calls_keep_their_rows_on_the_invariant_kernel(target):
    """A look-ahead call gives each stream as many tokens as keep the call's conv-stem rows (8 mel frames a token)
    within the encoder's chunk rows (256 with 32-token chunks), never fewer than a step's 8: one stream 32, two
    16, four or more 8. Calls of several tokens ask `linear` for those rows, one-token calls for the runner's 64
    (what a plain runner's steps ask for). The calls a backlogged run of 3 streams makes follow it."""
    model, tok = target
    d = echo_drafter(model)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(4, 4, cuda_graphs=False),
                        speculative=SpeculativeConfig(d, 4, lookahead_chunk=32))
    sp = eng.speculator
    enc = sp.lookahead
    assert (sp.runner.encoder_rows, enc.chunk_rows) == (64, 256)
    assert [enc.tokens_per_call(n) for n in (1, 2, 3, 4, 16)] == [32, 16, 8, 8, 8]
    # buffers (and on CUDA graphs) for a call of n tokens only as wide as the streams it takes
    assert enc.max_streams == {32: 1, 16: 2, 8: 4, 4: 4, 2: 4, 1: 4}
    assert [enc.samples[n].shape[0] for n in (32, 16, 8)] == [1, 2, 4]
    eight = BatchedEngine(model, tok, opts=RunnerOptions(4, 4, cuda_graphs=False),
                          speculative=SpeculativeConfig(d, 4, lookahead_chunk=8)).speculator.lookahead
    assert eight.chunk_rows == 64 and eight.tokens_per_call(1) == 8 and set(eight.max_streams.values()) == {4}
    # a caller asking more streams of a size than it takes: split into calls it takes, or refused when direct
    split: list[list[int]] = []
    mel = SimpleNamespace(window_samples=lambda f: None, advance=lambda f: None)
    fake = [SimpleNamespace(slot=i, audio_done=0, mel=mel) for i in range(3)]
    real_run, enc.run = enc.run, lambda n, w, slots, done, ahead=False: split.append([n, *slots])
    enc.encode([(s, 16) for s in fake])
    assert split == [[16, 0, 1], [16, 2]]
    enc.run = real_run
    with pytest.raises(ValueError, match="a look-ahead call of 32 tokens takes at most 1 streams"):
        enc.run(32, [torch.zeros(1)] * 2, [0, 1], [0, 0])
    calls: list[tuple[int, int, int]] = []  # (tokens a stream, streams, rows asked of `linear`) of every call
    run = sp.lookahead.run
    conv = model.audio_tower.embedder

    def spy(n, windows, slots, audio_done, ahead=False):
        out = run(n, windows, slots, audio_done, ahead)
        calls.append((n, len(slots), asked[-1]))
        return out

    asked: list[int] = []
    forward = sp.lookahead._encode

    def spy_encode(n, b):
        asked.append(conv.linear_rows)  # inside the call's `encoder_rows` context
        return forward(n, b)

    sp.lookahead._encode = spy_encode

    sp.lookahead.run = spy
    rec = Recorder()
    clips = [LONG, SEEN[0], UNSEEN[1]]
    sids = []
    for clip in clips:
        sids.append(eng.open_stream(rec))
        eng.push_audio(sids[-1], clip)
        eng.finish_stream(sids[-1])
    drive(eng)
    assert all(isinstance(rec.done(s), StreamDone) for s in sids)
    assert calls and all(n <= enc.tokens_per_call(b) for n, b, _ in calls), calls
    assert any(n == 32 for n, b, _ in calls) and any(b == 3 for n, b, _ in calls), calls
    assert all(rows == (64 if n == 1 else 256) for n, _, rows in calls), calls


@pytest.mark.parametrize("chunk", [None, 32])
def test_max_session_length_with_speculation(target, drafter_kind, chunk):
    """A stream cut at the engine's maximum session length: drafts (a tree's nodes too) never run past
    the last position it may decode (the KV rings are sized to it), and the kept tokens are the oracle's; also
    with look-ahead calls of up to 32 tokens (CUDA's default), which reach the end in fewer, larger calls."""
    model, tok = target
    opts = RunnerOptions(max_streams=2, max_batch=2, max_session_seconds=1.0, cuda_graphs=False)
    eng = BatchedEngine(model, tok, opts=opts, speculative=spec_config(drafter_kind, 4, lookahead_chunk=chunk))
    rec = Recorder()
    long_sid, short_sid = eng.open_stream(rec), eng.open_stream(rec)
    long_clip = np.concatenate([SEEN[0], SEEN[1], SEEN[2]])  # 9 s: more than max_tokens can hold
    eng.push_audio(long_sid, long_clip)
    eng.push_audio(short_sid, SEEN[2][:8000])
    eng.finish_stream(short_sid)
    long_stream = eng._controls[long_sid].stream
    for _ in range(1000):
        if rec.done(long_sid) is not None and rec.done(short_sid) is not None:
            break
        eng._run_step(eng._sync_with_clients())
    done = rec.done(long_sid)
    assert isinstance(done, StreamDone) and done.truncated
    # the look-ahead stopped at the last position the stream could run, though more audio had arrived
    assert long_stream.audio_done == long_stream.max_tokens - 1
    assert long_stream.audio_tokens_ready(model.config.streaming.mel_frames_per_token) > 0
    got = rec.tokens(long_sid)
    assert len(got) == eng.runner.max_tokens - model.config.prompt_length(6)
    assert got == reference(model, tok, long_clip)[: len(got)]
    assert rec.tokens(short_sid) == reference(model, tok, SEEN[2][:8000])
    assert eng.stats().spec_accepted > 0


# ---------------------------------------------------------------------------------------------
# Joins: the drafter's prompt state comes from the prefix cache and the prompt rows
# ---------------------------------------------------------------------------------------------
def prefill_drafter_kv(model, drafter, clip, delay_ms) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The drafter's KV at the prompt positions 0..P-1 as the eager prefill wrote it: from the
    target's dense (teacher-forced) audio embeddings and hidden states, position q reading h_{q-1}
    and position 0 zeros."""
    c = model.config
    delay = c.delay_tokens(delay_ms)
    prompt = c.prompt_ids(delay)
    audio, hidden = teacher_forced(model, clip, prompt + [0], delay)  # positions 0..P-1
    pos = torch.arange(len(prompt))
    x = drafter.embed_input_ids(torch.tensor(prompt), audio)
    prev = torch.cat([torch.zeros_like(hidden[:1]), hidden[:-1]])
    rec = RecordingAttention(pos, drafter.config.sliding_window, drafter.config.num_layers)
    with torch.no_grad():
        drafter(x[None], prev[None], pos[None], drafter.t_cond(torch.tensor([delay]))[:, None, :], rec)
    return rec.k, rec.v


@pytest.mark.parametrize(("left_pad_tokens", "small_windows"), [(32, False), (0, False), (32, True)])
def test_joined_drafter_state_is_what_a_prefill_writes(tiny_ckpt, trained, left_pad_tokens, small_windows):
    """A stream joins (into a slot another stream used before) with its whole audio buffered: after
    its last prompt row, the drafter's KV at every prompt position its ring holds equals the eager
    prefill's, the prefix's positions 0..K-1 and the prompt rows' K..P-1 alike. No left padding:
    K = 0, and the catch-up of position 0 reads zeros, not the slot's last stream's hidden state.
    Small windows: a 2-layer drafter with window 6 whose ring wraps inside the prompt (its second
    layer's keys come from attention over the prefix pages)."""
    path = tiny_ckpt(seed=1, small_windows=small_windows)
    cfg = load_config(path)
    cfg = dataclasses.replace(cfg, streaming=dataclasses.replace(cfg.streaming, n_left_pad_tokens=left_pad_tokens))
    model, _ = load_model(path, config=cfg)
    tok = load_tokenizer(path)
    if small_windows:
        torch.manual_seed(0)
        drafter = EagleDrafter(DrafterConfig.for_target(cfg, num_layers=2, sliding_window=6)).eval()
    else:
        drafter = copy.deepcopy(trained)
    opts = RunnerOptions(max_streams=1, max_batch=1, block_size=4 if small_windows else 16, cuda_graphs=False)
    eng = BatchedEngine(model, tok, opts=opts, speculative=SpeculativeConfig(drafter, 4))
    sp, rec = eng.speculator, Recorder()
    before = eng.open_stream(rec, delay_ms=160)  # leaves its drafter KV and hidden states in the slot
    eng.push_audio(before, UNSEEN[0])
    eng.finish_stream(before)
    drive(eng)
    eng.close_stream(before)
    eng._sync_with_clients()  # the slot is free again
    sid = eng.open_stream(rec, delay_ms=480)
    eng.push_audio(sid, SEEN[1])
    eng.finish_stream(sid)
    s = eng._controls[sid].stream
    n = s.prompt_len
    assert (silent_prefix_tokens(cfg, s.delay_tokens) > 0) is (left_pad_tokens > 0)
    for _ in range(n):  # a prompt row per step at most
        if s.lm_pos >= n or s.done:
            break
        eng._run_step(eng._sync_with_clients())
    assert s.lm_pos >= n and not s.done
    first = sp.d_cache.oldest_kept(n - 1)  # positions first..n-1 are in the ring, nothing after
    assert (first > 0) is small_windows
    rows = torch.from_numpy(sp.d_cache.host_slots(s.slot, np.arange(first, n)))
    want_k, want_v = prefill_drafter_kv(model, sp.drafter, SEEN[1], 480)
    for layer in range(sp.drafter.config.num_layers):
        for cache, want in ((sp.d_cache.k, want_k), (sp.d_cache.v, want_v)):
            got = cache[layer].view(-1, *want[layer].shape[1:])[rows]
            torch.testing.assert_close(got, want[layer][first:], atol=2e-5, rtol=1e-4)
    drive(eng)
    assert rec.tokens(sid) == reference(model, tok, SEEN[1], 480)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_speculative_engine_equals_plain_engine(tiny_ckpt, trained, dtype):
    """Both engines join through the prompt-prefix cache and run the rest of the prompt as rows of
    their steps, so they start every stream from the same caches: equal tokens (streams with
    different delays, joining and leaving at different steps, live, catching up and whole).

    In bf16 the look-ahead here encodes one token per stream per step, as the plain engine's encoder
    does (so nothing is drafted), neither engine encodes ahead (`encode_ahead`, which batches other
    streams together), and the tokens are bit-for-bit the plain engine's; with the
    earlier eager-prefill joins 3 of these 4 streams differed. With the default look-ahead all 4
    differ in bf16, drafting or not: an encoder call over several tokens or another set of streams
    rounds the audio embeddings differently (measured on the CPU; each stream alone, with its
    encoder calls made one token each like the plain engine's, gives the plain engine's tokens
    while drafting)."""
    path = tiny_ckpt(seed=1)
    model, _ = load_model(path, dtype=dtype)
    tok = load_tokenizer(path)
    drafter = copy.deepcopy(trained).to(dtype)
    rng = np.random.default_rng(2)
    clips = [SEEN[0], UNSEEN[1], SEEN[2], UNSEEN[2][:20000]]
    schedules = [SCHEDULES["live"](clips[0], rng), SCHEDULES["catch-up"](clips[1], rng), [0] * 30 + [clips[2].size],
                 [0] * 9 + SCHEDULES["live"](clips[3], rng)]
    delays = [480, 160, 480, 80]
    # bf16: the encoder calls of both engines must batch the same streams, so neither encodes ahead
    bf16 = dtype == torch.bfloat16
    opts = RunnerOptions(max_streams=4, max_batch=4, cuda_graphs=False, encode_ahead=not bf16)
    _, plain = run_streams(model, tok, None, clips, schedules, delays=delays, opts=opts)
    one_token = 1 if bf16 else None
    eng, spec = run_streams(model, tok, drafter, clips, schedules, delays=delays, lookahead_chunk=one_token, opts=opts)
    assert spec == plain
    if dtype == torch.float32:
        assert_partial_acceptance(eng.stats())
        # CUDA's default: a step's tokens are sent while the next step runs (the CPU's, at the end of their step)
        in_flight = dataclasses.replace(opts, send_tokens_in_flight=True)
        eng, spec = run_streams(model, tok, drafter, clips, schedules, delays=delays, opts=in_flight)
        assert spec == plain and eng._send_in_flight


def test_offline_cli_with_drafter(target, tiny_ckpt, tmp_path, capsys, caplog, monkeypatch):
    import soundfile as sf

    from realtime.transcribe import main

    model, tok = target
    caplog.set_level(logging.INFO, logger="realtime.transcribe")
    spec_lines = lambda: "\n".join(r.getMessage() for r in caplog.records)  # noqa: E731  (the run summary)
    save_drafter(echo_drafter(model), tmp_path / "drafter")
    files = []
    for i, clip in enumerate([UNSEEN[1], SEEN[1]]):
        files.append(str(tmp_path / f"c{i}.wav"))
        sf.write(files[-1], clip, 16000)
    assert main(["--model", str(tiny_ckpt(seed=1)), "--drafter", str(tmp_path / "drafter"), "--k", "3",
                 "--device", "cpu", "--batch", "2", *files]) == 0
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    assert [ln.split("\t")[0] for ln in lines] == files
    for ln, clip in zip(lines, [UNSEEN[1], SEEN[1]]):
        assert ln.split("\t", 1)[1] == transcribe(model, tok, clip).text.strip()
    assert "speculation (k = 3): acceptance rate" in spec_lines()
    # without --k, the drafter's kind decides: 4 drafts for a chained drafter, 6 for a parallel one
    save_drafter(echo_drafter(model, cls=ParallelEagleDrafter), tmp_path / "parallel")
    for drafter, k in (("drafter", 4), ("parallel", 6)):
        caplog.clear()
        assert main(["--model", str(tiny_ckpt(seed=1)), "--drafter", str(tmp_path / drafter), "--device", "cpu",
                     files[0]]) == 0
        out = capsys.readouterr()
        assert out.out.strip() == transcribe(model, tok, UNSEEN[1]).text.strip()
        assert f"speculation (k = {k}): acceptance rate" in spec_lines()
    # --tree-nodes: a parallel drafter's tree; a chained drafter or no drafter is refused with a message
    caplog.clear()
    assert main(["--model", str(tiny_ckpt(seed=1)), "--drafter", str(tmp_path / "parallel"), "--tree-nodes", "5",
                 "--device", "cpu", files[0]]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == transcribe(model, tok, UNSEEN[1]).text.strip()
    assert "speculation (k = 6, tree of 5 nodes): acceptance rate" in spec_lines()
    # --tree-max-streams reaches the engine's configuration (the tree only in steps where that few files draft)
    import realtime.transcribe as cli

    seen = []
    real = cli.transcribe_batch
    monkeypatch.setattr(cli, "transcribe_batch", lambda *a, speculative, **kw: seen.append(speculative) or real(
        *a, speculative=speculative, **kw))
    assert main(["--model", str(tiny_ckpt(seed=1)), "--drafter", str(tmp_path / "parallel"), "--tree-nodes", "5",
                 "--tree-max-streams", "2", "--device", "cpu", *files]) == 0
    assert [(c.tree_nodes, c.tree_max_streams) for c in seen] == [(5, 2)]
    capsys.readouterr()
    for extra, msg in ((["--drafter", str(tmp_path / "drafter")], "needs a parallel drafter"),
                       ([], "--tree-nodes needs a drafter")):
        assert main(["--model", str(tiny_ckpt(seed=1)), *extra, "--tree-nodes", "5", "--device", "cpu", files[0]]) == 2
        assert msg in capsys.readouterr().err


def test_transcribe_cli_decodes_files_on_the_engine(target, tiny_ckpt, tmp_path, capsys, caplog):
    """`python -m realtime.transcribe`: several files at once through the batched engine, with a drafter (chain or
    tree, batched or one at a time) or without, and through the single-stream reference session: each file's
    transcript is the session's, in the order given; one file prints its transcript alone."""
    import soundfile as sf

    from realtime.transcribe import main, one_line

    model, tok = target
    ckpt = str(tiny_ckpt(seed=1))
    drafter = str(tmp_path / "drafter")
    save_drafter(echo_drafter(model, cls=ParallelEagleDrafter), tmp_path / "drafter")
    clips = [UNSEEN[0], SEEN[2], UNSEEN[2]]
    files = []
    for i, clip in enumerate(clips):
        files.append(str(tmp_path / f"c{i}.wav"))
        sf.write(files[-1], clip, 16000, subtype="FLOAT")
    expected = [transcribe(model, tok, c).text for c in clips]
    assert len(set(expected)) == 3
    caplog.set_level(logging.INFO, logger="realtime.transcribe")
    runs = {"no drafter": [], "drafter": ["--drafter", drafter], "tree": ["--drafter", drafter, "--tree-nodes", "5",
            "--batch", "1"], "k 3, batch 2": ["--drafter", drafter, "--k", "3", "--batch", "2"],
            "reference": ["--reference"], "none": ["--drafter", "none", "--batch", "2"],
            "none, one-token encoder calls": ["--drafter", "none", "--encoder-chunk", "1"],
            "none, 8-token encoder calls, batch 1": ["--drafter", "none", "--encoder-chunk", "8", "--batch", "1"],
            "k 3, 4 verify rows": ["--drafter", drafter, "--k", "3", "--max-verify-rows", "4"]}
    caplog.set_level(logging.INFO, logger="realtime.engine.speculation")
    plain = {"no drafter": 32, "none": 32, "none, one-token encoder calls": 1,
             "none, 8-token encoder calls, batch 1": 8}
    for name, extra in runs.items():
        caplog.clear()
        assert main(["--model", ckpt, "--device", "cpu", *extra, *files]) == 0, name
        assert capsys.readouterr().out.splitlines() == [f"{f}\t{one_line(e)}" for f, e in zip(files, expected)], name
        spec = [r.getMessage() for r in caplog.records if r.getMessage().startswith("speculation (")]
        assert len(spec) == (name not in ("reference", *plain)), name
        # without a drafter the CPU encodes a file's buffered audio 32 tokens a call unless --encoder-chunk says
        chunks = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no drafter; encoder calls")]
        want = [f"no drafter; encoder calls of up to {plain[name]} audio tokens"] if name in plain else []
        assert chunks == want, name
        if name == "tree":
            assert spec[0].startswith("speculation (k = 6, tree of 5 nodes)")
        if name == "k 3, batch 2":
            assert spec[0].startswith("speculation (k = 3)")
        on = [r.getMessage() for r in caplog.records if r.getMessage().startswith("speculation on:")]
        if name == "k 3, 4 verify rows":  # the CPU's default is 32 (CPU_MAX_VERIFY_ROWS)
            assert on and all(m.endswith("verify rows a step at most 4") for m in on), on
        elif name == "drafter":
            assert on and all(m.endswith("verify rows a step at most 32") for m in on), on
    assert main(["--model", ckpt, "--device", "cpu", "--drafter", drafter, files[1]]) == 0
    assert capsys.readouterr().out == expected[1].strip() + "\n"
    # --progress: lines on stderr that end with everything decoded; stdout unchanged
    assert main(["--model", ckpt, "--device", "cpu", "--progress", *files]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"{f}\t{one_line(e)}" for f, e in zip(files, expected)]
    total = sum(c.size for c in clips) / 16000
    assert out.err.splitlines()[-1].startswith(f"transcribed {total:.1f} of {total:.1f} s (")
    # an unreadable file among several: named on stderr, the others transcribed, exit status 1; alone: 2
    (tmp_path / "bad.wav").write_bytes(b"not audio")
    (tmp_path / "empty.wav").write_bytes(b"")
    bad, empty, missing = str(tmp_path / "bad.wav"), str(tmp_path / "empty.wav"), str(tmp_path / "missing.wav")
    assert main(["--model", ckpt, "--device", "cpu", "--drafter", drafter, files[0], bad, files[2], empty,
                 missing]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"{files[0]}\t{one_line(expected[0])}", f"{files[2]}\t{one_line(expected[2])}"]
    assert [ln.split(":", 1)[0] for ln in out.err.splitlines()] == ["error"] * 3
    assert bad in out.err and empty in out.err and f"{missing} does not exist" in out.err
    for argv in ([bad], [bad, missing]):
        assert main(["--model", ckpt, "--device", "cpu", *argv]) == 2
        assert capsys.readouterr().out == ""


def test_offline_options_give_encoder_chunks_only_to_runs_without_a_drafter(target):
    from realtime.engine.offline import offline_options

    assert offline_options(3, 16, None).encoder_chunk == 1
    assert offline_options(3, 16, None, encoder_chunk=32) == RunnerOptions(max_streams=3, max_batch=3, encoder_chunk=32)
    spec = SpeculativeConfig(echo_drafter(target[0], cls=ParallelEagleDrafter), 4)
    assert offline_options(1, 1, spec).max_step_tokens == 8
    with pytest.raises(ValueError, match="a drafter's look-ahead sets its own"):
        offline_options(1, 1, spec, encoder_chunk=8)
    # a drafter of 10 drafts a round (more than a plain step's 8 rows): the runner is sized for its 11-row verify, also
    # where transcribe_batch makes the options itself
    ten = SpeculativeConfig(spec.drafter, 10)
    assert offline_options(2, 16, ten).max_step_tokens == 11
    run = transcribe_batch(target[0], target[1], [UNSEEN[0]], speculative=ten)
    assert run.results[0].token_ids == transcribe(target[0], target[1], UNSEEN[0]).token_ids


def test_transcribe_cli_refuses_bad_arguments_with_a_message(target, tiny_ckpt, tmp_path, capsys):
    import soundfile as sf

    from realtime.model_store import DEFAULT_DRAFTER_DIR
    from realtime.transcribe import main

    model, _ = target
    save_drafter(echo_drafter(model), tmp_path / "chain")
    a, b = str(tmp_path / "a.wav"), str(tmp_path / "b.wav")
    sf.write(a, UNSEEN[0], 16000)
    sf.write(b, UNSEEN[1], 16000)
    ckpt = str(tiny_ckpt(seed=1))
    cases = [
        ([a, b, "--words", str(tmp_path / "w.json")], "--srt and --words take one input file"),
        ([a, "--reference", "--drafter", str(tmp_path / "chain")], "--reference decodes one file at a time"),
        ([a, "--reference", "--progress"],
         "it takes no --drafter, --k, --tree-nodes, --encoder-chunk, --max-verify-rows or --progress"),
        ([a, "--reference", "--encoder-chunk", "8"], "--reference decodes one file at a time"),
        ([a, "--reference", "--max-verify-rows", "8"], "--reference decodes one file at a time"),
        ([a, "--drafter", str(tmp_path / "chain"), "--max-verify-rows", "0"], "--max-verify-rows must be at least 1"),
        ([a, "--drafter", "none", "--max-verify-rows", "8"], "--max-verify-rows needs a drafter"),
        ([a, "--drafter", "none", "--encoder-chunk", "0"], "--encoder-chunk must be 1..32, got 0"),
        ([a, "--drafter", "none", "--encoder-chunk", "33"], "--encoder-chunk must be 1..32, got 33"),
        ([a, "--drafter", str(tmp_path / "chain"), "--encoder-chunk", "8"], "a drafter's look-ahead sets its own"),
        ([a, "--batch", "0"], "--batch must be at least 1"),
        ([a, "--k", "0"], "--k must be at least 1"),
        ([a, "--drafter", str(tmp_path / "missing")], "holds no drafter"),
        # distilled for the embedded model
        ([a, "--drafter", str(DEFAULT_DRAFTER_DIR)], "drafter expects a target embedding of shape"),
    ]
    if not torch.cuda.is_available():
        cases.append(([a, "--device", "cuda"], "this machine has no CUDA device"))
    for argv, msg in cases:
        assert main(["--model", ckpt, "--device", "cpu", *argv]) == 2, argv
        out = capsys.readouterr()
        assert out.out == "" and msg in out.err, (argv, out.err)


def test_embedded_model_transcribes_with_its_drafter_by_default(caplog, capsys):
    """With the embedded model and no --drafter, `realtime.transcribe` speculates with the embedded drafter, and
    prints what the reference session decodes; other checkpoints get no default drafter."""
    from pathlib import Path

    from realtime.model_store import DEFAULT_DRAFTER_DIR, DEFAULT_MODEL_DIR, default_drafter_dir
    from realtime.transcribe import main

    assert default_drafter_dir("default") == DEFAULT_DRAFTER_DIR == default_drafter_dir(DEFAULT_MODEL_DIR)
    assert default_drafter_dir(Path("models/elsewhere")) is None
    from realtime.transcribe import build_parser, drafter_for

    def chosen(*argv: str):
        return drafter_for(build_parser().parse_args([*argv, "a.wav"]))

    # on CUDA no drafter unless named: there its graphs' setup costs more than it saves on files of a few minutes
    assert chosen("--device", "cpu") == DEFAULT_DRAFTER_DIR and chosen("--device", "cuda:0") is None
    assert chosen("--device", "cuda", "--drafter", "d") == "d"
    assert chosen("--device", "cpu", "--drafter", "none") is None
    assert chosen("--device", "cpu", "--reference") is None and chosen("--device", "cpu", "--model", "x") is None
    sample = str(Path(__file__).resolve().parent.parent / "demo" / "samples" / "heldout_nyc_f4.wav")
    caplog.set_level(logging.INFO, logger="realtime.transcribe")
    assert main(["--device", "cpu", sample]) == 0
    fast = capsys.readouterr().out
    assert any(r.getMessage().startswith("speculation (k = 6)") for r in caplog.records)
    assert main(["--device", "cpu", "--reference", sample]) == 0
    assert capsys.readouterr().out == fast and len(fast.split()) >= 4


# ---------------------------------------------------------------------------------------------
# Each draft step reads the audio embedding of its own position
# ---------------------------------------------------------------------------------------------
def _shift_audio_gather(monkeypatch, shift: int) -> None:
    """Makes the drafter's look-ahead gather read the audio `shift` positions away (a planted bug)."""
    orig = Speculator._gather_audio

    def shifted(self, rows):
        c = self.C
        return orig(self, (rows // c) * c + (rows % c + shift) % c)

    monkeypatch.setattr(Speculator, "_gather_audio", shifted)


def _echo_run(model, tok, drafter, monkeypatch=None, shift: int = 0):
    if shift:
        _shift_audio_gather(monkeypatch, shift)
    clips = [UNSEEN[0], SEEN[1]]
    run = transcribe_batch(model, tok, clips, opts=RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False),
                           speculative=SpeculativeConfig(drafter, num_speculative_tokens=4))
    for clip, res in zip(clips, run.results):
        assert res.token_ids == reference(model, tok, clip)  # lossless whatever the drafter does
    return run.stats


def test_draft_steps_get_their_own_audio(target, monkeypatch):
    base, tok = target
    model = scaled_target(base, 0.0)  # each token depends only on its own position's fused input
    st = _echo_run(model, tok, echo_drafter(model))
    assert st.spec_drafted > 50 and st.spec_acceptance_rate == 1.0
    assert st.spec_mean_acceptance_length > 4.0  # every round accepts all k = 4 drafts
    # the same drafter without audio, or reading the next / previous position's audio, collapses
    text_only = _echo_run(model, tok, echo_drafter(model, cls=EagleModel))
    assert text_only.spec_acceptance_rate < 0.3
    for shift in (1, -1):
        with monkeypatch.context() as mp:
            st = _echo_run(model, tok, echo_drafter(model), mp, shift)
        assert st.spec_acceptance_rate < 0.3, shift


@dataclasses.dataclass
class DrafterPass:
    second: bool  # a two-pass drafter's second pass
    ids: torch.Tensor
    audio: torch.Tensor | None
    hidden: torch.Tensor
    positions: torch.Tensor
    out: torch.Tensor


class PassRecorder:
    """Mixin for a drafter class: records every pass (`DrafterPass`) in `passes`."""

    passes: list[DrafterPass]
    second: bool = False

    def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):
        self._last = (input_ids.clone(), None if multimodal_embeddings is None else multimodal_embeddings.clone())
        return super().embed_input_ids(input_ids, multimodal_embeddings, is_multimodal=is_multimodal)

    def forward(self, inputs_embeds, hidden, positions, t_cond, backend, ada_scales=None):
        out = super().forward(inputs_embeds, hidden, positions, t_cond, backend, ada_scales)
        self.passes.append(DrafterPass(self.second, *self._last, hidden[0].clone(), positions[0].clone(),
                                       out[0].clone()))
        return out


class ParallelSpy(PassRecorder, ParallelEagleDrafter):
    pass


class TwoPassSpy(PassRecorder, TwoPassEagleDrafter):
    pass


def _spied_offline_run(model, tok, d: PassRecorder, monkeypatch, shift: int) -> torch.Tensor:
    """One stream offline (UNSEEN[1], k = 4) with the spying drafter `d`, its look-ahead gather shifted by
    `shift`, and the stash's padding rows dirty (graph padding rows write there: they may hold anything).
    Checks the output is lossless; returns the target's audio embedding of every position."""
    if shift:
        _shift_audio_gather(monkeypatch, shift)
    clip = UNSEEN[1]
    d.passes = []
    init = Speculator.__init__

    def with_dirty_padding_rows(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.stash[self.pad_stash: self.pad_stash + self.k + 1] = 1.0

    monkeypatch.setattr(Speculator, "__init__", with_dirty_padding_rows)
    run = transcribe_batch(model, tok, [clip], opts=RunnerOptions(max_streams=1, max_batch=1, cuda_graphs=False),
                           speculative=SpeculativeConfig(d, num_speculative_tokens=4))
    assert run.results[0].token_ids == reference(model, tok, clip)
    delay = model.config.delay_tokens()
    tokens = model.config.prompt_ids(delay) + run.results[0].token_ids
    return teacher_forced(model, clip, tokens, delay)[0]


def _parallel_rows_audio_errors(model, tok, monkeypatch, shift: int = 0) -> tuple[int, float, int]:
    """Runs one stream offline with a spying parallel drafter. Returns (draft rows seen, largest
    difference between a draft row's audio and the target's audio embedding at that row's position,
    draft rows whose hidden input was not zeros)."""
    d = ParallelSpy(DrafterConfig.for_target(model.config)).eval().tie_to(model.language_model.embed_tokens.weight)
    audio = _spied_offline_run(model, tok, d, monkeypatch, shift)
    rows, worst, nonzero_hidden = 0, 0.0, 0
    for ps in d.passes:
        for r in torch.nonzero(ps.ids == d.mask_token_id).flatten().tolist():
            rows += 1
            worst = max(worst, float((ps.audio[r] - audio[int(ps.positions[r])]).abs().max()))
            nonzero_hidden += int(bool(ps.hidden[r].any()))
    return rows, worst, nonzero_hidden


def test_trained_drafters_are_right_on_their_training_clips(target, drafter_kind):
    """Distilled on SEEN, both drafters are accepted almost always there (a draft read from the wrong
    row, or a draft row fed wrong inputs, would not be)."""
    model, tok = target
    run = transcribe_batch(model, tok, SEEN, opts=RunnerOptions(max_streams=3, max_batch=3, cuda_graphs=False),
                           speculative=spec_config(drafter_kind, 4))
    st = run.stats
    if isinstance(drafter_kind, TreeDrafting):  # most of a tree's nodes are alternatives: count paths
        assert st.spec_rounds > 25 and st.spec_accepted / st.spec_rounds > 0.9 * 4
    else:
        assert st.spec_drafted > 100 and st.spec_acceptance_rate > 0.9


@pytest.mark.parametrize("kind", ["chained", "parallel", "two_pass"])
def test_drafter_rings_keep_every_key_a_pass_reads(target, monkeypatch, tmp_path, kind):
    """A 2-layer drafter (its second layer's keys depend on the first layer's attention) with window 6,
    distilled on the clip, computes the same outputs whether its KV ring has
    blocks of 2 positions (as small as its sizing allows; a parallel pass writes up to 2k positions per
    stream when the last round accepted everything) or of 16 (no slot is reused within a pass)."""
    model, tok = target
    with single_thread():
        train_drafter(model, SEEN[:1], tmp_path, TrainConfig(steps=60, batch=8, seq_len=64, lr=3e-3, unroll=5, layers=2,
                                                             window=6, parallel=kind == "parallel",
                                                             two_pass=kind == "two_pass", log_every=1000),
                      eval_audios=[])
    d = load_drafter(tmp_path, target_embedding=model.language_model.embed_tokens.weight)
    outputs: list[torch.Tensor] = []  # every catch-up pass's outputs (the rows that draft, and all others)
    orig, orig_chain = Speculator._catchup_forward, Speculator._chain_forward

    def recording(self, t):
        orig(self, t)
        outputs.append(self.g_c[:t].clone())

    def recording_drafts(self, s):  # the drafts of the chain or of the second pass
        orig_chain(self, s)
        outputs.append(self.drafts[:s].double())

    monkeypatch.setattr(Speculator, "_catchup_forward", recording)
    monkeypatch.setattr(Speculator, "_chain_forward", recording_drafts)
    runs = []
    for block in (2, 16):
        outputs.clear()
        run = transcribe_batch(model, tok, SEEN[:1], opts=RunnerOptions(max_streams=1, max_batch=1,
                                                                        block_size=block, cuda_graphs=False),
                               speculative=SpeculativeConfig(d, num_speculative_tokens=5))
        runs.append(list(outputs))
    assert run.stats.spec_accepted_per_position[-1] >= 5  # rounds that accepted all 5: full-length passes
    assert len(runs[0]) == len(runs[1])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_parallel_draft_rows_get_their_own_audio_and_no_hidden_state(target, monkeypatch):
    """Each parallel draft row (mask token) at position q reads the audio embedding of q itself
    (the target's, as a teacher-forced pass computes it) and zeros for the target hidden state;
    the same check flags a look-ahead gather that is off by one either way."""
    model, tok = target
    with monkeypatch.context() as mp:
        rows, worst, nonzero_hidden = _parallel_rows_audio_errors(model, tok, mp)
    assert rows > 50 and worst < 1e-4 and nonzero_hidden == 0
    for shift in (1, -1):
        with monkeypatch.context() as mp:
            _, worst, _ = _parallel_rows_audio_errors(model, tok, mp, shift)
        assert worst > 1e-2, shift


def _two_pass_rows_errors(model, tok, monkeypatch, shift: int = 0) -> dict[str, float]:
    """Runs one stream offline with a spying two-pass drafter (random weights, a non-zero mask
    embedding). Returns, over the second passes' rows: how many there were, the largest difference
    between a row's audio and the target's audio embedding at its position, how many mask rows had
    a non-zero hidden input, and, for the first row after p, the largest difference between its
    hidden input and the catch-up pass's output at p, and how many of its tokens were not that
    output's draft."""
    torch.manual_seed(3)
    d = TwoPassSpy(DrafterConfig.for_target(model.config)).eval()
    with torch.no_grad():
        d.mask_embedding.normal_(0.0, 0.5)
    d.tie_to(model.language_model.embed_tokens.weight)
    orig = Speculator._second_pass

    def flagged(self, s, g_first):
        self.drafter.second = True
        orig(self, s, g_first)
        self.drafter.second = False

    monkeypatch.setattr(Speculator, "_second_pass", flagged)
    audio = _spied_offline_run(model, tok, d, monkeypatch, shift)
    res = {"rows": 0, "audio": 0.0, "mask_hidden": 0, "first_rows": 0, "first_hidden": 0.0, "first_token": 0}
    catchup = None
    for ps in d.passes:
        if not ps.second:
            catchup = ps
            continue
        for r in torch.nonzero(ps.positions >= 0).flatten().tolist():
            q = int(ps.positions[r])
            res["rows"] += 1
            res["audio"] = max(res["audio"], float((ps.audio[r] - audio[q]).abs().max()))
            if ps.ids[r] == d.mask_token_id:
                res["mask_hidden"] += int(bool(ps.hidden[r].any()))
                continue
            at_p = int(torch.nonzero(catchup.positions == q - 1).flatten()[0])  # the catch-up row of position p
            res["first_rows"] += 1
            res["first_hidden"] = max(res["first_hidden"], float((ps.hidden[r] - catchup.out[at_p]).abs().max()))
            res["first_token"] += int(ps.ids[r] != d.logits(catchup.out[at_p]).argmax())
    return res


def test_two_pass_rows_read_the_first_draft_and_their_own_audio(target, monkeypatch):
    """The second pass: the row after p reads the first draft's token and the catch-up output at p in
    place of the target hidden state; the rows after it the mask token and zeros; every row the
    target's audio embedding of its own position. An off-by-one look-ahead gather either way is flagged."""
    model, tok = target
    with monkeypatch.context() as mp:
        res = _two_pass_rows_errors(model, tok, mp)
    assert res["rows"] > 50 and res["first_rows"] > 15 and res["rows"] > res["first_rows"]
    assert res["audio"] < 1e-4 and res["mask_hidden"] == 0
    assert res["first_hidden"] < 1e-5 and res["first_token"] == 0
    for shift in (1, -1):
        with monkeypatch.context() as mp:
            assert _two_pass_rows_errors(model, tok, mp, shift)["audio"] > 1e-2, shift


# ---------------------------------------------------------------------------------------------
# Drafter checkpoint format
# ---------------------------------------------------------------------------------------------
def test_a_loaded_drafter_is_prepared_for_inference_and_computes_what_it_did(target, tmp_path):
    """`load_drafter` fuses the drafter's q/k/v and gate/up projections and tabulates its delay scales (what the
    target's loader does for the target): a pass then reads the table instead of running the delay embedding and
    two matmuls a layer, with the outputs of the unprepared drafter; the fused matrices and the table follow a
    `.to()`; a prepared drafter (its q/k/v and gate/up weights views of one matrix each) saves and loads back the
    same."""
    from realtime.attention import DenseAttention

    model, _ = target
    emb = model.language_model.embed_tokens.weight
    d = ParallelEagleDrafter(DrafterConfig.for_target(model.config, num_layers=2, sliding_window=64))
    with torch.no_grad():
        for p in d.parameters():
            p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(p.numel()))
    d.tie_to(emb)
    save_drafter(d, tmp_path / "a")
    back = load_drafter(tmp_path / "a", target_embedding=emb)
    h = d.config.hidden_size
    assert d.ada_table is None and back.ada_table is not None and back.ada_table.shape == (2, 31, h)
    assert all(layer.self_attn._qkv is not None and layer.mlp._gate_up is not None for layer in back.layers)
    g = torch.Generator().manual_seed(3)
    x, hid = torch.randn(1, 9, h, generator=g), torch.randn(1, 9, h, generator=g)
    pos = torch.arange(9)[None]
    delays = torch.tensor([0, 6, 6, 30, 1, 2, 6, 12, 6])
    with torch.no_grad():
        want = d(x, hid, pos, d.t_cond(delays)[None], DenseAttention(pos, 64))
        got = back(x, hid, pos, None, DenseAttention(pos, 64), back.ada_scales_for(delays))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    half = copy.deepcopy(back).to(torch.float64)
    assert half.ada_table.dtype == half.layers[0].self_attn._qkv[0].dtype == torch.float64
    save_drafter(back, tmp_path / "b")
    again = load_drafter(tmp_path / "b", target_embedding=emb)
    for (k1, v1), (k2, v2) in zip(d.state_dict().items(), again.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)


def test_drafter_checkpoint_roundtrip_and_strictness(target, tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    model, _ = target
    emb = model.language_model.embed_tokens.weight
    d = EagleDrafter(DrafterConfig.for_target(model.config, num_layers=2, sliding_window=64))
    save_drafter(d, tmp_path / "ok")
    back = load_drafter(tmp_path / "ok", target_embedding=emb)
    assert type(back) is EagleDrafter and back.config == d.config
    for (k1, v1), (k2, v2) in zip(d.state_dict().items(), back.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)
    assert "embed" not in " ".join(back.state_dict())  # the tied table is the target's, never saved

    def broken(name, edit_weights=None, edit_config=None):
        dst = tmp_path / name
        save_drafter(d, dst)
        if edit_weights:
            w = load_file(str(dst / "drafter.safetensors"))
            edit_weights(w)
            save_file(w, str(dst / "drafter.safetensors"))
        if edit_config:
            meta = json.loads((dst / "drafter_config.json").read_text())
            edit_config(meta)
            (dst / "drafter_config.json").write_text(json.dumps(meta))
        return dst

    with pytest.raises(CheckpointError, match=r"missing tensors \(1\): fc.weight"):
        load_drafter(broken("missing", edit_weights=lambda w: w.pop("fc.weight")))
    with pytest.raises(CheckpointError, match=r"unexpected tensors \(1\): extra"):
        load_drafter(broken("extra", edit_weights=lambda w: w.update(extra=torch.zeros(1))))
    with pytest.raises(CheckpointError, match=r"shape mismatches \(1\): norm.weight"):
        load_drafter(broken("shape", edit_weights=lambda w: w.update({"norm.weight": torch.ones(3)})))
    with pytest.raises(CheckpointError, match="NaN/inf"):
        load_drafter(broken("nan", edit_weights=lambda w: w["fc.weight"].fill_(float("nan"))))
    with pytest.raises(CheckpointError, match="unknown fields"):
        load_drafter(broken("field", edit_config=lambda m: m["config"].update(bogus=1)))
    with pytest.raises(CheckpointError, match="unknown architecture"):
        load_drafter(broken("arch", edit_config=lambda m: m.update(architecture="Medusa")))
    with pytest.raises(CheckpointError, match="format_version"):
        load_drafter(broken("ver", edit_config=lambda m: m.update(format_version=99)))
    with pytest.raises(CheckpointError, match="no drafter"):
        load_drafter(tmp_path / "nothing")
    other = EagleDrafter(DrafterConfig.for_target(model.config, vocab_size=77))
    save_drafter(other, tmp_path / "vocab")
    with pytest.raises(CheckpointError, match="target embedding of shape"):
        load_drafter(tmp_path / "vocab", target_embedding=emb)
    # a text-only drafter keeps its (undeclared) class through a save/load
    save_drafter(EagleModel(d.config), tmp_path / "text")
    assert type(load_drafter(tmp_path / "text")) is EagleModel
    # a parallel or two-pass drafter keeps its class and its mask embedding; a chained checkpoint misses that tensor
    for cls in (ParallelEagleDrafter, TwoPassEagleDrafter):
        masked = cls(d.config)
        with torch.no_grad():
            masked.mask_embedding.normal_()
        save_drafter(masked, tmp_path / cls.__name__)
        back = load_drafter(tmp_path / cls.__name__, target_embedding=emb)
        assert type(back) is cls and torch.equal(back.mask_embedding, masked.mask_embedding)
        with pytest.raises(CheckpointError, match=r"missing tensors \(1\): mask_embedding"):
            load_drafter(broken(f"to_{cls.__name__}", edit_config=lambda m, c=cls: m.update(architecture=c.__name__)))


class TruthyParallel(EagleDrafter):
    supports_parallel_drafting = 1  # not the literal True
    supports_two_pass_drafting = 1


def test_parallel_drafting_is_declared_not_probed(target):
    cfg = DrafterConfig.for_target(target[0].config)
    assert supports_parallel_drafting(ParallelEagleDrafter(cfg))
    assert not supports_parallel_drafting(EagleDrafter(cfg))
    assert not supports_parallel_drafting(TruthyParallel(cfg))
    assert supports_two_pass_drafting(TwoPassEagleDrafter(cfg))
    assert not supports_two_pass_drafting(ParallelEagleDrafter(cfg))
    assert not supports_parallel_drafting(TwoPassEagleDrafter(cfg))
    assert not supports_two_pass_drafting(TruthyParallel(cfg))
    # a round of a chained drafter costs one pass per draft, of the others one or two passes whatever k
    assert [default_num_speculative_tokens(c(cfg)) for c in (EagleDrafter, TruthyParallel, ParallelEagleDrafter,
                                                              TwoPassEagleDrafter)] == [4, 4, 6, 6]
    # a drafter that records the drafts it was trained for gets that many (speculative.train writes it)
    trained_for_10 = ParallelEagleDrafter(dataclasses.replace(cfg, draft_tokens=10))
    assert default_num_speculative_tokens(trained_for_10) == 10 == default_num_speculative_tokens(trained_for_10, "cuda")
    # on the CPU every verified row costs compute: at most CPU_MAX_DEFAULT_DRAFTS, never more than it was trained for
    assert default_num_speculative_tokens(trained_for_10, torch.device("cpu")) == CPU_MAX_DEFAULT_DRAFTS == 6
    trained_for_3 = ParallelEagleDrafter(dataclasses.replace(cfg, draft_tokens=3))
    assert default_num_speculative_tokens(trained_for_3, "cpu") == 3 == default_num_speculative_tokens(trained_for_3)
    # a drafter whose config records a GPU count measured better (the shipped one: trained for 10, drafts 12 on a
    # GPU) drafts that many off the CPU and on the CPU what it was trained for, at most CPU_MAX_DEFAULT_DRAFTS
    gpu_12 = ParallelEagleDrafter(dataclasses.replace(cfg, draft_tokens=10, gpu_draft_tokens=12))
    assert default_num_speculative_tokens(gpu_12, "cuda") == 12 == default_num_speculative_tokens(gpu_12)
    assert default_num_speculative_tokens(gpu_12, "cpu") == CPU_MAX_DEFAULT_DRAFTS
    gpu_only = ParallelEagleDrafter(dataclasses.replace(cfg, gpu_draft_tokens=3))
    assert default_num_speculative_tokens(gpu_only, "cuda") == 3
    assert default_num_speculative_tokens(gpu_only, "cpu") == 6  # the kind's default, as without it
    for name in ("draft_tokens", "gpu_draft_tokens"):
        for bad in (0, -2, True, 2.5, "6"):
            with pytest.raises(CheckpointError, match=f"drafter config: {name} must be None or a positive integer"):
                DrafterConfig.from_dict({**dataclasses.asdict(cfg), name: bad})
    d = ParallelEagleDrafter(cfg).tie_to(target[0].language_model.embed_tokens.weight)
    with torch.no_grad():
        d.mask_embedding.fill_(0.5)
    ids = torch.tensor([3, d.mask_token_id, -1])
    audio = torch.randn(3, cfg.hidden_size)
    x = d.embed_input_ids(ids, audio)
    assert d.mask_token_id == cfg.vocab_size
    torch.testing.assert_close(x[1], torch.full((cfg.hidden_size,), 0.5) + audio[1])  # mask + its own audio
    torch.testing.assert_close(x[0], d.embed_weight[3] + audio[0])


def gpu_echo_setup(tiny_ckpt, small_windows: bool, cls) -> tuple:
    """fp32 on the GPU (no TF32): the tiny target with its layers scaled to 0.03, and an echo drafter of `cls` whose
    mask embedding (mask-row drafters) is not zero, so that graphs must gather it right. (model, tok, drafter)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    path = tiny_ckpt(seed=1, small_windows=small_windows)
    model, _ = load_model(path, device="cuda")
    tok = load_tokenizer(path)
    model = scaled_target(model, 0.03)
    drafter = echo_drafter(model, cls=cls, window=6 if small_windows else None)
    if cls is not EagleDrafter:
        with torch.no_grad():
            drafter.mask_embedding.normal_(0.0, 0.02, generator=torch.Generator("cuda").manual_seed(0))
    return model, tok, drafter


@pytest.mark.gpu
@pytest.mark.parametrize(("cls", "tree_nodes"), [(EagleDrafter, None), (ParallelEagleDrafter, None),
                                                 (TwoPassEagleDrafter, None), (ParallelEagleDrafter, 9)])
@pytest.mark.parametrize("small_windows", [False, True])
def test_graphs_equal_eager_with_speculation_on_gpu(tiny_ckpt, small_windows, cls, tree_nodes):
    model, tok, drafter = gpu_echo_setup(tiny_ckpt, small_windows, cls)
    clips = [synthetic_audio(3.0 + i, seed=500 + i) for i in range(5)]
    outs = {}
    for graphs in (False, True):
        opts = RunnerOptions(max_streams=3, max_batch=3, block_size=16, cuda_graphs=graphs)
        run = transcribe_batch(model, tok, clips, opts=opts,
                               speculative=SpeculativeConfig(drafter, 4, tree_nodes=tree_nodes))
        outs[graphs] = [r.token_ids for r in run.results]
        assert run.stats.spec_drafted > 0
    assert outs[True] == outs[False]
    assert outs[False] == [transcribe(model, tok, c).token_ids for c in clips]


@pytest.mark.gpu
@pytest.mark.parametrize("cls", [EagleDrafter, TwoPassEagleDrafter])
def test_graphs_equal_eager_with_the_whole_step_layout_on_gpu(tiny_ckpt, monkeypatch, cls):
    """14 streams a step: the engine's own choice lays out a chain's rows all at once (from
    AT_ONCE_MIN_STREAMS streams); graphs equal eager and both equal the plain engine at the same batch.

    Not the single-stream sessions: on an H100 (fiftieth session) the plain engine itself, at 14 streams, took
    another token than the session at one of 14 x ~48 positions (stream 4, token 12: 903 against 83), and equalled
    the sessions at 3 and 1 streams. fp32 GEMMs reduce in a batch-dependent order and this random-weight model has
    near-ties; speculation's claim is that it changes nothing the same engine would decode."""
    model, tok, drafter = gpu_echo_setup(tiny_ckpt, False, cls)
    n = max(14, speculation.AT_ONCE_MIN_STREAMS)
    clips = [synthetic_audio(2.0 + 0.25 * i, seed=700 + i) for i in range(n)]
    at_once = []
    real = Speculator._rows_at_once
    monkeypatch.setattr(Speculator, "_rows_at_once", lambda self, *a: at_once.append(1) or real(self, *a))
    outs = {}
    for graphs in (False, True):
        at_once.clear()
        opts = RunnerOptions(max_streams=n, max_batch=n, block_size=16, cuda_graphs=graphs)
        run = transcribe_batch(model, tok, clips, opts=opts, speculative=SpeculativeConfig(drafter, 4))
        outs[graphs] = [r.token_ids for r in run.results]
        assert run.stats.spec_drafted > 0 and at_once, graphs
        plain = transcribe_batch(model, tok, clips, opts=opts)
        assert outs[graphs] == [r.token_ids for r in plain.results], graphs
    assert outs[True] == outs[False]


def test_shipped_drafter_speculates_losslessly_on_the_shipped_model():
    """models/default_drafter was distilled from models/default: it loads against it, gets drafts
    accepted on held-out-style speech, and changes no token."""
    from pathlib import Path

    from realtime.audio import load_audio_file
    from realtime.model_store import load_model_and_tokenizer

    root = Path(__file__).resolve().parent.parent
    model, tok = load_model_and_tokenizer("default")
    drafter = load_drafter(root / "models" / "default_drafter",
                           target_embedding=model.language_model.embed_tokens.weight)
    clip = load_audio_file(root / "demo" / "samples" / "sample_en.wav")[: 16000 * 4]
    base = transcribe_batch(model, tok, [clip], delay_ms=480)
    spec = transcribe_batch(model, tok, [clip], delay_ms=480, speculative=SpeculativeConfig(drafter, 4))
    assert spec.results[0].token_ids == base.results[0].token_ids
    assert spec.stats.spec_accepted > 0 and spec.steps < base.steps


def test_shipped_drafter_records_the_drafts_it_was_trained_for():
    """The shipped drafter was trained to draft 10 tokens a round (--unroll 10) and its config says so. Its config
    also records the 12 drafts a GPU engine makes by default: on an H100 at batch 1 (forty-seventh session) 12 drafts
    accepted 4.09 tokens a round against 3.99 with 10, at the same speed (931x and 961x real time). A CPU engine
    drafts at most CPU_MAX_DEFAULT_DRAFTS (10 ran slower than 6 on the 2-core box; docs/benchmarks.md, issue 5)."""
    from pathlib import Path

    drafter = load_drafter(Path(__file__).resolve().parent.parent / "models" / "default_drafter")
    assert supports_parallel_drafting(drafter) and drafter.config.draft_tokens == 10
    assert drafter.config.gpu_draft_tokens == 12
    assert default_num_speculative_tokens(drafter, "cuda") == 12
    assert default_num_speculative_tokens(drafter, "cpu") == CPU_MAX_DEFAULT_DRAFTS


def test_shipped_drafters_window_is_within_its_training_windows():
    """The shipped drafter was distilled on windows of TrainConfig.seq_len positions (models/README.md's recipe
    passes no --seq-len), so it never learned a longer attention distance. Its config said 512 until the
    forty-third session; at 256 its mean acceptance length on the held-out 45 s clips went from 2.58 to 3.46
    (docs/benchmarks.md, issue 5), as `speculative.train` now sets for every drafter it makes."""
    from pathlib import Path

    from speculative.train import TrainConfig

    config = load_drafter(Path(__file__).resolve().parent.parent / "models" / "default_drafter").config
    assert config.sliding_window is not None and config.sliding_window <= TrainConfig().seq_len


# ---------------------------------------------------------------------------------------------
# Tree verification (realtime/engine/tree.py)
# ---------------------------------------------------------------------------------------------
def test_default_tree_is_the_likeliest_paths_in_order():
    """Every prefix of the default tree is a tree; its paths are the likeliest under the rank model
    (checked against every path of depth <= 3 over 6 ranks), likeliest first."""
    from realtime.engine.tree import DraftTree, default_tree_paths

    first, ratio = 0.6, 0.3
    like = {}
    for depth in range(1, 4):
        for path in np.ndindex(*(6,) * depth):
            like[path] = float(np.prod([first * ratio ** r for r in path]))
    for m in (1, 3, 10, 25):
        paths = default_tree_paths(3, m, first, ratio)
        assert len(paths) == len(set(paths)) == m
        for j in range(1, m + 1):
            DraftTree(paths[:j], 3)  # validates: parents first, depths within k
        worst_in = min(like[p] for p in paths)
        assert all(like[p] <= worst_in + 1e-12 for p in like if p not in paths)
        assert all(like[a] >= like[b] - 1e-12 for a, b in itertools.pairwise(paths))
    assert default_tree_paths(4, 4) == [(0,), (0, 0), (0, 0, 0), (1,)]


def test_tree_layouts_and_walk():
    """A hand-made tree: the layout of each draft length keeps the paths that fit, parents first, with
    the right ancestor rows and scratch slots; the walk follows the target's choices and stops at a miss."""
    from realtime.engine.tree import DraftTree, walk_tree

    tree = DraftTree([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)], 3)
    assert (tree.ranks, tree.off_chain, tree.scratch_blocks(2), tree.scratch_blocks(16)) == (2, 3, 2, 1)
    lay = tree.layouts[2]
    # rows 1..5: (0,), (1,), (0, 0), (0, 1), (1, 0); rank = choice_offset - (depth - 1) * ranks
    assert lay.depth.tolist() == [1, 1, 2, 2, 2] and lay.row_depth.tolist() == [0, 1, 1, 2, 2, 2]
    assert (lay.choice_offset - (lay.depth - 1) * 2).tolist() == [0, 1, 0, 1, 0]
    assert lay.children == [[1, 2], [3, 4], [5], [], [], []]  # parents: 0, 0, 1, 1, 2
    assert lay.row_off_chain == [False, False, True, False, True, True]
    assert lay.off_rows.tolist() == [2, 4, 5] and lay.off_scratch.tolist() == [0, 1, 2]
    ancestors = np.where(lay.ancestor_mask > 0, lay.ancestor_take, -1)
    assert ancestors.tolist() == [[1, -1, -1], [2, -1, -1], [1, 3, -1], [1, 4, -1], [2, 5, -1]]
    assert lay.per_depth == [2, 3, 0] and tree.layouts[0].per_depth == [0, 0, 0]
    assert tree.layouts[3].per_depth == [2, 3, 1]
    for bad in ([(0, 0)], [(0,), (0,)], [(0,), (0, 0, 0, 0)], [(-1,)]):
        with pytest.raises(ValueError, match="tree path"):
            DraftTree(bad, 3)
    # rows: root, (0,)=11, (1,)=12, (0,0)=13, (0,1)=14, (1,0)=15 in a block at base 2 of the step
    tokens = [0, 0, 9, 11, 12, 13, 14, 15]
    # the target picks 12 after the root, then 15 after (1,): path root, (1,), (1,0)
    assert walk_tree([0, 0, 12, 0, 15, 0, 0, 7], tokens, 2, lay) == [0, 2, 5]
    assert walk_tree([0, 0, 11, 14, 0, 0, 0, 0], tokens, 2, lay) == [0, 1, 4]
    assert walk_tree([0, 0, 99, 0, 0, 0, 0, 0], tokens, 2, lay) == [0]


def _demote_argmax(logits_fn):
    """The drafter's logits with its favourite moved to second place (between the old 2nd and 3rd)."""

    def logits(g):
        out = logits_fn(g)
        top = out.topk(3, -1)
        mid = (top.values[..., 1] + top.values[..., 2]) / 2
        return out.scatter(-1, top.indices[..., :1], mid[..., None])

    return logits


def _ring_after_one_stream(model, tok, spec: SpeculativeConfig | None, clip) -> tuple[BatchedEngine, object, list]:
    """One stream decoded to its end and left open: (the engine, the stream, each LM layer's keys and
    values at every position of its ring)."""
    eng = BatchedEngine(model, tok, opts=RunnerOptions(1, 1, cuda_graphs=False), speculative=spec)
    rec = Recorder()
    sid = eng.open_stream(rec)
    eng.push_audio(sid, clip)
    eng.finish_stream(sid)
    drive(eng)
    s = eng._controls[sid].stream
    cache = eng.runner.lm_cache
    slots = torch.from_numpy(cache.host_slots(s.slot, np.arange(s.lm_pos)))
    kv = [(k.view(-1, *k.shape[2:])[slots], v.view(-1, *v.shape[2:])[slots]) for k, v in zip(cache.k, cache.v)]
    return eng, s, kv


def test_tree_accepts_the_runner_up_that_a_chain_misses(target, monkeypatch):
    """Against a target without context (its layers zeroed) an echo drafter's first draft is the
    target's token. With its favourite demoted to second place, a chain's first draft is always wrong;
    a tree of 4 nodes ((0,), (0, 0), (0, 0, 0), (1,)) holds the runner-up and gets the first draft of
    every round accepted. Both stay lossless. The runner-up's keys went to a scratch slot: the commit
    must have put them into the ring (its keys and values equal plain decoding's at every position but
    the last round's), and the next catch-up must read the accepted nodes' hidden states (the target's
    h_{q-1} at every position q it runs), not the chain's rows of the block. A closed stream leaves no
    commit behind (its ring's blocks may go to another stream)."""
    model, tok = target
    zero = scaled_target(model, 0.0)
    d = echo_drafter(zero, cls=ParallelSpy)
    d.passes = []
    monkeypatch.setattr(d, "logits", _demote_argmax(d.logits))
    clip = UNSEEN[1]
    _, st = run_scenario(zero, tok, d, [clip], [[clip.size]], k=4)
    assert st.spec_rounds > 20 and st.spec_accepted == 0
    d.passes = []
    eng, stream, kv = _ring_after_one_stream(zero, tok, SpeculativeConfig(d, 4, tree_nodes=4), clip)
    t = eng.stats()
    assert t.spec_rounds > 10 and t.spec_accepted_per_position[0] == t.spec_rounds
    _, plain_stream, plain_kv = _ring_after_one_stream(zero, tok, None, clip)
    last = stream.lm_pos
    assert last == plain_stream.lm_pos
    done = last - 5  # the last round's accepted nodes may still wait for a commit
    for (k, v), (pk, pv) in zip(kv, plain_kv):
        torch.testing.assert_close(k[:done], pk[:done], rtol=1e-4, atol=1e-4)  # batch shapes round differently
        torch.testing.assert_close(v[:done], pv[:done], rtol=1e-4, atol=1e-4)
    hidden = teacher_forced(zero, clip, list(stream.tokens), stream.delay_tokens)[1]
    checked = 0
    for ps in d.passes:
        for r in torch.nonzero(ps.ids != d.mask_token_id).flatten().tolist():
            q = int(ps.positions[r])
            if q >= 1:
                torch.testing.assert_close(ps.hidden[r], hidden[q - 1], rtol=1e-4, atol=1e-4)
                checked += 1
    assert checked > last // 2
    # a client that leaves while its last round's commit waits: the commit goes with it
    eng = BatchedEngine(zero, tok, opts=RunnerOptions(1, 1, cuda_graphs=False),
                        speculative=SpeculativeConfig(d, 4, tree_nodes=4))
    sid, sp = eng.open_stream(Recorder()), eng.speculator
    eng.push_audio(sid, clip)
    for _ in range(200):
        eng._run_step(eng._sync_with_clients())
        if sp._pending:
            break
    assert sp._pending
    eng.close_stream(sid)
    eng._sync_with_clients()
    assert not sp._pending and not sp._stash_path


def test_bad_tree_settings(target):
    model, tok = target
    opts = RunnerOptions(1, 1, cuda_graphs=False)
    with pytest.raises(ValueError, match="tree verification needs a parallel drafter.*EagleDrafter"):
        BatchedEngine(model, tok, opts=opts, speculative=SpeculativeConfig(echo_drafter(model), 4, tree_nodes=4))
    par = echo_drafter(model, cls=ParallelEagleDrafter)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="tree_nodes"):
            BatchedEngine(model, tok, opts=opts, speculative=SpeculativeConfig(par, 4, tree_nodes=bad))
    with pytest.raises(ValueError, match="exceeds the most a round verifies"):
        BatchedEngine(model, tok, opts=opts, speculative=SpeculativeConfig(par, 4, tree_nodes=10**6))
    for bad, nodes in ((0, 4), (True, 4), (1.5, 4), (1, None)):
        with pytest.raises(ValueError, match="tree_max_streams"):
            BatchedEngine(model, tok, opts=opts,
                          speculative=SpeculativeConfig(par, 4, tree_nodes=nodes, tree_max_streams=bad))


def test_a_chain_inside_a_wider_tree_reads_the_trees_choices():
    from realtime.engine.tree import DraftTree, chain_paths

    tree = DraftTree(default_tree_paths(4, 12), 4)
    chain = DraftTree(chain_paths(4), 4, ranks=tree.ranks)
    lay = chain.layouts[4]
    assert tree.ranks > 1 and lay.depth.tolist() == [1, 2, 3, 4] and chain.off_chain == 0
    assert lay.choice_offset.tolist() == [d * tree.ranks for d in range(4)]  # first choice of each depth
    with pytest.raises(ValueError, match="more than ranks"):
        DraftTree(tree.paths, 4, ranks=tree.ranks - 1)


def test_tree_only_when_few_streams_draft(target, trained_parallel):
    """`tree_max_streams=1`: a step where two streams draft verifies each one's chain (k_s nodes), a step
    where one stream drafts its tree; tokens are the single-stream session's throughout (the chain's
    drafts are read at the tree's stride among the drafter's choices, and a tree step's accepted
    scratch nodes are committed before a chain step reads the ring)."""
    model, tok = target
    k = 4
    spec = SpeculativeConfig(trained_parallel, num_speculative_tokens=k, tree_nodes=12, tree_max_streams=1)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False),
                        speculative=spec)
    sp = eng.speculator
    seen: list[tuple[int, list[tuple[int, int]]]] = []  # per step: drafting streams, (k_s, nodes) per stream
    layout = sp._layout

    def spy(streams):
        plan, n_catchup, n_draft = layout(streams)
        seen.append((n_draft, [(ks, len(lay.depth)) for ks, (lay, _) in zip(plan.k_s, plan.tree) if ks]))
        return plan, n_catchup, n_draft

    sp._layout = spy
    # the short clip ends first: the long one drafts alone after that (both are the drafter's training
    # clips, where its first choices are right almost always, in chains as in trees)
    assert_whole_clips_transcribed(eng, model, tok, [SEEN[0][:16000], SEEN[1]])
    both = [streams for n, streams in seen if n >= 2]
    alone = [streams for n, streams in seen if n == 1]
    assert both and alone
    assert all(nodes == ks for streams in both for ks, nodes in streams)  # chains
    assert any(nodes > ks for streams in alone for ks, nodes in streams)  # trees
    # the chain steps draft what a chain engine drafts: at least as many accepted as there
    chain = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False),
                          speculative=SpeculativeConfig(trained_parallel, num_speculative_tokens=k))
    assert_whole_clips_transcribed(chain, model, tok, [SEEN[0][:16000], SEEN[1]])
    assert eng.stats().spec_accepted >= chain.stats().spec_accepted > 0


@pytest.mark.parametrize("encode_ahead", [True, False])
def test_next_look_ahead_is_queued_behind_the_verify(target, trained_parallel, encode_ahead):
    """With `encode_ahead` the look-ahead encoder runs after a step's launches (for the next step: a
    chunk when fewer than 2k + 2 tokens are encoded past p), so a backlogged stream's steps start with
    their launches, not with encoder work; without it the look-ahead runs first, as before. The
    tokens are the single-stream session's either way, no audio past the last position is encoded,
    and the look-ahead never writes a ring row the next step reads (that would change tokens)."""
    model, tok = target
    k = 4
    opts = runner_options_for(RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False, encode_ahead=encode_ahead),
                              spec_config(trained_parallel, k))
    eng = BatchedEngine(model, tok, opts=opts, speculative=spec_config(trained_parallel, k))
    sp = eng.speculator
    order: list[str] = []
    encode, run = sp.lookahead.encode, sp._run

    def spy_encode(work, ahead=False):
        if work:
            order.append("encode")
        return encode(work, ahead)

    def spy_run(*args):
        order.append("run")
        return run(*args)

    sp.lookahead.encode, sp._run = spy_encode, spy_run
    run_step = eng._run_step

    def spy_step(live):
        order.append("step")
        return run_step(live)

    eng._run_step = spy_step
    assert_whole_clips_transcribed(eng, model, tok, [UNSEEN[0], SEEN[1]])
    steps = [part for part in "".join(x[0] for x in order).split("s") if "r" in part]  # e.g. "ere": one step
    first_encodes = [i for i, part in enumerate(steps) if part.startswith("e")]
    late_encodes = [i for i, part in enumerate(steps) if part.endswith("e")]
    if encode_ahead:  # after the first step, every encoder call comes after the launches
        assert first_encodes == [0] and len(late_encodes) >= 3
    else:
        assert len(first_encodes) >= 3 and late_encodes == []


def test_speculation_keeps_the_encoder_on_the_main_stream(trained_parallel):
    """`runner_options_for` turns the encoder's own CUDA stream off for a speculative engine (see its
    comment), whatever the options asked, and leaves the other options as they were."""
    cfg = spec_config(trained_parallel, 4)
    asked = RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False, encoder_stream=True)
    opts = runner_options_for(asked, cfg)
    assert asked.encoder_stream and not opts.encoder_stream
    assert dataclasses.replace(opts, encoder_stream=True, encoder_cache_tokens=asked.encoder_cache_tokens,
                               encoder_chunk=asked.encoder_chunk, one_row_decode=None) == asked
    assert runner_options_for(opts, cfg) == opts


def test_speculation_turns_the_one_row_path_off_unless_forced(trained_parallel):
    """A speculative engine's plain steps must round as its verify steps do (lossless speculation in fp16/bf16):
    `runner_options_for` turns the one-row batch-1 kernels off when the options leave them to the engine, and
    keeps an explicit choice."""
    cfg = spec_config(trained_parallel, 4)
    auto = RunnerOptions(max_streams=1, max_batch=1, cuda_graphs=False)
    assert auto.one_row_decode is None and runner_options_for(auto, cfg).one_row_decode is False
    for forced in (True, False):
        assert runner_options_for(dataclasses.replace(auto, one_row_decode=forced), cfg).one_row_decode is forced


@pytest.mark.parametrize("kind", ["chain", "parallel", "two_pass"])
@pytest.mark.parametrize("chunk", [None, 1, 32])
def test_next_look_ahead_never_writes_a_row_this_step_reads(target, request, kind, chunk):
    """On CUDA the next step's look-ahead runs on the encoder's stream, beside the step just launched
    (`ModelRunner.on_encoder_stream`), so no ordering protects the audio rows that step still reads:
    the rows an ahead call writes must be other rows than the step's drafter and verify inputs
    (`runner_options_for` sizes the ring for it). Checked on every step of a backlogged run, with the
    largest look-ahead chunk and with one-token chunks (the most calls)."""
    model, tok = target
    drafter = request.getfixturevalue("trained" if kind == "chain" else f"trained_{kind}")
    cfg = spec_config(drafter, 4, lookahead_chunk=chunk)
    opts = runner_options_for(RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False), cfg)
    eng = BatchedEngine(model, tok, opts=opts, speculative=cfg)
    sp = eng.speculator
    read_rows: set[int] = set()  # the audio rows the step just laid out reads
    writes = 0
    layout, encode = sp._layout, sp.lookahead.encode

    def spy_layout(streams):
        out = layout(streams)
        h = sp.meta.host
        rows = np.concatenate([h[name].ravel() for name in ("c_aud", "v_aud", "dr_aud") if name in h])
        read_rows.clear()
        read_rows.update(int(x) for x in rows if x >= 0 and x != sp.pad_audio)
        return out

    def spy_encode(work, ahead=False):
        nonlocal writes
        if ahead:
            for s, count in work:
                written = {s.slot * sp.C + (s.audio_done + j) % sp.C for j in range(count)}
                assert not written & read_rows, (s.audio_done, count, sorted(read_rows))
                writes += count
        return encode(work, ahead)

    sp._layout, sp.lookahead.encode = spy_layout, spy_encode
    assert_whole_clips_transcribed(eng, model, tok, [UNSEEN[0], SEEN[1]])
    assert writes > 20 and eng.stats().spec_accepted > 0


def _slot_tensor_bytes(eng: BatchedEngine) -> int:
    """Bytes of every tensor that grows with the engine's stream slots: the KV caches (with a tree's
    scratch blocks), the audio embedding ring and, with speculation, the drafter's KV and the stash."""
    r = eng.runner
    tensors = [*r.enc_cache.k, *r.enc_cache.v, *r.lm_cache.k, *r.lm_cache.v, r.audio_cache]
    if eng.speculator is not None:
        sp = eng.speculator
        tensors += [*sp.d_cache.k, *sp.d_cache.v, sp.stash]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("mode", ["plain", "chain", "tree"])
def test_bytes_per_stream_is_what_a_slot_allocates(target, trained_parallel, mode):
    """The capacity planner's figure (`bytes_per_stream`, what the server divides free GPU memory by)
    equals the growth of the per-slot allocations from one more slot, with speculation and a tree too:
    a stream admitted on it can never run out of memory mid-stream."""
    from realtime.engine.engine import bytes_per_stream

    model, tok = target
    spec = None if mode == "plain" else spec_config(trained_parallel if mode == "chain" else TreeDrafting(trained_parallel, 12), 4)
    sizes = []
    for n in (2, 3):
        opts = RunnerOptions(max_streams=n, max_batch=n, cuda_graphs=False, max_session_seconds=20.0)
        sizes.append(_slot_tensor_bytes(BatchedEngine(model, tok, opts=opts, speculative=spec)))
    per = bytes_per_stream(model, RunnerOptions(max_streams=5, max_batch=5, max_session_seconds=20.0), spec)
    assert per == sizes[1] - sizes[0]
    if spec is not None:
        assert per > bytes_per_stream(model, RunnerOptions(max_session_seconds=20.0))


def test_verify_steps_run_with_batch_invariant_lm_rows(target, trained_parallel, monkeypatch):
    """Every verify step runs inside `lm_rows_invariant_to(INVARIANT_ROWS)` (its rows, up to 64, take the kernel
    that gives each row its one-row bits on the GPU), and the model's modules are back to their own row limits
    after it, also when the step raises."""
    from kernels.linear import INVARIANT_ROWS, MAX_ROWS

    model, tok = target
    entered = []
    original = type(model).lm_rows_invariant_to

    def spy(self, rows):
        entered.append((rows, self.language_model.layers[0].mlp.linear_rows))
        return original(self, rows)

    monkeypatch.setattr(type(model), "lm_rows_invariant_to", spy)
    clip = synthetic_audio(2.0, seed=11)
    run_streams(model, tok, trained_parallel, [clip], [[clip.size]], k=4)  # all audio at once: catch-up rounds
    assert entered and all(rows == INVARIANT_ROWS for rows, _ in entered)
    layer = model.language_model.layers[0]
    assert (layer.self_attn.linear_rows, layer.mlp.linear_rows, model.head_rows) == (MAX_ROWS,) * 3
    with pytest.raises(RuntimeError), original(model, INVARIANT_ROWS):
        assert layer.mlp.linear_rows == model.head_rows == INVARIANT_ROWS
        raise RuntimeError("a failing step")
    assert (layer.self_attn.linear_rows, layer.mlp.linear_rows, model.head_rows) == (MAX_ROWS,) * 3
    assert model.audio_tower.layers[0].mlp.linear_rows == INVARIANT_ROWS  # the encoder's own, untouched


# ---------------------------------------------------------------------------------------------
# Rounds chained on the device (`chained_rounds`): one stream with all its audio
# ---------------------------------------------------------------------------------------------
CHAINED = {"chained_rounds": 8}  # on the CPU chaining is off unless asked for (SpeculativeConfig.on)


class ChainSpy:
    """Counts the chains an engine ran and their rounds (wraps the instance's method)."""

    def __init__(self, eng: BatchedEngine) -> None:
        self.chains, self.rounds = 0, 0
        sp = eng.speculator
        self.chained = sp.chained
        run = sp.run_chained

        def counted(s, rounds):
            self.chains += 1
            self.rounds += rounds
            return run(s, rounds)

        sp.run_chained = counted


def _offline_one_by_one(model, tok, spec: SpeculativeConfig, clips, delay_ms=None, **opts):
    """Each clip pushed whole and finished, one stream at a time: (tokens per clip, engine stats, chain spy)."""
    eng = BatchedEngine(model, tok, opts=RunnerOptions(1, 1, **{"cuda_graphs": False, **opts}), speculative=spec)
    spy = ChainSpy(eng)
    out = []
    for clip in clips:
        rec = Recorder()
        sid = eng.open_stream(rec, delay_ms=delay_ms)
        eng.push_audio(sid, clip)
        eng.finish_stream(sid)
        drive(eng)
        assert isinstance(rec.done(sid), StreamDone)
        out.append(rec.tokens(sid))
        eng.close_stream(sid)
        eng._sync_with_clients()
    return out, eng.stats(), spy


LONG = np.concatenate([SEEN[0], UNSEEN[1], SEEN[2]])


@pytest.mark.parametrize("kind", ["trained", "trained_two_pass", "trained_parallel"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_chained_rounds_equal_the_session_and_the_host_rounds(target, request, kind, k):
    """At batch 1 with all the audio there, rounds run in chains (their layout and acceptance on the device),
    and every token is the session's; the same engine with chaining off gives the same tokens."""
    model, tok = target
    drafter = request.getfixturevalue(kind)
    clips = [SEEN[1], UNSEEN[0], LONG]
    got, st, spy = _offline_one_by_one(model, tok, SpeculativeConfig(drafter, k, **CHAINED), clips)
    assert got == [reference(model, tok, c) for c in clips]
    assert spy.chains >= 3 and spy.rounds >= 2 * spy.chains  # every clip chains some rounds
    assert_partial_acceptance(st)
    assert len(st.spec_drafted_per_position) == k
    off, st_off, spy_off = _offline_one_by_one(model, tok, SpeculativeConfig(drafter, k, chained_rounds=0), clips)
    assert off == got and spy_off.chains == 0
    # every round lays out the rows the host path lays out (plus padding rows): the same drafts, the same decisions
    assert (st.spec_drafted_per_position, st.spec_accepted_per_position) == \
        (st_off.spec_drafted_per_position, st_off.spec_accepted_per_position)


@pytest.mark.parametrize("delay_ms", [160, 1200])
def test_chained_rounds_at_other_delays_and_text_only(target, trained, delay_ms, caplog):
    """Other delays (the drafter's delay conditioning and the prompt come from the chain's state), and a drafter
    that gets no audio (its catch-up and chain rows then have no audio rows to lay out)."""
    model, tok = target
    clips = [LONG]
    got, st, spy = _offline_one_by_one(model, tok, SpeculativeConfig(trained, 4, **CHAINED), clips,
                                      delay_ms=delay_ms)
    assert got == [reference(model, tok, LONG, delay_ms)] and spy.chains > 0 and st.spec_accepted > 0
    with caplog.at_level(logging.WARNING):
        text_only, _, spy = _offline_one_by_one(model, tok, SpeculativeConfig(echo_drafter(model, cls=EagleModel), 4, **CHAINED),
                                                clips, delay_ms=delay_ms)
    assert text_only == got and spy.chains > 0


@pytest.mark.parametrize("cls", [EagleDrafter, ParallelEagleDrafter])
def test_chained_rounds_with_small_rings_and_one_token_chunks(tiny_ckpt, cls):
    """Windows of 8 (encoder) and 6 (LM, drafter), blocks of 4: the rings wrap many times inside a chain; with
    a look-ahead chunk of 1 a chain's audio comes in one-token encoder calls. Against a target without context
    the echo drafter is the target itself when every draft row reads its own position's audio: every draft is
    accepted (an off-by-one in the chain's audio rows would reject most). A parallel drafter's mask rows carry no
    token, so it is right less often; its rounds must decide as the host path's do."""
    path = tiny_ckpt(seed=1, small_windows=True)
    base, _ = load_model(path)
    tok = load_tokenizer(path)
    model = scaled_target(base, 0.0)
    drafter = echo_drafter(model, cls=cls, window=6)
    if cls is not EagleDrafter:  # a mask embedding that is not zero, so that the mask rows must gather it right
        with torch.no_grad():
            drafter.mask_embedding.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(0))
    clips = [synthetic_audio(6.0, seed=402)]
    for chunk in (None, 1, 16, 32):  # 16 and 32: look-ahead calls of more tokens than a step's LM rows (8)
        spec = SpeculativeConfig(drafter, 5, lookahead_chunk=chunk, **CHAINED)
        got, st, spy = _offline_one_by_one(model, tok, spec, clips, block_size=4)
        assert got == [reference(model, tok, clips[0])]
        assert spy.chains > 0 and st.spec_accepted > 0
        assert st.spec_accepted == st.spec_drafted or cls is not EagleDrafter
    host, st_host, _ = _offline_one_by_one(model, tok, SpeculativeConfig(drafter, 5, chained_rounds=0), clips,
                                           block_size=4)
    assert host == got and st_host.spec_accepted_per_position == st.spec_accepted_per_position


def test_chained_rounds_stop_at_eos(target, trained):
    """A token the session ends on (EOS, here a text token made the EOS id) inside a chain: the stream ends there
    as the session does, and the chain's later rounds are discarded."""
    base, tok = target
    full = reference(base, tok, LONG)
    # the first token past two thirds of the transcript that has not come before
    stop_at = next(i for i in range(len(full) * 2 // 3, len(full)) if full[i] not in full[:i])
    eos = full[stop_at]
    model = copy.copy(base)
    model.config = dataclasses.replace(base.config, tokens=dataclasses.replace(base.config.tokens, eos=eos))
    want = transcribe(model, tok, LONG).token_ids
    assert want[-1] == eos and len(want) == stop_at + 1  # the session stops at the first EOS
    got, _, spy = _offline_one_by_one(model, tok, SpeculativeConfig(trained, 6, **CHAINED), [LONG])
    assert got == [want] and spy.chains > 0 and spy.chained.discarded_rounds > 0


def test_chains_for_one_stream_with_audio_for_several_rounds(target, trained):
    """A live stream with a backlog chains (the chain stops where its audio does), a paced one never does, nor do
    two streams in a step or a tree; the tokens are the session's throughout; bad settings are refused."""
    model, tok = target
    clips = [SEEN[0], UNSEEN[0]]
    eng, tokens = run_streams(model, tok, trained, clips, [[1280] * 400, [1280] * 400])
    assert tokens == [reference(model, tok, c) for c in clips]
    eng = BatchedEngine(model, tok, opts=RunnerOptions(1, 1, cuda_graphs=False),
                        speculative=SpeculativeConfig(trained, 4, **CHAINED))
    spy = ChainSpy(eng)
    rec = Recorder()
    sid = eng.open_stream(rec)
    for chunk in np.array_split(LONG[:16000], 12):  # paced: about one token of audio a step
        eng.push_audio(sid, chunk)
        eng._run_step(eng._sync_with_clients())
    assert spy.chains == 0
    eng.push_audio(sid, LONG[16000: LONG.size // 2])  # a backlog, but the stream goes on
    s = eng._controls[sid].stream
    for _ in range(4):
        eng._run_step(eng._sync_with_clients())
    assert spy.chains > 0 and not s.finish_requested
    assert s.lm_pos <= s.audio_done + s.audio_tokens_ready(model.config.streaming.mel_frames_per_token)
    eng.push_audio(sid, LONG[LONG.size // 2:])
    eng.finish_stream(sid)
    drive(eng)
    assert rec.tokens(sid) == reference(model, tok, LONG)
    spec = SpeculativeConfig(echo_drafter(model, cls=ParallelEagleDrafter), 4, tree_nodes=5, **CHAINED)
    assert BatchedEngine(model, tok, opts=RunnerOptions(1, 1, cuda_graphs=False), speculative=spec).speculator.chained \
        is None
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match="chained_rounds"):
            BatchedEngine(model, tok, speculative=SpeculativeConfig(trained, 4, chained_rounds=bad))


def test_chained_rounds_stop_at_the_maximum_session_length(target, trained):
    """A stream longer than the engine's maximum session: chains never run past its last position (the rings are
    sized to it), and the kept tokens are the session's."""
    model, tok = target
    got, _, spy = _offline_one_by_one(model, tok, SpeculativeConfig(trained, 4, **CHAINED), [LONG],
                                      max_session_seconds=4.0)
    assert spy.chains > 0 and len(got[0]) < len(reference(model, tok, LONG))
    assert got[0] == reference(model, tok, LONG)[: len(got[0])]


@pytest.mark.parametrize("kind", ["trained", "trained_two_pass", "trained_parallel"])
@pytest.mark.parametrize(("k", "min_buffered"), [(1, 2), (4, 2), (4, 4)])
def test_a_chained_rounds_layout_is_the_host_paths(target, request, kind, k, min_buffered):
    """Field by field, the metadata a chained round writes on the device is what the host path uploads for the
    same stream state (rows past the round's own hold the same padding), over catch-ups of 1 to k+1 positions
    and rounds allowed 0 to k drafts, with the default and a larger `min_buffered_tokens`. (Where a round drafts
    nothing, the chain's first-draft row and the chain steps' delay are left out: nothing reads them.)"""
    model, tok = target
    eng = BatchedEngine(model, tok, opts=RunnerOptions(2, 2, cuda_graphs=False),
                        speculative=SpeculativeConfig(request.getfixturevalue(kind), k,
                                                      min_buffered_tokens=min_buffered, **CHAINED))
    sp = eng.speculator
    rec = Recorder()
    eng.open_stream(rec)
    sid = eng.open_stream(rec, delay_ms=1200)  # slot 1, another delay
    eng._sync_with_clients()
    s = eng._controls[sid].stream
    rng = np.random.default_rng(0)
    s.tokens = s.tokens + rng.integers(3, 200, size=200).tolist()
    s.audio_done = 10_000  # the host path reads it only to bound the drafts
    for n_acc, ks in itertools.product(sorted({1, 2, k + 1}), range(k + 1)):
        p = s.prompt_len + 40 + n_acc
        s.lm_pos, sp.prev_pos[s.slot] = p, p - n_acc
        s.total_tokens = p + ks + 2  # the last position is p + ks: ks drafts allowed
        sp._layout([s])
        host = {name: t.clone() for name, t in sp.m.items()}
        sp.chained.start(s, sp.chained.last_decodable(s))
        sp.chained.layout()
        drafts = ks if ks + 1 >= min_buffered else 0  # what the round may draft
        for name, t in sp.m.items():
            if drafts == 0 and name in ("c_last", "dr_dly"):
                continue
            assert torch.equal(t, host[name]), (name, n_acc, ks, t, host[name])


@pytest.mark.gpu
@pytest.mark.parametrize("cls", [EagleDrafter, ParallelEagleDrafter, TwoPassEagleDrafter])
@pytest.mark.parametrize("small_windows", [False, True])
def test_gpu_chained_rounds_with_graphs_equal_eager_and_the_session(tiny_ckpt, small_windows, cls, monkeypatch):
    """On the GPU, a chained round is one graph (the default) or the speculator's graphs between layout's and
    acceptance's (STREAMSCRIBE_ROUND_GRAPH=0): either way the tokens equal the eager chains', the host path's and
    the session's (fp32)."""
    model, tok, drafter = gpu_echo_setup(tiny_ckpt, small_windows, cls)
    clips = [synthetic_audio(4.0 + i, seed=520 + i) for i in range(3)]
    want = [transcribe(model, tok, c).token_ids for c in clips]
    for graphs, chained, one_graph in [(False, 8, "1"), (False, 0, "1"), (True, 8, "1"), (True, 8, "0"),
                                       (True, 0, "1")]:
        monkeypatch.setenv("STREAMSCRIBE_ROUND_GRAPH", one_graph)
        got, st, spy = _offline_one_by_one(model, tok, SpeculativeConfig(drafter, 4, chained_rounds=chained), clips,
                                           cuda_graphs=graphs, block_size=16)
        assert got == want, (graphs, chained, one_graph)
        assert (spy.chains > 0) == (chained > 0) and st.spec_accepted > 0
        if graphs and chained:  # the round took the graphs asked for
            assert (spy.chained.g_round is not None) == (one_graph == "1"), one_graph


def test_the_round_graph_switch_takes_0_or_1_and_says_what_else_it_got(monkeypatch):
    """STREAMSCRIBE_ROUND_GRAPH: unset or 1, a chained round is one CUDA graph; 0, six; anything else is an error
    that names the variable and the value (not a silent default)."""
    monkeypatch.delenv("STREAMSCRIBE_ROUND_GRAPH", raising=False)
    assert one_graph_rounds()
    for value, want in (("1", True), ("0", False)):
        monkeypatch.setenv("STREAMSCRIBE_ROUND_GRAPH", value)
        assert one_graph_rounds() is want
    monkeypatch.setenv("STREAMSCRIBE_ROUND_GRAPH", "yes")
    with pytest.raises(ValueError, match="STREAMSCRIBE_ROUND_GRAPH must be 0 or 1, got 'yes'"):
        one_graph_rounds()


def test_chaining_is_on_by_default_on_cuda_only(target, trained):
    """By default (None) an engine chains on CUDA (8 rounds) and not on the CPU, where the host waits for no device
    and a chain would only hold the engine longer; an explicit value is kept on either. Likewise the look-ahead
    encoder's calls take up to 32 tokens on CUDA (a call costs about the same at 1 or 32 tokens there) and up to
    max_step_tokens (8) on the CPU, where its cost grows with its tokens."""
    model, tok = target
    spec = SpeculativeConfig(trained, 4)
    cuda, cpu = spec.on(torch.device("cuda")), spec.on(torch.device("cpu"))
    assert cuda.chained_rounds == 8 and cpu.chained_rounds == 0
    assert cuda.lookahead_chunk == 32 and cpu.lookahead_chunk is None
    assert cpu.chunk(RunnerOptions()) == 8 and cuda.chunk(RunnerOptions()) == 32
    assert SpeculativeConfig(trained, 4, chained_rounds=3).on(torch.device("cpu")).chained_rounds == 3
    assert SpeculativeConfig(trained, 4, chained_rounds=0).on(torch.device("cuda")).chained_rounds == 0
    assert SpeculativeConfig(trained, 4, lookahead_chunk=4).on(torch.device("cuda")).lookahead_chunk == 4
    got, _, spy = _offline_one_by_one(model, tok, spec, [LONG])
    assert spy.chained is None and spy.chains == 0 and got == [reference(model, tok, LONG)]
