"""Load-based admission (`stream_server/admission.py`, --max-step-ms): the measured recent step, and the step the
engine's fitted cost line foresees with every open session and the new one; without a line only the measured one."""

from __future__ import annotations

from realtime.serving import EngineStats
from stream_server.admission import LoadAdmission


def _stats(step_ms: float, streams: float, line_ms: tuple[float, float] = (0.0, 0.0)) -> EngineStats:
    return EngineStats(active_streams=int(streams), max_streams=64, steps=100, step_seconds=[],
                       tokens_emitted=0, recent_step_seconds=step_ms / 1000, recent_step_streams=streams,
                       step_fixed_seconds=line_ms[0] / 1000, step_seconds_per_stream=line_ms[1] / 1000)


def _admitted(adm: LoadAdmission, stats: EngineStats, open_sessions: int = 0, tries: int = 1000) -> int:
    """How many more one at a time (each admitted one stays open)."""
    n = 0
    while n < tries and adm.refusal(stats, open_sessions + n) is None:
        n += 1
    return n


def test_a_burst_is_cut_where_the_foreseen_step_passes_the_limit() -> None:
    """The measured step (20 ms for 4 streams) does not yet show the sessions that just connected; the line does:
    2 + 4.5 x 13 = 60.5 ms, a 14th stream would make 65."""
    adm = LoadAdmission(limit_ms=64.0)
    busy = _stats(20.0, 4, line_ms=(2.0, 4.5))
    assert _admitted(adm, busy, open_sessions=4) == 9
    why = adm.refusal(busy, 13)
    assert why is not None and "near capacity" in why and "13 open sessions" in why and "65 ms" in why
    assert "2.0 ms + 4.50 ms a stream" in why and "--max-step-ms" in why
    assert adm.refusal(busy, 12) is None  # one left: room again
    assert adm.foreseen_ms(10) == 47.0


def test_without_a_fitted_line_only_the_measured_step_decides() -> None:
    """A cold engine, or one that ran too few batch sizes for a line: nothing is foreseen (the recent step divided
    by its streams would count the fixed cost as every stream's, and refuse far below capacity)."""
    adm = LoadAdmission(limit_ms=64.0)
    assert adm.foreseen_ms(10) is None
    assert _admitted(adm, _stats(0.0, 0)) == 1000
    assert _admitted(adm, _stats(30.0, 2), open_sessions=2) == 1000
    why = adm.refusal(_stats(90.0, 30), 30)
    assert why is not None and "at capacity" in why and "90 ms" in why and "--max-step-ms" in why
    assert _admitted(LoadAdmission(limit_ms=0.0), _stats(500.0, 1, (10.0, 10.0))) == 1000  # --max-step-ms 0


def test_the_fitted_line_is_remembered_while_the_engine_idles() -> None:
    """A GPU-like line, 4 ms a step whatever its size and 0.1 ms more per stream: a burst of hundreds fits."""
    adm = LoadAdmission(limit_ms=64.05)
    assert adm.refusal(_stats(4.2, 2, line_ms=(4.0, 0.1)), 2) is None  # learnt
    assert _admitted(adm, _stats(0.0, 0)) == 600  # idle now: 4 + 600 x 0.1 = 64 ms
