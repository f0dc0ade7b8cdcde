"""Start-up step-cost calibration (`stream_server/calibration.py`): paced noise at doubling stream counts, so that a
cold server's admission foresees its first burst. Against an engine whose steps cost a known line (recorded, not
slept, so the figures are exact), and against the real tiny engine behind a real server."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import numpy as np
import pytest
from websockets.asyncio.client import connect

from realtime.serving import AdmissionError, EngineStats, RecentSteps, StreamError, StreamFailed, fits_step_cost
from stream_server.app import build_parser, settings_from_args
from stream_server.calibration import CalibrationError, calibrate_or_warn, calibrate_step_cost
from stream_server.server import StreamServer
from stream_server.settings import ServerSettings
from test_server_common import (  # noqa: F401  (fixtures)
    ckpt,
    clip,
    engine,
    fresh_vllm_utterance,
    recv_json,
    reference,
    start_server,
    wait_no_streams,
)
from test_server_robustness import http_get

CHUNK = 1280  # 80 ms at 16 kHz
SHORT = clip(0.4, seed=43)


class LineCostEngine:
    """A `TranscriptionEngine` whose step decodes 80 ms for every open stream once each has it (a paced tick), and
    records `fixed_ms + per_stream_ms x streams` as its duration in the real engine's `RecentSteps`. `decodes=False`
    never steps (a stalled engine); `fail_stream` fails that stream (by open order) at its first step."""

    fits_step_cost = True  # serving.FitsStepCost: the server calibrates it

    def __init__(self, config, fixed_ms: float, per_stream_ms: float, *, max_streams: int = 256,
                 decodes: bool = True, fail_stream: int | None = None) -> None:
        self.config = config  # the tiny checkpoint's (the server reads its delays)
        self.model_name = "line"
        self.fixed_ms, self.per_stream_ms, self.max_streams = fixed_ms, per_stream_ms, max_streams
        self.decodes, self.fail_stream = decodes, fail_stream
        self._cond = threading.Condition()
        self._pending: dict[int, int] = {}  # open stream -> samples not decoded
        self._events: dict[int, object] = {}
        self._next = 1
        self._steps: list[float] = []
        self._recent = RecentSteps()
        self._stop = False
        self.opened = 0
        self.sizes_stepped: list[int] = []
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(5)

    def _loop(self) -> None:
        with self._cond:
            while not self._stop:
                ready = self.decodes and self._pending and all(p >= CHUNK for p in self._pending.values())
                if not ready:
                    self._cond.wait(0.05)
                    continue
                for sid in self._pending:
                    self._pending[sid] -= CHUNK
                    if sid == self.fail_stream:
                        self._events[sid](StreamFailed(sid, "synthetic failure"))
                n = len(self._pending)
                dt = (self.fixed_ms + self.per_stream_ms * n) / 1000
                self._steps.append(dt)
                self._recent.add(dt, time.monotonic(), n)
                self.sizes_stepped.append(n)

    def open_stream(self, on_event, *, delay_ms=None) -> int:
        with self._cond:
            if len(self._pending) >= self.max_streams:
                raise AdmissionError(f"engine is full: {self.max_streams} streams")
            sid, self._next = self._next, self._next + 1
            self._pending[sid], self._events[sid] = 0, on_event
            self.opened += 1
            return sid

    def push_audio(self, stream_id: int, samples: np.ndarray) -> None:
        with self._cond:
            if stream_id not in self._pending:
                raise StreamError(f"unknown or closed stream {stream_id}")
            self._pending[stream_id] += samples.size
            self._cond.notify_all()

    def finish_stream(self, stream_id: int) -> None: ...

    def close_stream(self, stream_id: int) -> None:
        with self._cond:
            self._pending.pop(stream_id, None)
            self._events.pop(stream_id, None)
            self._cond.notify_all()

    def pending_audio_seconds(self, stream_id: int) -> float:
        with self._cond:
            return self._pending.get(stream_id, 0) / 16000

    def stats(self) -> EngineStats:
        with self._cond:
            fixed, per = self._recent.cost_line()
            return EngineStats(len(self._pending), self.max_streams, len(self._steps), list(self._steps),
                               recent_step_seconds=self._recent.median(time.monotonic()),
                               step_fixed_seconds=fixed, step_seconds_per_stream=per)


@pytest.fixture
def line_engine(engine):
    made: list[LineCostEngine] = []

    def make(*args, **kw) -> LineCostEngine:
        eng = LineCostEngine(engine.config, *args, **kw)
        eng.start()
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.stop()


def test_it_doubles_until_a_step_passes_half_the_limit_and_fits_the_line(line_engine) -> None:
    """2 ms + 3 ms a stream against --max-step-ms 64: 1, 2, 4, 8 streams step in 5, 8, 14, 26 ms; 16 take 50 ms,
    past half the limit, so it stops there. The engine's fit is the line itself, and every stream is closed."""
    eng = line_engine(2.0, 3.0)
    report = calibrate_step_cost(eng, limit_ms=64.0, max_streams=64, rounds=4)
    assert report.sizes == [1, 2, 4, 8, 16]
    assert report.median_step_ms == pytest.approx([5.0, 8.0, 14.0, 26.0, 50.0])
    assert (report.fixed_ms, report.per_stream_ms) == pytest.approx((2.0, 3.0))
    assert eng.stats().active_streams == 0 and eng.opened == 31
    assert sorted(set(eng.sizes_stepped)) == [1, 2, 4, 8, 16] and len(eng.sizes_stepped) == 5 * 4  # paced: 1 a round
    assert "2.00 ms + 3.000 ms a stream" in report.line() and "16: 50.0 ms" in report.line()


def test_it_stops_at_the_session_limit_and_at_a_step_over_the_limit(line_engine) -> None:
    cheap = calibrate_step_cost(line_engine(1.0, 0.01), limit_ms=64.0, max_streams=12, rounds=3)
    assert cheap.sizes == [1, 2, 4, 8]  # 16 would pass the server's session limit
    assert cheap.per_stream_ms == pytest.approx(0.01)
    slow = calibrate_step_cost(line_engine(70.0, 1.0), limit_ms=64.0, max_streams=64, rounds=3)
    assert slow.sizes == [1]  # one stream already over the limit: no more load on a server that cannot carry it
    assert slow.per_stream_ms == 0.0 and "no line" in slow.line()


def test_a_refusing_a_stalled_or_a_failing_engine_gives_a_clear_error_and_leaves_no_stream(line_engine,
                                                                                          caplog) -> None:
    full = line_engine(1.0, 1.0, max_streams=3)
    with pytest.raises(CalibrationError, match="refused calibration stream 4 of 4"):
        calibrate_step_cost(full, limit_ms=64.0, max_streams=64, rounds=2)
    assert full.stats().active_streams == 0
    stalled = line_engine(1.0, 1.0, decodes=False)
    t0 = time.monotonic()
    with pytest.raises(CalibrationError, match="did not decode round 1 within 0.2 s"):
        calibrate_step_cost(stalled, limit_ms=64.0, max_streams=64, round_timeout_s=0.2)
    assert time.monotonic() - t0 < 5 and stalled.stats().active_streams == 0
    failing = line_engine(1.0, 1.0, fail_stream=2)
    with pytest.raises(CalibrationError, match="a calibration stream failed: synthetic failure"):
        calibrate_step_cost(failing, limit_ms=64.0, max_streams=64)
    assert failing.stats().active_streams == 0
    with caplog.at_level(logging.WARNING, logger="stream_server.calibration"):
        assert calibrate_or_warn(line_engine(1.0, 1.0, max_streams=1), limit_ms=64.0, max_streams=64) is None
    assert "step-cost calibration failed" in caplog.text and "no line until clients have run" in caplog.text


async def test_a_cold_server_that_calibrated_cuts_its_first_burst(line_engine) -> None:
    """The burst a restart brings: 30 sessions connect at once to a server that has decoded nothing for a client.
    At 2 ms + 3 ms a stream and --max-step-ms 64, 20 fit; the other 10 get `server_busy`. Without the calibration
    (the settings' default, and `--no-calibrate`) all 30 are admitted."""
    for calibrate, admitted in ((True, 20), (False, 30)):
        eng = line_engine(2.0, 3.0)
        settings = ServerSettings(port=0, served_model_names=("line",), max_sessions=64, max_step_ms=64.0,
                                  calibrate_on_start=calibrate)
        server = StreamServer(settings, eng, owns_engine=False)
        await server.start()
        try:
            conns = await asyncio.gather(*(connect(f"ws://127.0.0.1:{server.port}/v1/realtime") for _ in range(30)))
            firsts = [await recv_json(c) for c in conns]
            taken = [f for f in firsts if f["type"] == "session.created"]
            busy = [f for f in firsts if f["type"] == "error"]
            assert len(taken) == admitted and len(busy) == 30 - admitted
            assert all(f["code"] == "server_busy" and "near capacity" in f["error"] for f in busy)
            health = server._health()["engine"]
            if calibrate:
                assert health["calibration"]["streams"] == [1, 2, 4, 8, 16]
                assert health["step_cost_ms"] == {"fixed": 2.0, "per_stream": 3.0}
            else:
                assert health["calibration"] is None
            for c in conns:
                await c.close()
        finally:
            await server.stop()


def test_the_command_line_calibrates_unless_told_not_to() -> None:
    assert settings_from_args(build_parser().parse_args([]), env={}).calibrate_on_start is True
    assert settings_from_args(build_parser().parse_args(["--no-calibrate"]), env={}).calibrate_on_start is False
    assert ServerSettings().calibrate_on_start is False  # a test's server starts at once


async def test_the_real_engine_calibrates_behind_a_real_server_and_then_serves(start_server, engine, reference):
    """The tiny checkpoint's batched engine: the calibration runs 1, 2, 4, 8 streams (its steps are far below half
    of --max-step-ms, so the session limit stops it), leaves no engine stream open, and the server then transcribes
    as before."""
    srv = start_server(max_sessions=8, max_step_ms=64.0, calibrate_on_start=True)
    health = json.loads(http_get(f"{srv.http_url}/health")[2])["engine"]
    assert health["calibration"]["streams"] == [1, 2, 4, 8]
    assert all(ms > 0 for ms in health["calibration"]["median_step_ms"])
    assert await asyncio.to_thread(wait_no_streams, engine) == 0
    assert await fresh_vllm_utterance(srv.ws_url, SHORT) == reference(SHORT)


async def test_only_an_engine_that_declares_a_fitted_step_cost_is_calibrated(line_engine, caplog) -> None:
    """The capability is declared on the class (`serving.FitsStepCost`), not probed: the batched engine declares
    it, the sequential reference engine (one stream at a time, no line) does not, and neither does an engine that
    merely has the same stats fields."""
    assert fits_step_cost(line_engine(1.0, 1.0))
    from realtime.engine.engine import BatchedEngine
    from realtime.sequential_engine import SequentialEngine

    assert BatchedEngine.fits_step_cost is True and not hasattr(SequentialEngine, "fits_step_cost")

    class Undeclared(LineCostEngine):
        fits_step_cost = None  # type: ignore[assignment]

    eng = Undeclared(line_engine(1.0, 1.0).config, 2.0, 3.0)
    eng.start()
    try:
        assert not fits_step_cost(eng)
        server = StreamServer(ServerSettings(port=0, served_model_names=("line",), calibrate_on_start=True), eng,
                              owns_engine=False)
        with caplog.at_level(logging.INFO, logger="stream_server.server"):
            await server.start()
        try:
            assert server.calibration is None and eng.opened == 0
            assert "not calibrating the step cost: Undeclared fits none" in caplog.text
        finally:
            await server.stop()
    finally:
        eng.stop()
