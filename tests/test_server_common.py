"""Shared fixtures and client helpers for the server tests (imported by the other test_server_* files).

Servers run in-process on a background thread (port 0); clients run on the test's event loop.
Every server started through `start_server` checks at teardown that no engine stream leaked.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from conftest import synthetic_audio
from websockets.asyncio.client import ClientConnection, connect

from realtime.model_store import load_model_and_tokenizer
from realtime.session import transcribe
from stream_server.background import ServerThread
from stream_server.engine_factory import build_engine
from stream_server.settings import ServerSettings

MODEL = "tiny-test-model"
RECV_TIMEOUT = 30.0


def pcm16(audio: np.ndarray) -> bytes:
    """float -> PCM16 such that `from_pcm16(pcm16(x)) == x` for every x that `clip` makes."""
    return np.clip(np.round(audio * 32768.0), -32768, 32767).astype("<i2").tobytes()


def from_pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def clip(seconds: float, seed: int) -> np.ndarray:
    """A clip exactly representable in PCM16 (so the server and the reference see the same samples)."""
    return from_pcm16(pcm16(synthetic_audio(seconds, seed=seed)))


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt):
    return tiny_ckpt(seed=0)


@pytest.fixture(scope="module")
def engine(ckpt):
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=128)
    eng.start()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def reference(ckpt):
    """reference(audio, delay_ms=None) -> the single-session transcript of `audio` (cached)."""
    model, tok = load_model_and_tokenizer(ckpt)
    cache: dict[tuple, str] = {}

    def ref(audio: np.ndarray, delay_ms: int | None = None) -> str:
        key = (audio.tobytes(), delay_ms)
        if key not in cache:
            cache[key] = transcribe(model, tok, audio, delay_ms=delay_ms).text
        return cache[key]

    return ref


def wait_for(predicate, timeout: float = 10.0) -> bool:
    """Poll `predicate` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_no_streams(engine, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        n = engine.stats().active_streams
        if n == 0 or time.monotonic() > deadline:
            return n
        time.sleep(0.02)


@pytest.fixture
def start_server(engine):
    """start_server(**settings) -> a running ServerThread on a free port (stopped at teardown)."""
    started: list[ServerThread] = []

    def start(engine_override=None, **overrides: Any) -> ServerThread:
        settings = replace(ServerSettings(port=0, served_model_names=(MODEL,)), **overrides)
        srv = ServerThread(settings, engine_override or engine).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
    assert wait_no_streams(engine) == 0, "engine streams leaked"


# -- client helpers --------------------------------------------------------------------------------
async def recv_json(ws: ClientConnection, timeout: float = RECV_TIMEOUT) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def send_json(ws: ClientConnection, event: dict[str, Any]) -> None:
    await ws.send(json.dumps(event))


async def recv_until(ws: ClientConnection, types: set[str], timeout: float = RECV_TIMEOUT) -> list[dict[str, Any]]:
    """All events up to and including the first whose type is in `types`."""
    out = []
    while True:
        ev = await recv_json(ws, timeout)
        out.append(ev)
        if ev["type"] in types:
            return out


def session(fmt: dict[str, Any] | None = None, turn_detection: Any = None, **transcription: Any) -> dict[str, Any]:
    return {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "format": fmt or {"type": "audio/pcm", "rate": 16000},
        "transcription": {"model": MODEL, **transcription},
        "turn_detection": turn_detection}}}}


async def open_openai(url: str, update: dict[str, Any] | None = None, *, intent: bool = True, **kw: Any):
    ws = await connect(url + ("?intent=transcription" if intent else ""), **kw)
    created = await recv_json(ws)
    assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
    if update is not None:
        await send_json(ws, update)
        ev = await recv_json(ws)
        assert ev["type"] == "session.updated", ev
    return ws


async def open_vllm(url: str, model: str = MODEL, **connect_kw: Any) -> ClientConnection:
    ws = await connect(url, **connect_kw)
    created = await recv_json(ws)
    assert created["type"] == "session.created"
    await send_json(ws, {"type": "session.update", "model": model})
    assert (await recv_json(ws))["type"] == "session.updated"
    return ws


async def send_utterance_vllm(ws: ClientConnection, audio: np.ndarray, *, chunk_bytes: int = 3200,
                              pace: float | None = None) -> None:
    """commit, appends (optionally paced: `pace` x real time), final commit; does not read."""
    data = pcm16(audio)
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    for i in range(0, len(data), chunk_bytes):
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data[i: i + chunk_bytes])})
        if pace:
            await asyncio.sleep(len(data[i: i + chunk_bytes]) / 2 / 16000 / pace)
    await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})


async def read_utterance_vllm(ws: ClientConnection) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(deltas, done); fails on an error event."""
    events = await recv_until(ws, {"transcription.done", "error"})
    assert events[-1]["type"] == "transcription.done", events[-1]
    deltas = [e for e in events if e["type"] == "transcription.delta"]
    assert len(deltas) == len(events) - 1, [e["type"] for e in events]
    return deltas, events[-1]


async def utterance_vllm(ws: ClientConnection, audio: np.ndarray, **kw: Any) -> str:
    await send_utterance_vllm(ws, audio, **kw)
    deltas, done = await read_utterance_vllm(ws)
    assert done["text"] == "".join(d["delta"] for d in deltas)
    return done["text"]


async def fresh_vllm_utterance(url: str, audio: np.ndarray) -> str:
    ws = await open_vllm(url)
    try:
        return await utterance_vllm(ws, audio)
    finally:
        await ws.close()


class StalledEngine:
    """Takes audio and never decodes it."""

    def __init__(self, inner) -> None:
        self.config, self.model_name = inner.config, inner.model_name
        self.pending: dict[int, float] = {}
        self._next = 0

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def open_stream(self, on_event, *, delay_ms=None) -> int:
        self._next += 1
        self.pending[self._next] = 0.0
        return self._next

    def push_audio(self, sid, samples) -> None:
        self.pending[sid] += len(samples) / 16000

    def finish_stream(self, sid) -> None: ...

    def close_stream(self, sid) -> None:
        self.pending.pop(sid, None)

    def pending_audio_seconds(self, sid) -> float:
        return self.pending.get(sid, 0.0)

    def stats(self):
        from realtime.serving import EngineStats

        return EngineStats(active_streams=len(self.pending))
