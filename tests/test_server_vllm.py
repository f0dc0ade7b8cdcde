"""The vLLM dialect end to end: vLLM's own validation sequence, its example client, extras, bad input."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from test_server_common import (  # noqa: F401  (fixtures)
    MODEL,
    b64,
    ckpt,
    clip,
    engine,
    fresh_vllm_utterance,
    open_vllm,
    pcm16,
    read_utterance_vllm,
    recv_json,
    recv_until,
    reference,
    send_json,
    send_utterance_vllm,
    start_server,
    utterance_vllm,
)
from websockets.asyncio.client import connect

AUDIO = clip(1.2, seed=3)
SHORT = clip(0.4, seed=5)


async def test_vllm_validation_multi_chunk_streaming(start_server, reference):
    """vLLM's test_multi_chunk_streaming: warm-up utterance, then a second one on the same socket."""
    srv = start_server()
    async with connect(srv.ws_url) as ws:
        created = await recv_json(ws)
        assert list(created)[:3] == ["type", "id", "created"]
        assert created["id"].startswith("sess-") and len(created["id"]) == 5 + 32
        assert isinstance(created["created"], int)
        await send_json(ws, {"type": "session.update", "model": MODEL})
        updated = await recv_json(ws, timeout=5)
        assert updated["type"] == "session.updated"
        # warm-up: commit, one append, final commit, drain until done
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(SHORT))})
        await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
        events = await recv_until(ws, {"transcription.done", "error"})
        assert events[-1]["type"] == "transcription.done"
        # the real utterance, in 1600-sample (0.1 s) chunks
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        data = pcm16(AUDIO)
        for i in range(0, len(data), 3200):
            await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data[i: i + 3200])})
        await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
        deltas, done = await read_utterance_vllm(ws)
        assert done["text"] == "".join(d["delta"] for d in deltas) == reference(AUDIO)
        assert list(done)[:3] == ["type", "text", "usage"]
        usage = done["usage"]
        assert list(usage) == ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"]
        assert usage["prompt_tokens"] == 39 and usage["prompt_tokens_details"] is None
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        # one delta per engine step (mostly empty), plus at most one for flushed partial characters
        assert usage["completion_tokens"] <= len(deltas) <= usage["completion_tokens"] + 1
        assert sum(1 for d in deltas if d["delta"] == "") > len(deltas) // 2


@pytest.mark.parametrize("empty_deltas", [True, False])
async def test_vllm_empty_deltas_can_be_left_out(start_server, reference, empty_deltas):
    """--no-empty-deltas (`vllm_empty_deltas=False`): a delta only for tokens with text, each with its audio_end_ms
    and words, and the same transcript and usage; by default one per token, most of them empty, as vLLM sends."""
    deltas, done = await one_utterance(start_server(vllm_empty_deltas=empty_deltas), AUDIO)
    assert done["text"] == "".join(d["delta"] for d in deltas) == reference(AUDIO) != ""
    tokens = done["usage"]["completion_tokens"]
    empty = sum(1 for d in deltas if d["delta"] == "")
    if empty_deltas:
        assert tokens <= len(deltas) <= tokens + 1 and empty > len(deltas) // 2
    else:
        assert empty == 0 and 0 < len(deltas) < tokens // 2
        ends = [d["audio_end_ms"] for d in deltas]
        assert ends == sorted(ends) and all("words" in d for d in deltas)


async def test_vllm_empty_commit_then_new_connection(start_server, reference):
    srv = start_server()
    ws = await open_vllm(srv.ws_url)
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
    first = await recv_json(ws)
    assert first["type"] in ("error", "transcription.done", "transcription.delta")
    await recv_until(ws, {"transcription.done"})
    await ws.close()
    assert await fresh_vllm_utterance(srv.ws_url, SHORT) == reference(SHORT)


async def test_vllm_invalid_model_then_valid(start_server, reference):
    srv = start_server()
    async with connect(srv.ws_url) as ws:
        await recv_json(ws)
        await send_json(ws, {"type": "session.update", "model": "nonexistent-model"})
        err = await recv_json(ws)
        assert err == {"type": "error", "error": "The model `nonexistent-model` does not exist.",
                       "code": "model_not_found", "detail": f"served models: {MODEL}"}
        await send_json(ws, {"type": "input_audio_buffer.commit"})  # still not validated
        assert (await recv_json(ws))["code"] == "model_not_validated"
        await send_json(ws, {"type": "session.update", "model": MODEL})
        assert (await recv_json(ws))["type"] == "session.updated"
        assert await utterance_vllm(ws, SHORT) == reference(SHORT)


@pytest.mark.parametrize("final", [True, False])
async def test_vllm_commit_without_session_update(start_server, final):
    srv = start_server()
    async with connect(srv.ws_url) as ws:
        await recv_json(ws)
        await send_json(ws, {"type": "input_audio_buffer.commit", "final": final})
        err = await recv_json(ws)
        assert err["type"] == "error" and "model_not_validated" in err["code"]
        assert err["error"] == ("Model not validated. Make sure to validate the model by sending a "
                                "session.update event.")


async def test_vllm_missing_model_field(start_server):
    srv = start_server()
    async with connect(srv.ws_url) as ws:
        await recv_json(ws)
        await send_json(ws, {"type": "session.update"})
        assert await recv_json(ws) == {"type": "error", "error": "Missing required field: model",
                                       "code": "invalid_event"}


async def test_vllm_example_client_sends_everything_before_reading(start_server, reference):
    """vLLM's example file client: update + commit, unpaced 4096-byte appends, final, then read.

    A small backlog limit makes the server pause reading many times during the upload; nothing may
    be lost and the transcript must equal the single-session one.
    """
    srv = start_server(max_pending_audio_s=0.3)
    audio = clip(4.0, seed=11)
    async with connect(srv.ws_url) as ws:
        created = await recv_json(ws)
        assert created["type"] == "session.created"
        await send_json(ws, {"type": "session.update", "model": MODEL})
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        data = pcm16(audio)
        for i in range(0, len(data), 4096):
            await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data[i: i + 4096])})
        await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
        texts = []
        while True:
            ev = await recv_json(ws)
            assert ev["type"] != "error", ev
            if ev["type"] == "transcription.delta":
                texts.append(ev["delta"])
            elif ev["type"] == "transcription.done":
                break
        assert ev["text"] == "".join(texts) == reference(audio)
    assert srv.call(lambda: srv.server.metrics.read_pauses.get("engine_backlog")) > 0


async def one_utterance(srv, audio: np.ndarray) -> tuple[list[dict], dict]:
    """(deltas, done) of one utterance on a fresh session."""
    ws = await open_vllm(srv.ws_url)
    try:
        await send_utterance_vllm(ws, audio)
        return await read_utterance_vllm(ws)
    finally:
        await ws.close()


async def test_vllm_extras_audio_end_and_words(start_server, reference):
    deltas, done = await one_utterance(start_server(), AUDIO)
    dur_ms = len(AUDIO) * 1000 // 16000
    ends = [d["audio_end_ms"] for d in deltas]
    assert all(list(d)[:2] == ["type", "delta"] and d["is_final"] is False for d in deltas)
    assert ends == sorted(ends) and 0 < ends[0] and ends[-1] == dur_ms
    assert done["is_final"] is True and done["audio_start_ms"] == 0 and done["audio_end_ms"] == dur_ms
    words = done["words"]
    assert [w["word"] for w in words] == done["text"].split()
    assert [w for d in deltas for w in d["words"]] == words[: sum(len(d["words"]) for d in deltas)]
    for w in words:
        assert 0 <= w["start_ms"] <= w["end_ms"] <= dur_ms
    assert [w["start_ms"] for w in words] == sorted(w["start_ms"] for w in words)


async def test_vllm_transcription_delay(start_server, reference):
    srv = start_server()
    async with connect(srv.ws_url) as ws:
        await recv_json(ws)
        for bad in (100, 1280, 3000, "480", True, 480.5):
            await send_json(ws, {"type": "session.update", "model": MODEL, "transcription_delay_ms": bad})
            err = await recv_json(ws)
            assert err["type"] == "error" and err["code"] == "invalid_value", err
        await send_json(ws, {"type": "input_audio_buffer.commit"})  # a rejected update validated nothing
        assert (await recv_json(ws))["code"] == "model_not_validated"
        await send_json(ws, {"type": "session.update", "model": MODEL, "transcription_delay_ms": 160})
        assert (await recv_json(ws))["transcription_delay_ms"] == 160
        assert await utterance_vllm(ws, AUDIO) == reference(AUDIO, delay_ms=160)
        await send_json(ws, {"type": "session.update", "model": MODEL, "transcription_delay_ms": 2400})
        assert (await recv_json(ws))["transcription_delay_ms"] == 2400
        assert await utterance_vllm(ws, SHORT) == reference(SHORT, delay_ms=2400)


# -- bad input: one test each; the same socket and a new one keep working ----------------------------
BAD_INPUTS = {
    "malformed_json": ('{"type": "input_audio_buffer.append", "audio": ', "invalid_json", "Invalid JSON"),
    "non_object_json": ("[1, 2, 3]", "invalid_event", None),
    "unknown_event": ('{"type": "response.create"}', "unknown_event", "Unknown event type: response.create"),
    "missing_type": ('{"audio": "AAAA"}', "unknown_event", "Unknown event type: None"),
    "bad_base64": ('{"type": "input_audio_buffer.append", "audio": "@@not base64@@"}', "invalid_audio",
                   "Invalid audio data"),
    "odd_byte_count": (json.dumps({"type": "input_audio_buffer.append", "audio": b64(b"\x01\x02\x03")}),
                       "invalid_audio", "Invalid audio data"),
    "empty_audio": ('{"type": "input_audio_buffer.append", "audio": ""}', "invalid_audio", "Invalid audio data"),
    "audio_not_a_string": ('{"type": "input_audio_buffer.append", "audio": 12}', "processing_error", None),
    "final_not_bool": ('{"type": "input_audio_buffer.commit", "final": "yes"}', "processing_error", None),
    "binary_frame": (b"\x00\x01binary", "invalid_event", None),
    "too_large": (json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 10000}), "message_too_large",
                  None),
    "nan_delay": (f'{{"type": "session.update", "model": "{MODEL}", "transcription_delay_ms": NaN}}',
                  "invalid_value", None),
    # an unpaired surrogate escape in a string the error would echo back (the model name, the event type)
    "lone_surrogate_model": ('{"type": "session.update", "model": "m\\ud800"}', "invalid_json", None),
    "lone_surrogate_type": ('{"type": "\\udfff"}', "invalid_json", None),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
async def test_vllm_bad_input_then_normal_utterance(start_server, reference, name):
    message, code, text = BAD_INPUTS[name]
    srv = start_server(max_message_bytes=8192)
    ws = await open_vllm(srv.ws_url)
    try:
        await ws.send(message)
        err = await recv_json(ws)
        assert err["type"] == "error" and err["code"] == code, err
        if text is not None:
            assert err["error"] == text
        assert await utterance_vllm(ws, SHORT) == reference(SHORT)
    finally:
        await ws.close()
    assert await fresh_vllm_utterance(srv.ws_url, SHORT) == reference(SHORT)


async def test_vllm_audio_after_final_is_reported_not_mixed_in(start_server, reference):
    srv = start_server()
    ws = await open_vllm(srv.ws_url)
    try:
        data = pcm16(AUDIO)
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data)})
        await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(SHORT))})
        events = await recv_until(ws, {"transcription.done"})
        errors = [e for e in events if e["type"] == "error"]
        if errors:  # the append arrived before the utterance ended: reported, not transcribed
            assert [e["code"] for e in errors] == ["audio_after_final"]
        assert events[-1]["text"] == reference(AUDIO)
        # whichever way the race went, the next utterance holds exactly its own audio
        if not errors:  # the append landed after done: it waits in the buffer for the next commit
            await send_json(ws, {"type": "input_audio_buffer.commit"})
            await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
            assert (await read_utterance_vllm(ws))[1]["text"] == reference(SHORT)
        assert await utterance_vllm(ws, SHORT) == reference(SHORT)
    finally:
        await ws.close()


async def test_vllm_commit_while_running_and_final_without_utterance(start_server, reference):
    srv = start_server()
    ws = await open_vllm(srv.ws_url)
    try:
        await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
        assert (await recv_json(ws))["code"] == "no_active_utterance"
        # audio appended before any commit is kept for the next utterance
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(SHORT))})
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        assert (await recv_json(ws))["code"] == "utterance_in_progress"
        await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
        await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
        events = await recv_until(ws, {"transcription.done"})
        codes = [e.get("code") for e in events if e["type"] == "error"]
        assert codes in ([], ["utterance_finishing"])  # depends on whether done came first
        assert events[-1]["text"] == reference(SHORT)
    finally:
        await ws.close()


async def test_vllm_buffer_limit(start_server, reference):
    srv = start_server(max_buffered_audio_s=0.5)
    ws = await open_vllm(srv.ws_url)
    try:
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(SHORT))})
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm16(SHORT))})
        assert (await recv_json(ws))["code"] == "buffer_full"
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
        _, done = await read_utterance_vllm(ws)
        assert done["text"] == reference(SHORT)  # the first append only
    finally:
        await ws.close()


async def test_vllm_deltas_arrive_while_audio_streams(start_server):
    """Realtime: deltas for early audio arrive before the final commit is sent."""
    srv = start_server()
    ws = await open_vllm(srv.ws_url)
    try:
        audio = clip(3.0, seed=9)
        data = pcm16(audio)
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        got_delta = asyncio.get_running_loop().create_future()

        async def reader():
            while True:
                ev = await recv_json(ws)
                if ev["type"] == "transcription.delta" and not got_delta.done():
                    got_delta.set_result(ev)
                if ev["type"] == "transcription.done":
                    return ev

        task = asyncio.create_task(reader())
        for i in range(0, len(data), 3200):  # paced at 4x real time
            await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(data[i: i + 3200])})
            await asyncio.sleep(0.025)
        assert got_delta.done(), "no delta before the end of the audio"
        await send_json(ws, {"type": "input_audio_buffer.commit", "final": True})
        await asyncio.wait_for(task, 30)
    finally:
        await ws.close()
    assert np.isfinite(audio).all()


def test_the_command_line_leaves_empty_deltas_out_only_when_told() -> None:
    from stream_server.app import build_parser, settings_from_args

    assert settings_from_args(build_parser().parse_args([]), env={}).vllm_empty_deltas is True
    assert settings_from_args(build_parser().parse_args(["--no-empty-deltas"]), env={}).vllm_empty_deltas is False
