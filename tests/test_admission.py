"""Load-based admission (`stream_server/admission.py`, --max-step-ms): the engine's recent step, foreseen with the
sessions admitted in the last window by its fitted step cost, decides; a burst is cut where the foreseen step
passes the limit; without a fitted cost only the recent step does."""

from __future__ import annotations

from realtime.serving import LOAD_WINDOW_S, EngineStats
from stream_server.admission import LoadAdmission


def _stats(step_ms: float, streams: float, line_ms: tuple[float, float] = (0.0, 0.0)) -> EngineStats:
    return EngineStats(active_streams=int(streams), max_streams=64, steps=100, step_seconds=[],
                       tokens_emitted=0, recent_step_seconds=step_ms / 1000, recent_step_streams=streams,
                       step_fixed_seconds=line_ms[0] / 1000, step_seconds_per_stream=line_ms[1] / 1000)


def _admitted(adm: LoadAdmission, stats: EngineStats, now: float, tries: int = 1000, **kw) -> int:
    n = 0
    while n < tries and adm.refusal(stats, now, **kw) is None:
        n += 1
    return n


BUSY = _stats(20.0, 4, line_ms=(2.0, 4.5))  # 4.5 ms more a stream: 20 + 9 x 4.5 = 60.5 ms, a 10th makes 65


def test_a_burst_is_cut_where_the_foreseen_step_passes_the_limit() -> None:
    adm = LoadAdmission(limit_ms=64.0)
    assert _admitted(adm, BUSY, now=0.0) == 9
    why = adm.refusal(BUSY, 0.5)
    assert why is not None and "near capacity" in why and "9 sessions admitted" in why and "65 ms" in why
    assert adm.admitted_recently(0.5) == 9
    # once the window has passed, the engine's own figures show whether they came; here the load did not change
    assert _admitted(adm, BUSY, now=LOAD_WINDOW_S + 0.01) == 9
    # later arrivals spread over the window count only while they are inside it
    adm = LoadAdmission(limit_ms=64.0)
    assert sum(_admitted(adm, BUSY, now=t, tries=1) for t in (0.0, 0.7, 1.4, 2.1, 2.8, 3.5)) == 6


def test_without_a_fitted_cost_only_the_recent_step_decides() -> None:
    """A cold engine, or one that ran too few batch sizes for a line: nothing is foreseen (the recent step divided
    by its streams would count the fixed cost as every stream's, and refuse far below capacity)."""
    adm = LoadAdmission(limit_ms=64.0)
    assert _admitted(adm, _stats(0.0, 0), now=0.0) == 1000
    assert _admitted(adm, _stats(30.0, 2), now=0.0) == 1000
    why = adm.refusal(_stats(90.0, 30), now=0.0)
    assert why is not None and "at capacity" in why and "90 ms" in why and "--max-step-ms" in why


def test_the_fitted_cost_is_remembered_while_the_engine_idles() -> None:
    """A GPU-like line, 4 ms a step whatever its size and 0.1 ms more per stream: idle, its fixed cost is the step."""
    adm = LoadAdmission(limit_ms=64.05)
    assert adm.refusal(_stats(4.2, 2, line_ms=(4.0, 0.1)), now=0.0, admit=False) is None  # learnt, nobody admitted
    assert adm.admitted_recently(0.0) == 0
    assert _admitted(adm, _stats(0.0, 0), now=5.0) == 600  # 4 + 600 x 0.1 = 64 ms


def test_sessions_that_already_ended_add_no_load() -> None:
    adm = LoadAdmission(limit_ms=64.0)
    assert _admitted(adm, BUSY, now=0.0) == 9
    assert adm.refusal(BUSY, now=0.1, open_sessions=9) is not None  # all 9 still open
    assert adm.refusal(BUSY, now=0.1, open_sessions=3) is None  # 6 of them ended: 3 + this one fit
    assert _admitted(LoadAdmission(limit_ms=0.0), _stats(500.0, 1), now=0.0) == 1000  # --max-step-ms 0
