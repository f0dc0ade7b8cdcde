"""Prometheus text-format metrics, written by hand (no client library).

Everything is updated on the event-loop thread, so no locks are needed; the engine's step times
come from `engine.stats()` (polled by the server) rather than from the engine thread.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.08, 0.1, 0.16, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
_STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0)
_SESSION_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 10800)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


@dataclass
class Counter:
    name: str
    help: str
    labelnames: tuple[str, ...] = ()
    values: dict[tuple[str, ...], float] = field(default_factory=dict)
    kind: str = "counter"

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        if amount < 0 and self.kind == "counter":
            raise ValueError("counters only go up")
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def get(self, *labels: str) -> float:
        return self.values.get(labels, 0.0)

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        if not self.values and not self.labelnames:
            out.append(f"{self.name} 0")
        for labels, v in sorted(self.values.items()):
            out.append(f"{self.name}{_labels(self.labelnames, labels)} {_num(v)}")
        return out


@dataclass
class Gauge(Counter):
    kind: str = "gauge"

    def set(self, value: float, *labels: str) -> None:
        self.values[labels] = float(value)

    def dec(self, *labels: str, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) - amount


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # last = +Inf

    def observe(self, value: float) -> None:
        if not math.isfinite(value):
            return
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, c in zip(self.buckets + (math.inf,), self.counts):
            cumulative += c
            out.append(f'{self.name}_bucket{{le="{_num(bound)}"}} {cumulative}')
        out.append(f"{self.name}_sum {_num(self.total)}")
        out.append(f"{self.name}_count {self.n}")
        return out


class Metrics:
    """All server metrics; `render()` gives the /metrics body."""

    def __init__(self) -> None:
        self.sessions_active = Gauge("streamscribe_sessions_active", "Websocket sessions open now.")
        self.sessions_total = Counter("streamscribe_sessions_total", "Websocket sessions accepted.")
        self.sessions_by_dialect = Counter("streamscribe_sessions_by_dialect_total",
                                           "Sessions by the protocol dialect they spoke.", ("dialect",))
        self.rejected = Counter("streamscribe_connections_rejected_total",
                                "Connections refused, by reason.", ("reason",))
        self.errors = Counter("streamscribe_error_events_total", "Error events sent to clients, by code.", ("code",))
        self.tokens = Counter("streamscribe_tokens_emitted_total", "Engine tokens delivered to sessions.")
        self.keepalive_timeouts = Counter("streamscribe_keepalive_timeouts_total",
                                          "Sessions closed because the client answered no keepalive ping.")
        self.shutdown_flushed_sessions = Counter(
            "streamscribe_shutdown_flushed_sessions_total",
            "Sessions still open when a graceful shutdown's drain time ran out: the server finished their turns.")
        self.read_pauses = Counter("streamscribe_read_pauses_total",
                                   "Times a session stopped reading its socket (backpressure), by cause.", ("cause",))
        self.audio_seconds = Counter("streamscribe_audio_received_seconds_total",
                                     "Seconds of audio received from clients (at 16 kHz).")
        self.engine_streams = Gauge("streamscribe_engine_active_streams", "Streams open in the engine.")
        self.engine_steps = Gauge("streamscribe_engine_steps", "Engine steps run since start.")
        self.step_seconds = Histogram("streamscribe_engine_step_seconds", "Duration of one engine step.",
                                      _STEP_BUCKETS)
        self.recent_step = Gauge("streamscribe_engine_recent_step_seconds",
                                 "Median duration of the engine's steps in the last 2 s (0: idle); new sessions are "
                                 "refused (server_busy) above --max-step-ms.")
        self.step_cost_fixed = Gauge("streamscribe_engine_step_cost_fixed_seconds",
                                     "A step's fixed cost, fitted to the engine's steps by batch size (0: no fit yet).")
        self.step_cost_per_stream = Gauge("streamscribe_engine_step_cost_per_stream_seconds",
                                          "What each stream adds to a step, fitted likewise; with the fixed cost, the "
                                          "step admission foresees for the open sessions (--max-step-ms).")
        self.loop_lag = Gauge("streamscribe_event_loop_lag_seconds",
                              "How late the server's event loop runs a timer, median over the time of the last 2 s: "
                              "the load of the host side (websockets, audio parsing, deltas); new sessions are refused "
                              "(server_busy) above --max-loop-lag-ms.")
        self.loop_lag_worst = Gauge("streamscribe_event_loop_lag_worst_seconds",
                                    "The largest event-loop lag since the server started.")
        self.emission_delay = Histogram(
            "streamscribe_emission_delay_seconds",
            "Wall time from the arrival of the audio a delta covers (its audio_end_ms) to sending the delta.",
            _LATENCY_BUCKETS)
        self.spec_drafted = Gauge("streamscribe_spec_drafted_tokens", "Draft tokens proposed (speculative decoding).")
        self.spec_accepted = Gauge("streamscribe_spec_accepted_tokens", "Draft tokens accepted by the target.")
        self.spec_acceptance = Gauge("streamscribe_spec_acceptance_rate", "Accepted / drafted tokens.")
        self.spec_rounds = Gauge("streamscribe_spec_rounds",
                                 "Verify steps of a stream that carried at least one draft.")
        self.spec_mean_length = Gauge("streamscribe_spec_mean_acceptance_length",
                                      "Tokens a stream gets from one verify step with drafts: 1 + accepted / rounds.")
        self.spec_position_drafted = Gauge("streamscribe_spec_position_drafted_tokens",
                                           "Draft tokens proposed at each draft depth (0: the first draft).",
                                           ("position",))
        self.spec_position_accepted = Gauge("streamscribe_spec_position_accepted_tokens",
                                            "Draft tokens accepted at each draft depth.", ("position",))
        self.spec_position_acceptance = Gauge("streamscribe_spec_position_acceptance_rate",
                                              "Accepted / drafted tokens at each draft depth.", ("position",))
        self.session_seconds = Histogram("streamscribe_session_duration_seconds", "Length of finished sessions.",
                                         _SESSION_BUCKETS)
        self.http_requests = Counter("streamscribe_http_transcriptions_total",
                                     "File transcription requests (POST /v1/audio/transcriptions), by status.",
                                     ("status",))
        self.http_active = Gauge("streamscribe_http_transcriptions_active", "File transcriptions running now.")
        self.http_audio_seconds = Counter("streamscribe_http_transcribed_audio_seconds_total",
                                          "Seconds of uploaded audio transcribed (at 16 kHz).")
        self._steps_seen = 0

    def record_engine_stats(self, stats: object) -> None:
        """Fold an `EngineStats` snapshot in: only the steps not seen in an earlier snapshot."""
        self.engine_streams.set(getattr(stats, "active_streams", 0))
        steps = getattr(stats, "steps", 0)
        self.engine_steps.set(steps)
        self.recent_step.set(getattr(stats, "recent_step_seconds", 0.0))
        self.step_cost_fixed.set(getattr(stats, "step_fixed_seconds", 0.0))
        self.step_cost_per_stream.set(getattr(stats, "step_seconds_per_stream", 0.0))
        recent = list(getattr(stats, "step_seconds", ()) or ())
        new = max(0, min(len(recent), steps - self._steps_seen))
        for s in recent[len(recent) - new:]:
            self.step_seconds.observe(float(s))
        self._steps_seen = max(self._steps_seen, steps)
        # cumulative counters of speculative decoding (zero when it is off or the engine lacks it)
        self.spec_drafted.set(getattr(stats, "spec_drafted", 0))
        self.spec_accepted.set(getattr(stats, "spec_accepted", 0))
        self.spec_acceptance.set(getattr(stats, "spec_acceptance_rate", 0.0))
        self.spec_rounds.set(getattr(stats, "spec_rounds", 0))
        self.spec_mean_length.set(getattr(stats, "spec_mean_acceptance_length", 0.0))
        per_depth = zip(getattr(stats, "spec_drafted_per_position", ()),
                        getattr(stats, "spec_accepted_per_position", ()),
                        getattr(stats, "spec_acceptance_per_position", ()))
        for i, (d, a, rate) in enumerate(per_depth):
            self.spec_position_drafted.set(d, str(i))
            self.spec_position_accepted.set(a, str(i))
            self.spec_position_acceptance.set(rate, str(i))

    def render(self) -> str:
        lines: list[str] = []
        # every metric attribute, in the order __init__ made them (a hand-kept list once left one out)
        for m in vars(self).values():
            if isinstance(m, (Counter, Gauge, Histogram)):
                lines.extend(m.render())
        return "\n".join(lines) + "\n"
