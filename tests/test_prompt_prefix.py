"""Joins through the prompt-prefix cache: which positions may come from it, and that joining that way
(no eager prefill, the rest of the prompt as decode rows; with speculation too) gives exactly the
single-stream tokens."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import synthetic_audio
from test_engine import Recorder, drive
from test_speculative import echo_drafter

from realtime.audio import log_mel_spectrogram
from realtime.engine import BatchedEngine, RunnerOptions
from realtime.engine.prompt_prefix import silent_prefix_tokens
from realtime.engine.speculation import SpeculativeConfig
from realtime.loader import load_model
from realtime.session import transcribe
from realtime.tokenizer import load_tokenizer


def first_audio_dependent_token(cfg) -> int:
    """Brute force: the first audio token whose mel frames change when the user's audio does."""
    rng = np.random.default_rng(0)
    left = np.zeros(cfg.left_pad_samples, np.float32)
    user = (0.2 * rng.standard_normal(16000)).astype(np.float32)
    with_audio = log_mel_spectrogram(np.concatenate([left, user]), cfg.audio)
    silent = log_mel_spectrogram(np.concatenate([left, np.zeros_like(user)]), cfg.audio)
    first_frame = int(np.argmax((with_audio != silent).any(0).numpy()))
    return first_frame // cfg.streaming.mel_frames_per_token


@pytest.mark.parametrize("left_pad_tokens", [32, 5, 1, 0])
def test_silent_prefix_is_exactly_the_audio_independent_tokens(tiny_ckpt, left_pad_tokens):
    model, _ = load_model(tiny_ckpt(seed=0))
    cfg = model.config
    cfg = dataclasses.replace(cfg, streaming=dataclasses.replace(cfg.streaming, n_left_pad_tokens=left_pad_tokens))
    independent = first_audio_dependent_token(cfg)
    if left_pad_tokens == 32:
        assert independent == 31  # the real model's padding: token 31's last frame reaches the first samples
    for delay in (1, 6, 30):
        assert silent_prefix_tokens(cfg, delay) == min(independent, cfg.prompt_length(delay) - 1)


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("small_windows", [False, True])
def test_joins_use_the_prefix_and_no_prefill(tiny_ckpt, small_windows, speculative, monkeypatch):
    """With and without speculation: every stream's first LM row is position K (positions before
    come from the cache, nothing prefills them), every prompt position after runs as a row of its
    own (with speculation: a verify row without drafts, whose drafter catch-up starts at K)."""
    path = tiny_ckpt(seed=3, small_windows=small_windows)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    spec = SpeculativeConfig(echo_drafter(model, window=6 if small_windows else None), 3) if speculative else None
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=4, max_batch=4, block_size=4), speculative=spec)
    rows: dict[int, list[int]] = {}  # per slot: the LM position of each row run, in order
    catch_up_from: dict[int, int] = {}  # per slot: the first position the drafter's catch-up ran
    if speculative:
        sp = eng.speculator
        layout = sp._layout

        def spy_layout(streams):
            plan, n_catchup, n_draft = layout(streams)
            for s, p, ks in zip(plan.order, plan.p, plan.k_s):
                catch_up_from.setdefault(s.slot, sp.prev_pos[s.slot] + 1)
                assert ks == 0 or p >= s.prompt_len, "drafted from a prompt position"
                rows.setdefault(s.slot, []).append(p)
            return plan, n_catchup, n_draft

        monkeypatch.setattr(sp, "_layout", spy_layout)
    else:
        decode = eng.runner.decode

        def spy(slots, positions, tokens, delays):
            for slot, p in zip(slots, positions):
                rows.setdefault(slot, []).append(p)
            return decode(slots, positions, tokens, delays)

        monkeypatch.setattr(eng.runner, "decode", spy)
    rec = Recorder()
    clips = [synthetic_audio(1.7, seed=20), synthetic_audio(0.9, seed=21), synthetic_audio(2.2, seed=22)]
    delays = [480, 80, 480]
    sids = []
    for clip, delay in zip(clips, delays):
        sid = eng.open_stream(rec, delay_ms=delay)
        sids.append(sid)
        for k in range(0, clip.size, 2000):
            eng.push_audio(sid, clip[k: k + 2000])
            drive(eng)  # each stream joins while the others are mid-stream
    for sid in sids:
        eng.finish_stream(sid)
    drive(eng)
    for sid, clip, delay in zip(sids, clips, delays):
        assert rec.tokens(sid) == transcribe(model, tok, clip, delay_ms=delay).token_ids
    assert sorted(eng.prompt_prefix._by_delay) == sorted({model.config.delay_tokens(d) for d in delays})
    k = {d: silent_prefix_tokens(model.config, model.config.delay_tokens(d)) for d in delays}
    assert k[480] > 0
    # every stream's first LM row was position K: the positions before came from the cache
    assert sorted(r[0] for r in rows.values()) == sorted(k[d] for d in delays)
    for slot, delay in enumerate(delays):  # and every prompt position after K ran as a row of its own
        n = model.config.prompt_length(model.config.delay_tokens(delay))
        assert rows[slot][: n - k[delay]] == list(range(k[delay], n))
    if speculative:
        assert catch_up_from == {slot: k[d] for slot, d in enumerate(delays)}
        assert eng.stats().spec_drafted > 0
