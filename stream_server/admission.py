"""Load-based admission (`--max-step-ms`): whether one more session or upload would overload the engine.

A batched step decodes 80 ms of audio for every stream, so its duration is the service's load: past 80 ms live
streams fall behind. The engine reports the median step of its last 2 s and how many streams those steps decoded
(`EngineStats.recent_step_seconds`, `.recent_step_streams`). That figure lags: sessions admitted in the last 2 s may
not be decoding yet, so a burst that connects at once would all be admitted against the load from before it.
So this foresees the step with them: the recent step plus what one stream adds to a step, times those admitted
within the window and the new one.

What one stream adds is the slope of the engine's fitted step cost (`EngineStats.step_seconds_per_stream`: a line
over the median step of each batch size it ran). Until steps of enough batch sizes ran there is no line, and the
recent step divided by its streams stands in: it also counts the step's fixed cost, so it overestimates (much, on a
GPU at small batches), and a burst onto a lightly loaded engine is then admitted in waves, one per window (the
refused get `server_busy`, "try again shortly"). Both are remembered while the engine idles. A server that has never
decoded knows no cost and admits everyone, as before this existed.
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
    _ms_per_stream: float = 0.0  # the last known cost one stream adds to a step; 0.0 = never seen one decode
    _ms_fixed: float = 0.0  # the fitted step's fixed cost (0.0 without a fit): an idle engine's step

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
        elif streams > 0 and recent_ms > 0:  # no line yet: the recent ratio, fixed cost included
            self._ms_fixed, self._ms_per_stream = 0.0, recent_ms / streams
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
