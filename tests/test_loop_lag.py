"""Event-loop lag (`stream_server/loop_lag.py`, --max-loop-lag-ms): the host side's load. The window and its median,
the probe on a real loop that something blocks, the refusal, and a real server that refuses new sessions and
uploads while its loop is late, shows the lag on /health and /metrics, and admits again once the loop is free."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
from websockets.asyncio.client import connect

from stream_server.app import build_parser, settings_from_args
from stream_server.loop_lag import LoopLag, loop_lag_refusal
from stream_server.server import StreamServer
from stream_server.settings import ServerSettings
from test_server_common import (  # noqa: F401  (fixtures)
    MODEL,
    ckpt,
    engine,
    recv_json,
)


def test_the_median_covers_only_the_window_and_the_worst_is_kept() -> None:
    lag = LoopLag(window_s=2.0)
    for i in range(10):  # t = 0.0 .. 0.9: 300 ms late each
        lag.record(i / 10, 0.3)
    assert lag.recent_s(0.9) == pytest.approx(0.3)
    for i in range(30):  # t = 1.0 .. 3.9: 1 ms late; by t = 3.9 the 300 ms samples are out of the window
        lag.record(1.0 + i / 10, 0.001)
    assert lag.recent_s(3.9) == pytest.approx(0.001)
    assert lag.worst_s == pytest.approx(0.3)
    assert lag.recent_s(10.0) == 0.0  # nothing in the last 2 s
    lag.record(10.0, -0.0005)  # a timer a hair early (clock rounding) is not negative lag
    assert lag.recent_s(10.0) == 0.0
    assert len(lag._samples) == 1  # the window is pruned as it goes


def test_the_refusal_names_the_lag_the_limit_and_the_option() -> None:
    lag = LoopLag()
    for i in range(5):
        lag.record(i * 0.05, 0.12)
    assert loop_lag_refusal(lag, 0.2, 0.0) is None  # 0 disables
    assert loop_lag_refusal(lag, 0.2, 150.0) is None
    why = loop_lag_refusal(lag, 0.2, 100.0)
    assert why is not None and "120 ms late" in why and "100 ms" in why and "--max-loop-lag-ms" in why
    assert "--workers" in why


async def _block_loop(seconds: float, until: float) -> None:
    """Hold the event loop (as a saturated host side does) for `seconds` at a time until `until`."""
    while time.monotonic() < until:
        time.sleep(seconds)
        await asyncio.sleep(0)


async def test_the_probe_measures_a_free_loop_and_a_blocked_one() -> None:
    lag = LoopLag(interval_s=0.01)
    probe = asyncio.create_task(lag.run())
    try:
        await asyncio.sleep(0.3)
        free_ms = lag.recent_s(time.monotonic()) * 1000
        await _block_loop(0.08, time.monotonic() + 0.8)
        blocked_ms = lag.recent_s(time.monotonic()) * 1000
    finally:
        probe.cancel()
    assert free_ms < 20  # a 2-core box under a test suite wakes a sleeping task within a few ms
    assert blocked_ms >= 40  # each 80 ms block makes the probe that waits on it late by up to 80 ms
    assert lag.worst_s >= 0.06


def _post(port: int) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/audio/transcriptions", data=b"x", method="POST",
                                 headers={"Content-Type": "multipart/form-data; boundary=b"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_a_server_whose_loop_is_late_refuses_new_sessions_and_uploads(engine) -> None:
    settings = ServerSettings(port=0, served_model_names=(MODEL,), max_loop_lag_ms=30.0)
    server = StreamServer(settings, engine, owns_engine=False)
    await server.start()
    try:
        port = server.port
        await asyncio.sleep(0.3)  # the probe's first samples, on a free loop
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            assert (await recv_json(ws))["type"] == "session.created"
        health = server._health()
        assert set(health["event_loop"]) == {"recent_lag_ms", "worst_lag_ms"}
        assert health["event_loop"]["recent_lag_ms"] < 30

        await _block_loop(0.15, time.monotonic() + 1.5)  # the host side saturated for 1.5 s: each probe ~100 ms late
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            first = await recv_json(ws)
        assert first["type"] == "error" and first["code"] == "server_busy"
        assert "event loop runs" in first["error"] and "--max-loop-lag-ms" in first["error"]
        status, body = await asyncio.to_thread(_post, port)  # the loop is free while the client waits
        # an upload is refused the same way, unless the loop caught up while the request was read
        assert status == 503 and body["error"]["code"] == "server_busy", body
        metrics = server._metrics_text()
        line = next(ln for ln in metrics.splitlines() if ln.startswith("streamscribe_event_loop_lag_worst_seconds "))
        assert float(line.split()[1]) >= 0.08
        assert "streamscribe_event_loop_lag_seconds " in metrics
        assert server.metrics.rejected.get("server_busy") >= 1

        await asyncio.sleep(2.2)  # the late samples leave the 2 s window
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            assert (await recv_json(ws))["type"] == "session.created"
    finally:
        await server.stop()


def test_the_command_line_sets_the_limit() -> None:
    assert settings_from_args(build_parser().parse_args([]), env={}).max_loop_lag_ms == 100.0
    assert settings_from_args(build_parser().parse_args(["--max-loop-lag-ms", "0"]), env={}).max_loop_lag_ms == 0
    assert settings_from_args(build_parser().parse_args(["--max-loop-lag-ms", "150"]), env={}).max_loop_lag_ms == 150
    assert ServerSettings().max_loop_lag_ms == 0.0
