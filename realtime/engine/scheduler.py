"""Chooses the streams that run in the next step.

Streams join through the prompt-prefix cache, so they are decode rows from the start (their
remaining prompt positions included). Every stream with at least one decodable 80 ms audio token
runs (one LM position, or a speculative round). When more streams are ready than a step takes,
the ones that waited longest go first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .stream import EngineStream


@dataclass
class StepPlan:
    decode: list[EngineStream] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.decode)


@dataclass
class Scheduler:
    max_batch: int
    mel_frames_per_token: int

    def plan(self, streams: list[EngineStream], step: int) -> StepPlan:
        ready = [s for s in streams if not s.done and not s.is_finished() and s.has_frame(self.mel_frames_per_token)]
        by_wait = lambda s: (s.last_scheduled_step, s.stream_id)  # noqa: E731
        plan = StepPlan(sorted(ready, key=by_wait)[: self.max_batch])
        for s in plan.decode:
            s.last_scheduled_step = step
        return plan
