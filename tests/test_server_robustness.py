"""Robustness, security and operations: concurrency, disconnects, limits, auth, origins, HTTP, CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf
from test_server_common import (  # noqa: F401  (fixtures)
    MODEL,
    StalledEngine,
    b64,
    ckpt,
    clip,
    engine,
    fresh_vllm_utterance,
    open_openai,
    open_vllm,
    pcm16,
    read_utterance_vllm,
    recv_json,
    recv_until,
    reference,
    send_json,
    send_utterance_vllm,
    session,
    start_server,
    utterance_vllm,
    wait_for,
    wait_no_streams,
)
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from realtime.model_store import load_model_and_tokenizer
from realtime.serving import StreamFailed, StreamToken
from realtime.session import transcribe
from stream_server.app import build_parser, settings_from_args
from stream_server.client import main as client_main
from stream_server.engine_factory import build_engine
from stream_server.upload_client import UploadError, upload_file

SHORT = clip(0.4, seed=41)
ROOT = Path(__file__).resolve().parent.parent


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


# -- concurrency -------------------------------------------------------------------------------------
async def test_32_concurrent_paced_sessions_match_single_session(start_server, reference, engine):
    srv = start_server(max_sessions=32)
    clips = [clip(0.4 + 0.1 * (i % 4), seed=100 + i) for i in range(32)]

    async def one(audio: np.ndarray) -> str:
        ws = await open_vllm(srv.ws_url)
        try:
            # paced at 2x real time in 50 ms appends
            return await utterance_vllm(ws, audio, chunk_bytes=1600, pace=2.0)
        finally:
            await ws.close()

    texts = await asyncio.wait_for(asyncio.gather(*(one(c) for c in clips)), 150)
    assert texts == [reference(c) for c in clips]
    assert wait_no_streams(engine) == 0


# -- disconnects ---------------------------------------------------------------------------------------
async def test_disconnect_at_any_moment_frees_engine_streams(start_server, engine, reference):
    srv = start_server()
    audio = pcm16(clip(2.0, seed=42))

    async def vllm_until(stage: str) -> None:
        ws = await open_vllm(srv.ws_url)
        if stage != "after_update":
            await send_json(ws, {"type": "input_audio_buffer.commit"})
        if stage in ("mid_audio", "after_final"):
            for i in range(0, len(audio) // 2, 3200):
                await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(audio[i: i + 3200])})
        if stage == "after_final":
            await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
        if stage == "abort":
            await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(audio)})
            ws.transport.abort()  # no close handshake: the TCP connection just drops
            return
        await ws.close()

    async def openai_mid_item() -> None:
        ws = await connect(srv.ws_url + "?intent=transcription")
        await recv_json(ws)
        await send_json(ws, {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}})
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(audio)})
        await asyncio.sleep(0.05)
        await ws.close()

    stages = ["after_update", "after_commit", "mid_audio", "after_final", "abort"]
    await asyncio.gather(*(vllm_until(s) for s in stages), openai_mid_item())
    assert wait_for(lambda: engine.stats().active_streams == 0)
    assert wait_for(lambda: srv.call(lambda: len(srv.server.active)) == 0)
    assert await fresh_vllm_utterance(srv.ws_url, SHORT) == reference(SHORT)


def _live_session_objects() -> dict[str, int]:
    """Instances of the per-session classes still reachable after a full collection, by class name."""
    import gc

    from realtime.engine.stream import EngineStream as EngineSideStream
    from stream_server.connection import Connection
    from stream_server.engine_stream import EngineStream
    from stream_server.openai_dialect import OpenAIDialect
    from realtime.timestamps import WordTracker
    from stream_server.vllm_dialect import VllmDialect

    kinds = (Connection, EngineStream, EngineSideStream, OpenAIDialect, VllmDialect, WordTracker)
    gc.collect()
    counts = {k.__name__ + ("" if k is not EngineSideStream else " (engine)"): 0 for k in kinds}
    for obj in gc.get_objects():
        for k in kinds:
            if type(obj) is k:
                counts[k.__name__ + ("" if k is not EngineSideStream else " (engine)")] += 1
    return counts


async def test_finished_sessions_leave_no_objects_behind(start_server, engine, reference):
    """A long-running service must not keep anything of a session once it is over: after finished sessions of both
    dialects, a client that vanishes mid-audio and one that closes mid-item, no connection, dialect, word tracker
    or stream object (server or engine side) survives a garbage collection. (480 sessions of the default model
    on the CPU left the server's RSS flat: benchmarks/soak_sessions.py, docs/benchmarks.md issue 4.)"""
    srv = start_server()
    audio = pcm16(clip(1.2, seed=43))

    async def openai_turn(close_mid_item: bool) -> None:
        ws = await connect(srv.ws_url + "?intent=transcription")
        await recv_json(ws)
        await send_json(ws, {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}})
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(audio)})
        if not close_mid_item:
            await send_json(ws, {"type": "input_audio_buffer.commit"})
            await recv_until(ws, {"conversation.item.input_audio_transcription.completed"})
        await ws.close()

    async def vllm_vanishes() -> None:
        ws = await open_vllm(srv.ws_url)
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(audio)})
        ws.transport.abort()

    for _ in range(2):
        await asyncio.gather(fresh_vllm_utterance(srv.ws_url, SHORT), openai_turn(False), openai_turn(True),
                             vllm_vanishes())
    assert wait_for(lambda: engine.stats().active_streams == 0)
    assert wait_for(lambda: srv.call(lambda: len(srv.server.active)) == 0)
    assert wait_for(lambda: not any(_live_session_objects().values()), timeout=5.0), _live_session_objects()


async def test_dead_client_is_dropped_by_keepalive(start_server, engine):
    srv = start_server(ping_interval_s=0.2, ping_timeout_s=0.2, close_timeout_s=0.5)
    ws = await open_vllm(srv.ws_url, ping_interval=None)
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(SHORT))})
    await asyncio.sleep(0.1)
    ws.transport.pause_reading()  # the client stops answering pings (a hung peer)
    assert await asyncio.to_thread(wait_for, lambda: srv.call(lambda: len(srv.server.active)) == 0, 10)
    assert await asyncio.to_thread(wait_for, lambda: engine.stats().active_streams == 0, 10)
    assert srv.call(lambda: srv.server.metrics.keepalive_timeouts.get()) == 1
    ws.transport.abort()


async def test_idle_connection_kept_alive_by_pings(start_server, reference):
    srv = start_server(ping_interval_s=0.1, ping_timeout_s=1.0, idle_timeout_s=5.0)
    ws = await open_vllm(srv.ws_url)
    await asyncio.sleep(0.6)  # several keepalive rounds with no traffic
    assert await utterance_vllm(ws, SHORT) == reference(SHORT)
    await ws.close()


async def test_keepalive_off_sessions_work_and_end(start_server, reference):
    """--ping-interval 0: no pings, and sessions still transcribe and end (nothing waits on a keepalive)."""
    srv = start_server(ping_interval_s=None, ping_timeout_s=None)
    ws = await open_vllm(srv.ws_url, ping_interval=None)
    assert await utterance_vllm(ws, SHORT) == reference(SHORT)
    await ws.close()
    assert await asyncio.to_thread(wait_for, lambda: srv.call(lambda: len(srv.server.active)) == 0, 10)


class ThrottledEngine:
    """Delegates to a real engine, but hands it a stream's audio at `rate` x real time from a thread of its own: an
    engine slower than the client's upload, so the server's backpressure holds reading for seconds."""

    def __init__(self, inner, rate: float) -> None:
        self.inner, self.config, self.model_name, self.rate = inner, inner.config, inner.model_name, rate
        self.queued: dict[int, list[np.ndarray]] = {}
        self.finishing: set[int] = set()
        self.lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._forward, daemon=True)
        self.thread.start()

    def _forward(self) -> None:
        step = 1280  # one 80 ms frame
        while self.running:
            with self.lock:
                for sid, chunks in self.queued.items():
                    if chunks:
                        head = chunks[0]
                        self.inner.push_audio(sid, head[:step])
                        if len(head) > step:
                            chunks[0] = head[step:]
                        else:
                            chunks.pop(0)
                    if not chunks and sid in self.finishing:
                        self.finishing.discard(sid)
                        self.inner.finish_stream(sid)
            time.sleep(step / 16000 / self.rate)

    def stop_forwarding(self) -> None:
        self.running = False
        self.thread.join()

    def open_stream(self, on_event, *, delay_ms=None):
        sid = self.inner.open_stream(on_event, delay_ms=delay_ms)
        with self.lock:
            self.queued[sid] = []
        return sid

    def push_audio(self, sid, samples) -> None:
        with self.lock:
            self.queued[sid].append(np.asarray(samples, np.float32))

    def finish_stream(self, sid) -> None:
        with self.lock:
            self.finishing.add(sid)

    def close_stream(self, sid) -> None:
        with self.lock:
            self.queued.pop(sid, None)
            self.finishing.discard(sid)
        self.inner.close_stream(sid)

    def pending_audio_seconds(self, sid) -> float:
        with self.lock:
            held = sum(len(c) for c in self.queued.get(sid, ())) / 16000
        return held + self.inner.pending_audio_seconds(sid)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_keepalive_spares_a_client_whose_pong_waits_behind_its_audio(start_server, engine, reference):
    """A client that uploads faster than the engine decodes (a file sent at once) is held back by the server's
    backpressure, so its pong to a keepalive ping waits in the socket behind its own audio until the engine catches
    up. That is the server not reading, not the client failing to answer: the session must go on. (With the
    websockets library's own keepalive, this closed the session with 1011 after the ping timeout: a 30-minute file
    sent at 50x real time to the default model on the CPU was cut after 40 s.)
    The engine decodes at real time, so the pong waits seconds, several times the 1.5 s timeout, while the time
    the server spends reading before it stays well under it (a 0.5 s timeout at 4x real time counted one timeout
    once on a CI-like box whose two cores were busy with other work)."""
    slow = ThrottledEngine(engine, rate=1.0)
    srv = start_server(engine_override=slow, ping_interval_s=0.2, ping_timeout_s=1.5, max_pending_audio_s=0.3)
    audio = clip(6.0, seed=48)
    try:
        ws = await open_vllm(srv.ws_url)
        assert await utterance_vllm(ws, audio) == reference(audio)
        await ws.close()
    finally:
        slow.stop_forwarding()
    assert srv.call(lambda: srv.server.metrics.read_pauses.get("engine_backlog")) > 0  # reading was held back
    assert srv.call(lambda: srv.server.metrics.keepalive_timeouts.get()) == 0


# -- limits --------------------------------------------------------------------------------------------
async def test_server_full_is_explicit_then_recovers(start_server, reference):
    srv = start_server(max_sessions=2)
    a = await open_vllm(srv.ws_url)
    b = await open_vllm(srv.ws_url)
    async with connect(srv.ws_url) as c:
        err = await recv_json(c)
        assert err == {"type": "error", "error": "The server is full (2 sessions); try again later",
                       "code": "server_full"}
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(c.recv(), 5)
        assert info.value.rcvd.code == 1013
    async with connect(srv.ws_url + "?intent=transcription") as c:  # OpenAI clients get their error shape
        err = await recv_json(c)
        assert err["type"] == "error" and err["error"]["code"] == "server_full"
    await a.close()
    assert await asyncio.to_thread(wait_for, lambda: srv.call(lambda: len(srv.server.active)) == 1)
    assert await fresh_vllm_utterance(srv.ws_url, SHORT) == reference(SHORT)
    await b.close()
    _, _, body = http_get(f"{srv.http_url}/metrics")
    assert 'streamscribe_connections_rejected_total{reason="server_full"} 2' in body.decode()


class LoadedEngine:
    """The real engine, reporting a load of `recent_ms` per step for `streams` streams (`EngineStats.
    recent_step_seconds`, `.recent_step_streams`) and a fitted step cost of `line_ms` (fixed, per stream; (0, 0):
    none, so nothing is foreseen)."""

    def __init__(self, inner, recent_ms: float, streams: float = 0.0, line_ms: tuple[float, float] = (0.0, 0.0)):
        self.inner, self.recent_ms, self.streams, self.line_ms = inner, recent_ms, streams, line_ms

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def stats(self):
        return dataclasses.replace(self.inner.stats(), recent_step_seconds=self.recent_ms / 1000,
                                   recent_step_streams=self.streams, step_fixed_seconds=self.line_ms[0] / 1000,
                                   step_seconds_per_stream=self.line_ms[1] / 1000)


async def test_an_engine_at_capacity_refuses_new_sessions_and_uploads_then_recovers(start_server, engine, reference,
                                                                                    tmp_path):
    """While the engine's recent steps take longer than --max-step-ms, a new realtime session gets `server_busy`
    (its dialect's error shape, close 1013) and an upload 503 `server_busy` with Retry-After; sessions already open
    go on. When the load falls, both are taken again; --max-step-ms 0 never refuses."""
    loaded = LoadedEngine(engine, recent_ms=20.0)
    srv = start_server(engine_override=loaded, max_step_ms=64.0)
    open_before = await open_vllm(srv.ws_url)
    loaded.recent_ms = 90.0
    async with connect(srv.ws_url) as c:
        err = await recv_json(c)
        assert err["code"] == "server_busy" and "90 ms" in err["error"] and "--max-step-ms" in err["error"]
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(c.recv(), 5)
        assert info.value.rcvd.code == 1013
    async with connect(srv.ws_url + "?intent=transcription") as c:
        err = await recv_json(c)
        assert err["type"] == "error" and err["error"]["code"] == "server_busy"
    sf.write(tmp_path / "short.wav", SHORT, 16000, subtype="PCM_16")
    with pytest.raises(UploadError) as refused:
        await asyncio.to_thread(upload_file, srv.http_url, tmp_path / "short.wav")
    assert refused.value.status == 503 and refused.value.code == "server_busy"
    status, _, body = http_get(f"{srv.http_url}/health")
    assert status == 200 and json.loads(body)["engine"]["recent_step_ms"] == 90.0
    assert json.loads(body)["engine"]["recent_step_streams"] == 0.0
    assert await utterance_vllm(open_before, SHORT) == reference(SHORT)  # an open session is never cut
    await open_before.close()
    _, _, body = http_get(f"{srv.http_url}/metrics")
    assert 'streamscribe_connections_rejected_total{reason="server_busy"} 3' in body.decode()
    assert "streamscribe_engine_recent_step_seconds 0.09" in body.decode()
    loaded.recent_ms = 60.0
    assert await fresh_vllm_utterance(srv.ws_url, SHORT) == reference(SHORT)
    assert (await asyncio.to_thread(upload_file, srv.http_url, tmp_path / "short.wav")).text == reference(SHORT).strip()
    unlimited = start_server(engine_override=LoadedEngine(engine, recent_ms=500.0), max_step_ms=0)
    assert await fresh_vllm_utterance(unlimited.ws_url, SHORT) == reference(SHORT)
    args = build_parser().parse_args([])
    assert settings_from_args(args, env={}).max_step_ms == 64.0
    assert settings_from_args(build_parser().parse_args(["--max-step-ms", "0"]), env={}).max_step_ms == 0


async def test_a_burst_of_sessions_is_admitted_only_as_far_as_the_engine_can_carry_it(start_server, engine, reference,
                                                                                      tmp_path):
    """Sessions that connect at once are all admitted against the same recent load, which does not show them yet:
    admission foresees the step with every open session from the engine's fitted step cost. At 4 ms + 5 ms a stream
    and --max-step-ms 64, 12 streams fit: of 13 connecting at once, 12 are taken and one gets `server_busy` (close
    1013). An upload is one more stream: refused while 12 are open, taken once one has closed."""
    loaded = LoadedEngine(engine, recent_ms=20.0, streams=4, line_ms=(4.0, 5.0))  # 4 + 5 x 12 = 64 ms
    srv = start_server(engine_override=loaded, max_step_ms=64.0)
    sf.write(tmp_path / "short.wav", SHORT, 16000, subtype="PCM_16")

    async def attempt():
        c = await connect(srv.ws_url)
        first = await recv_json(c)
        return c, first

    tries = await asyncio.gather(*(attempt() for _ in range(13)))
    taken = [c for c, first in tries if first["type"] == "session.created"]
    refused = [(c, first) for c, first in tries if first["type"] == "error"]
    assert len(taken) == 12 and len(refused) == 1
    for c, err in refused:
        assert err["code"] == "server_busy" and "near capacity" in err["error"] and "12 open sessions" in err["error"]
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(c.recv(), 5)
        assert info.value.rcvd.code == 1013
    with pytest.raises(UploadError) as busy:  # an upload is one more stream too
        await asyncio.to_thread(upload_file, srv.http_url, tmp_path / "short.wav")
    assert busy.value.status == 503 and busy.value.code == "server_busy"
    for c in taken:
        await send_json(c, {"type": "session.update", "model": MODEL})
        assert (await recv_json(c))["type"] == "session.updated"
    assert await utterance_vllm(taken[0], SHORT) == reference(SHORT)
    health = json.loads(http_get(f"{srv.http_url}/health")[2])["engine"]
    assert health["step_cost_ms"] == {"fixed": 4.0, "per_stream": 5.0}
    metrics = http_get(f"{srv.http_url}/metrics")[2].decode()
    assert "streamscribe_engine_step_cost_fixed_seconds 0.004" in metrics
    assert "streamscribe_engine_step_cost_per_stream_seconds 0.005" in metrics
    await taken[1].close()
    for _ in range(250):  # the closed session leaves the server's count once its handler has finished
        if json.loads(http_get(f"{srv.http_url}/health")[2])["active_sessions"] == 11:
            break
        await asyncio.sleep(0.02)
    assert (await asyncio.to_thread(upload_file, srv.http_url, tmp_path / "short.wav")).text == reference(SHORT).strip()
    for c in taken[2:] + taken[:1]:
        await c.close()


async def test_sessions_per_client_are_capped_per_key(start_server, reference):
    srv = start_server(api_keys=("k1", "k2"), max_sessions_per_client=2)
    auth1 = {"additional_headers": {"Authorization": "Bearer k1"}}
    a, b = await open_vllm(srv.ws_url, **auth1), await open_vllm(srv.ws_url, **auth1)
    async with connect(srv.ws_url, **auth1) as c:
        assert await recv_json(c) == {"type": "error", "code": "too_many_sessions", "error": (
            "This client (key #1) already has 2 sessions open, the most one client may hold; close one or try again "
            "later")}
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(c.recv(), 5)
        assert info.value.rcvd.code == 1013
    other = await open_vllm(srv.ws_url, additional_headers={"Authorization": "Bearer k2"})  # another key: room
    await other.close()
    await a.close()
    assert await asyncio.to_thread(wait_for, lambda: srv.call(lambda: len(srv.server.active)) == 1)
    c = await open_vllm(srv.ws_url, **auth1)  # room again
    assert await utterance_vllm(c, SHORT) == reference(SHORT)
    await c.close()
    await b.close()
    _, _, body = http_get(f"{srv.http_url}/metrics")
    assert 'streamscribe_connections_rejected_total{reason="too_many_sessions"} 1' in body.decode()


async def test_sessions_per_client_without_keys_count_per_address(start_server):
    srv = start_server(max_sessions_per_client=1)
    a = await open_vllm(srv.ws_url)
    async with connect(srv.ws_url) as c:
        err = await recv_json(c)
        assert err["code"] == "too_many_sessions" and "(127.0.0.1)" in err["error"]
    await a.close()


async def test_each_session_ends_with_one_log_line(start_server, reference, caplog):
    srv = start_server(api_keys=("k1", "k2"))
    with caplog.at_level(logging.INFO, logger="stream_server.server"):
        ws = await open_vllm(srv.ws_url, additional_headers={"Authorization": "Bearer k2"})
        await send_json(ws, {"type": "nonsense"})
        assert (await recv_json(ws))["code"] == "unknown_event"
        assert await utterance_vllm(ws, SHORT) == reference(SHORT)
        await ws.close()
        assert await asyncio.to_thread(wait_for, lambda: srv.call(lambda: len(srv.server.active)) == 0)
    lines = [r.getMessage() for r in caplog.records if "ended after" in r.getMessage()]
    assert len(lines) == 1, lines
    tokens = int(srv.call(lambda: srv.server.metrics.tokens.get()))  # this server's only session
    line = lines[0]
    assert tokens > 0 and line.startswith("session sess-") and "(key #2, vllm)" in line
    assert (f"{len(SHORT) / 16000:.1f} s of audio, 1 turn(s), {tokens} token(s), 1 error event(s), close 1000"
            in line), line


async def test_idle_timeout_closes_with_error(start_server):
    srv = start_server(idle_timeout_s=0.4)
    async with connect(srv.ws_url) as ws:
        await recv_json(ws)
        t0 = time.monotonic()
        err = await recv_json(ws, timeout=5)
        assert err["type"] == "error" and err["code"] == "idle_timeout"
        assert 0.3 < time.monotonic() - t0 < 3
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), 5)
        assert info.value.rcvd.code == 1000


async def test_idle_timeout_spares_active_sessions(start_server, reference):
    srv = start_server(idle_timeout_s=0.5)
    ws = await open_vllm(srv.ws_url)
    audio = clip(2.0, seed=43)
    # appends every 0.25 s for 2 s: never idle for 0.5 s
    assert await utterance_vllm(ws, audio, chunk_bytes=8000, pace=1.0) == reference(audio)
    await ws.close()


async def test_slow_reader_blocks_nobody_and_loses_nothing(start_server, reference):
    srv = start_server()
    slow_audio = clip(3.0, seed=44)
    slow = await open_vllm(srv.ws_url)
    slow.transport.pause_reading()  # reads nothing for now
    await send_utterance_vllm(slow, slow_audio, chunk_bytes=8192)
    t0 = time.monotonic()
    assert await fresh_vllm_utterance(srv.ws_url, SHORT) == reference(SHORT)
    assert time.monotonic() - t0 < 30
    slow.transport.resume_reading()
    _, done = await read_utterance_vllm(slow)
    assert done["text"] == reference(slow_audio)
    await slow.close()


async def test_send_queue_backpressure_pauses_reading_without_loss(start_server, reference):
    srv = start_server(send_queue_high_bytes=1)  # any queued event pauses reading until it is sent
    audio = clip(1.5, seed=45)
    ws = await open_vllm(srv.ws_url)
    assert await utterance_vllm(ws, audio) == reference(audio)
    await ws.close()
    assert srv.call(lambda: srv.server.metrics.read_pauses.get("send_queue")) > 0


# -- engine failures -----------------------------------------------------------------------------------
class FailingEngine:
    """Delegates to a real engine, but fails every stream at its first token (StreamFailed)."""

    def __init__(self, inner) -> None:
        self.inner, self.config, self.model_name = inner, inner.config, inner.model_name
        self.fail = True

    def open_stream(self, on_event, *, delay_ms=None):
        failed = threading.Event()

        def cb(ev):
            if failed.is_set():
                return
            if self.fail and isinstance(ev, StreamToken):
                failed.set()
                on_event(StreamFailed(ev.stream_id, "injected failure"))
                return
            on_event(ev)

        return self.inner.open_stream(cb, delay_ms=delay_ms)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_engine_failure_is_reported_and_session_goes_on(start_server, engine, reference):
    flaky = FailingEngine(engine)
    srv = start_server(engine_override=flaky)
    ws = await open_vllm(srv.ws_url)
    await send_utterance_vllm(ws, SHORT)
    err = await recv_json(ws)
    assert err["type"] == "error" and err["code"] == "processing_error" and "injected failure" in err["error"]
    flaky.fail = False
    assert await utterance_vllm(ws, SHORT) == reference(SHORT)
    await ws.close()
    # OpenAI dialect: the item fails with its own event
    flaky.fail = True
    async with connect(srv.ws_url + "?intent=transcription") as ws:
        await recv_json(ws)
        await send_json(ws, {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}})
        await recv_json(ws)
        # long enough for the engine's first token before any commit
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(clip(1.5, seed=47)))})
        ev = await recv_json(ws)
        assert ev["type"] == "conversation.item.input_audio_transcription.failed"
        assert ev["error"]["code"] == "processing_error"


class EosEngine:
    """Delegates to a real engine, but turns each stream's third token into the end token."""

    def __init__(self, inner) -> None:
        self.inner, self.config, self.model_name = inner, inner.config, inner.model_name

    def open_stream(self, on_event, *, delay_ms=None):
        count = [0]

        def cb(ev):
            if isinstance(ev, StreamToken):
                count[0] += 1
                if count[0] == 3:
                    ev = StreamToken(ev.stream_id, self.config.tokens.eos, "", ev.position, ev.audio_end_ms)
            on_event(ev)

        return self.inner.open_stream(cb, delay_ms=delay_ms)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_end_token_mid_stream_is_explicit(start_server, engine):
    srv = start_server(engine_override=EosEngine(engine))
    data = pcm16(clip(2.0, seed=48))
    half = len(data) // 2
    ws = await open_vllm(srv.ws_url)
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data[:half])})
    for _ in range(3):
        assert (await recv_json(ws))["type"] == "transcription.delta"
    for i in range(half, len(data), 3200):  # audio after the end token: reported once, not transcribed
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data[i: i + 3200])})
    await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
    events = await recv_until(ws, {"transcription.done"})
    assert [e["code"] for e in events if e["type"] == "error"] == ["utterance_ended"]
    await ws.close()
    # OpenAI dialect: the end token ends the turn by itself (committed without a client commit)
    async with connect(srv.ws_url + "?intent=transcription") as ws:
        await recv_json(ws)
        await send_json(ws, {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}})
        await recv_json(ws)
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data)})
        events = await recv_until(ws, {"conversation.item.done", "error"})
        types = [e["type"] for e in events]
        assert "input_audio_buffer.committed" in types and "error" not in types
        assert types.index("input_audio_buffer.committed") < types.index(
            "conversation.item.input_audio_transcription.completed")


def first_stream_ends_at_its_end_token(eng, after: int = 5):
    """`eng` (a batched engine) makes its first stream's `after`-th generated token the end token, so that the
    engine really ends that stream early (`EosEngine` only relabels a token while the engine decodes on)."""
    record, eos, first = eng._record_token, eng.config.tokens.eos, []

    def patched(s, tok):
        first[:] = first or [s.stream_id]
        if s.stream_id == first[0] and len(s.tokens) - s.prompt_len + 1 == after:
            tok = eos
        record(s, tok)

    eng._record_token = patched


@pytest.mark.parametrize("dialect", ["vllm", "openai"])
async def test_audio_after_an_early_end_token_is_transcribed_next(ckpt, start_server, reference, dialect):
    """The model ends a stream early (its end token) while audio the client sent after that point is in flight:
    the final event's `audio_end_ms` is where the transcript ends (not the audio sent), and the rest is not dropped.
    vLLM: an `utterance_ended` error says so, and the rest waits for the next commit; OpenAI: the rest goes on in a
    new item, which the client's commit ends. Either way the next transcript is the reference's for the rest."""
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=4)
    first_stream_ends_at_its_end_token(eng)
    eng.start()
    audio = clip(3.0, seed=47)
    try:
        srv = start_server(engine_override=eng)
        if dialect == "vllm":
            ws = await open_vllm(srv.ws_url)
            await send_utterance_vllm(ws, audio)
            events = await recv_until(ws, {"transcription.done"})
            first = events[-1]
            assert [e["code"] for e in events if e["type"] == "error"] == ["utterance_ended"]
            assert f"ends at {first['audio_end_ms']} ms" in next(e for e in events if e["type"] == "error")["error"]
            await send_json(ws, {"type": "input_audio_buffer.commit"})  # the rest is the next utterance
            await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
            events = await recv_until(ws, {"transcription.done"})
            second = events[-1]
            # the client's first final commit came after the end token's `done` or before it (a race): if after, it
            # found no utterance to end, and said so
            assert [e["code"] for e in events if e["type"] == "error"] in ([], ["no_active_utterance"])
            rest_start = first["audio_end_ms"]
            assert second["audio_end_ms"] == 3000 - rest_start  # vLLM's times count from the utterance's start
        else:
            ws = await open_openai(srv.ws_url, session(turn_detection=None))
            await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(audio))})
            first = (await recv_until(ws, {"conversation.item.input_audio_transcription.completed"}))[-1]
            await send_json(ws, {"type": "input_audio_buffer.commit"})
            events = await recv_until(ws, {"conversation.item.input_audio_transcription.completed", "error"})
            second = events[-1]
            assert second["type"] == "conversation.item.input_audio_transcription.completed", second
            rest_start = first["audio_end_ms"]
            assert second["audio_start_ms"] == rest_start and second["audio_end_ms"] == 3000
        await ws.close()
        assert 0 < rest_start < 3000  # the transcript ended early, at a frame's end
        assert rest_start % 80 == 0
        key = "text" if dialect == "vllm" else "transcript"
        assert reference(audio).startswith(first[key])  # the first tokens, up to the forced end
        assert second[key] == reference(audio[rest_start * 16:])
        assert wait_no_streams(eng) == 0
    finally:
        eng.stop()


async def test_engine_stall_is_reported_not_silent(start_server, engine):
    stalled = StalledEngine(engine)
    srv = start_server(engine_override=stalled, engine_stall_timeout_s=0.5)
    ws = await open_vllm(srv.ws_url)
    await send_utterance_vllm(ws, SHORT)
    err = await recv_json(ws, timeout=10)
    assert err["type"] == "error" and err["code"] == "engine_stalled"
    with pytest.raises(ConnectionClosed) as info:
        await asyncio.wait_for(ws.recv(), 5)
    assert info.value.rcvd.code == 1011
    assert wait_for(lambda: not stalled.pending)


async def test_max_session_length_is_reported_not_silent(ckpt, start_server, reference, tmp_path):
    """`--max-session-seconds`: an utterance (or item, or upload) longer than the engine's limit is ended there. Its
    transcript covers what fit and says so (`audio_end_ms`), an error event `session_too_long` follows, and the
    session goes on; an upload gets 413 `audio_too_long`, never a partial transcript."""
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=4, max_session_seconds=1.0)
    eng.start()
    try:
        srv = start_server(engine_override=eng)
        long = clip(10.0, seed=49)
        ws = await open_vllm(srv.ws_url)
        await send_utterance_vllm(ws, long)
        events = await recv_until(ws, {"transcription.done"})  # the error comes first: clients stop at done
        done, errors = events[-1], [e for e in events if e["type"] == "error"]
        assert 0 < done["audio_end_ms"] < 10_000 and [e["code"] for e in errors] == ["session_too_long"]
        assert f"ends at {done['audio_end_ms']} ms" in errors[0]["error"]
        # the transcript ends at the frame its last token closed: the model had seen one delay (480 ms) beyond it,
        # which is kept for the next utterance, not claimed by this one
        last_delta = [e for e in events if e["type"] == "transcription.delta"][-1]
        assert last_delta["audio_end_ms"] - done["audio_end_ms"] == 480
        assert "kept" in errors[0]["error"]
        assert reference(long).startswith(done["text"])
        await send_json(ws, {"type": "session.update", "model": MODEL})  # the session goes on
        assert (await recv_until(ws, {"session.updated"}))[-1]["type"] == "session.updated"
        await ws.close()
        ws = await open_openai(srv.ws_url, session(turn_detection=None))
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(long))})
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        events = await recv_until(ws, {"conversation.item.input_audio_transcription.completed"})
        await ws.close()
        assert events[-1]["audio_end_ms"] < 10_000
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["session_too_long"]
        # the command-line client prints what fit, warns, and exits 1
        sf.write(tmp_path / "long.wav", long, 16000, subtype="PCM_16")
        out, err = io.StringIO(), io.StringIO()
        rc = await asyncio.to_thread(client_main, [str(tmp_path / "long.wav"), "--url", srv.ws_url, "--pace", "0",
                                                   "--model", MODEL], out=out, err=err)
        assert rc == 1 and "session_too_long" in err.getvalue() and out.getvalue() == done["text"] + "\n"
        with pytest.raises(UploadError) as info:
            upload_file(srv.http_url, tmp_path / "long.wav")
        assert info.value.status == 413 and info.value.code == "audio_too_long"
        assert wait_no_streams(eng) == 0
    finally:
        eng.stop()
    # the command line caps uploads at the session length
    args = build_parser().parse_args(["--max-session-seconds", "30"])
    assert settings_from_args(args, env={}).max_upload_seconds == 30


async def test_session_longer_than_the_model_context(tiny_ckpt, start_server):
    path = tiny_ckpt(seed=0, small_windows=True)  # encoder window 8 frames, decoder window 6 tokens
    eng = build_engine("sequential", str(path), model_name=MODEL)
    eng.start()
    try:
        srv = start_server(engine_override=eng)
        audio = clip(4.0, seed=46)
        ws = await open_vllm(srv.ws_url)
        text = await utterance_vllm(ws, audio, chunk_bytes=6400)
        await ws.close()
        model, tok = load_model_and_tokenizer(path)
        assert text == transcribe(model, tok, audio).text
        assert wait_no_streams(eng) == 0
    finally:
        eng.stop()


# -- auth ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["header", "query", "subprotocol"])
async def test_api_key_accepted(start_server, reference, how):
    srv = start_server(api_keys=("k-one", "k-two"))
    url, kw = srv.ws_url, {}
    if how == "header":
        kw = {"additional_headers": {"Authorization": "Bearer k-two"}}
    elif how == "query":
        url += "?api_key=k-one"
    else:
        kw = {"subprotocols": ["realtime", "openai-insecure-api-key.k-one"]}
    ws = await open_vllm(url, **kw)
    if how == "subprotocol":
        assert ws.subprotocol == "realtime"  # the key-bearing entry is never echoed
    assert await utterance_vllm(ws, SHORT) == reference(SHORT)
    await ws.close()


@pytest.mark.parametrize("kw", [
    {},
    {"additional_headers": {"Authorization": "Bearer wrong"}},
    {"additional_headers": {"Authorization": "Basic k-one"}},
    {"subprotocols": ["openai-insecure-api-key.k-on"]},
])
async def test_api_key_rejected(start_server, kw):
    srv = start_server(api_keys=("k-one",))
    with pytest.raises(InvalidStatus) as info:
        await connect(srv.ws_url, **kw)
    assert info.value.response.status_code == 401
    assert b"invalid_api_key" in info.value.response.body
    _, _, body = http_get(f"{srv.http_url}/metrics")
    assert 'streamscribe_connections_rejected_total{reason="unauthorized"} 1' in body.decode()


async def test_models_route_needs_key_when_auth_on(start_server):
    srv = start_server(api_keys=("k-one",))
    assert http_get(f"{srv.http_url}/v1/models")[0] == 401
    status, _, body = http_get(f"{srv.http_url}/v1/models", {"Authorization": "Bearer k-one"})
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == [MODEL]
    assert http_get(f"{srv.http_url}/health")[0] == 200  # health stays open for load balancers
    # one model, as the OpenAI SDK's client.models.retrieve asks for it (ids may hold a slash)
    srv = start_server(api_keys=("k-one",), served_model_names=(MODEL, "org/other-name"))
    client = openai.OpenAI(base_url=f"{srv.http_url}/v1", api_key="k-one", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL, "org/other-name"]
    assert client.models.retrieve("org/other-name").id == "org/other-name"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("whisper-1")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{srv.http_url}/v1", api_key="no", max_retries=0).models.retrieve(MODEL)


def test_public_host_needs_key_or_explicit_opt_out():
    parse = build_parser().parse_args
    with pytest.raises(SystemExit, match="API key"):
        settings_from_args(parse(["--host", "0.0.0.0"]), env={})
    assert settings_from_args(parse(["--host", "0.0.0.0", "--allow-no-auth"]), env={}).api_keys == ()
    assert settings_from_args(parse(["--host", "0.0.0.0", "--api-key", "k"]), env={}).api_keys == ("k",)
    s = settings_from_args(parse(["--host", "0.0.0.0"]), env={"STREAMSCRIBE_API_KEYS": "a, b"})
    assert s.api_keys == ("a", "b")
    for host in ("127.0.0.1", "localhost", "::1"):
        assert settings_from_args(parse(["--host", host]), env={}).api_keys == ()


# -- origins -------------------------------------------------------------------------------------------
async def test_origin_check_default(start_server):
    srv = start_server()
    for origin, ok in [(None, True), (f"http://127.0.0.1:{srv.port}", True), ("http://localhost:5173", True),
                       ("https://evil.example", False), ("null", False)]:
        headers = {"Origin": origin} if origin else {}
        if ok:
            async with connect(srv.ws_url, additional_headers=headers) as ws:
                assert (await recv_json(ws))["type"] == "session.created"
        else:
            with pytest.raises(InvalidStatus) as info:
                await connect(srv.ws_url, additional_headers=headers)
            assert info.value.response.status_code == 403


async def test_origin_check_explicit_list(start_server):
    srv = start_server(allowed_origins=("https://app.example",))
    async with connect(srv.ws_url, additional_headers={"Origin": "https://app.example"}) as ws:
        assert (await recv_json(ws))["type"] == "session.created"
    for origin in ("https://evil.example", "http://localhost:5173", "https://app.example.evil.example"):
        with pytest.raises(InvalidStatus) as info:
            await connect(srv.ws_url, additional_headers={"Origin": origin})
        assert info.value.response.status_code == 403


# -- HTTP ----------------------------------------------------------------------------------------------
async def test_http_routes_and_metrics(start_server, reference, tmp_path):
    demo = tmp_path / "demo"
    (demo / "js").mkdir(parents=True)
    (demo / "index.html").write_text("<!doctype html><title>demo</title>")
    (demo / "js" / "app.js").write_text("console.log(1)")
    srv = start_server(demo_dir=demo)
    base = srv.http_url
    status, headers, body = http_get(base + "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"demo" in body
    status, headers, _ = http_get(base + "/js/app.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    for missing in ("/nope.html", "/../pyproject.toml", "/%2e%2e/pyproject.toml", "/v1/unknown"):
        assert http_get(base + missing)[0] == 404, missing
    status, _, body = http_get(base + "/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok" and health["models"] == [MODEL]
    status, _, body = http_get(base + "/v1/models")
    assert status == 200 and json.loads(body)["object"] == "list"
    with pytest.raises(InvalidStatus) as info:  # websocket on another path
        await connect(f"ws://127.0.0.1:{srv.port}/v1/other")
    assert info.value.response.status_code == 404

    assert await fresh_vllm_utterance(srv.ws_url, SHORT) == reference(SHORT)

    def scrape() -> tuple[int, dict, str, dict[str, float]]:
        status, headers, body = http_get(base + "/metrics")
        text = body.decode()
        return status, headers, text, {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
                                       if line and not line.startswith("#")}

    # the client has closed; the server ends the session when it reads the close frame, a moment later
    deadline = time.monotonic() + 10
    status, headers, text, values = scrape()
    while values["streamscribe_sessions_active"] != 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        status, headers, text, values = scrape()
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert values["streamscribe_sessions_total"] >= 1
    assert values['streamscribe_sessions_by_dialect_total{dialect="vllm"}'] >= 1
    assert values["streamscribe_tokens_emitted_total"] > 0
    assert values["streamscribe_emission_delay_seconds_count"] >= values["streamscribe_tokens_emitted_total"]
    assert values["streamscribe_engine_step_seconds_count"] > 0
    assert values['streamscribe_engine_step_seconds_bucket{le="+Inf"}'] == values[
        "streamscribe_engine_step_seconds_count"]
    assert "# TYPE streamscribe_emission_delay_seconds histogram" in text
    assert values["streamscribe_sessions_active"] == 0


async def test_demo_page_missing_is_404(start_server, tmp_path):
    srv = start_server(demo_dir=tmp_path / "nothing-here")
    assert http_get(srv.http_url + "/")[0] == 404


# -- the command line ----------------------------------------------------------------------------------
def launch_cli(args: list[str], ready: str, timeout: float = 180) -> tuple[subprocess.Popen, str | None]:
    """`python -m stream_server --model default --port 0 --device cpu ARGS`; returns the process and its
    first stderr line containing `ready` (None if it never printed one: the process is then stopped)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "stream_server", "--model", "default", "--port", "0",
                             "--device", "cpu", "--log-level", "WARNING", *args], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if ready in line:
            return proc, line
    proc.kill()
    proc.wait()
    return proc, None


async def open_turn_across_sigterm(url: str, audio: np.ndarray, proc: subprocess.Popen) -> tuple[str, str, int]:
    """A vLLM utterance still open (no final commit) when `proc` gets SIGTERM: (its done text, the error code that
    follows, the close code)."""
    ws = await open_vllm(url, model="streamscribe-default")
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    data = pcm16(audio)
    for i in range(0, len(data), 3200):
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data[i: i + 3200])})
    await send_json(ws, {"type": "streamscribe.barrier"})  # answered in order: every append was taken in
    assert (await recv_until(ws, {"error"}))[-1]["code"] == "unknown_event"
    proc.send_signal(signal.SIGTERM)
    events = await recv_until(ws, {"transcription.done", "error"})
    assert events[-1]["type"] == "transcription.done", events[-1]
    err = await recv_json(ws)
    with pytest.raises(ConnectionClosed) as info:
        await asyncio.wait_for(ws.recv(), 30)
    return events[-1]["text"], err.get("code", ""), info.value.rcvd.code


LIVE = clip(1.6, seed=43)


def test_cli_serves_default_model_and_stops_on_sigterm(reference):
    """The real process: a session, then SIGTERM while a second session's turn is open: that turn's transcript
    still arrives (graceful shutdown), the session closes with 1001 and the process exits 0."""
    proc, line = launch_cli(["--drain-timeout", "0.5"], "listening on", timeout=120)
    try:
        url = line.strip().split()[-1] if line else None
        assert url and url.startswith("ws://127.0.0.1:"), "server did not start"
        port = int(url.split(":")[2].split("/")[0])
        status, _, body = http_get(f"http://127.0.0.1:{port}/health")
        assert status == 200 and json.loads(body)["models"] == ["streamscribe-default"]

        async def go() -> str:
            return await fresh_vllm_utterance_named(url, SHORT)

        model, tok = load_model_and_tokenizer("default")
        assert asyncio.run(go()) == transcribe(model, tok, SHORT).text
        text, code, close = asyncio.run(open_turn_across_sigterm(url, LIVE, proc))
        assert (text, code, close) == (transcribe(model, tok, LIVE).text, "server_shutting_down", 1001)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_serves_tls(reference):
    """`--ssl-certfile/--ssl-keyfile`: the process announces wss:// and transcribes over it."""
    tls = ROOT / "tests" / "tls"
    certs = ["--ssl-certfile", str(tls / "localhost.pem"), "--ssl-keyfile", str(tls / "localhost-key.pem")]
    proc, line = launch_cli(certs, "listening on", timeout=120)
    try:
        assert line and line.strip().split()[-1].startswith("wss://127.0.0.1:"), line
        url = line.strip().split()[-1]

        async def go() -> str:
            ws = await open_vllm(url, model="streamscribe-default",
                                 ssl=ssl.create_default_context(cafile=str(tls / "localhost.pem")))
            try:
                return await utterance_vllm(ws, LIVE)
            finally:
                await ws.close()

        model, tok = load_model_and_tokenizer("default")
        assert asyncio.run(go()) == transcribe(model, tok, LIVE).text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_second_signal_stops_without_draining():
    """A live session would hold the drain for 120 s; a second SIGTERM stops the server at once."""
    proc, line = launch_cli(["--drain-timeout", "120"], "listening on", timeout=120)
    try:
        assert line, "server did not start"
        url = line.strip().split()[-1]

        async def go() -> float:
            ws = await open_vllm(url, model="streamscribe-default")
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(1.0)
            assert proc.poll() is None  # draining: the live session may go on
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 30)
            return time.monotonic() - t0

        assert asyncio.run(go()) < 20
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_workers(n: int, *extra: str) -> tuple[subprocess.Popen, str, list[int]]:
    """`python -m stream_server --workers n` on the CPU; returns (supervisor, url, worker pids)."""
    proc, line = launch_cli(["--workers", str(n), "--max-sessions", "4", *extra], f"({n} workers, pids")
    assert line is not None, "the workers did not start"
    return proc, line.split()[3], [int(p) for p in line.split("pids")[1].strip(" )\n").split()]


def alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped by whoever adopted it, counts as stopped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def test_workers_share_one_port_and_stop_together(reference, tmp_path):
    """`--workers 2`: two server processes on one port, each answering some of the connections, each
    transcribing exactly as one session does; a signal to the supervisor stops both gracefully (an open turn
    still gets its transcript)."""
    proc, url, pids = start_workers(2, "--drain-timeout", "0.5")
    try:
        port = int(url.split(":")[2].split("/")[0])
        answered = {json.loads(http_get(f"http://127.0.0.1:{port}/health")[2])["pid"] for _ in range(24)}
        assert answered == set(pids)  # the kernel spread 24 connections over both (all on one: p = 2^-23)

        async def four_at_once() -> list[str]:
            return list(await asyncio.gather(*(fresh_vllm_utterance_named(url, SHORT) for _ in range(4))))

        assert asyncio.run(four_at_once()) == [reference(SHORT)] * 4
        # a worker counts a closed session until its handler has finished: with 4 sessions a worker, four uploads
        # on one worker would find it full while one lingers, so wait until both report none open
        idle: set[int] = set()
        deadline = time.monotonic() + 30
        while idle != set(pids) and time.monotonic() < deadline:
            health = json.loads(http_get(f"http://127.0.0.1:{port}/health")[2])
            (idle.add if health["active_sessions"] == 0 else idle.discard)(health["pid"])
        assert idle == set(pids)
        # file uploads reach whichever worker the kernel picks, and each transcribes them
        sf.write(tmp_path / "short.wav", SHORT, 16000, subtype="PCM_16")
        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(lambda _: upload_file(f"http://127.0.0.1:{port}", tmp_path / "short.wav").text,
                                  range(4)))
        assert texts == [reference(SHORT).strip()] * 4
        model, tok = load_model_and_tokenizer("default")
        text, code, close = asyncio.run(open_turn_across_sigterm(url, LIVE, proc))
        assert (text, code, close) == (transcribe(model, tok, LIVE).text, "server_shutting_down", 1001)
        assert proc.wait(60) == 0
        assert not any(alive(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_client_secrets_work_on_every_worker():
    """A client secret made by whichever worker took the request opens sessions on every worker (they are signed,
    not stored), and the session starts with the secret's configuration there too."""
    # admission by load off: 12 sessions at once on a loaded 2-core box may be refused as busy (by design), which
    # is not what this test is about (a CI run next to a speech-synthesis job got one such refusal)
    proc, url, pids = start_workers(2, "--api-key", "k-w", "--max-sessions", "16", "--max-step-ms", "0",
                                    "--max-loop-lag-ms", "0")
    try:
        port = int(url.split(":")[2].split("/")[0])
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k-w", max_retries=0)
        made = client.realtime.client_secrets.create(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}})

        async def open_with_secret() -> tuple[object, str]:
            async with connect(url, subprotocols=[f"openai-insecure-api-key.{made.value}"]) as ws:
                created = await recv_json(ws)
            assert created["type"] == "session.created", created
            return created["session"]["audio"]["input"]["turn_detection"], created["type"]

        async def many() -> list[tuple[object, str]]:
            return list(await asyncio.gather(*(open_with_secret() for _ in range(12))))

        assert asyncio.run(many()) == [(None, "session.created")] * 12
        answered = {json.loads(http_get(f"http://127.0.0.1:{port}/health")[2])["pid"] for _ in range(24)}
        assert answered == set(pids)  # both workers take connections (so both took some of the 12)
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_worker_that_dies_stops_the_others():
    """A worker that exits on its own (here: killed) makes the supervisor stop the other and exit with an
    error, rather than serve on at half capacity unnoticed."""
    proc, _, pids = start_workers(2)
    try:
        os.kill(pids[0], signal.SIGKILL)
        assert proc.wait(60) == 1
        assert wait_for(lambda: not alive(pids[1]), timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_workers_do_not_outlive_a_killed_supervisor():
    """SIGKILL to the supervisor (no chance to stop anything): the workers still stop, so none keeps the port."""
    proc, _, pids = start_workers(2)
    try:
        proc.kill()
        proc.wait(10)
        assert wait_for(lambda: not any(alive(p) for p in pids), timeout=60), "a worker outlived its supervisor"
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


async def fresh_vllm_utterance_named(url: str, audio: np.ndarray) -> str:
    ws = await open_vllm(url, model="streamscribe-default")
    try:
        return await utterance_vllm(ws, audio)
    finally:
        await ws.close()
