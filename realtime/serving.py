"""The one narrow interface between the websocket service and an engine.

`stream_server` sees only what is in this file: `TranscriptionEngine` (open / push / finish /
close streams, thread-safe and non-blocking), the events an engine emits, and its errors. Engines
run their own thread; `on_event` callbacks are invoked from that thread, in order per stream, and
must not block (the server hands them to its event loop).

Lifecycle of a stream: `open_stream` -> any number of `push_audio` -> `finish_stream` -> token
events -> exactly one `StreamDone` (or one `StreamFailed`). `close_stream` at any time aborts it and
frees everything; no event follows a close.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Literal, Protocol, Union

import numpy as np
from typing_extensions import TypeIs

from .config import ModelConfig


class AdmissionError(RuntimeError):
    """The engine cannot take another stream now (capacity); `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StreamError(ValueError):
    """A request about a stream that is invalid (unknown id, audio after finish, bad samples...)."""


@dataclass(frozen=True, slots=True)  # one a stream a step: slots make it ~0.4 us cheaper to build
class StreamToken:
    stream_id: int
    token_id: int
    text: str  # text delta ("" for control tokens and for bytes of an unfinished character)
    position: int  # LM position of the token
    audio_end_ms: int  # stream audio (ms from its first sample) the model had seen when it decided


@dataclass(frozen=True)
class StreamDone:
    stream_id: int
    text: str  # the whole transcript (== concatenation of the token texts)
    prompt_tokens: int
    completion_tokens: int
    ended_by_eos: bool
    truncated: bool = False  # ended because the stream reached the engine's maximum session length


@dataclass(frozen=True)
class StreamFailed:
    stream_id: int
    message: str


StreamEvent = Union[StreamToken, StreamDone, StreamFailed]
EventCallback = Callable[[StreamEvent], None]


@dataclass
class EngineStats:
    active_streams: int = 0
    max_streams: int = 0
    steps: int = 0
    # durations of the most recent steps (at most 4096), the last being step number `steps`; stats() never
    # clears them, so any number of readers can each fold in only the steps they have not seen
    step_seconds: list[float] = field(default_factory=list)
    tokens_emitted: int = 0
    # the engine's current load: the median duration of the steps that ended in the last `RecentSteps.window_s`
    # seconds, 0.0 when none did (an idle engine; the sequential reference engine never reports one). A batched
    # step decodes one token, 80 ms of audio, for every stream with audio: past 80 ms live streams fall behind
    recent_step_seconds: float = 0.0
    # the median number of streams those steps decoded (0.0 when idle; shown by /health beside the step)
    recent_step_streams: float = 0.0
    # a step's cost as a line, fixed + per stream × streams, fitted to the engine's last steps (RecentSteps.cost_line;
    # both 0.0 until steps of enough batch sizes ran): admission foresees with it the step of every open session
    step_fixed_seconds: float = 0.0
    step_seconds_per_stream: float = 0.0
    # speculative decoding (all 0 when it is off); counters since the engine started
    spec_rounds: int = 0  # verify steps of a stream that carried at least one draft
    spec_drafted: int = 0  # draft tokens proposed
    spec_accepted: int = 0  # draft tokens accepted by the target
    spec_drafted_per_position: list[int] = field(default_factory=list)  # [i]: drafts at depth i
    spec_accepted_per_position: list[int] = field(default_factory=list)  # [i]: accepted at depth i

    @property
    def spec_acceptance_rate(self) -> float:
        """accepted / drafted."""
        return self.spec_accepted / self.spec_drafted if self.spec_drafted else 0.0

    @property
    def spec_acceptance_per_position(self) -> list[float]:
        """accepted / drafted at each draft depth (0.0 where none was drafted)."""
        return [a / d if d else 0.0 for a, d in zip(self.spec_accepted_per_position, self.spec_drafted_per_position)]

    @property
    def spec_mean_acceptance_length(self) -> float:
        """Tokens per drafting verify step: 1 + accepted / rounds."""
        return 1.0 + self.spec_accepted / self.spec_rounds if self.spec_rounds else 0.0


LOAD_WINDOW_S = 2.0  # how far back an engine's current load looks (RecentSteps)


class RecentSteps:
    """The durations of an engine's steps that ended in the last `window_s` seconds (at most `keep` of them): its
    current load, `EngineStats.recent_step_seconds`; and its step cost as a line fitted to the last `history` steps
    (`cost_line`). The caller passes the clock (`time.monotonic()`), so that tests can drive it."""

    def __init__(self, window_s: float = LOAD_WINDOW_S, keep: int = 512, history: int = 2048) -> None:
        self.window_s = window_s
        self._steps: deque[tuple[float, float, int]] = deque(maxlen=keep)  # (end time, seconds, streams)
        self._history: deque[tuple[int, float]] = deque(maxlen=history)  # (streams, seconds), for cost_line
        self._line: tuple[float, float] | None = None  # cost_line's last answer, refitted every REFIT steps
        self._since_fit = 0

    REFIT = 32  # steps between two fits: admission asks for the line per connection, a fit reads `history` steps

    def add(self, seconds: float, now: float, streams: int = 1) -> None:
        self._steps.append((now, seconds, streams))
        self._history.append((streams, seconds))
        self._since_fit += 1

    def cost_line(self) -> tuple[float, float]:
        """`fit_cost_line` of the last steps, refitted at most every REFIT steps, or at every new step while there is
        no line yet (so that the first line is there as soon as the steps allow it: a start-up calibration's)."""
        if self._line is None or self._since_fit >= self.REFIT or (self._line == (0.0, 0.0) and self._since_fit):
            self._line, self._since_fit = self.fit_cost_line(), 0
        return self._line

    def fit_cost_line(self, min_sizes: int = 3, min_each: int = 2, max_points: int = 24) -> tuple[float, float]:
        """(fixed seconds, seconds per stream) of a step: a Theil-Sen line (the median of the slopes between every two
        points, then the median intercept) through the median step of each batch size among the last `history` steps,
        both clamped at 0. Medians twice over, so that neither a pause of the host nor one odd batch size tilts it.
        (0.0, 0.0) while fewer than `min_sizes` batch sizes have `min_each` steps: a line through fewer follows
        noise. At most `max_points` sizes, evenly spread over those seen: the fit runs under the engine's lock, and
        512 sizes (a GPU's) would make 130,000 slopes (13 ms on the 2-core box, against 0.4 ms for 24)."""
        by_size: dict[int, list[float]] = {}
        for n, sec in self._history:
            by_size.setdefault(n, []).append(sec)
        points = sorted((n, statistics.median(v)) for n, v in by_size.items() if len(v) >= min_each)
        if len(points) < min_sizes:
            return 0.0, 0.0
        if len(points) > max_points:
            points = [points[round(i * (len(points) - 1) / (max_points - 1))] for i in range(max_points)]
        slope = max(statistics.median((tj - ti) / (nj - ni) for k, (ni, ti) in enumerate(points)
                                      for nj, tj in points[k + 1:]), 0.0)
        return max(statistics.median(t - slope * n for n, t in points), 0.0), slope

    def _prune(self, now: float) -> None:
        while self._steps and self._steps[0][0] < now - self.window_s:
            self._steps.popleft()

    def median(self, now: float) -> float:
        self._prune(now)
        return statistics.median(s for _, s, _ in self._steps) if self._steps else 0.0

    def median_streams(self, now: float) -> float:
        """The median number of streams the window's steps decoded (0.0 when none ran)."""
        self._prune(now)
        return float(statistics.median(n for _, _, n in self._steps)) if self._steps else 0.0


class TranscriptionEngine(Protocol):
    config: ModelConfig
    model_name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def open_stream(self, on_event: EventCallback, *, delay_ms: int | None = None) -> int:
        """A new stream id; raises AdmissionError when full, ConfigError for a bad delay."""
        ...

    def push_audio(self, stream_id: int, samples: np.ndarray) -> None:
        """Queue 16 kHz mono float32 samples (validated: StreamError / AudioError)."""
        ...

    def finish_stream(self, stream_id: int) -> None: ...

    def close_stream(self, stream_id: int) -> None: ...

    def pending_audio_seconds(self, stream_id: int) -> float:
        """Audio queued for the stream that the engine has not decoded yet (for backpressure)."""
        ...

    def stats(self) -> EngineStats: ...


class FitsStepCost(Protocol):
    """An engine that batches streams into steps and reports the line fitted to them (`EngineStats.
    step_fixed_seconds`, `.step_seconds_per_stream`): the server calibrates such an engine at start-up
    (`stream_server/calibration.py`). The sequential reference engine decodes one stream at a time and fits none."""

    fits_step_cost: ClassVar[Literal[True]] = True


def fits_step_cost(engine: object) -> TypeIs[FitsStepCost]:
    """True only if the engine's class declares the capability (the flag is exactly True)."""
    return getattr(type(engine), "fits_step_cost", False) is True
