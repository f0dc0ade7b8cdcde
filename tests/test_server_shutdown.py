"""Graceful shutdown (SIGTERM / SIGINT, `StreamServer.shut_down`): no transcript of audio a client sent is lost.

New sessions are refused with `server_shutting_down` and /health says "draining"; live sessions go on until they
end or the drain time is up; then each running turn is finished as a final commit would finish it, its transcript
is sent, and the session is closed with 1001. The CLI's signal path is tested in test_server_robustness.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from test_server_common import (  # noqa: F401  (fixtures)
    MODEL,
    StalledEngine,
    b64,
    ckpt,
    clip,
    engine,
    open_openai,
    open_vllm,
    pcm16,
    recv_json,
    recv_until,
    reference,
    send_json,
    session,
    start_server,
    utterance_vllm,
    wait_no_streams,
)
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

CLIP_A, CLIP_B, CLIP_C = clip(1.2, seed=61), clip(0.9, seed=62), clip(1.0, seed=63)
COMPLETED = "conversation.item.input_audio_transcription.completed"


def health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def append_all(ws, audio, chunk: int = 3200) -> None:
    data = pcm16(audio)
    for i in range(0, len(data), chunk):
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data[i: i + chunk])})


async def barrier(ws) -> list[dict]:
    """The server handles a session's messages in order: once it answers this unknown event, it has taken in
    every append sent before it. Returns the events before that answer."""
    await send_json(ws, {"type": "streamscribe.test_barrier"})
    events = await recv_until(ws, {"error"})
    code = events[-1]["code"] if "code" in events[-1] else events[-1]["error"]["code"]
    assert code == "unknown_event", events[-1]
    return events[:-1]


async def closed_code(ws) -> int:
    with pytest.raises(ConnectionClosed) as info:
        while True:
            await asyncio.wait_for(ws.recv(), 30)
    return info.value.rcvd.code


async def test_shutdown_finishes_every_running_turn_then_closes_going_away(start_server, engine, reference):
    srv = start_server(drain_timeout_s=2.0)
    # a vLLM utterance in progress (commit, audio, no final commit)
    a = await open_vllm(srv.ws_url)
    await send_json(a, {"type": "input_audio_buffer.commit"})
    await append_all(a, CLIP_A)
    await barrier(a)
    # vLLM audio appended but not committed yet
    b = await open_vllm(srv.ws_url)
    await append_all(b, CLIP_B)
    await barrier(b)
    # an OpenAI manual turn in progress
    c = await open_openai(srv.ws_url, session())
    await append_all(c, CLIP_C)
    await barrier(c)

    t0 = time.monotonic()
    done = asyncio.wrap_future(srv.shut_down())
    # during the drain: no new sessions, and health tells load balancers to stop routing here
    status, info = await asyncio.to_thread(health, srv.http_url)
    assert (status, info["status"]) == (503, "draining")
    async with connect(srv.ws_url) as late:
        assert await recv_json(late) == {"type": "error", "code": "server_shutting_down", "error": (
            "The server is shutting down and takes no new sessions; connect to another instance or try again later")}
        assert await closed_code(late) == 1001
    async with connect(srv.ws_url + "?intent=transcription") as late:
        err = await recv_json(late)
        assert err["error"]["code"] == "server_shutting_down" and err["error"]["type"] == "server_error"

    # each live session gets the transcript of everything it sent, then the reason, then 1001
    for ws, audio in ((a, CLIP_A), (b, CLIP_B)):
        events = await recv_until(ws, {"transcription.done", "error"})
        assert events[-1]["type"] == "transcription.done", events[-1]
        assert events[-1]["text"] == reference(audio)
        assert "".join(e["delta"] for e in events if e["type"] == "transcription.delta") == events[-1]["text"]
        err = await recv_json(ws)
        assert err["code"] == "server_shutting_down" and "complete" in err["error"]
        assert await closed_code(ws) == 1001
    events = await recv_until(c, {COMPLETED, "error"})
    types = [e["type"] for e in events]
    assert types[-1] == COMPLETED and "input_audio_buffer.committed" in types, events[-1]
    assert events[-1]["transcript"] == reference(CLIP_C)
    assert (await recv_json(c))["type"] == "conversation.item.done"
    err = await recv_json(c)
    assert err["type"] == "error" and err["error"]["code"] == "server_shutting_down"
    assert await closed_code(c) == 1001

    await asyncio.wait_for(done, 30)
    assert time.monotonic() - t0 >= 2.0  # the live sessions had their drain time first
    assert srv.server.metrics.shutdown_flushed_sessions.get() == 3
    assert wait_no_streams(engine) == 0


async def test_sessions_that_end_during_the_drain_finish_normally_and_end_it_early(start_server, reference):
    srv = start_server(drain_timeout_s=120.0)
    ws = await open_vllm(srv.ws_url)
    t0 = time.monotonic()
    done = asyncio.wrap_future(srv.shut_down())
    # the session goes on as usual: a whole utterance, the normal done, no shutdown error
    assert await utterance_vllm(ws, CLIP_A) == reference(CLIP_A)
    await ws.close()
    await asyncio.wait_for(done, 30)
    assert time.monotonic() - t0 < 60  # ended when the last session did, not at the drain time
    assert srv.server.metrics.shutdown_flushed_sessions.get() == 0
    assert srv.server.metrics.errors.get("server_shutting_down") == 0


async def test_an_engine_that_never_finishes_does_not_hold_the_shutdown(start_server, engine):
    stalled = StalledEngine(engine)
    srv = start_server(engine_override=stalled, drain_timeout_s=0.2, shutdown_flush_s=1.0,
                       engine_stall_timeout_s=600.0)
    ws = await open_vllm(srv.ws_url)
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    await append_all(ws, CLIP_A)
    await barrier(ws)
    t0 = time.monotonic()
    await asyncio.wait_for(asyncio.wrap_future(srv.shut_down()), 30)
    assert time.monotonic() - t0 < 15
    err = await recv_json(ws)
    assert err["code"] == "server_shutting_down" and "1 transcription(s) could not be finished" in err["error"]
    assert await closed_code(ws) == 1001
    assert not stalled.pending  # the session's stream was closed


async def test_requests_still_arriving_do_not_hold_the_shutdown(start_server):
    """An upload whose body is still arriving (fast enough for the body deadline) is answered 503, and a
    connection that has sent half a request head is closed: the shutdown waited for both as long as they dripped
    (a head's bytes also restarted its read timeout, so a drip kept it open forever)."""
    srv = start_server(drain_timeout_s=0.2, shutdown_flush_s=0.5)
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b"
            f"\r\nContent-Length: 2000000\r\n\r\n").encode()
    body_drip, head_drip = socket.create_connection(("127.0.0.1", srv.port)), socket.create_connection(
        ("127.0.0.1", srv.port))
    try:
        body_drip.sendall(head + b"--b\r\n")
        head_drip.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n")
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        done = asyncio.wrap_future(srv.shut_down())
        while not done.done() and time.monotonic() - t0 < 20:
            for s in (body_drip, head_drip):
                try:
                    s.sendall(b"x")
                except OSError:  # closed by the server
                    pass
            await asyncio.sleep(0.1)
        assert done.done() and time.monotonic() - t0 < 10
        body_drip.settimeout(5)
        reply = body_drip.recv(4096)
        assert reply.startswith(b"HTTP/1.1 503") and b"server_shutting_down" in reply
        head_drip.settimeout(5)
        assert head_drip.recv(4096) == b""  # closed without a reply: no request had arrived
    finally:
        body_drip.close()
        head_drip.close()


async def test_server_vad_turn_in_speech_is_finished_and_silence_is_not_a_turn(start_server, reference):
    srv = start_server(drain_timeout_s=0.2)
    speech = np.concatenate([np.zeros(8000, np.float32), clip(1.0, seed=22)])  # the VAD hears speech in it
    vad = {"type": "server_vad", "silence_duration_ms": 3000}  # longer than the audio: the turn is still open

    async def open_vad(audio) -> object:
        ws = await open_openai(srv.ws_url, session(turn_detection=vad))
        await append_all(ws, audio)
        return ws

    talking, silent = await open_vad(speech), await open_vad(np.zeros(16000, np.float32))
    events = await barrier(talking)
    assert await barrier(silent) == []
    done = asyncio.wrap_future(srv.shut_down())
    events += await recv_until(talking, {COMPLETED, "error"})
    assert events[-1]["type"] == COMPLETED, [e["type"] for e in events]
    start = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    assert events[-1]["transcript"] == reference(speech[start["audio_start_ms"] * 16:])
    assert (await recv_json(talking))["type"] == "conversation.item.done"
    assert (await recv_json(talking))["error"]["code"] == "server_shutting_down"
    assert await closed_code(talking) == 1001
    assert (await recv_json(silent))["error"]["code"] == "server_shutting_down"  # no item: nothing was said
    assert await closed_code(silent) == 1001
    await asyncio.wait_for(done, 30)
