"""Event-loop lag (`--max-loop-lag-ms`): how late the server's event loop runs a timer, the load of the service's host
side.

One server process reads every session's websocket, parses its JSON and base64 audio, and sends its deltas on one
event loop, beside an engine thread that needs the same interpreter lock for its own host work. Past a few hundred
streams on a GPU (`docs/benchmarks.md`, issue 4) that host work, not the engine's step, is what falls behind: the
steps stay short while every session's audio and deltas wait in line. The engine's step time cannot see that; a
timer's lateness can. A task sleeps `interval_s` again and again and records how much later than asked it woke up.

`LoopLag` keeps those samples for the last `window_s`; the server refuses new sessions and uploads (`server_busy`)
while their median over time is over the limit, shows it on `/health` and exports it on `/metrics`. Like the
measured step, this lags a burst that arrives all at once (the sessions it would overload are not sending yet); it
stops the next ones, and it is the signal to run more processes (`--workers`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from realtime.serving import LOAD_WINDOW_S


@dataclass
class LoopLag:
    interval_s: float = 0.05  # how long each probe sleeps: short enough for a 2 s window of 40 samples
    window_s: float = LOAD_WINDOW_S
    _samples: deque[tuple[float, float]] = field(default_factory=deque)  # (monotonic time woken, lag in seconds)
    worst_s: float = 0.0  # the largest lag since start (/health: a stall the median hides)

    def record(self, now: float, lag_s: float) -> None:
        lag_s = max(0.0, lag_s)  # a timer never fires early by more than the clock's rounding
        self._samples.append((now, lag_s))
        self.worst_s = max(self.worst_s, lag_s)
        while self._samples and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()

    def recent_s(self, now: float) -> float:
        """Median lag over the time of the last `window_s` before `now` (0.0 without samples): each sample weighs
        the time it took (`interval_s` + its lag). A late loop takes fewer samples, so a median over samples would
        let a few free moments outvote a second of lateness."""
        recent = sorted(lag for t, lag in self._samples if t >= now - self.window_s)
        half = sum(self.interval_s + lag for lag in recent) / 2
        covered = 0.0
        for lag in recent:
            covered += self.interval_s + lag
            if covered >= half:
                return lag
        return 0.0

    async def run(self) -> None:
        """Probe the running loop until cancelled."""
        while True:
            asked = time.monotonic()  # the clock admission reads `recent_s` with (the loop's own, by default)
            await asyncio.sleep(self.interval_s)
            woke = time.monotonic()
            self.record(woke, woke - asked - self.interval_s)


def loop_lag_refusal(lag: LoopLag, now: float, limit_ms: float) -> str | None:
    """Why the host side cannot take one more session (its loop runs timers more than `limit_ms` late), or None."""
    if not limit_ms:
        return None
    recent_ms = lag.recent_s(now) * 1000
    if recent_ms <= limit_ms:
        return None
    return (f"The server is overloaded: its event loop runs {recent_ms:.0f} ms late (median of the last "
            f"{lag.window_s:g} s; the limit is {limit_ms:g} ms, --max-loop-lag-ms); try again later or another "
            "server process (--workers)")
