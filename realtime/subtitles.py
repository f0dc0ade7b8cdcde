"""Subtitles (SubRip, WebVTT) from word timings (`realtime.timestamps.Word`): the offline CLI's and the client's
`--srt`, the HTTP transcription endpoint's `srt` and `vtt` formats."""

from __future__ import annotations

from collections.abc import Sequence

from .timestamps import Word


def srt_time(ms: int) -> str:
    h, rest = divmod(max(0, int(ms)), 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d},{ms:03d}"


def subtitle_cues(words: Sequence[Word], *, max_chars: int = 42, max_ms: int = 6000, gap_ms: int = 800
                  ) -> list[tuple[int, int, str]]:
    """(start_ms, end_ms, text) cues: a new cue when the line would pass `max_chars` or `max_ms`, or after a pause of
    `gap_ms` (subtitle conventions: about two seconds to read a 42-character line)."""
    cues: list[tuple[int, int, str]] = []
    cur: list[Word] = []
    for w in words:
        if cur:
            text = " ".join(x.word for x in [*cur, w])
            if len(text) > max_chars or w.end_ms - cur[0].start_ms > max_ms or w.start_ms - cur[-1].end_ms > gap_ms:
                cues.append((cur[0].start_ms, cur[-1].end_ms, " ".join(x.word for x in cur)))
                cur = []
        cur.append(w)
    if cur:
        cues.append((cur[0].start_ms, cur[-1].end_ms, " ".join(x.word for x in cur)))
    return cues


def format_srt(cues: Sequence[tuple[int, int, str]]) -> str:
    """A SubRip file's text: numbered cues from 1, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after each."""
    return "".join(f"{i}\n{srt_time(a)} --> {srt_time(b)}\n{text}\n\n" for i, (a, b, text) in enumerate(cues, 1))


def to_srt(words: Sequence[Word]) -> str:
    return format_srt(subtitle_cues(words))


def vtt_time(ms: int) -> str:
    return srt_time(ms).replace(",", ".")


def format_vtt(cues: Sequence[tuple[int, int, str]]) -> str:
    """A WebVTT file's text: the `WEBVTT` header, then each cue as `HH:MM:SS.mmm --> HH:MM:SS.mmm` and its text."""
    return "WEBVTT\n\n" + "".join(f"{vtt_time(a)} --> {vtt_time(b)}\n{text}\n\n" for a, b, text in cues)
