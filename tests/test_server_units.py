"""Unit tests of the server's pieces: codecs, timestamps, auth helpers, metrics, VAD turns."""

from __future__ import annotations

import base64
import json
import sys

import numpy as np
import pytest
from test_server_common import clip

from realtime.audio import AudioError
from stream_server import auth
from stream_server.codecs import (
    ALAW_TO_PCM16,
    ULAW_TO_PCM16,
    AudioFormat,
    alaw_to_float,
    decode_base64,
    parse_openai_format,
    ulaw_to_float,
)
from stream_server.events import ProtocolError, dumps, has_unpaired_surrogate, unsendable
from stream_server.metrics import Counter, Histogram, Metrics
from stream_server.options import parse_delay_ms, parse_delay_name
from realtime.timestamps import TokenClock, Word, WordTracker
from stream_server.vad import SpeechAudio, SpeechStarted, SpeechStopped, TurnDetector, VadParams


# -- codecs ------------------------------------------------------------------------------------------
def test_g711_tables_match_the_standard_expansion():
    # G.711 reference points: µ-law 0x00 -> -32124, 0x7f -> 0 (negative zero), 0x80 -> 32124, 0xff -> 0;
    # A-law 0xd5 -> 8 (smallest positive step), 0x55 -> -8, 0xaa -> 32256, 0x2a -> -32256
    assert (ULAW_TO_PCM16[[0x00, 0x7F, 0x80, 0xFF]] == [-32124, 0, 32124, 0]).all()
    assert (ALAW_TO_PCM16[[0xD5, 0x55, 0xAA, 0x2A]] == [8, -8, 32256, -32256]).all()
    # both are odd-symmetric and monotonic within each sign half
    assert (np.sort(np.abs(ULAW_TO_PCM16[128:].astype(int)))[::-1] == np.abs(ULAW_TO_PCM16[128:].astype(int))).all()
    assert len(set(ALAW_TO_PCM16.tolist())) == 256


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="audioop left the standard library in 3.13")
def test_g711_tables_match_audioop():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import audioop
    every = bytes(range(256))
    assert (np.frombuffer(audioop.ulaw2lin(every, 2), "<i2") == ULAW_TO_PCM16).all()
    assert (np.frombuffer(audioop.alaw2lin(every, 2), "<i2") == ALAW_TO_PCM16).all()


def test_decoders_are_finite_and_bounded():
    every = bytes(range(256))
    for f in (ulaw_to_float, alaw_to_float):
        x = f(every)
        assert x.dtype == np.float32 and np.isfinite(x).all() and np.abs(x).max() < 1.0


def test_base64_and_pcm_errors():
    assert decode_base64(base64.b64encode(b"\x01\x02").decode()) == b"\x01\x02"
    for bad in ("@@@", "AAA", 5, None):
        with pytest.raises(AudioError):
            decode_base64(bad)
    with pytest.raises(AudioError, match="even"):
        AudioFormat("audio/pcm", 16000).decode(b"\x00\x01\x02")
    assert AudioFormat("audio/pcmu", 8000).decode(b"\x00\x01\x02").size == 3  # 1 byte per sample


def test_openai_format_parsing():
    assert parse_openai_format({"type": "audio/pcm"}) == AudioFormat("audio/pcm", 24000)
    assert parse_openai_format({"type": "audio/pcm", "rate": 16000}) == AudioFormat("audio/pcm", 16000)
    assert parse_openai_format({"type": "audio/pcma"}) == AudioFormat("audio/pcma", 8000)
    assert parse_openai_format({"type": "audio/pcmu"}).to_json() == {"type": "audio/pcmu"}
    for bad in ({"type": "audio/pcm", "rate": 44100}, {"type": "audio/pcm", "rate": True},
                {"type": "audio/pcmu", "rate": 16000}, {"type": "audio/opus"}, "pcm16"):
        with pytest.raises(ValueError):
            parse_openai_format(bad)


def test_delay_options():
    assert parse_delay_ms(480, "p") == 480 and parse_delay_ms(2400.0, "p") == 2400
    for bad in (0, 40, 100, 1280, 2000, -80, "480", True, float("nan"), float("inf"), 480.5):
        with pytest.raises(ProtocolError) as info:
            parse_delay_ms(bad, "the.param")
        assert info.value.code == "invalid_value" and info.value.param == "the.param"
    assert parse_delay_name("xhigh", "p") == 2400
    with pytest.raises(ProtocolError):
        parse_delay_name("fast", "p")


# -- timestamps --------------------------------------------------------------------------------------
def test_token_clock_convention():
    c = TokenClock(n_left_pad_tokens=32, delay_tokens=6, token_ms=80)
    # the first generated token (position 39 = prompt length) transcribes the first 80 ms frame
    assert c.frame_ms(39) == (0, 80)
    assert c.frame_ms(40) == (80, 160)
    assert TokenClock(32, 30, 80).frame_ms(63 + 10) == (800, 880)  # prompt 63 at a 2400 ms delay


def test_word_tracker():
    w = WordTracker()
    assert w.push(" hel", 0, 80) == []
    assert w.push("", 80, 160) == []
    assert w.push("lo", 160, 240) == []
    assert w.push(" wor", 240, 320) == [Word("hello", 0, 240)]
    assert w.push("ld! foo", 320, 400) == [Word("world!", 240, 400)]
    assert w.push(" ", 400, 480) == [Word("foo", 320, 400)]
    assert w.flush() == []
    assert [x.word for x in w.words] == ["hello", "world!", "foo"]
    w2 = WordTracker()
    w2.push("no-leading-space", 0, 80)
    assert w2.flush() == [Word("no-leading-space", 0, 80)]


# -- auth ----------------------------------------------------------------------------------------------
def test_key_extraction_and_matching():
    assert auth.extract_api_key("Bearer abc", "/v1/realtime", []) == "abc"
    assert auth.extract_api_key("bearer  abc ", "/v1/realtime", []) == "abc"
    assert auth.extract_api_key(None, "/v1/realtime?intent=transcription&api_key=q1", []) == "q1"
    assert auth.extract_api_key(None, "/v1/realtime", ["realtime", "openai-insecure-api-key.s1"]) == "s1"
    assert auth.extract_api_key("Basic abc", "/v1/realtime", []) is None
    assert auth.offered_subprotocols(["realtime, openai-insecure-api-key.x", "y"]) == [
        "realtime", "openai-insecure-api-key.x", "y"]
    assert auth.key_matches("abc", ("x", "abc"))
    assert not auth.key_matches("ab", ("abc",)) and not auth.key_matches(None, ("abc",))
    assert not auth.key_matches("abc", ())
    assert auth.key_index("k2", ("k1", "k2", "k3")) == 1 and auth.key_index("k", ("k1",)) is None
    assert auth.key_index(None, ("k1",)) is None


def test_loopback_hosts():
    for h in ("127.0.0.1", "127.5.5.5", "::1", "[::1]", "localhost"):
        assert auth.is_loopback_host(h), h
    for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", ""):
        assert not auth.is_loopback_host(h), h


def test_origin_rules():
    ok = auth.origin_allowed
    assert ok(None, "h:1", None, auth_enabled=False)
    assert ok("http://127.0.0.1:8000", "127.0.0.1:8000", None, auth_enabled=False)
    assert ok("http://localhost:3000", "10.1.2.3:8000", None, auth_enabled=False)
    assert not ok("https://evil.example", "127.0.0.1:8000", None, auth_enabled=False)
    assert not ok("null", "127.0.0.1:8000", None, auth_enabled=False)
    # same host by name: DNS rebinding risk without keys, fine with keys
    assert not ok("http://stt.example:8000", "stt.example:8000", None, auth_enabled=False)
    assert ok("http://stt.example:8000", "stt.example:8000", None, auth_enabled=True)
    assert ok("https://stt.example", "stt.example", None, auth_enabled=True)
    assert not ok("http://stt.example:9999", "stt.example:8000", None, auth_enabled=True)
    assert ok("https://app.example", "10.0.0.1:8000", ("https://app.example/",), auth_enabled=True)
    assert not ok("http://localhost:3000", "10.0.0.1:8000", ("https://app.example",), auth_enabled=True)
    assert ok("https://anything.example", "h", ("*",), auth_enabled=False)


# -- metrics -------------------------------------------------------------------------------------------
def test_prometheus_rendering():
    c = Counter("x_total", "Things.", ("reason",))
    c.inc("a b\"c")
    c.inc("a b\"c", amount=2)
    assert c.render() == ["# HELP x_total Things.", "# TYPE x_total counter", 'x_total{reason="a b\\"c"} 3']
    with pytest.raises(ValueError):
        c.inc("a", amount=-1)
    h = Histogram("lat_seconds", "Latency.", (0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0, float("nan")):
        h.observe(v)
    lines = h.render()
    assert 'lat_seconds_bucket{le="0.1"} 2' in lines and 'lat_seconds_bucket{le="1"} 3' in lines
    assert 'lat_seconds_bucket{le="+Inf"} 4' in lines and "lat_seconds_count 4" in lines
    text = Metrics().render()
    assert text.endswith("\n") and "streamscribe_sessions_active 0" in text


def test_metrics_page_lists_every_metric():
    m = Metrics()
    names = [v.name for v in vars(m).values() if isinstance(v, (Counter, Histogram))]
    assert {"streamscribe_keepalive_timeouts_total", "streamscribe_shutdown_flushed_sessions_total"} <= set(names)
    text = m.render()
    assert all(f"# TYPE {n} " in text for n in names), [n for n in names if f"# TYPE {n} " not in text]


def test_metrics_export_speculation_per_draft_depth():
    """/metrics carries speculation's acceptance rate, mean acceptance length and acceptance at each draft depth, from
    the engine's counters; an engine that drafted nothing at a depth shows 0 there, not a division error."""
    from realtime.serving import EngineStats

    m = Metrics()
    m.record_engine_stats(EngineStats(spec_rounds=4, spec_drafted=10, spec_accepted=5,
                                      spec_drafted_per_position=[4, 4, 2, 0], spec_accepted_per_position=[3, 2, 0, 0]))
    lines = set(m.render().splitlines())
    assert {"streamscribe_spec_acceptance_rate 0.5", "streamscribe_spec_rounds 4",
            "streamscribe_spec_mean_acceptance_length 2.25"} <= lines  # 1 + 5 accepted / 4 rounds
    for i, (d, a, r) in enumerate([(4, 3, "0.75"), (4, 2, "0.5"), (2, 0, "0"), (0, 0, "0")]):
        assert {f'streamscribe_spec_position_drafted_tokens{{position="{i}"}} {d}',
                f'streamscribe_spec_position_accepted_tokens{{position="{i}"}} {a}',
                f'streamscribe_spec_position_acceptance_rate{{position="{i}"}} {r}'} <= lines, i
    assert not any("position=\"4\"" in ln for ln in lines)


# -- VAD -----------------------------------------------------------------------------------------------
def test_turn_detector_finds_speech_and_keeps_every_sample():
    sil = np.zeros(16000, np.float32)
    audio = np.concatenate([sil, clip(1.2, 21), sil, sil[:8000], clip(1.0, 22), sil, sil[:8000]])
    det = TurnDetector(VadParams(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500))
    events = []
    rng = np.random.default_rng(0)
    pos = 0
    while pos < audio.size:  # any chunking
        n = int(rng.integers(1, 3000))
        events += det.feed(audio[pos: pos + n])
        pos += n
    turns, cur = [], None
    for ev in events:
        if isinstance(ev, SpeechStarted):
            assert cur is None
            cur = [ev.start_sample, [ev.audio]]
        elif isinstance(ev, SpeechAudio):
            assert ev.start_sample == cur[0] + sum(a.size for a in cur[1])  # contiguous
            cur[1].append(ev.audio)
        elif isinstance(ev, SpeechStopped):
            turns.append((cur[0], ev.end_sample, np.concatenate(cur[1])))
            cur = None
    assert len(turns) == 2
    for start, end, samples in turns:
        assert np.array_equal(samples, audio[start:end])  # contiguous audio, prefix padding included
    assert 16000 - 4800 - 512 <= turns[0][0] and turns[0][1] <= 16000 + 19200 + 8000 + 512
    assert turns[1][0] >= turns[0][1]


def test_turn_detector_silence_only_and_prefix_zero():
    det = TurnDetector(VadParams(prefix_padding_ms=0))
    assert det.feed(np.zeros(64 * 512, np.float32)) == []
    assert det.feed(np.zeros(100, np.float32)) == [] and det.buffered_samples == 100


# -- engine stream bookkeeping -------------------------------------------------------------------------
def test_arrival_log_answers_increasing_queries_and_stays_small():
    from stream_server.engine_stream import _Arrivals

    log = _Arrivals()
    for k in range(1, 2001):
        log.add(k * 320, float(k))  # 20 ms appends arriving at t = k
    got = [log.time_of(s, default=-1.0) for s in range(0, 2000 * 320 + 1, 160)]
    assert got == [float(max(1, -(-s // 320))) for s in range(0, 2000 * 320 + 1, 160)]
    assert len(log.ends) < 300
    assert log.time_of(10**9, default=-1.0) == -1.0  # beyond the audio received: the default


def test_final_words_are_bounded():
    from stream_server.engine_stream import MAX_FINAL_WORDS, StreamOutcome

    few = [Word(f"w{i}", i, i + 1) for i in range(10)]
    assert StreamOutcome("", 0, 0, few, few[-1:], 0, 0, 0.0).final_words() == (few, False)
    many = [Word("w", i, i + 1) for i in range(MAX_FINAL_WORDS + 1)]
    assert StreamOutcome("", 0, 0, many, many[-2:], 0, 0, 0.0).final_words() == (many[-2:], True)


def test_cpu_serving_uses_one_thread_unless_told():
    import torch

    from stream_server.app import build_parser, configure_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert configure_threads("cpu", None) == 1
        assert configure_threads("cpu", 2) == 2
        torch.set_num_threads(2)
        assert configure_threads("cuda", None) == 2  # left as torch has it
        assert build_parser().parse_args(["--threads", "3"]).threads == 3
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--threads", "0"])
    finally:
        torch.set_num_threads(before)


def test_final_fields_are_the_same_extensions_in_both_dialects():
    from stream_server.engine_stream import MAX_FINAL_WORDS, StreamOutcome

    few = [Word("a", 0, 80), Word("b", 80, 160)]
    out = StreamOutcome("a b", 3, 4, few, few[-1:], 40, 200, 0.0)
    assert out.final_fields() == {"is_final": True, "audio_start_ms": 40, "audio_end_ms": 200,
                                  "words": [w.to_json() for w in few]}
    many = [Word("w", i, i + 1) for i in range(MAX_FINAL_WORDS + 1)]
    long = StreamOutcome("", 0, 0, many, many[-2:], 0, 0, 0.0).final_fields()
    assert long["words_truncated"] is True and len(long["words"]) == 2


def test_engine_events_keep_order_wake_the_loop_once_per_burst_and_isolate_failures():
    """The engine thread's events reach the loop in order, with one loop wake-up for everything queued
    before the drain runs (not one per token); a delivery that raises costs only its own event; once the
    loop is closed, events are dropped without an error reaching the engine thread."""
    import asyncio
    import threading

    from stream_server.engine_stream import EngineEvents

    loop = asyncio.new_event_loop()
    wakes = []
    real = loop.call_soon_threadsafe

    def counting(cb, *args):
        wakes.append(cb)
        return real(cb, *args)

    loop.call_soon_threadsafe = counting
    events = EngineEvents(loop)
    got: list[int] = []

    def broken(ev: int) -> None:
        raise RuntimeError("a session's handler failed")

    burst = threading.Thread(target=lambda: [events.put(broken if i == 5 else got.append, i) for i in range(100)])
    burst.start()
    burst.join()
    loop.run_until_complete(asyncio.sleep(0))
    assert got == [i for i in range(100) if i != 5]
    assert len(wakes) == 1
    events.put(got.append, 100)  # after a drain the next event wakes the loop again
    loop.run_until_complete(asyncio.sleep(0))
    assert got[-1] == 100 and len(wakes) == 2
    loop.close()
    events.put(got.append, 101)  # the loop is gone: dropped, no exception
    assert got[-1] == 100


def test_events_that_no_utf8_frame_could_carry():
    """A JSON `\\ud800` escape parses to an unpaired surrogate, which UTF-8 cannot encode: the checks name it, and
    `dumps` writes such a string escaped (valid JSON that parses back to the same value) instead of handing the
    socket text it cannot encode; NaN is named too. Paired escapes (an emoji) are ordinary text."""
    lone = json.loads('{"type": "a\\ud800b", "x": ["\\udfff"]}')
    assert has_unpaired_surrogate(lone) and has_unpaired_surrogate(lone["x"])
    assert "surrogate" in unsendable(lone)
    assert unsendable({"v": float("nan")}) == "NaN and Infinity are not JSON values"
    pair = json.loads('{"type": "\\ud83d\\ude00 \u00e9"}')
    assert not has_unpaired_surrogate(pair) and unsendable(pair) is None
    assert dumps(pair) == '{"type":"\U0001F600 \u00e9"}'  # non-ASCII text stays unescaped
    text = dumps(lone)
    text.encode("utf-8")  # sendable
    assert json.loads(text) == lone
    with pytest.raises(ValueError):
        dumps({"v": float("inf")})
