"""Step-cost calibration at start-up: paced streams of quiet noise, so that the foreseen-load admission
(`admission.LoadAdmission`) has a line before the first client connects.

Without it a cold server has no line and admits its first burst whole: after a deploy or a restart every client
reconnects at once, which is exactly when the line is missing. The calibration opens 1, 2, 4, ... streams through
the engine's one interface (`realtime.serving.TranscriptionEngine`), feeds each 80 ms per round as a live client
would, waits until every stream has decoded it, and closes them. The engine records every step's duration and
batch size (`EngineStats.step_fixed_seconds`, `.step_seconds_per_stream`), so the line comes from the same fit that
live traffic refines later. An engine step's cost does not depend on what the audio says, so noise measures it.

It stops doubling once a size's median step passes half of `--max-step-ms` (after three sizes, the fewest a line is
fitted through; the line extrapolates beyond), once one passes the limit itself, or at the server's session limit. It
never leaves its streams open, and a failure only logs: a server that cannot calibrate starts as it did before, with
no line.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from realtime.serving import AdmissionError, StreamFailed, TranscriptionEngine

logger = logging.getLogger(__name__)

TOKEN_SECONDS = 0.08  # one decode step's audio: the unit a live client's stream advances by


class CalibrationError(RuntimeError):
    """The engine refused, stalled on or failed a calibration stream."""


@dataclass
class CalibrationReport:
    sizes: list[int] = field(default_factory=list)  # the stream counts run, in order
    median_step_ms: list[float] = field(default_factory=list)  # the median step while each size ran
    fixed_ms: float = 0.0  # the engine's fitted line afterwards (0.0, 0.0: none)
    per_stream_ms: float = 0.0
    seconds: float = 0.0

    def line(self) -> str:
        runs = ", ".join(f"{n}: {ms:.1f} ms" for n, ms in zip(self.sizes, self.median_step_ms))
        fit = (f"{self.fixed_ms:.2f} ms + {self.per_stream_ms:.3f} ms a stream" if self.per_stream_ms > 0
               else "no line (too few batch sizes)")
        return f"step cost calibrated in {self.seconds:.1f} s: {fit} (median step by streams: {runs})"


def calibrate_step_cost(engine: TranscriptionEngine, *, limit_ms: float, max_streams: int, rounds: int = 6,
                        round_timeout_s: float = 10.0) -> CalibrationReport:
    """Run paced noise through `engine` at doubling stream counts (see the module docstring). Blocking: call it
    before serving (or from a worker thread). Raises CalibrationError when a round does not drain in time or a
    stream fails; its streams are closed either way."""
    t0 = time.monotonic()
    report = CalibrationReport()
    rate = engine.config.audio.sampling_rate
    chunk = int(round(TOKEN_SECONDS * rate))
    noise = (np.random.default_rng(0).standard_normal(chunk) * 1e-3).astype(np.float32)  # a quiet microphone
    n = 1
    while n <= max_streams:
        before = engine.stats().steps
        _run_size(engine, n, noise, rounds, round_timeout_s)
        st = engine.stats()
        ran = st.steps - before
        steps = st.step_seconds[-ran:] if ran > 0 else []
        median_ms = statistics.median(steps) * 1000 if steps else 0.0
        report.sizes.append(n)
        report.median_step_ms.append(median_ms)
        if median_ms > limit_ms or (len(report.sizes) >= 3 and median_ms > limit_ms / 2):
            break
        n *= 2
    st = engine.stats()
    report.fixed_ms, report.per_stream_ms = st.step_fixed_seconds * 1000, st.step_seconds_per_stream * 1000
    report.seconds = time.monotonic() - t0
    return report


def _run_size(engine: TranscriptionEngine, n: int, noise: np.ndarray, rounds: int, round_timeout_s: float) -> None:
    failed: list[str] = []
    lock = threading.Lock()

    def on_event(event: object) -> None:  # engine thread: never blocks
        if isinstance(event, StreamFailed):
            with lock:
                failed.append(event.message)

    ids: list[int] = []
    try:
        for _ in range(n):
            ids.append(engine.open_stream(on_event))
        for r in range(rounds):
            for sid in ids:
                engine.push_audio(sid, noise)
            deadline = time.monotonic() + round_timeout_s
            while any(engine.pending_audio_seconds(sid) > 0 for sid in ids):
                if time.monotonic() > deadline:
                    raise CalibrationError(f"{n} calibration streams did not decode round {r + 1} within "
                                           f"{round_timeout_s:g} s")
                time.sleep(0.0005)
            with lock:
                if failed:
                    raise CalibrationError(f"a calibration stream failed: {failed[0]}")
    except AdmissionError as exc:
        raise CalibrationError(f"the engine refused calibration stream {len(ids) + 1} of {n}: {exc}") from exc
    finally:
        for sid in ids:
            engine.close_stream(sid)


def calibrate_or_warn(engine: TranscriptionEngine, *, limit_ms: float, max_streams: int) -> CalibrationReport | None:
    """`calibrate_step_cost`, logging its result; a failure is logged and the server starts without a line."""
    try:
        report = calibrate_step_cost(engine, limit_ms=limit_ms, max_streams=max_streams)
    except Exception as exc:  # calibration is an optimisation of admission: it never stops the server
        logger.warning("step-cost calibration failed (%s: %s): admission has no line until clients have run",
                       type(exc).__name__, exc)
        return None
    logger.info(report.line())
    return report
