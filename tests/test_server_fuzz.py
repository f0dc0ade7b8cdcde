"""Protocol fuzzing: seeded random sequences of valid, malformed and out-of-order events in both dialects, on
concurrent sessions, some dropped mid-way. Bad input must get error events (never a crash, a hang or a dropped
session), no handler may fail with an unexpected exception, and the server must still transcribe exactly after.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random

import numpy as np
from test_server_common import (  # noqa: F401  (fixtures)
    MODEL,
    ckpt,
    clip,
    engine,
    fresh_vllm_utterance,
    pcm16,
    recv_json,
    reference,
    start_server,
    wait_no_streams,
)
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

AUDIO = pcm16(clip(1.0, seed=91))
SHORT = clip(0.5, seed=92)
# close codes a fuzzed session may legitimately end with: normal, idle (1000), server full / quota (1013)
ALLOWED_CLOSES = {1000, 1013}


def audio_payload(rng: random.Random) -> object:
    pick = rng.random()
    if pick < 0.6:
        start = rng.randrange(0, len(AUDIO) - 3200, 2)
        return base64.b64encode(AUDIO[start: start + rng.choice([2, 320, 1600, 3200])]).decode()
    return rng.choice(["", "not base64!", base64.b64encode(b"\x01\x02\x03").decode(), 42, None, ["x"],
                       base64.b64encode(b"\x00" * 7).decode(), "=" * 8])


def vllm_event(rng: random.Random) -> object:
    kind = rng.random()
    if kind < 0.15:
        return {"type": "session.update", "model": rng.choice([MODEL, MODEL, "", "nope", 7, None]),
                **({"transcription_delay_ms": rng.choice([480, 80, 81, -80, "x", 10**9, None])}
                   if rng.random() < 0.4 else {})}
    if kind < 0.6:
        return {"type": "input_audio_buffer.append", "audio": audio_payload(rng)}
    if kind < 0.85:
        return {"type": "input_audio_buffer.commit", **({"final": rng.choice([True, False, "yes", 1])}
                                                          if rng.random() < 0.6 else {})}
    return rng.choice([{"type": "nonsense"}, {"no": "type"}, [1, 2], "text", 3.5, None, {"type": 5},
                       {"type": "input_audio_buffer.clear"}, {"type": "session.update", "session": "x"}])


def openai_event(rng: random.Random) -> object:
    kind = rng.random()
    if kind < 0.15:
        fmt = rng.choice([{"type": "audio/pcm", "rate": 16000}, {"type": "audio/pcm", "rate": 24000},
                          {"type": "audio/pcmu"}, {"type": "audio/pcm", "rate": 44100}, {"type": "mp3"}, "pcm16", 5])
        td = rng.choice([None, {"type": "server_vad"}, {"type": "server_vad", "threshold": 2.0},
                         {"type": "semantic_vad"}, "off", {"type": "server_vad", "silence_duration_ms": -1}])
        return {"type": "session.update", "session": {"type": rng.choice(["transcription", "realtime", 3]), "audio": {
            "input": {"format": fmt, "turn_detection": td,
                      "transcription": {"model": rng.choice([MODEL, "nope", None])}}}}}
    if kind < 0.65:
        return {"type": "input_audio_buffer.append", "audio": audio_payload(rng)}
    if kind < 0.85:
        return {"type": "input_audio_buffer.commit"}
    if kind < 0.9:
        return {"type": "input_audio_buffer.clear"}
    return rng.choice([{"type": "response.create"}, {}, [], "x", {"type": None},
                       {"type": "input_audio_buffer.append"}, {"type": "session.update"}])


def frame(rng: random.Random, event: object) -> str | bytes:
    roll = rng.random()
    if roll < 0.03:
        return b"\x00binary"
    if roll < 0.06:
        return "{not json"
    if roll < 0.08:
        return "[" * 5000 + "]" * 5000  # deep nesting
    return json.dumps(event)


async def fuzz_session(url: str, seed: int) -> list[dict]:
    """One session of random events; returns what the server sent. Asserts the protocol-level invariants."""
    rng = random.Random(seed)
    openai = rng.random() < 0.5
    make = openai_event if openai else vllm_event
    received: list[dict] = []
    async with connect(url + ("?intent=transcription" if openai else ""), max_size=None) as ws:

        async def reader() -> None:
            try:
                async for raw in ws:
                    ev = json.loads(raw)
                    assert isinstance(ev, dict) and isinstance(ev.get("type"), str), ev
                    if ev["type"] == "error":
                        code = ev["error"]["code"] if isinstance(ev.get("error"), dict) else ev.get("code")
                        assert isinstance(code, str) and code, ev
                    received.append(ev)
            except ConnectionClosed as exc:
                assert exc.rcvd is None or exc.rcvd.code in ALLOWED_CLOSES, exc

        task = asyncio.create_task(reader())
        drop = rng.random() < 0.2  # some clients vanish mid-way without a close handshake
        n = rng.randrange(20, 80)
        for i in range(n):
            await ws.send(frame(rng, make(rng)))
            if rng.random() < 0.2:
                await asyncio.sleep(rng.random() * 0.02)
            if drop and i == n // 2:
                ws.transport.abort()
                break
        if not drop:
            # time for a committed turn's final transcript before the close: 0.2 s let only 2 of 36 sessions
            # reach one in a loaded CI run (fifty-sixth session), under the 3 the coverage check below needs
            await asyncio.sleep(1.0)
            await ws.close()
        await asyncio.wait_for(task, 60)
    return received


async def test_random_event_sequences_never_break_the_server(start_server, engine, reference, caplog):
    srv = start_server(max_sessions=16, idle_timeout_s=5.0)
    results: list[list[dict]] = []
    with caplog.at_level(logging.WARNING, logger="stream_server"):
        for batch in range(3):
            results += await asyncio.wait_for(
                asyncio.gather(*(fuzz_session(srv.ws_url, 1000 * batch + i) for i in range(12))), 240)
        assert wait_no_streams(engine, timeout=30) == 0, "engine streams leaked"
        # still exact for a well-behaved client
        assert await fresh_vllm_utterance(srv.ws_url, SHORT) == reference(SHORT)
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, [f"{r.getMessage()}\n{r.exc_text or ''}" for r in failures][:3]
    codes = {e["code"] if "code" in e else e["error"]["code"] for r in results for e in r if e["type"] == "error"}
    assert {"invalid_json", "invalid_event", "invalid_audio", "unknown_event", "model_not_found"} <= codes, codes
    types = [e["type"] for r in results for e in r]
    # the engine paths were exercised too: turns of both dialects ran to their final transcript
    assert types.count("transcription.done") >= 3, sorted(set(types))
    assert types.count("conversation.item.input_audio_transcription.completed") >= 3, sorted(set(types))


def test_fuzz_payloads_cover_the_malformed_cases():
    rng = random.Random(0)
    payloads = [audio_payload(rng) for _ in range(400)]
    assert any(isinstance(p, str) and p and len(base64.b64decode(p + "==")) % 2 for p in payloads
               if isinstance(p, str) and p and p != "not base64!" and not p.startswith("="))
    assert any(not isinstance(p, str) for p in payloads)
    frames = [frame(rng, {}) for _ in range(400)]
    assert any(isinstance(f, bytes) for f in frames) and any(f == "{not json" for f in frames)
    assert np.mean([isinstance(f, str) and f.startswith("{") and f != "{not json" for f in frames]) > 0.8
