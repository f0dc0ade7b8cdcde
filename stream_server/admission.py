"""Load-based admission (`--max-step-ms`): whether one more session or upload would overload the engine.

A batched step decodes 80 ms of audio for every stream, so its duration is the service's load: past 80 ms live
streams fall behind. Two checks, both against `--max-step-ms`:
- **measured**: the engine's median step of its last 2 s (`EngineStats.recent_step_seconds`);
- **foreseen**: the step with every open session and this one, from the line the engine fits to its own step
  times (`EngineStats.step_fixed_seconds` + `.step_seconds_per_stream` × streams: a robust line through the median
  step of each batch size it ran). The measured figure lags: sessions that just connected are not decoding yet, so
  a burst would all be admitted against the load from before it. The server's count of open sessions does not lag.

Until the engine has run steps of enough batch sizes there is no line and only the measured check applies, so the
server calibrates the engine before it listens (`calibration.py`; with `--no-calibrate` a server that has not yet
decoded admits a first burst whole). The line is remembered while the engine idles. The recent step
divided by its streams would be known sooner, but it counts the step's fixed cost as every stream's: on the 2-core
CPU box it refused 8 of 12 streams starting on a cold server, which carries 28 (thirty-ninth session).
"""

from __future__ import annotations

from dataclasses import dataclass

from realtime.serving import LOAD_WINDOW_S, EngineStats


@dataclass
class LoadAdmission:
    limit_ms: float  # --max-step-ms; 0 admits everyone
    _ms_fixed: float = 0.0  # the last fitted line: a step's fixed cost
    _ms_per_stream: float = 0.0  # and what each stream adds; 0.0 = no line yet

    def foreseen_ms(self, streams: int) -> float | None:
        """The step the last fitted line foresees for `streams` streams (None before any line)."""
        return self._ms_fixed + self._ms_per_stream * streams if self._ms_per_stream > 0 else None

    def refusal(self, stats: EngineStats, open_sessions: int) -> str | None:
        """Why one more stream, beside the server's `open_sessions` (sessions and uploads), would overload the
        engine, or None."""
        if not self.limit_ms:
            return None
        recent_ms = stats.recent_step_seconds * 1000
        if recent_ms > self.limit_ms:
            return (f"The engine is at capacity: its steps take {recent_ms:.0f} ms for each 80 ms of audio (median of "
                    f"the last {LOAD_WINDOW_S:g} s; the limit is {self.limit_ms:g} ms, --max-step-ms); try again later")
        if stats.step_seconds_per_stream > 0:
            self._ms_fixed, self._ms_per_stream = stats.step_fixed_seconds * 1000, stats.step_seconds_per_stream * 1000
        foreseen = self.foreseen_ms(open_sessions + 1)
        if foreseen is not None and foreseen > self.limit_ms:
            return (f"The engine is near capacity: with the {open_sessions} open sessions and this one a step would "
                    f"take about {foreseen:.0f} ms ({self._ms_fixed:.1f} ms + {self._ms_per_stream:.2f} ms a stream, "
                    f"fitted to its steps; the limit is {self.limit_ms:g} ms, --max-step-ms); try again shortly")
        return None
