"""TLS on the server's own port (`--ssl-certfile`, `--ssl-keyfile`): wss:// and https://, with the test-only
self-signed certificate in tests/tls/. The browser demo over https is tested in test_demo_browser.py."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import ssl
import urllib.request
from pathlib import Path

import openai
import pytest
import soundfile as sf
from test_server_common import (  # noqa: F401  (fixtures)
    MODEL,
    ckpt,
    clip,
    engine,
    open_vllm,
    pcm16,
    reference,
    start_server,
    utterance_vllm,
)
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage

from stream_server import loadtest
from stream_server.app import build_parser, settings_from_args
from stream_server.loadtest import ClientConfig

TLS = Path(__file__).resolve().parent / "tls"
CERT, KEY = TLS / "localhost.pem", TLS / "localhost-key.pem"
AUDIO = clip(0.8, seed=71)


def trusting() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(CERT))


async def test_wss_and_https_on_the_same_port(start_server, reference):
    srv = start_server(tls_certfile=CERT, tls_keyfile=KEY)
    assert srv.ws_url.startswith("wss://") and srv.http_url.startswith("https://")
    ws = await open_vllm(srv.ws_url, ssl=trusting())
    try:
        assert await utterance_vllm(ws, AUDIO) == reference(AUDIO)
    finally:
        await ws.close()
    with urllib.request.urlopen(f"{srv.http_url}/health", timeout=10, context=trusting()) as r:
        assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    # the load tester (and any client) trusts a self-signed server through its certificate file
    res = await loadtest.transcribe_pcm(ClientConfig(url=srv.ws_url, model=MODEL, ca_file=str(CERT)), pcm16(AUDIO))
    assert res.completed and res.text == reference(AUDIO)
    # file uploads (POST /v1/audio/transcriptions) over https, with the official SDK
    wav = io.BytesIO()
    sf.write(wav, AUDIO, 16000, format="WAV", subtype="PCM_16")
    client = openai.OpenAI(base_url=f"{srv.http_url}/v1", api_key="unused", max_retries=0,
                           http_client=openai.DefaultHttpxClient(verify=trusting()))
    r = await asyncio.to_thread(client.audio.transcriptions.create, model=MODEL, file=("a.wav", wav.getvalue()))
    assert r.text == reference(AUDIO).strip()


async def test_plain_clients_fail_at_the_handshake_and_harm_nobody(start_server, reference):
    srv = start_server(tls_certfile=CERT, tls_keyfile=KEY)
    plain = srv.ws_url.replace("wss://", "ws://")
    with pytest.raises((InvalidMessage, OSError, EOFError)):
        async with connect(plain, open_timeout=10):
            pass
    # a client that does not trust the certificate is refused by its own TLS check
    with pytest.raises(ssl.SSLCertVerificationError):
        async with connect(srv.ws_url, open_timeout=10):
            pass
    ws = await open_vllm(srv.ws_url, ssl=trusting())  # the server goes on
    try:
        assert await utterance_vllm(ws, AUDIO) == reference(AUDIO)
    finally:
        await ws.close()


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_bad_certificates_stop_the_server_with_their_reason(tmp_path):
    missing = tmp_path / "nope.pem"
    with pytest.raises(SystemExit, match="cannot load the TLS certificate.*nope.pem"):
        settings_from_args(parse("--ssl-certfile", str(missing)), env={})
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(SystemExit, match="garbage.pem"):
        settings_from_args(parse("--ssl-certfile", str(garbage)), env={})
    with pytest.raises(SystemExit, match="cannot load"):  # the certificate without its key
        settings_from_args(parse("--ssl-certfile", str(CERT)), env={})
    with pytest.raises(SystemExit, match="without its certificate"):
        settings_from_args(parse("--ssl-keyfile", str(KEY)), env={})
    s = settings_from_args(parse("--ssl-certfile", str(CERT), "--ssl-keyfile", str(KEY)), env={})
    assert s.tls_enabled and s.ws_scheme == "wss"


def test_keys_in_clear_text_are_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="stream_server"):
        settings_from_args(parse("--host", "0.0.0.0", "--api-key", "k"), env={})
    assert any("without TLS" in r.message for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stream_server"):
        settings_from_args(parse("--host", "0.0.0.0", "--api-key", "k", "--ssl-certfile", str(CERT),
                                 "--ssl-keyfile", str(KEY)), env={})
    assert not any("without TLS" in r.message for r in caplog.records)


def test_loadtest_cli_takes_a_ca_file():
    args = loadtest.parse_args(["--url", "wss://127.0.0.1:1", "--ca-file", str(CERT)])
    assert args.ca_file == str(CERT)
    assert isinstance(loadtest.client_tls(args.ca_file)["ssl"], ssl.SSLContext) and loadtest.client_tls(None) == {}

