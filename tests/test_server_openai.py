"""The OpenAI Realtime transcription dialect end to end, including the official `openai` SDK client."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import openai
import pytest
from test_server_common import (  # noqa: F401  (fixtures)
    MODEL,
    b64,
    ckpt,
    clip,
    engine,
    fresh_vllm_utterance,
    open_openai,
    pcm16,
    recv_json,
    recv_until,
    reference,
    send_json,
    session,
    start_server,
)
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from realtime.audio import resample
from stream_server.client_secrets import ClientSecrets
from stream_server.codecs import ALAW_TO_PCM16, ULAW_TO_PCM16
from stream_server.openai_dialect import MAX_STREAMS
from stream_server.vad import SpeechStarted, TurnDetector, VadParams

SHORT = clip(0.5, seed=31)
COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


async def manual_item(ws, payload: bytes, chunk: int = 3200) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Append `payload` in chunks, commit, return (events up to completed, completed)."""
    for i in range(0, len(payload), chunk):
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(payload[i: i + chunk])})
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    events = await recv_until(ws, {COMPLETED, "error", "conversation.item.input_audio_transcription.failed"})
    assert events[-1]["type"] == COMPLETED, events[-1]
    done = await recv_json(ws)
    assert done["type"] == "conversation.item.done" and done["item"]["content"][0]["transcript"] == events[-1][
        "transcript"]
    return events, events[-1]


def check_item_events(events: list[dict[str, Any]], completed: dict[str, Any]) -> None:
    item_id = completed["item_id"]
    types = [e["type"] for e in events]
    assert types.count("input_audio_buffer.committed") == 1 and types.count("conversation.item.added") == 1
    assert types.index("input_audio_buffer.committed") < types.index("conversation.item.added")
    committed = events[types.index("input_audio_buffer.committed")]
    assert committed["item_id"] == item_id and item_id.startswith("item_")
    deltas = [e for e in events if e["type"] == DELTA]
    assert all(d["item_id"] == item_id and d["content_index"] == 0 and d["delta"] for d in deltas)
    assert "".join(d["delta"] for d in deltas) == completed["transcript"]
    assert all(e["event_id"].startswith("event_") for e in events)
    assert completed["usage"]["type"] == "tokens" and completed["usage"]["total_tokens"] > 0
    assert completed["is_final"] is True and [w["word"] for w in completed["words"]] == completed["transcript"].split()


async def test_openai_manual_commit_pcm24k(start_server, reference):
    srv = start_server()
    audio24 = np.clip(resample(SHORT, 16000, 24000), -1, 1)
    payload = pcm16(audio24)
    seen16 = resample(np.frombuffer(payload, "<i2").astype(np.float32) / 32768.0, 24000, 16000)
    update = session({"type": "audio/pcm", "rate": 24000})
    async with await open_openai(srv.ws_url, update) as ws:
        for _ in range(2):  # two items on one socket
            events, completed = await manual_item(ws, payload, chunk=4800)
            check_item_events(events, completed)
            assert completed["transcript"] == reference(seen16)
            assert completed["audio_end_ms"] - completed["audio_start_ms"] == len(seen16) * 1000 // 16000


async def test_openai_pcm16k_default_session_and_first_update_selects_dialect(start_server, reference):
    srv = start_server()
    # no ?intent: the first session.update's shape selects the OpenAI dialect
    async with await open_openai(srv.ws_url, session(), intent=False) as ws:
        events, completed = await manual_item(ws, pcm16(SHORT))
        check_item_events(events, completed)
        assert completed["transcript"] == reference(SHORT)


def g711_encode(audio: np.ndarray, table: np.ndarray) -> bytes:
    """Nearest code word for each sample (a brute-force encoder, independent of the decoder's logic)."""
    x = np.round(audio * 32768.0)
    return np.abs(x[:, None] - table[None, :].astype(np.float64)).argmin(axis=1).astype(np.uint8).tobytes()


async def test_openai_long_append_is_resampled_off_the_loop_with_the_same_samples(start_server, reference):
    """An append of over a second of 24 kHz audio is resampled on a worker thread (a 1 MiB append would otherwise
    hold the event loop); the item is the same as with 100 ms appends, and the reference's."""
    srv = start_server()
    audio24 = np.clip(resample(clip(2.5, 32), 16000, 24000), -1, 1)
    payload = pcm16(audio24)
    seen16 = resample(np.frombuffer(payload, "<i2").astype(np.float32) / 32768.0, 24000, 16000)
    async with await open_openai(srv.ws_url, session({"type": "audio/pcm", "rate": 24000})) as ws:
        _, whole = await manual_item(ws, payload, chunk=len(payload))
        _, chunked = await manual_item(ws, payload, chunk=4800)
    assert whole["transcript"] == chunked["transcript"] == reference(seen16)
    assert whole["audio_end_ms"] - whole["audio_start_ms"] == len(seen16) * 1000 // 16000


@pytest.mark.parametrize("fmt,table", [("audio/pcmu", ULAW_TO_PCM16), ("audio/pcma", ALAW_TO_PCM16)])
async def test_openai_g711(start_server, reference, fmt, table):
    srv = start_server()
    audio8 = resample(SHORT, 16000, 8000)
    payload = g711_encode(audio8, table)
    decoded = table[np.frombuffer(payload, np.uint8)].astype(np.float32) / 32768.0
    assert np.abs(decoded - audio8).max() < 0.02  # the codec round trip is close
    async with await open_openai(srv.ws_url, session({"type": fmt})) as ws:
        events, completed = await manual_item(ws, payload, chunk=800)
        check_item_events(events, completed)
        assert completed["transcript"] == reference(resample(decoded, 8000, 16000))


async def test_openai_server_vad_turns(start_server, reference):
    srv = start_server()
    sil = lambda s: np.zeros(int(s * 16000), np.float32)
    audio = np.concatenate([sil(1.0), clip(1.2, 21), sil(1.5), clip(1.0, 22), sil(1.5)])
    vad = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}
    async with await open_openai(srv.ws_url, session(turn_detection=vad)) as ws:
        data = pcm16(audio)
        for i in range(0, len(data), 3200):
            await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data[i: i + 3200])})
        events: list[dict[str, Any]] = []
        while sum(e["type"] == "conversation.item.done" for e in events) < 2:
            events.append(await recv_json(ws))
            assert events[-1]["type"] != "error", events[-1]
    starts = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
    stops = [e for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    completed = [e for e in events if e["type"] == COMPLETED]
    assert len(starts) == len(stops) == len(completed) == 2
    committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    assert committed[0]["previous_item_id"] is None and committed[1]["previous_item_id"] == committed[0]["item_id"]
    for start, stop, done in zip(starts, stops, completed):
        assert start["item_id"] == stop["item_id"] == done["item_id"]
        assert done["audio_start_ms"] == start["audio_start_ms"] and done["audio_end_ms"] == stop["audio_end_ms"]
        seg = audio[start["audio_start_ms"] * 16: stop["audio_end_ms"] * 16]
        assert done["transcript"] == reference(seg)
        for w in done["words"]:
            assert start["audio_start_ms"] <= w["start_ms"] <= w["end_ms"] <= stop["audio_end_ms"]
    # the turns lie where the speech is (1.0-2.2 s and 3.7-4.7 s): a turn starts at most the prefix
    # padding (and one 32 ms window) before the speech and ends at least the silence duration after
    # its start, and at most that long (plus a window) after the speech ends
    for (s0, s1), start, stop in zip(((1000, 2200), (3700, 4700)), starts, stops):
        assert s0 - 332 <= start["audio_start_ms"] < s1
        assert start["audio_start_ms"] + 500 <= stop["audio_end_ms"] <= s1 + 532


async def test_openai_one_append_of_many_turns_keeps_the_stream_quota(start_server, engine, reference):
    """One append that holds several spoken turns (the VAD finds three in these five clips, as an offline detector
    with the same parameters does): the session never holds more than MAX_STREAMS engine streams at once (what the
    engine is sized for: 2 x --max-sessions). Each turn waits for room, and every turn is transcribed. Opening
    them all at once took other sessions' engine capacity."""
    srv = start_server()
    sil = lambda s: np.zeros(int(s * 16000), np.float32)
    audio = np.concatenate([np.concatenate([sil(1.0), clip(1.0, 30 + i), sil(1.0)]) for i in range(5)])
    vad = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}
    offline = TurnDetector(VadParams(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500)).feed(audio)
    turns = sum(isinstance(e, SpeechStarted) for e in offline)
    assert turns > MAX_STREAMS
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], engine.stats().active_streams)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        async with await open_openai(srv.ws_url, session(turn_detection=vad)) as ws:
            await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(audio)), "event_id": "a1"})
            events: list[dict[str, Any]] = []
            while sum(e["type"] == "conversation.item.done" for e in events) < turns:
                events.append(await recv_json(ws))
                assert events[-1]["type"] != "error", events[-1]
    finally:
        stop.set()
        watcher.join()
    starts = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
    stops = [e for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    completed = [e for e in events if e["type"] == COMPLETED]
    assert len(starts) == len(stops) == len(completed) == turns
    assert 1 <= peak[0] <= MAX_STREAMS, peak[0]
    done_by_item = {e["item_id"]: e for e in completed}  # turns flushing side by side may complete out of order
    for start, stop_ev in zip(starts, stops):
        assert start["item_id"] == stop_ev["item_id"]
        seg = audio[start["audio_start_ms"] * 16: stop_ev["audio_end_ms"] * 16]
        assert done_by_item[start["item_id"]]["transcript"] == reference(seg)


async def test_openai_manual_commit_ends_vad_turn(start_server, reference):
    srv = start_server()
    audio = np.concatenate([np.zeros(8000, np.float32), clip(1.0, 22)])
    vad = {"type": "server_vad", "silence_duration_ms": 3000}  # longer than the audio: only the commit ends it
    async with await open_openai(srv.ws_url, session(turn_detection=vad)) as ws:
        data = pcm16(audio)
        for i in range(0, len(data), 3200):
            await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data[i: i + 3200])})
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        events = await recv_until(ws, {COMPLETED, "error"})
    assert events[-1]["type"] == COMPLETED, events
    start = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    assert not any(e["type"] == "input_audio_buffer.speech_stopped" for e in events)
    assert events[-1]["transcript"] == reference(audio[start["audio_start_ms"] * 16:])


async def test_openai_clear(start_server, reference):
    srv = start_server()
    async with await open_openai(srv.ws_url, session()) as ws:
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(SHORT))})
        await send_json(ws, {"type": "input_audio_buffer.clear", "event_id": "c1"})
        events = await recv_until(ws, {"input_audio_buffer.cleared"})
        assert all(e["type"] == DELTA for e in events[:-1])  # live deltas of the discarded audio, if any
        await send_json(ws, {"type": "input_audio_buffer.commit", "event_id": "c2"})
        err = await recv_json(ws)
        assert err["error"]["code"] == "input_audio_buffer_commit_empty" and err["error"]["event_id"] == "c2"
        events, completed = await manual_item(ws, pcm16(SHORT))
        assert completed["transcript"] == reference(SHORT)


async def test_openai_delay_option(start_server, reference):
    srv = start_server()
    async with await open_openai(srv.ws_url, session(transcription_delay_ms=160)) as ws:
        _, completed = await manual_item(ws, pcm16(SHORT))
        assert completed["transcript"] == reference(SHORT, delay_ms=160)
        await send_json(ws, session(delay="xhigh"))
        updated = await recv_json(ws)
        assert updated["session"]["audio"]["input"]["transcription"]["transcription_delay_ms"] == 2400
        _, completed = await manual_item(ws, pcm16(SHORT))
        assert completed["transcript"] == reference(SHORT, delay_ms=2400)


BAD_OPENAI = {
    "malformed_json": ("{not json", "invalid_json", None),
    "unknown_event": (json.dumps({"type": "response.create", "event_id": "e1"}), "unknown_event", "type"),
    "bad_base64": (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%", "event_id": "e1"}),
                   "invalid_audio", "audio"),
    "odd_bytes": (json.dumps({"type": "input_audio_buffer.append", "audio": b64(b"abc"), "event_id": "e1"}),
                  "invalid_audio", "audio"),
    "wrong_rate": (json.dumps({**session({"type": "audio/pcm", "rate": 44100}), "event_id": "e1"}),
                   "invalid_value", "session.audio.input.format"),
    "g711_rate": (json.dumps({**session({"type": "audio/pcmu", "rate": 16000}), "event_id": "e1"}),
                  "invalid_value", "session.audio.input.format"),
    "unknown_model": (json.dumps({"type": "session.update", "event_id": "e1", "session": {
        "type": "transcription", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}}),
        "model_not_found", "session.audio.input.transcription.model"),
    "bad_delay": (json.dumps({**session(transcription_delay_ms=500), "event_id": "e1"}), "invalid_value",
                  "session.audio.input.transcription.transcription_delay_ms"),
    "semantic_vad": (json.dumps({**session(turn_detection={"type": "semantic_vad"}), "event_id": "e1"}),
                     "invalid_value", "session.audio.input.turn_detection.type"),
    "bad_threshold": (json.dumps({**session(turn_detection={"type": "server_vad", "threshold": 7}),
                                  "event_id": "e1"}), "invalid_value", "session.audio.input.turn_detection.threshold"),
    "realtime_session": (json.dumps({"type": "session.update", "event_id": "e1", "session": {"type": "realtime"}}),
                         "invalid_value", "session.type"),
    "binary_frame": (b"\x00\x01", "invalid_event", None),
    # valid JSON, but the string holds an unpaired UTF-16 surrogate: no UTF-8 reply could carry it back
    "lone_surrogate_prompt": ('{"type": "session.update", "event_id": "e1", "session": {"type": "transcription", '
                              '"audio": {"input": {"transcription": {"prompt": "a\\ud800b"}}}}}', "invalid_json", None),
    "lone_surrogate_type": ('{"type": "x\\udc00"}', "invalid_json", None),
    "noise_reduction_nan": ('{"type": "session.update", "event_id": "e1", "session": {"type": "transcription", '
                            '"audio": {"input": {"noise_reduction": {"type": NaN}}}}}', "invalid_value",
                            "session.audio.input.noise_reduction"),
    "noise_reduction_unknown": (json.dumps({"type": "session.update", "event_id": "e1", "session": {
        "type": "transcription", "audio": {"input": {"noise_reduction": {"type": "studio"}}}}}),
        "invalid_value", "session.audio.input.noise_reduction"),
}


@pytest.mark.parametrize("name", sorted(BAD_OPENAI))
async def test_openai_bad_input_then_normal_item(start_server, reference, name):
    message, code, param = BAD_OPENAI[name]
    srv = start_server()
    async with await open_openai(srv.ws_url, session()) as ws:
        await ws.send(message)
        err = await recv_json(ws)
        assert err["type"] == "error" and err["event_id"].startswith("event_"), err
        e = err["error"]
        assert set(e) == {"type", "code", "message", "param", "event_id"}
        assert e["code"] == code and e["param"] == param and e["type"] == "invalid_request_error"
        if isinstance(message, str) and '"event_id"' in message:
            assert e["event_id"] == "e1"
        _, completed = await manual_item(ws, pcm16(SHORT))  # a rejected update changed nothing
        assert completed["transcript"] == reference(SHORT)
    async with await open_openai(srv.ws_url, session()) as ws:
        _, completed = await manual_item(ws, pcm16(SHORT))
        assert completed["transcript"] == reference(SHORT)


async def test_openai_sdk_realtime_client(start_server, reference):
    """The official SDK's realtime client runs a transcription session against us (with an API key)."""
    from openai import AsyncOpenAI
    from openai.types.realtime import (
        ConversationItemInputAudioTranscriptionCompletedEvent,
        ConversationItemInputAudioTranscriptionDeltaEvent,
        InputAudioBufferCommittedEvent,
        SessionUpdatedEvent,
    )

    srv = start_server(api_keys=("sk-test-123",))
    client = AsyncOpenAI(base_url=f"{srv.http_url}/v1", websocket_base_url=f"ws://127.0.0.1:{srv.port}/v1",
                         api_key="sk-test-123")
    audio24 = np.clip(resample(SHORT, 16000, 24000), -1, 1)
    payload = pcm16(audio24)
    seen16 = resample(np.frombuffer(payload, "<i2").astype(np.float32) / 32768.0, 24000, 16000)
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "transcription": {"model": MODEL},
            "turn_detection": None}}})
        for i in range(0, len(payload), 4800):
            await conn.input_audio_buffer.append(audio=base64.b64encode(payload[i: i + 4800]).decode())
        await conn.input_audio_buffer.commit()
        seen: list[Any] = []
        async for event in conn:
            assert event.type != "error", event
            seen.append(event)
            if event.type == COMPLETED:
                break
    kinds = {type(e) for e in seen}
    assert SessionUpdatedEvent in kinds and InputAudioBufferCommittedEvent in kinds
    completed = seen[-1]
    assert isinstance(completed, ConversationItemInputAudioTranscriptionCompletedEvent)
    deltas = [e for e in seen if isinstance(e, ConversationItemInputAudioTranscriptionDeltaEvent)]
    assert "".join(d.delta for d in deltas) == completed.transcript == reference(seen16)
    assert completed.usage.total_tokens > 0


async def test_openai_sdk_rejected_without_key(start_server):
    from openai import AsyncOpenAI

    srv = start_server(api_keys=("sk-test-123",))
    client = AsyncOpenAI(base_url=f"{srv.http_url}/v1", websocket_base_url=f"ws://127.0.0.1:{srv.port}/v1",
                         api_key="wrong")
    with pytest.raises(Exception) as info:
        async with client.realtime.connect(extra_query={"intent": "transcription"}):
            pass
    assert "401" in str(info.value)


async def test_client_secrets_open_sessions_with_their_configuration(start_server, reference):
    """`client.realtime.client_secrets.create(...)` with the API key gives an `ek_` secret; a websocket opened with it
    (no key, no ?intent) is an OpenAI transcription session that starts with the secret's configuration. The secret
    opens realtime sessions only, counts against the key that made it, and is refused once altered or expired."""
    srv = start_server(api_keys=("sk-a", "sk-b"), max_sessions_per_client=1)
    client = openai.OpenAI(base_url=f"{srv.http_url}/v1", api_key="sk-b", max_retries=0)
    made = client.realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 60},
        session={"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                                              "turn_detection": None,
                                                              "transcription": {"model": MODEL}}}})
    assert made.value.startswith("ek_") and made.session.type == "transcription"
    assert made.expires_at - 60 <= int(time.time()) <= made.expires_at
    proto = f"openai-insecure-api-key.{made.value}"
    async with connect(srv.ws_url, subprotocols=["realtime", proto]) as ws:
        created = await recv_json(ws)
        assert created["type"] == "session.created"
        inp = created["session"]["audio"]["input"]
        assert inp["format"] == {"type": "audio/pcm", "rate": 16000} and inp["turn_detection"] is None
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(SHORT))})
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        events = await recv_until(ws, {COMPLETED, "error"})
        assert events[-1]["type"] == COMPLETED and events[-1]["transcript"] == reference(SHORT)
        # the secret counts against key #2: a second session of it is over that key's quota of 1
        async with connect(srv.ws_url, additional_headers={"Authorization": "Bearer sk-b"}) as other:
            assert (await recv_json(other))["code"] == "too_many_sessions"
    # realtime sessions only: not uploads, not the model list; altered secrets are refused
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{srv.http_url}/v1", api_key=made.value, max_retries=0).models.list()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{srv.http_url}/v1", api_key=made.value, max_retries=0).audio.transcriptions.create(
            model=MODEL, file=("a.wav", b"RIFF"))
    with pytest.raises(openai.AuthenticationError):  # a secret cannot make another
        openai.OpenAI(base_url=f"{srv.http_url}/v1", api_key=made.value,
                      max_retries=0).realtime.client_secrets.create()
    tampered = made.value[:-3] + ("AAA" if not made.value.endswith("AAA") else "BBB")
    for bad in (tampered, "ek_nonsense", made.value.replace("ek_", "ek_x", 1)):
        with pytest.raises(InvalidStatus) as info:
            async with connect(srv.ws_url, subprotocols=[f"openai-insecure-api-key.{bad}"]):
                pass
        assert info.value.response.status_code == 401
    # expiry and keys: a secret is void after its time and under other API keys
    secrets = ClientSecrets(("sk-a", "sk-b"))
    value = secrets.issue(0, None, expires_at=1000)
    assert secrets.verify(value, now=999) is not None and secrets.verify(value, now=1000) is None
    assert ClientSecrets(("sk-a",)).verify(value, now=0) is None
    # bad requests name the field
    for kw, param in (({"expires_after": {"anchor": "created_at", "seconds": 5}}, "expires_after"),
                      ({"session": {"type": "realtime"}}, "session.type"),
                      ({"session": {"audio": {"input": {"transcription": {"model": "nope"}}}}},
                       "session.audio.input.transcription.model"),
                      ({"session": {"audio": {"input": {"noise_reduction": {"type": "studio"}}}}},
                       "session.audio.input.noise_reduction")):
        with pytest.raises(openai.BadRequestError) as bad_info:
            client.realtime.client_secrets.create(**kw)
        assert bad_info.value.body["param"] == param, bad_info.value.body
    # a NaN (valid for Python's json.loads, not JSON) is refused here, not stored in a secret that then could not
    # start a session; the SDK would not send one, so the request is raw
    nan_body = b'{"session": {"audio": {"input": {"noise_reduction": {"type": NaN}}}}}'
    request = urllib.request.Request(f"{srv.http_url}/v1/realtime/client_secrets", data=nan_body, method="POST",
                                     headers={"Authorization": "Bearer sk-b", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http_info:
        urllib.request.urlopen(request, timeout=10)
    assert http_info.value.code == 400
    assert json.loads(http_info.value.read())["error"]["param"] == "session.audio.input.noise_reduction"


async def test_client_secret_edge_cases(start_server, caplog):
    """A secret made without a `session` opens an OpenAI session with the defaults (it opened a vLLM one); a
    malformed secret with non-ASCII characters is a 401 (it was a 500, or a dropped websocket with auth off); a body
    nested too deeply is a 400, and no request's API key reaches the log."""
    srv = start_server(api_keys=("sk-secret-key-123",))
    made = openai.OpenAI(base_url=f"{srv.http_url}/v1", api_key="sk-secret-key-123",
                         max_retries=0).realtime.client_secrets.create()
    async with connect(srv.ws_url, subprotocols=["realtime", f"openai-insecure-api-key.{made.value}"]) as ws:
        created = await recv_json(ws)
        assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        err = await recv_json(ws)
        assert err["type"] == "error" and err["error"]["code"] == "input_audio_buffer_commit_empty"  # OpenAI's shape
    for query in ("?api_key=ek_%C3%A9.x", "?api_key=ek_abc.%C3%A9"):
        with pytest.raises(InvalidStatus) as status:
            async with connect(srv.ws_url + query):
                pass
        assert status.value.response.status_code == 401, query
    with caplog.at_level(logging.DEBUG):
        deep = urllib.request.Request(f"{srv.http_url}/v1/realtime/client_secrets?api_key=sk-secret-key-123",
                                      data=b"[" * 200_000, method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(deep, timeout=10)
        assert info.value.code == 400 and json.loads(info.value.read())["error"]["code"] == "invalid_json"
    assert "sk-secret-key-123" not in caplog.text



async def test_client_secret_whose_session_no_longer_applies(start_server):
    """A secret made while the server served another model name still opens a session after a restart without it
    (same keys): the session starts with the defaults and an error event says why, instead of failing silently."""
    old = start_server(api_keys=("sk-a",), served_model_names=(MODEL, "retired"))
    made = openai.OpenAI(base_url=f"{old.http_url}/v1", api_key="sk-a", max_retries=0).realtime.client_secrets.create(
        session={"type": "transcription", "audio": {"input": {"transcription": {"model": "retired"}}}})
    new = start_server(api_keys=("sk-a",))
    async with connect(new.ws_url, subprotocols=[f"openai-insecure-api-key.{made.value}"]) as ws:
        created = await recv_json(ws)
        assert created["type"] == "session.created"
        assert created["session"]["audio"]["input"]["transcription"]["model"] == MODEL
        err = await recv_json(ws)
        assert err["type"] == "error" and err["error"]["code"] == "model_not_found"
        await send_json(ws, session(turn_detection=None))  # the session goes on and takes a new configuration
        assert (await recv_json(ws))["type"] == "session.updated"
