"""Load-based admission (`stream_server/admission.py`, --max-step-ms): the engine's recent step, foreseen with the
sessions admitted in the last window, decides; a burst is cut where the foreseen step passes the limit."""

from __future__ import annotations

from realtime.serving import LOAD_WINDOW_S, EngineStats
from stream_server.admission import LoadAdmission


def _stats(step_ms: float, streams: float, line_ms: tuple[float, float] = (0.0, 0.0)) -> EngineStats:
    return EngineStats(active_streams=int(streams), max_streams=64, steps=100, step_seconds=[],
                       tokens_emitted=0, recent_step_seconds=step_ms / 1000, recent_step_streams=streams,
                       step_fixed_seconds=line_ms[0] / 1000, step_seconds_per_stream=line_ms[1] / 1000)


def _admitted(adm: LoadAdmission, stats: EngineStats, now: float, tries: int = 100) -> int:
    n = 0
    while n < tries and adm.refusal(stats, now) is None:
        n += 1
    return n


def test_a_burst_is_cut_where_the_foreseen_step_passes_the_limit() -> None:
    adm = LoadAdmission(limit_ms=64.0)
    busy = _stats(20.0, 4)  # 5 ms a stream: 4 + 8 = 12 streams foreseen at 60 ms, a 13th would make 65
    assert _admitted(adm, busy, now=0.0) == 8
    why = adm.refusal(busy, 0.5)
    assert why is not None and "near capacity" in why and "8 sessions admitted" in why and "65 ms" in why
    assert adm.admitted_recently(0.5) == 8
    # once the window has passed, the engine's own figures show whether they came; here the load did not change
    assert _admitted(adm, busy, now=LOAD_WINDOW_S + 0.01) == 8
    # later arrivals spread over the window count only while they are inside it
    adm = LoadAdmission(limit_ms=64.0)
    assert sum(_admitted(adm, busy, now=t, tries=1) for t in (0.0, 0.7, 1.4, 2.1, 2.8, 3.5)) == 6


def test_the_fitted_line_says_what_one_more_stream_adds() -> None:
    """A GPU-like engine: 4 ms a step whatever its size, 0.1 ms more per stream. The ratio (4 ms / 2 streams) would
    allow 30 more; the line allows 600 (4 + 600 x 0.1 = 64 ms). Idle, the line's fixed cost is the step."""
    adm = LoadAdmission(limit_ms=64.0)
    line = _stats(4.2, 2, line_ms=(4.0, 0.1))
    assert _admitted(adm, line, now=0.0, tries=1000) == 598  # 4.2 + 598 x 0.1 = 64.0
    adm = LoadAdmission(limit_ms=64.0)
    assert _admitted(adm, _stats(4.2, 2), now=0.0, tries=1000) == 28  # without the line: 2.1 x 30 = 63 ms
    adm = LoadAdmission(limit_ms=64.0)
    assert adm.refusal(line, now=0.0, admit=False) is None  # learnt
    assert _admitted(adm, _stats(0.0, 0), now=5.0, tries=1000) == 600  # idle: 4 + 600 x 0.1 = 64 ms


def test_the_cost_of_a_stream_is_remembered_while_the_engine_idles() -> None:
    adm = LoadAdmission(limit_ms=64.0)
    assert _admitted(adm, _stats(0.0, 0), now=0.0) == 100  # never seen a step: no cost known, nobody refused
    adm = LoadAdmission(limit_ms=64.0)
    assert adm.refusal(_stats(10.0, 2), now=0.0) is None  # 5 ms a stream, learnt
    idle = _stats(0.0, 0)
    assert _admitted(adm, idle, now=10.0) == 12  # 12 x 5 = 60 ms; the 13th would make 65


def test_over_the_limit_refuses_and_peeking_counts_nobody() -> None:
    adm = LoadAdmission(limit_ms=64.0)
    why = adm.refusal(_stats(90.0, 30), now=0.0)
    assert why is not None and "at capacity" in why and "90 ms" in why and "--max-step-ms" in why
    light = _stats(10.0, 10)  # 1 ms a stream
    for _ in range(80):
        assert adm.refusal(light, now=1.0, admit=False) is None  # an upload's head: checked, not admitted
    assert adm.admitted_recently(1.0) == 0
    assert _admitted(adm, light, now=1.0) == 54  # 10 + 54 = 64 streams at 1 ms
    assert _admitted(LoadAdmission(limit_ms=0.0), _stats(500.0, 1), now=0.0) == 100  # --max-step-ms 0


def test_sessions_that_already_ended_add_no_load() -> None:
    adm = LoadAdmission(limit_ms=64.0)
    busy = _stats(20.0, 4)  # 5 ms a stream: room for 8
    assert _admitted(adm, busy, now=0.0) == 8
    assert adm.refusal(busy, now=0.1, open_sessions=8) is not None  # all 8 still open
    assert adm.refusal(busy, now=0.1, open_sessions=3) is None  # 5 of them ended: 3 + this one fit
