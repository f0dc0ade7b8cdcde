"""`python -m stream_server.client`: live transcription of a file or of stdin, printed as the server decodes it.

    python -m stream_server.client talk.wav                      # sent at real time, like a live source
    python -m stream_server.client talk.wav --pace 0             # as fast as the server takes it
    python -m stream_server.client talk.mp3 --upload             # POST /v1/audio/transcriptions: the fastest way
    arecord -q -f S16_LE -r 16000 -c 1 -t raw | python -m stream_server.client -          # the microphone
    ffmpeg -loglevel quiet -i INPUT -f s16le -ar 16000 -ac 1 - | python -m stream_server.client -

It speaks the vLLM dialect of `/v1/realtime` (so it works with vLLM's server too), or with `--turns` the OpenAI
dialect with server VAD: one line per spoken turn, for long live sessions. Files: WAV/FLAC/Ogg/MP3 at any rate
and channel count (resampled to 16 kHz mono); `-`: raw PCM16 little-endian mono 16 kHz on stdin. `--upload` sends
the file itself to the server's file transcription endpoint instead (any format the server reads) and
prints the text as the server streams it back (`upload_client.py`).

stdout gets the transcript as the deltas arrive, then a newline (`--json`: every server event as one JSON line
instead); stderr gets status and errors. `--srt FILE` also writes subtitles from the final event's word timings. The end of the input or Ctrl-C (SIGINT) ends the utterance: the server
still finishes it, and its final transcript is printed. A second Ctrl-C quits at once. Exit status: 0 when the
final transcript arrived (server errors before it: 1), 1 when the connection or the server failed, 2 for bad
arguments or input, 130 after a second Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import numpy as np
import websockets

from realtime.subtitles import format_srt, subtitle_cues
from realtime.timestamps import Word

from .loadtest import RATE, append_event, client_keepalive, client_tls, error_code_message, fetch_model, load_pcm16
from .upload_client import UploadError, upload_file

API_KEY_ENV = "STREAMSCRIBE_API_KEY"
# after these the server will not finish the utterance (the demo page's list, plus a refused handshake's)
FATAL_CODES = frozenset({"model_not_found", "model_not_validated", "processing_error", "server_busy", "server_full",
                         "engine_stalled", "idle_timeout", "server_shutting_down", "too_many_sessions"})


@dataclass(frozen=True)
class ClientOptions:
    url: str = "ws://127.0.0.1:8000/v1/realtime"
    model: str | None = None  # None: the first of the server's /v1/models
    api_key: str | None = None
    delay_ms: int | None = None  # None: the server's default
    chunk_ms: int = 80
    pace: float = 1.0  # files: times real time (0: unpaced); stdin is sent as it comes
    ca_file: str | None = None
    json_events: bool = False
    srt: Path | None = None  # subtitles from the final event's words
    turns: bool = False  # OpenAI dialect with server VAD: one line per spoken turn


def write_srt(path: Path, words: list[dict[str, Any]]) -> int:
    """SubRip file of the final event's `words`; returns the number of cues."""
    cues = subtitle_cues([Word(str(w["word"]), int(w["start_ms"]), int(w["end_ms"])) for w in words])
    path.write_text(format_srt(cues), encoding="utf-8")
    return len(cues)


def realtime_url(url: str) -> str:
    """ws://host:port -> ws://host:port/v1/realtime (a URL with a path is kept)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a websocket URL: {url!r} (ws://HOST:PORT or wss://HOST:PORT)")
    return url if "/" in rest.rstrip("/") else f"{scheme}://{rest.rstrip('/')}/v1/realtime"


async def file_chunks(pcm: np.ndarray, chunk_ms: int, pace: float) -> AsyncIterator[bytes]:
    """`pcm` (int16, 16 kHz) in chunks of `chunk_ms`, each sent once its last sample would have been spoken."""
    loop = asyncio.get_running_loop()
    step = max(1, RATE * chunk_ms // 1000)
    t0 = loop.time()
    for start in range(0, len(pcm), step):
        end = min(len(pcm), start + step)
        if pace > 0:
            await asyncio.sleep(max(0.0, t0 + end / RATE / pace - loop.time()))
        yield pcm[start:end].astype("<i2").tobytes()


async def stream_chunks(stream: BinaryIO, chunk_ms: int, err: TextIO) -> AsyncIterator[bytes]:
    """Raw PCM16 from a pipe, as it comes. The reads block, so a daemon thread does them: a pipe that stays open
    and silent never keeps the client from ending."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    size = max(2, RATE * chunk_ms // 1000 * 2)

    # what the pipe holds now, up to a chunk (read() would wait for a whole chunk that a paused source may not send
    # for a long time). From a file descriptor with os.read, not the buffered stream's read1: a thread blocked in
    # read1 holds the buffer's lock, and if the interpreter then shuts down and touches that buffer it aborts
    # ("could not acquire lock ... at interpreter shutdown, possibly due to daemon threads"): exit status -6
    # instead of 130 after a second Ctrl-C, in 2 of 8 runs of its test on a loaded box (0 of 12 since)
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        fd = None
    read_some = (lambda n: os.read(fd, n)) if fd is not None else getattr(stream, "read1", stream.read)

    def read() -> None:
        try:
            while data := read_some(size):
                loop.call_soon_threadsafe(queue.put_nowait, data)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read, name="stdin-reader", daemon=True).start()
    pending = b""
    while (data := await queue.get()) is not None:
        data, pending = pending + data, b""
        if len(data) % 2:
            data, pending = data[:-1], data[-1:]
        if data:
            yield data
    if pending:
        print("streamscribe: the input ended in the middle of a sample: its last byte was not sent", file=err)


OPENAI_DELTA = "conversation.item.input_audio_transcription.delta"
OPENAI_COMPLETED = "conversation.item.input_audio_transcription.completed"
OPENAI_FAILED = "conversation.item.input_audio_transcription.failed"


def setup_event(opts: ClientOptions) -> dict[str, Any]:
    """The session.update each mode sends: vLLM's (one utterance), or OpenAI's with server VAD (`--turns`)."""
    if opts.turns:
        transcription: dict[str, Any] = {"model": opts.model or ""}
        if opts.delay_ms is not None:
            transcription["transcription_delay_ms"] = opts.delay_ms
        return {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": RATE}, "transcription": transcription,
            "turn_detection": {"type": "server_vad"}}}}}
    update: dict[str, Any] = {"type": "session.update", "model": opts.model or ""}
    if opts.delay_ms is not None:
        update["transcription_delay_ms"] = opts.delay_ms
    return update


async def transcribe_live(opts: ClientOptions, chunks: AsyncIterator[bytes], out: TextIO, err: TextIO,
                          stop: asyncio.Event) -> int:
    """`chunks` until they end or `stop` is set, then the end of input and every final transcript.

    One utterance (vLLM dialect): its text streams to `out`, then a newline at its `transcription.done`. With
    `opts.turns` (OpenAI dialect, server VAD): one line per turn the server detects, ended at its `completed`; the
    end of input commits the turn being spoken, and the client waits until every turn it saw has completed."""
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else None
    url = realtime_url(opts.url) + ("?intent=transcription" if opts.turns else "")
    errors = 0

    def show(event: dict[str, Any]) -> None:
        if opts.json_events:
            out.write(json.dumps(event) + "\n")
            out.flush()

    def write(text: str) -> None:
        if not opts.json_events:
            out.write(text)
            out.flush()

    def report(event: dict[str, Any]) -> str | None:
        nonlocal errors
        code, message = error_code_message(event)
        print(f"streamscribe: server error {code}: {message}", file=err)
        errors += 1
        return code

    def finish(words: list[dict[str, Any]]) -> int:
        if opts.srt is not None and not srt_written(opts.srt, words, err):
            return 1
        return 1 if errors else 0

    try:
        async with websockets.connect(url, additional_headers=headers, max_size=None, open_timeout=15,
                                      **client_keepalive(None if opts.pace == 0 else 1.0),
                                      **client_tls(opts.ca_file)) as ws:
            created = json.loads(await ws.recv())
            show(created)
            if created.get("type") == "error":
                report(created)
                return 1
            await ws.send(json.dumps(setup_event(opts)))
            updated = json.loads(await ws.recv())
            show(updated)
            if updated.get("type") == "error":
                report(updated)
                return 1
            if updated.get("type") != "session.updated":
                print(f"streamscribe: unexpected answer to session.update: {updated.get('type')}", file=err)
                return 1
            if not opts.turns:
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))  # the utterance starts
            end_event = {"type": "input_audio_buffer.commit", **({} if opts.turns else {"final": True})}

            async def send() -> None:
                # the next chunk or Ctrl-C, whichever comes first (a live pipe may be silent for long)
                source = aiter(chunks)
                stopped = asyncio.create_task(stop.wait())
                try:
                    while True:
                        nxt = asyncio.ensure_future(anext(source))
                        await asyncio.wait({nxt, stopped}, return_when=asyncio.FIRST_COMPLETED)
                        if not nxt.done():
                            nxt.cancel()
                            break
                        try:
                            chunk = nxt.result()
                        except StopAsyncIteration:
                            break
                        await ws.send(json.dumps(append_event(chunk)))
                finally:
                    stopped.cancel()
                await ws.send(json.dumps(end_event))

            sender = asyncio.create_task(send())
            words: list[dict[str, Any]] = []  # vLLM: from the deltas; turns: from each completed turn
            open_turns: set[str] = set()
            end_answered = False  # turns: the server has handled our end-of-input commit
            try:
                async for raw in ws:
                    event = json.loads(raw)
                    show(event)
                    kind = event.get("type")
                    if kind == "transcription.delta":
                        words += event.get("words") or []
                        write(event.get("delta", ""))
                    elif kind == "transcription.done":
                        write("\n")
                        # the final event lists every word, or past 4096 words only those no delta carried
                        final = event.get("words") or []
                        return finish(words + final if event.get("words_truncated") else final)
                    elif kind in ("input_audio_buffer.speech_started", "input_audio_buffer.committed", OPENAI_DELTA):
                        open_turns.add(str(event.get("item_id")))
                        if kind == OPENAI_DELTA:
                            write(event.get("delta", ""))
                        if kind == "input_audio_buffer.committed" and sender.done():
                            end_answered = True
                    elif kind in (OPENAI_COMPLETED, OPENAI_FAILED):
                        open_turns.discard(str(event.get("item_id")))
                        if kind == OPENAI_COMPLETED:
                            words += event.get("words") or []
                            write("\n")
                        else:
                            report(event)
                    elif kind == "error":
                        code, _ = error_code_message(event)
                        if opts.turns and code == "input_audio_buffer_commit_empty" and sender.done():
                            end_answered = True  # nobody was speaking when the input ended: nothing to finish
                        elif report(event) in FATAL_CODES:
                            return 1
                    if opts.turns and end_answered and not open_turns:
                        return finish(words)
                print("streamscribe: the server closed the connection before the final transcript", file=err)
                return 1
            finally:
                sender.cancel()
                if sender.done() and not sender.cancelled():
                    sender.exception()  # retrieved: a failed send (a dropped connection) is reported by the receiver
    except websockets.InvalidStatus as exc:
        print(f"streamscribe: the server refused the connection: HTTP {exc.response.status_code} "
              f"{exc.response.body.decode(errors='replace').strip() if exc.response.body else ''}", file=err)
    except websockets.ConnectionClosed as exc:  # a normal close (1000, 1001) too, before the final transcript
        print(f"streamscribe: the server closed the connection ({exc.rcvd.code if exc.rcvd else 'no close frame'}"
              f"{': ' + exc.rcvd.reason if exc.rcvd and exc.rcvd.reason else ''}) before the final transcript",
              file=err)
    except json.JSONDecodeError as exc:
        print(f"streamscribe: the server sent something that is not a JSON event: {exc}", file=err)
    except (OSError, websockets.InvalidHandshake, TimeoutError) as exc:
        print(f"streamscribe: connection to {opts.url} failed: {exc}", file=err)
    return 1


def srt_written(path: Path, words: list[dict[str, Any]], err: TextIO) -> bool:
    """`--srt`: the subtitles written and said so, or why not (the transcript itself is already out)."""
    try:
        cues = write_srt(path, words)
    except OSError as exc:
        print(f"streamscribe: cannot write subtitles to {path}: {exc.strerror or exc}", file=err)
        return False
    print(f"streamscribe: {cues} subtitle(s) written to {path}", file=err)
    return True


def upload_main(args: argparse.Namespace, api_key: str | None, out: TextIO, err: TextIO) -> int:
    """`--upload`: the file to POST /v1/audio/transcriptions (stream=true); deltas to `out` as they come."""
    defaults = ClientOptions()
    if args.source == "-" or args.turns or args.pace != defaults.pace or args.chunk_ms != defaults.chunk_ms:
        print("streamscribe: --upload sends a file as it is: not with -, --turns, --pace or --chunk-ms", file=err)
        return 2
    path = Path(args.source)
    if not path.is_file():
        print(f"streamscribe: cannot read {args.source}: no such file", file=err)
        return 2

    def on_event(event: dict[str, Any]) -> None:
        if args.json:
            print(json.dumps(event, ensure_ascii=False), file=out, flush=True)
        elif event.get("type") == "transcript.text.delta":
            print(event.get("delta", ""), end="", file=out, flush=True)

    try:
        result = upload_file(args.url, path, model=args.model, api_key=api_key, stream=True, delay_ms=args.delay_ms,
                             ca_file=args.ca_file, on_event=on_event)
    except KeyboardInterrupt:
        print("\nstreamscribe: interrupted; the upload was abandoned", file=err)
        return 130
    except UploadError as exc:
        print(f"\nstreamscribe: the server refused {path.name}: {exc}", file=err)
        return 2 if exc.status in (400, 413, 415) else 1
    except (OSError, ValueError) as exc:
        print(f"streamscribe: upload to {args.url} failed: {exc}", file=err)
        return 1
    if not args.json:
        print(file=out, flush=True)
    if args.srt is not None and not srt_written(args.srt, result.words, err):
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stream_server.client", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="audio file (WAV/FLAC/Ogg/MP3), or - for raw PCM16 LE mono 16 kHz on stdin")
    p.add_argument("--url", default="ws://127.0.0.1:8000", help="server: ws[s]://HOST:PORT[/v1/realtime]")
    p.add_argument("--model", default=None, help="model name (default: the first the server lists)")
    p.add_argument("--api-key", default=None, help=f"API key (default: ${API_KEY_ENV})")
    p.add_argument("--delay-ms", type=int, default=None, help="transcription delay (default: the server's)")
    p.add_argument("--pace", type=float, default=ClientOptions.pace, help="files: send at this multiple of real time (0: unpaced)")
    p.add_argument("--chunk-ms", type=int, default=ClientOptions.chunk_ms, help="audio per message")
    p.add_argument("--ca-file", default=None, help="wss:// to a self-signed server: trust this PEM certificate")
    p.add_argument("--json", action="store_true", help="print every server event as a JSON line")
    p.add_argument("--srt", type=Path, default=None, help="also write SubRip subtitles (from the word timings)")
    p.add_argument("--upload", action="store_true",
                   help="send the file to POST /v1/audio/transcriptions (decoded as fast as the server can; any "
                        "format it reads) instead of streaming it over the websocket")
    p.add_argument("--turns", action="store_true",
                   help="one line per spoken turn (OpenAI dialect, the server's voice activity detection) instead of "
                        "one utterance: for long live sessions")
    return p


def main(argv: list[str] | None = None, *, stdin: BinaryIO | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        return _main(argv, stdin, out, err)
    except KeyboardInterrupt:  # before streaming began (looking the model up, reading the file)
        print("\nstreamscribe: interrupted", file=err)
        return 130


def _main(argv: list[str] | None, stdin: BinaryIO | None, out: TextIO, err: TextIO) -> int:
    args = build_parser().parse_args(argv)
    if args.pace < 0 or args.chunk_ms < 1:
        print("streamscribe: --pace must be >= 0 and --chunk-ms >= 1", file=err)
        return 2
    try:
        realtime_url(args.url)
    except ValueError as exc:
        print(f"streamscribe: {exc}", file=err)
        return 2
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.upload:
        return upload_main(args, api_key, out, err)
    model = args.model
    if model is None:  # what /v1/models lists first ("" lets the server pick its default)
        model = fetch_model(args.url, api_key, ca_file=args.ca_file)
    opts = ClientOptions(url=args.url, model=model, api_key=api_key, delay_ms=args.delay_ms, chunk_ms=args.chunk_ms,
                         pace=args.pace, ca_file=args.ca_file, json_events=args.json, srt=args.srt, turns=args.turns)
    pcm: np.ndarray | None = None
    if args.source != "-":
        try:
            pcm = load_pcm16(Path(args.source))
        except Exception as exc:  # any unreadable file: say which and why
            print(f"streamscribe: cannot read {args.source}: {exc}", file=err)
            return 2

    async def run() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        main_task = asyncio.current_task()

        def on_sigint() -> None:
            if stop.is_set() and main_task is not None:
                main_task.cancel()  # the second Ctrl-C: quit now
            stop.set()
            print("\nstreamscribe: input ended (Ctrl-C); waiting for the final transcript", file=err)

        try:
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        except (NotImplementedError, RuntimeError):  # not the main thread (tests) or no signals here
            pass
        chunks = (file_chunks(pcm, opts.chunk_ms, opts.pace) if pcm is not None
                  else stream_chunks(stdin or sys.stdin.buffer, opts.chunk_ms, err))
        try:
            return await transcribe_live(opts, chunks, out, err, stop)
        except asyncio.CancelledError:
            return 130

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
