"""`python -m stream_server.client`: the command-line live-transcription client, against the real server."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from test_server_common import (  # noqa: F401  (fixtures)
    MODEL,
    StalledEngine,
    ckpt,
    clip,
    engine,
    pcm16,
    reference,
    start_server,
)

from realtime.subtitles import srt_time, subtitle_cues
from realtime.timestamps import Word
from stream_server import client

ROOT = Path(__file__).resolve().parent.parent
AUDIO = clip(1.4, seed=81)


def run_client(*argv: str, stdin=None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = client.main(list(argv), stdin=stdin, out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def wav(tmp_path: Path, audio, rate: int = 16000) -> str:
    path = tmp_path / "in.wav"
    sf.write(path, audio, rate, subtype="PCM_16")
    return str(path)


@pytest.mark.parametrize("pace", ["0", "4"])
def test_file_is_transcribed_as_one_session_would(start_server, reference, tmp_path, pace):
    srv = start_server()
    rc, out, err = run_client(wav(tmp_path, AUDIO), "--url", srv.ws_url, "--pace", pace)
    assert (rc, out) == (0, reference(AUDIO) + "\n"), err
    assert reference(AUDIO).strip()


def test_stdin_pcm_and_json_events(start_server, reference):
    srv = start_server()
    r, w = os.pipe()
    os.write(w, pcm16(AUDIO) + b"\x00")  # an odd trailing byte: not a whole sample, and said so
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        rc, out, err = run_client("-", "--url", srv.ws_url.removesuffix("/v1/realtime"), "--json", stdin=pipe)
    events = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and events[0]["type"] == "session.created" and events[-1]["type"] == "transcription.done"
    assert events[-1]["text"] == reference(AUDIO)
    assert "".join(e["delta"] for e in events if e["type"] == "transcription.delta") == reference(AUDIO)
    assert "last byte was not sent" in err


def test_errors_are_explicit(start_server, tmp_path):
    srv = start_server(api_keys=("k1",))
    path = wav(tmp_path, AUDIO)
    rc, out, err = run_client(path, "--url", srv.ws_url, "--api-key", "k1", "--model", "nope")
    assert rc == 1 and "model_not_found" in err and out == ""
    rc, _, err = run_client(path, "--url", srv.ws_url, "--api-key", "wrong", "--model", MODEL)
    assert rc == 1 and "HTTP 401" in err
    rc, _, err = run_client(str(tmp_path / "missing.wav"), "--url", srv.ws_url)
    assert rc == 2 and "missing.wav" in err
    rc, _, err = run_client(path, "--url", "ws://127.0.0.1:9", "--model", MODEL)
    assert rc == 1 and "connection to ws://127.0.0.1:9 failed" in err
    rc, _, err = run_client(path, "--url", "127.0.0.1:8000")
    assert rc == 2 and "not a websocket URL" in err
    # subtitles that cannot be written: the transcript still prints, and the failure is named (it was reported as a
    # failed connection, or a traceback with --upload)
    for mode in (["--pace", "0"], ["--upload"]):
        rc, out, err = run_client(path, "--url", srv.ws_url, "--api-key", "k1", "--model", MODEL,
                                  "--srt", str(tmp_path / "missing" / "x.srt"), *mode)
        assert rc == 1 and out.strip() and "cannot write subtitles" in err and "Traceback" not in err, mode


def test_a_server_that_closes_or_talks_nonsense_is_a_message_not_a_traceback(tmp_path):
    """A server that closes normally (1000 or 1001) before the final transcript, or sends a frame that is not JSON:
    one line and exit 1 (a ConnectionClosedOK or JSONDecodeError traceback before)."""
    import asyncio
    import threading

    from websockets.asyncio.server import serve

    async def handler(ws) -> None:
        kind = ws.request.path.rsplit("/", 1)[-1]
        await ws.send(json.dumps({"type": "session.created", "session": {}}) if kind != "nonsense" else "not json")
        if kind == "close_1001":
            await ws.close(1001, "going away")
        else:
            await ws.close()

    ready, stop, port = threading.Event(), threading.Event(), []

    def run() -> None:
        async def main() -> None:
            async with serve(handler, "127.0.0.1", 0) as server:
                port.append(server.sockets[0].getsockname()[1])
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.05)

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        path = wav(tmp_path, AUDIO)
        for kind, says in (("close", "closed the connection"), ("close_1001", "going away"),
                           ("nonsense", "not a JSON event")):
            rc, out, err = run_client(path, "--url", f"ws://127.0.0.1:{port[0]}/{kind}", "--model", MODEL)
            assert rc == 1 and says in err and "Traceback" not in err, (kind, err)
    finally:
        stop.set()
        thread.join(10)


def launch(url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stream_server.client", "-", "--url", url, "--model", MODEL],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def feed_and_wait(proc: subprocess.Popen, srv, audio) -> None:
    """Write `audio` into the client's stdin, which stays open (like a microphone's), and wait until the server
    has taken in every sample."""
    proc.stdin.write(pcm16(audio))
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while srv.call(lambda: srv.server.metrics.audio_seconds.get()) < len(audio) / 16000:
        assert time.monotonic() < deadline, "the client did not send the audio"
        time.sleep(0.05)


def test_ctrl_c_ends_a_live_pipe_and_prints_the_final_transcript(start_server, reference):
    """The microphone case: a pipe that stays open. Ctrl-C ends the utterance; the transcript of everything sent
    still comes, and the client exits 0."""
    srv = start_server()
    half = AUDIO[: len(AUDIO) // 2]
    proc = launch(srv.ws_url)
    try:
        feed_and_wait(proc, srv, half)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.decode() == reference(half) + "\n"


def test_second_ctrl_c_quits_at_once(start_server, engine):
    srv = start_server(engine_override=StalledEngine(engine))  # the final transcript never comes
    proc = launch(srv.ws_url)
    try:
        feed_and_wait(proc, srv, AUDIO)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None  # waiting for the final transcript
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130


def test_subtitles_from_the_word_timings(start_server, reference, tmp_path):
    srv = start_server()
    audio = np.concatenate([clip(2.0, seed=82), np.zeros(16000, np.float32), clip(2.0, seed=83)])
    srt = tmp_path / "out.srt"
    rc, out, err = run_client(wav(tmp_path, audio), "--url", srv.ws_url, "--pace", "0", "--srt", str(srt))
    assert rc == 0 and out == reference(audio) + "\n", err
    blocks = [b.split("\n") for b in srt.read_text().strip().split("\n\n")]
    assert [int(b[0]) for b in blocks] == list(range(1, len(blocks) + 1))
    spans = [tuple(ms(t) for t in b[1].split(" --> ")) for b in blocks]
    assert all(a <= b for a, b in spans) and all(p[1] <= q[0] for p, q in zip(spans, spans[1:]))
    assert spans[-1][1] <= len(audio) * 1000 // 16000
    assert " ".join(" ".join(b[2:]) for b in blocks).split() == reference(audio).split()
    assert f"{len(blocks)} subtitle(s) written" in err


def ms(t: str) -> int:
    h, m, rest = t.split(":")
    s, milli = rest.split(",")
    return ((int(h) * 60 + int(m)) * 60 + int(s)) * 1000 + int(milli)


def test_subtitle_cues_follow_the_conventions():
    words = [{"word": w, "start_ms": i * 400, "end_ms": i * 400 + 300} for i, w in enumerate("a b c".split())]
    words += [{"word": "after", "start_ms": 3000, "end_ms": 3300}]  # a pause of 1.9 s: a new cue
    words += [{"word": "x" * 20, "start_ms": 3400 + i * 400, "end_ms": 3700 + i * 400} for i in range(3)]
    cues = subtitle_cues([Word(w["word"], w["start_ms"], w["end_ms"]) for w in words])
    assert cues[0] == (0, 1100, "a b c")
    assert cues[1][2] == "after " + "x" * 20 and cues[2][2] == "x" * 20 + " " + "x" * 20  # 42 characters at most
    assert srt_time(3_723_004) == "01:02:03,004"


def test_offline_cli_reports_the_words_and_subtitles_the_server_does(start_server, ckpt, tmp_path):
    """`python -m realtime.transcribe --words --srt` (no server) gives the very words and subtitles a streaming
    session's final event gives for the same file."""
    from realtime.transcribe import main as transcribe_main

    srv = start_server()
    audio = np.concatenate([clip(1.5, seed=84), np.zeros(14000, np.float32), clip(1.5, seed=85)])
    path = wav(tmp_path, audio)
    rc, _, err = run_client(path, "--url", srv.ws_url, "--pace", "0", "--json", "--srt", str(tmp_path / "live.srt"))
    assert rc == 0, err
    rc = transcribe_main(["--model", str(ckpt), path, "--words", str(tmp_path / "w.json"),
                          "--srt", str(tmp_path / "offline.srt")])
    assert rc == 0
    offline_words = json.loads((tmp_path / "w.json").read_text())
    rc, out, _ = run_client(path, "--url", srv.ws_url, "--pace", "0", "--json")
    done = [json.loads(line) for line in out.splitlines()][-1]
    assert done["type"] == "transcription.done" and len(offline_words) >= 3
    assert offline_words == done["words"]
    assert (tmp_path / "offline.srt").read_text() == (tmp_path / "live.srt").read_text()


def test_turns_mode_prints_one_line_per_spoken_turn(start_server, reference, tmp_path):
    """`--turns`: the server's VAD cuts the speech into turns, one line each, each the single-session transcript of
    its turn's audio; input that ends mid-speech still gets its last turn."""
    srv = start_server()
    sil = lambda s: np.zeros(int(s * 16000), np.float32)  # noqa: E731
    # ends while the VAD still hears speech (the second clip's first 0.6 s: its probability stays high only so long)
    audio = np.concatenate([sil(1.0), clip(1.2, 21), sil(1.5), clip(1.0, 22)[:9600]])
    path = wav(tmp_path, audio)
    rc, out, err = run_client(path, "--url", srv.ws_url, "--pace", "0", "--turns", "--json")
    assert rc == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    starts = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
    completed = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert len(starts) == len(completed) == 2
    for start, done in zip(starts, completed):
        assert done["transcript"] == reference(audio[start["audio_start_ms"] * 16: done["audio_end_ms"] * 16])
    assert completed[1]["audio_end_ms"] == len(audio) * 1000 // 16000  # the last turn ran to the end of input
    rc, out, err = run_client(path, "--url", srv.ws_url, "--pace", "0", "--turns")
    assert rc == 0 and out == "".join(d["transcript"] + "\n" for d in completed), err


def test_upload_mode_prints_and_subtitles_what_the_session_does(start_server, reference, tmp_path):
    """`--upload`: the file goes to POST /v1/audio/transcriptions; the text streams to stdout and the subtitles are the
    websocket path's for the same audio; bad input and refusals are explicit."""
    srv = start_server(api_keys=("k1",))
    audio = np.concatenate([clip(2.0, seed=84), np.zeros(16000, np.float32), clip(2.0, seed=85)])
    path = wav(tmp_path, audio)
    up_srt, ws_srt = tmp_path / "up.srt", tmp_path / "ws.srt"
    rc, out, err = run_client(path, "--url", srv.ws_url, "--api-key", "k1", "--upload", "--srt", str(up_srt))
    assert rc == 0 and out == reference(audio).strip() + "\n", err
    rc, _, err = run_client(path, "--url", srv.ws_url, "--api-key", "k1", "--pace", "0", "--srt", str(ws_srt))
    assert rc == 0 and up_srt.read_text() == ws_srt.read_text() and "subtitle(s) written" in err
    rc, out, _ = run_client(path, "--url", srv.http_url, "--api-key", "k1", "--upload", "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and events[-1]["type"] == "transcript.text.done"
    assert "".join(e["delta"] for e in events[:-1]) == events[-1]["text"] == reference(audio).strip()
    rc, out, err = run_client(path, "--url", srv.ws_url, "--api-key", "wrong", "--upload")
    assert rc == 1 and "401" in err and "invalid_api_key" in err
    (tmp_path / "bad.wav").write_bytes(b"RIFF....not audio")
    rc, _, err = run_client(str(tmp_path / "bad.wav"), "--url", srv.ws_url, "--api-key", "k1", "--upload")
    assert rc == 2 and "invalid_audio" in err and "bad.wav" in err
    for argv in (["-"], [path, "--turns"], [path, "--pace", "0"], [str(tmp_path / "none.wav")]):
        rc, _, err = run_client(*argv, "--url", srv.ws_url, "--upload")
        assert rc == 2, (argv, err)
    rc, _, err = run_client(path, "--url", "http://127.0.0.1:9", "--upload")
    assert rc == 1 and "failed" in err


def test_a_pipe_is_read_from_its_descriptor_not_its_buffer():
    """stdin is read by a daemon thread: from the pipe's descriptor, never through the buffered stream, whose lock a
    blocked read would hold when the interpreter shuts down (CPython then aborts: exit -6 instead of 130 after a
    second Ctrl-C). A stream without a descriptor (tests, wrappers) is read through read1."""
    import asyncio

    class NoBufferedReads(io.BufferedReader):
        def read1(self, *a):  # the path that can abort at shutdown
            raise AssertionError("read through the buffered stream")

        read = read1

    r, w = os.pipe()
    data = np.arange(-800, 800, dtype="<i2").tobytes()
    os.write(w, data)
    os.close(w)

    async def collect(stream) -> bytes:
        return b"".join([c async for c in client.stream_chunks(stream, 20, io.StringIO())])

    with NoBufferedReads(io.FileIO(r, "rb")) as stream:
        assert asyncio.run(collect(stream)) == data
    assert asyncio.run(collect(io.BytesIO(data))) == data
