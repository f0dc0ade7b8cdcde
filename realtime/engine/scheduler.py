"""Chooses the streams that run in the next step.

Streams that join through the prompt-prefix cache are decode rows from the start. Streams that
need an eager prefill are prefilled once their whole prompt of audio has arrived (a few per step,
to bound the step time). Every stream past that with at least one decodable 80 ms audio token runs
one LM position. When more streams are ready than a step takes, the ones that waited longest go first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .stream import EngineStream


@dataclass
class StepPlan:
    prefill: list[EngineStream] = field(default_factory=list)
    decode: list[EngineStream] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode)


@dataclass
class Scheduler:
    max_batch: int
    max_prefills_per_step: int
    mel_frames_per_token: int

    def plan(self, streams: list[EngineStream], step: int) -> StepPlan:
        plan = StepPlan()
        ready_prefill, ready_decode = [], []
        for s in streams:
            if s.done or s.is_finished():
                continue
            if s.eager_prefill and s.lm_pos == 0:
                if s.audio_done + s.audio_tokens_ready(self.mel_frames_per_token) >= s.prompt_len:
                    ready_prefill.append(s)
            elif s.audio_done > s.lm_pos or s.audio_tokens_ready(self.mel_frames_per_token) > 0:
                ready_decode.append(s)
        by_wait = lambda s: (s.last_scheduled_step, s.stream_id)  # noqa: E731
        plan.prefill = sorted(ready_prefill, key=by_wait)[: self.max_prefills_per_step]
        plan.decode = sorted(ready_decode, key=by_wait)[: self.max_batch]
        for s in plan.prefill + plan.decode:
            s.last_scheduled_step = step
        return plan
