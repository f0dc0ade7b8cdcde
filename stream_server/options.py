"""Session options both dialects accept beyond their reference protocols.

`transcription_delay_ms` picks the model's delay for the next utterance/item: one of
`realtime.config.ALLOWED_DELAYS_MS` (multiples of 80 ms from 80 to 1200, and 2400). OpenAI's
`transcription.delay` names map onto it: minimal 80, low 240, medium 480, high 960, xhigh 2400.
"""

from __future__ import annotations

from realtime.config import ALLOWED_DELAYS_MS

from .events import ProtocolError

OPENAI_DELAY_NAMES: dict[str, int] = {"minimal": 80, "low": 240, "medium": 480, "high": 960, "xhigh": 2400}


def parse_delay_ms(value: object, param: str) -> int:
    allowed = ", ".join(map(str, ALLOWED_DELAYS_MS))
    ok = not isinstance(value, bool) and (isinstance(value, int) or (isinstance(value, float) and value.is_integer()))
    if not ok or int(value) not in ALLOWED_DELAYS_MS:  # type: ignore[arg-type]
        raise ProtocolError("invalid_value", f"transcription_delay_ms must be one of {allowed} (ms), got {value!r}",
                            param=param)
    return int(value)


def parse_delay_name(value: object, param: str) -> int:
    if not isinstance(value, str) or value not in OPENAI_DELAY_NAMES:
        raise ProtocolError("invalid_value", f"delay must be one of {', '.join(OPENAI_DELAY_NAMES)}, got {value!r}",
                            param=param)
    return OPENAI_DELAY_NAMES[value]
