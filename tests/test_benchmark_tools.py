"""Helpers of the benchmark scripts whose figures the docs quote: position kinds, speed warp, median run,
kernel inventory."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_speculative import median_run, same_engine_options
from drafter_accuracy import position_kinds
from make_speech_clips import RATE, speed_warp
from profile_tools import kernel_kind, kernel_table, summarize_kernels

PAD = 32


def test_position_kinds_partition_the_kept_positions() -> None:
    g = torch.Generator().manual_seed(0)
    words = torch.randint(40, 90, (400,), generator=g)
    tokens = torch.where(torch.rand(400, generator=g) < 0.5, torch.full((400,), PAD), words)
    target, previous = tokens[1:], tokens[:-1]
    keep = torch.arange(399) >= 30  # the prompt is left out
    k = position_kinds(target, previous, PAD, keep)
    assert torch.equal(k["all"], keep)
    parts = torch.stack([k["pad"], k["word_start"], k["in_word"]]).int()
    assert torch.equal(parts.sum(0), keep.int())  # every kept position in exactly one of the three
    assert bool((k["word_end"] <= k["pad"]).all()) and k["word_end"].any()
    for r in torch.nonzero(k["in_word"]).flatten().tolist():
        assert target[r] != PAD and previous[r] != PAD
    for r in torch.nonzero(k["word_start"]).flatten().tolist():
        assert target[r] != PAD and previous[r] == PAD


def _peak_hz(x: np.ndarray) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spec)) * RATE / x.size


def test_speed_warp_moves_pitch_and_length_together() -> None:
    t = np.arange(RATE) / RATE
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    faster, f = speed_warp(tone, 1.1)
    assert f == 1.1 and abs(faster.size - RATE / 1.1) <= 2
    assert abs(_peak_hz(faster) - 484.0) < 3.0
    slower, f = speed_warp(tone, 0.8537)  # rounded to a multiple of 1/160
    assert f == 13700 / RATE and abs(slower.size - RATE / f) <= 2 and abs(_peak_hz(slower) - 440 * f) < 3.0
    same, f = speed_warp(tone, 1.0)
    assert f == 1.0 and same is tone


def test_median_run_reports_the_middle_wall_time() -> None:
    runs = [({"wall_seconds": w}, [[i]]) for i, w in enumerate([0.9, 0.5, 0.7, 1.4, 0.6])]
    out, tokens = median_run(runs)
    assert out["wall_seconds"] == 0.7 and tokens == [[2]]


def test_lossless_reference_is_the_speculative_runners_kernels() -> None:
    """bench_speculative's reference plain run takes the kernels the speculative runner chose: no one-row batch-1
    kernels, and the encoder rows of its look-ahead chunk (64 with chunks, 16 at one token per call); everything
    else as the timed plain run."""
    from types import SimpleNamespace

    from kernels.linear import INVARIANT_ROWS, MAX_ROWS
    from realtime.engine import RunnerOptions
    from realtime.engine.speculation import SpeculativeConfig

    drafter = SimpleNamespace(supports_parallel_drafting=True)
    opts = RunnerOptions(max_streams=1, max_batch=1, max_step_tokens=8)
    same = same_engine_options(opts, SpeculativeConfig(drafter, num_speculative_tokens=6))
    assert same.one_row_decode is False and same.encoder_rows == INVARIANT_ROWS
    assert (same.encoder_chunk, same.encoder_stream, same.max_batch) == (1, True, 1)  # the plain run's own
    one = same_engine_options(opts, SpeculativeConfig(drafter, num_speculative_tokens=6, lookahead_chunk=1))
    assert one.encoder_rows == MAX_ROWS
    forced = same_engine_options(RunnerOptions(max_step_tokens=8, one_row_decode=True),
                                 SpeculativeConfig(drafter, num_speculative_tokens=6))
    assert forced.one_row_decode is True  # a user's explicit choice stays


def test_kernel_inventory_counts_overlaps_once_and_sorts_kernels_by_kind() -> None:
    kernels = [  # (name, start us, end us) over 2 steps; the attention kernel overlaps the first GEMV
        ("std::gemv_kernel<bf16>", 0.0, 10.0), ("_paged_attention_kernel", 5.0, 15.0),
        ("add_rms_norm_kernel", 20.0, 22.0), ("std::gemv_kernel<bf16>", 30.0, 40.0), ("elementwise_copy", 41.0, 42.0)]
    r = summarize_kernels(kernels, 2)
    assert r["kernels_per_step"] == 2.5
    assert r["kernel_us_per_step"] == (10 + 10 + 2 + 10 + 1) / 2
    assert r["busy_us_per_step"] == (15 + 2 + 10 + 1) / 2  # [0, 15] counted once
    assert r["first_to_last_us_per_step"] == 42 / 2
    assert r["by_kind_us"] == {"gemm": 10.0, "attention": 5.0, "norm": 1.0, "other": 0.5}
    assert r["top"][0]["name"] == "std::gemv_kernel<bf16>" and r["top"][0]["per_step"] == 1.0
    assert [kernel_kind(n) for n in ("combine_splits_kernel", "nvjet_tst_128x8", "rope_kernel", "write_kv_kernel",
                                     "silu_mul_kernel", "gather_add_kernel")] == [
        "attention", "gemm", "rope", "kv_write", "act", "gather_add"]
    assert summarize_kernels([], 3)["busy_us_per_step"] == 0.0


def test_step_inventory_groups_kernels_by_name_and_grid() -> None:
    """Two shapes of one kernel name stay apart (their grids differ); non-kernel events are left out."""
    events = [{"cat": "kernel", "name": "skinny_linear_kernel", "dur": 4.0, "args": {"grid": [80, 1, 1]}},
              {"cat": "kernel", "name": "skinny_linear_kernel", "dur": 6.0, "args": {"grid": [80, 1, 1]}},
              {"cat": "kernel", "name": "skinny_linear_kernel", "dur": 9.0, "args": {"grid": [640, 1, 1]}},
              {"cat": "kernel", "name": "attn", "dur": 3.0, "args": {"grid": [1, 8, 64]}},
              {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "dur": 50.0, "args": {}}]
    rows = kernel_table(events, steps=2)
    assert [(r["name"], r["grid"]) for r in rows] == [("skinny_linear_kernel", [80, 1, 1]),
                                                     ("skinny_linear_kernel", [640, 1, 1]), ("attn", [1, 8, 64])]
    assert rows[0]["us_per_step"] == 5.0 and rows[0]["us_per_call"] == 5.0 and rows[0]["calls_per_step"] == 1.0
    assert rows[1]["us_per_step"] == 4.5 and rows[2]["calls_per_step"] == 0.5


def test_host_phases_times_one_engine_and_accounts_for_its_steps(tiny_ckpt) -> None:
    """`host_phases.instrument` wraps one engine instance's methods (an engine built later keeps the
    class's), and a run's phases add up to its wall time per step (`outside_run_step` is what is left)."""
    from conftest import synthetic_audio
    from host_phases import instrument

    from realtime.engine import BatchedEngine, RunnerOptions
    from realtime.engine.offline import run_engine_offline
    from realtime.loader import load_model
    from realtime.tokenizer import load_tokenizer

    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    opts = RunnerOptions(max_streams=1, max_batch=1, cuda_graphs=False)
    eng = BatchedEngine(model, tok, opts=opts)
    clock = instrument(eng)
    run = run_engine_offline(eng, [synthetic_audio(1.5, seed=3)])
    other = BatchedEngine(model, tok, opts=opts)
    assert "_run_step" not in vars(other) and "_run_step" in vars(eng)  # only the instrumented instance
    s = clock.seconds
    assert set(s) >= {"sync", "run_step", "plan", "encode", "launch", "emit"}
    inner = s["plan"] + s["encode"] + s["launch"] + s["emit"]
    assert 0 < inner < s["run_step"] <= run.seconds
    assert s["run_step"] + s["sync"] <= run.seconds * 1.001


def test_host_phases_runs_a_batch_with_either_layout(tiny_ckpt, monkeypatch) -> None:
    """`host_phases.run_mode` on several streams at once: the per-stream and the whole-step layouts (a mode's
    @LAYOUT) each take their own path, decode the same tokens in the same steps, and the layout phase is timed."""
    from conftest import synthetic_audio
    from host_phases import _AT_ONCE_FROM, run_mode

    from realtime.loader import load_model
    from realtime.tokenizer import load_tokenizer
    from speculative import DrafterConfig, ParallelEagleDrafter

    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    torch.manual_seed(0)
    drafter = ParallelEagleDrafter(DrafterConfig.for_target(model.config)).eval()
    drafter.tie_to(model.language_model.embed_tokens.weight)
    clips = [synthetic_audio(1.5, seed=3), synthetic_audio(1.0, seed=4), synthetic_audio(2.0, seed=5)]
    from realtime.engine.speculation import Speculator

    calls = {"per-stream": 0, "at-once": 0}
    for name, key in (("_rows_per_stream", "per-stream"), ("_rows_at_once", "at-once")):
        def counted(self, *a, _f=getattr(Speculator, name), _k=key):
            calls[_k] += 1
            return _f(self, *a)
        monkeypatch.setattr(Speculator, name, counted)
    runs = {}
    for lay in ("per-stream", "at-once"):
        before = dict(calls)
        runs[lay] = run_mode(model, tok, clips, "host-chain", drafter, 3, False, None, _AT_ONCE_FROM[lay])
        other = "at-once" if lay == "per-stream" else "per-stream"
        assert calls[lay] > before[lay] and calls[other] == before[other], (lay, calls)
    a, b = runs["per-stream"], runs["at-once"]
    assert (a["steps"], a["tokens"]) == (b["steps"], b["tokens"]) and a["tokens"] > 3 * 12
    assert a["phases_us_per_step"]["layout"] > 0 and b["phases_us_per_step"]["layout"] > 0


def test_host_phases_can_time_the_encoders_host_work_alone(tiny_ckpt, monkeypatch) -> None:
    """`run_mode(..., skip_encoder_forward=True)`: the encoder calls run (their host work is timed) but never the
    encoder itself, in that engine only; graphs refuse it (a replay runs what was captured)."""
    from conftest import synthetic_audio
    from host_phases import run_mode

    from realtime.engine.lookahead import LookaheadEncoder
    from realtime.loader import load_model
    from realtime.tokenizer import load_tokenizer

    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    forwards = []
    real = LookaheadEncoder._forward
    monkeypatch.setattr(LookaheadEncoder, "_forward", lambda self, n, b: forwards.append(b) or real(self, n, b))
    clips = [synthetic_audio(1.5, seed=3), synthetic_audio(1.0, seed=4)]
    full = run_mode(model, tok, clips, "plain", None, 3, False)
    assert forwards and full["phases_us_per_step"]["encode"] > 0
    forwards.clear()
    host = run_mode(model, tok, clips, "plain", None, 3, False, skip_encoder_forward=True)
    assert forwards == [] and host["phases_us_per_step"]["encode"] > 0 and host["steps"] == full["steps"]
    with pytest.raises(ValueError, match="needs eager steps"):
        run_mode(model, tok, clips, "plain", None, 3, True, skip_encoder_forward=True)


def _record_send_in_flight(monkeypatch) -> list[bool]:
    """The `send_tokens_in_flight` each `BatchedEngine` made from now on settled on, in order."""
    from realtime.engine import BatchedEngine

    seen: list[bool] = []
    real_init = BatchedEngine.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        seen.append(self._send_in_flight)

    monkeypatch.setattr(BatchedEngine, "__init__", init)
    return seen


def test_host_phases_sends_tokens_as_told(tiny_ckpt, monkeypatch) -> None:
    """`run_mode(..., tokens_in_flight=...)` builds its engine with that `send_tokens_in_flight` (on, off, or the
    engine's default), and the tokens do not change."""
    from conftest import synthetic_audio
    from host_phases import _IN_FLIGHT, run_mode

    from realtime.loader import load_model
    from realtime.tokenizer import load_tokenizer

    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    seen = _record_send_in_flight(monkeypatch)
    clips = [synthetic_audio(1.0, seed=3), synthetic_audio(1.3, seed=4)]
    tokens = {}
    for name in ("on", "off", "auto"):
        seen.clear()
        tokens[name] = run_mode(model, tok, clips, "plain", None, 3, False, tokens_in_flight=_IN_FLIGHT[name])["tokens"]
        assert seen == [{"on": True, "off": False, "auto": False}[name]], name  # auto: off on the CPU
    assert tokens["on"] == tokens["off"] == tokens["auto"] > 0


def test_paced_run_sends_tokens_as_told(tiny_ckpt, monkeypatch) -> None:
    """`bench_engine.paced_run(..., tokens_in_flight=...)` builds its engine with that `send_tokens_in_flight`, and
    its paced streams' tokens reach the lag measure either way."""
    from bench_engine import paced_run

    from realtime.loader import load_model
    from realtime.tokenizer import load_tokenizer

    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    seen = _record_send_in_flight(monkeypatch)
    for flag in (True, False, None):
        seen.clear()
        rep = paced_run(model, tok, 2, 1.0, 60.0, stagger_s=0.2, warmup_s=0.0, tokens_in_flight=flag)
        assert seen == [bool(flag)], flag  # None: the engine's default, off on the CPU
        # 1 s of audio is 12 positions a stream past the prompt's, of which the prompt holds the 480 ms delay's 6
        assert rep["streams"] == 2 and 2 * 4 <= rep["tokens_measured"] <= 2 * 7, rep
        assert 0 < rep["lag_p50_ms"] <= rep["lag_p99_ms"] <= rep["lag_max_ms"]


def test_synthetic_streams_in_the_engines_order_decode_the_same_tokens(tiny_ckpt) -> None:
    """`bench_engine.SyntheticStreams` with `ahead` (the next token's encoder after the LM launch, as the
    engine runs a backlog) times the same work as its serial order: the same audio gives the same
    token ids, step by step, at several session ages."""
    from bench_engine import SyntheticStreams

    from realtime.engine import RunnerOptions
    from realtime.engine.model_runner import ModelRunner
    from realtime.loader import load_model

    model, _ = load_model(tiny_ckpt(seed=2))
    tokens = {}
    for ahead in (False, True):
        torch.manual_seed(0)  # the sample windows SyntheticStreams draws
        runner = ModelRunner(model, RunnerOptions(max_streams=3, max_batch=3, cuda_graphs=False, max_session_seconds=60))
        sim = SyntheticStreams(runner, 3, [0, 5, 40], ahead=ahead)
        seen = []
        for _ in range(6):
            sim.step()
            seen.append(list(sim.tokens))
        tokens[ahead] = seen
        assert sim.lm_pos == [sim.prompt + a + 6 for a in (0, 5, 40)]
    assert tokens[True] == tokens[False]
    assert len({t for step in tokens[True] for t in step}) > 1  # real argmaxes, not a constant


def test_synthetic_streams_time_each_part_alone(tiny_ckpt, monkeypatch):
    """parts="lm" runs only LM steps and parts="encoder" only encoder steps, on the positions a whole step
    would take; "both" is the step (what the other tests check)."""
    from bench_engine import SyntheticStreams

    from realtime.engine import RunnerOptions
    from realtime.engine.model_runner import ModelRunner
    from realtime.loader import load_model

    model, _ = load_model(tiny_ckpt(seed=2))
    runner = ModelRunner(model, RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False, max_session_seconds=60))
    calls = {"encoder": 0, "lm": 0}
    run, decode = runner.encoder.run, runner.decode
    monkeypatch.setattr(runner.encoder, "run", lambda *a, **k: (calls.__setitem__("encoder", calls["encoder"] + 1),
                                                                run(*a, **k))[1])
    monkeypatch.setattr(runner, "decode", lambda *a, **k: (calls.__setitem__("lm", calls["lm"] + 1), decode(*a, **k))[1])
    for parts, want in (("lm", {"encoder": 0, "lm": 3}), ("encoder", {"encoder": 3, "lm": 0}),
                        ("both", {"encoder": 3, "lm": 3})):
        calls.update(encoder=0, lm=0)
        sim = SyntheticStreams(runner, 2, [0, 7], parts=parts)
        for _ in range(3):
            sim.step()
        assert calls == want, parts
        assert sim.lm_pos == [sim.prompt + 3, sim.prompt + 10]
        sim.release()
    with pytest.raises(ValueError, match="parts must be"):
        SyntheticStreams(runner, 1, [0], parts="half")


def test_pyspy_summary_counts_each_function_once_per_sample(tmp_path):
    """Samples per thread (thread ids dropped), functions by inclusive samples: a function on two lines
    of one stack (recursion, or two calls in one frame chain) counts once for that stack."""
    import gzip

    import pyspy_summary

    raw = ("thread (11): MainThread;run (a.py:1);step (b.py:5);step (b.py:9) 7\n"
           "thread (11): MainThread;run (a.py:1);idle (c.py:2) 3\n"
           "thread (12): engine;loop (e.py:3) 4\n")
    path = tmp_path / "p.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write(raw)
    out = pyspy_summary.summarise(pyspy_summary.read_stacks(path))
    assert list(out) == ["MainThread", "engine"]
    assert out["MainThread"]["samples"] == 10 and out["engine"]["samples"] == 4
    assert dict(out["MainThread"]["top"]) == {"run (a.py)": 10, "step (b.py)": 7, "idle (c.py)": 3}


def test_encoder_overlap_benchmark_refuses_unknown_modes_and_variants(monkeypatch, capsys) -> None:
    """Argument checks run before any GPU work; each variant is an environment of `kernels`' switches."""
    import bench_encoder_overlap as beo

    for bad in (["--modes", "serial,sideways"], ["--variants", "cublas,fastest"]):
        monkeypatch.setattr(sys, "argv", ["bench_encoder_overlap.py", "--model", "nowhere", *bad])
        with pytest.raises(SystemExit):
            beo.main()
        assert "unknown mode or variant" in capsys.readouterr().err
    assert set(beo.MODES) == {"serial", "ahead_one_stream", "ahead_encoder_stream", "lm_only", "encoder_only",
                              "encoder_only_own_stream"}
    assert beo.VARIANTS["encoder_sms_32"] == {"STREAMSCRIBE_ENCODER_SMS": "32"}
    assert beo.VARIANTS["cublas"] == {"STREAMSCRIBE_PDL": "0", "STREAMSCRIBE_SKINNY_ROWS": "0", "STREAMSCRIBE_ONE_ROW": "0"}
    assert beo.VARIANTS["one_row"]["STREAMSCRIBE_ONE_ROW"] == "1"
    assert beo.VARIANTS["default"] == {}


def test_encoder_overlap_variants_name_only_switches_the_code_reads() -> None:
    """A misspelt switch in a variant would time the default under another name: every environment variable a
    variant sets is read somewhere in kernels/ or realtime/."""
    import bench_encoder_overlap as beo

    root = Path(__file__).resolve().parent.parent
    source = "\n".join(p.read_text() for d in ("kernels", "realtime") for p in (root / d).rglob("*.py"))
    names = {name for env in beo.VARIANTS.values() for name in env}
    assert {"STREAMSCRIBE_ATTN_MAX_SPLITS", "STREAMSCRIBE_ROPE_KV"} <= names
    assert sorted(n for n in names if f'"{n}"' not in source) == []


def test_instant_engine_decodes_each_whole_token_of_audio_once_and_ends_on_finish() -> None:
    """`host_path_cost.py`'s model-free engine: one empty pad token per whole 80 ms pushed, at the LM position whose
    audio_end_ms is that token's end (so the load tester's delay is the host path's own), then StreamDone."""
    import threading

    from host_path_cost import InstantEngine

    from realtime.config import ModelConfig
    from realtime.serving import StreamDone, StreamError, StreamToken

    cfg = ModelConfig()
    eng = InstantEngine(cfg)
    events: list = []
    done = threading.Event()

    def on_event(ev) -> None:
        events.append(ev)
        if isinstance(ev, StreamDone):
            done.set()

    eng.start()
    try:
        sid = eng.open_stream(on_event)
        spt = cfg.samples_per_token
        eng.push_audio(sid, np.zeros(spt + spt // 2, dtype=np.float32))  # one whole token and half of the next
        eng.push_audio(sid, np.zeros(spt // 2 + 10, dtype=np.float32))  # completes the second
        eng.finish_stream(sid)
        assert done.wait(5)
        with pytest.raises(StreamError):
            eng.push_audio(sid, np.zeros(10, dtype=np.float32))  # gone after its end
    finally:
        eng.stop()
    tokens = [e for e in events if isinstance(e, StreamToken)]
    assert [t.audio_end_ms for t in tokens] == [80, 160]
    assert all(t.text == "" and t.token_id == cfg.tokens.streaming_pad for t in tokens)
    assert isinstance(events[-1], StreamDone) and events[-1].completion_tokens == 2
    assert eng.stats().tokens_emitted == 2 and eng.stats().active_streams == 0


@pytest.mark.skipif(__import__("shutil").which("espeak-ng") is None and not __import__("os").environ.get("CI"),
                    reason="espeak-ng is not installed (CI installs it)")
def test_make_clip_segments_name_each_sentence_and_leave_the_audio_alone() -> None:
    """`make_speech_clips.py --segments`: each spoken sentence's span, in order, inside the clip and over its speech
    (not the silence between); the bookkeeping draws nothing from the generator, so a seed makes the same clip
    with or without it. (Two syntheses are not compared: espeak-ng's output varies by a few samples from one call to
    the next within a process, while a fresh process reproduces the same files.)"""
    from make_speech_clips import make_clip

    from realtime.train.voices import VoiceSpec

    voice = VoiceSpec("espeak", "en-us", "en-us", False, 1.0)
    texts = ["the cat sat on the mat", "a quick brown fox", "seven days a week", "hello there my friend"]
    segments: list[dict] = []
    with_rng, without_rng = np.random.default_rng(5), np.random.default_rng(5)
    clip = make_clip(voice, texts, 4.0, with_rng, segments)
    make_clip(voice, texts, 4.0, without_rng)
    assert with_rng.bit_generator.state == without_rng.bit_generator.state
    assert [s["text"] for s in segments] == texts[: len(segments)] and len(segments) >= 2
    ends = [0.0] + [s["end_s"] for s in segments]
    for s, prev_end in zip(segments, ends):
        assert prev_end + 0.25 - 1e-3 <= s["start_s"] < s["end_s"] <= clip.size / RATE + 1e-3
        speech = clip[int(s["start_s"] * RATE): int(s["end_s"] * RATE)]
        gap = clip[int(prev_end * RATE) + 1: int(s["start_s"] * RATE) - 1]
        assert np.abs(speech).max() > 0.5 and (gap.size == 0 or np.abs(gap).max() == 0)


def test_long_stream_wer_gives_each_word_to_the_sentence_whose_share_holds_it(tmp_path) -> None:
    """benchmarks/long_stream_wer.py: a sentence's share of the clip runs from the middle of the gap before it to
    the middle of the gap after it (the first from 0, the last to the end); a word goes to the share holding its
    start; WER counts an empty hypothesis as deletions."""
    import json

    from long_stream_wer import assign_words, sentences_of, wer

    clip = tmp_path / "c.flac"
    (tmp_path / "c.segments.json").write_text(json.dumps([
        {"text": "One two", "start_s": 0.5, "end_s": 1.5}, {"text": "three", "start_s": 2.5, "end_s": 3.0},
        {"text": "four five", "start_s": 4.0, "end_s": 5.0}]))
    s = sentences_of(clip, 6.0)
    assert [(x.text, x.lo_s, x.hi_s) for x in s] == [("one two", 0.0, 2.0), ("three", 2.0, 3.5),
                                                      ("four five", 3.5, 6.0)]
    assign_words(s, [("one", 0.1), ("two", 1.99), ("three", 2.0), ("for", 3.6), ("five", 7.0)])
    assert [x.in_stream for x in s] == ["one two", "three", "for five"]
    assert wer([x.text for x in s], [x.in_stream for x in s]) == {"wer": 20.0, "words": 5, "sentences": 3}
    assert wer(["a b"], [""])["wer"] == 100.0


def test_accent_variant_probe_names_which_half_each_part_of_a_voice_is_from() -> None:
    """benchmarks/accent_variant_probe.py labels an espeak-ng voice ACCENT[+VARIANT] by the catalogue's halves."""
    from accent_variant_probe import kind_of

    assert kind_of("en-029+m6") == "accent held-out, variant held-out"
    assert kind_of("en-029+m3") == "accent held-out, variant train"
    assert kind_of("en-029") == "accent held-out, variant train"  # no variant: the training voices' plain one
    assert kind_of("en-us+f4") == "accent train, variant held-out"
    assert kind_of("en-gb-x-gbcwmd+Alex") == "accent neither, variant neither"


def test_bench_detokenizer_compares_three_transcript_keepings(tmp_path) -> None:
    """`bench_detokenizer.py` runs the current detokeniser and the two earlier ways of keeping the transcript on one
    token stream; they give the same text (it exits otherwise), and its report has a figure for each."""
    import json

    from bench_detokenizer import AppendedString, EveryPart, main, token_stream

    from realtime.tokenizer import IncrementalDetokenizer, load_tokenizer

    model = str(Path(__file__).resolve().parent.parent / "models" / "default")
    assert main(["--model", model, "--words", "300", "--repeats", "1", "--out", str(tmp_path / "d.json")]) == 0
    report = json.loads((tmp_path / "d.json").read_text())
    assert set(report["variants"]) == {"appended_string", "every_part", "current"} and report["pushes"] > 300
    assert all(v["us_per_push"] > 0 and v["bytes_held"] > 0 for v in report["variants"].values())
    tok = load_tokenizer(model)
    ids = token_stream(tok, 300)
    texts = []
    for cls in (AppendedString, EveryPart, IncrementalDetokenizer):
        d = cls(tok)
        for i in ids:
            d.push(i)
        texts.append(d.text)
    assert texts[0] == texts[1] == texts[2] == tok.decode(ids)
