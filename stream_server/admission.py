"""Load-based admission (`--max-step-ms`): whether one more session or upload would overload the engine.

A batched step decodes 80 ms of audio for every stream, so its duration is the service's load: past 80 ms live
streams fall behind. The engine reports the median step of its last 2 s and how many streams those steps decoded
(`EngineStats.recent_step_seconds`, `.recent_step_streams`). That figure lags: sessions admitted in the last 2 s may
not be decoding yet, so a burst that connects at once would all be admitted against the load from before it.
So this foresees the step with them: the recent step plus what one stream adds to a step, times those admitted
within the window (and still open) and the new one.

What one stream adds is the slope of the engine's fitted step cost (`EngineStats.step_seconds_per_stream`: a robust
line through the median step of each batch size it ran), remembered while the engine idles. Until steps of enough
batch sizes ran there is no line and nothing is foreseen: a server that has not yet decoded admits a first burst
whole, as before this existed. The recent step divided by its streams would be known sooner, but it also counts the
step's fixed cost: on the 2-core CPU box it refused 8 of 12 streams starting on a cold server, which carries 28.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from realtime.serving import LOAD_WINDOW_S, EngineStats


@dataclass
class LoadAdmission:
    limit_ms: float  # --max-step-ms; 0 admits everyone
    window_s: float = LOAD_WINDOW_S
    _admitted: deque[float] = field(default_factory=deque)  # admission times within the window
    _ms_per_stream: float = 0.0  # the last fitted cost one stream adds to a step; 0.0 = no line yet
    _ms_fixed: float = 0.0  # the fitted step's fixed cost: an idle engine's step

    def admitted_recently(self, now: float) -> int:
        while self._admitted and self._admitted[0] < now - self.window_s:
            self._admitted.popleft()
        return len(self._admitted)

    def refusal(self, stats: EngineStats, now: float, *, admit: bool = True, open_sessions: int | None = None
                ) -> str | None:
        """Why one more stream would overload the engine, or None; with `admit`, None also counts it as admitted
        at `now` (an upload is checked at its head without, and admitted after its body). `open_sessions` (the
        server's count, sessions and uploads) bounds those admitted in the window that still count: one that
        already ended adds no load."""
        if not self.limit_ms:
            return None
        recent_ms, streams = stats.recent_step_seconds * 1000, stats.recent_step_streams
        if recent_ms > self.limit_ms:
            return (f"The engine is at capacity: its steps take {recent_ms:.0f} ms for each 80 ms of audio (median of "
                    f"the last {self.window_s:g} s; the limit is {self.limit_ms:g} ms, --max-step-ms); try again later")
        if stats.step_seconds_per_stream > 0:  # the fitted line
            self._ms_fixed, self._ms_per_stream = stats.step_fixed_seconds * 1000, stats.step_seconds_per_stream * 1000
        pending = self.admitted_recently(now)
        if open_sessions is not None:
            pending = min(pending, open_sessions)
        now_ms = recent_ms if streams > 0 else self._ms_fixed
        foreseen = now_ms + self._ms_per_stream * (pending + 1)
        if foreseen > self.limit_ms:
            return (f"The engine is near capacity: {streams:g} streams take {recent_ms:.0f} ms a step, and with the "
                    f"{pending} sessions admitted in the last {self.window_s:g} s and this one a step would take about "
                    f"{foreseen:.0f} ms (the limit is {self.limit_ms:g} ms, --max-step-ms); try again shortly")
        if admit:
            self._admitted.append(now)
        return None
