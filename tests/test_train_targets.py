"""Streaming targets: the convention of realtime/train/README.md on hand-made word timings."""

from __future__ import annotations

import pytest

from realtime.config import ModelConfig
from realtime.train.targets import (
    TargetError,
    TimedWord,
    build_input_ids,
    due_frame,
    loss_mask_start,
    stream_layout,
    words_from_ids,
)

CFG = ModelConfig()
PAD, WORD, BOS = 32, 33, 1
SAMPLES_1S = 16000  # 12.5 tokens -> 13 user tokens


def _ids(words: list[tuple[str, float, float]], toks: list[list[int]], delay: int, n: int = SAMPLES_1S) -> list[int]:
    return build_input_ids(CFG, [TimedWord(*w) for w in words], toks, n, delay)


def test_layout_and_prompt() -> None:
    lay = stream_layout(CFG, SAMPLES_1S, 6)
    assert (lay.n_left, lay.n_user, lay.n_right, lay.total, lay.prompt_len) == (32, 13, 17, 62, 39)
    ids = _ids([], [], 6)
    assert len(ids) == 62
    assert ids[:39] == CFG.prompt_ids(6) == [BOS] + [PAD] * 38
    assert ids[39:] == [PAD] * 23  # no words: every decided token is a pad, no EOS
    assert loss_mask_start(CFG, 6) == 38  # the last prompt position predicts the first decided token


@pytest.mark.parametrize(("delay", "expected"), [(1, 37), (6, 42), (15, 51), (30, 66)])
def test_single_word_position_per_delay(delay: int, expected: int) -> None:
    # ends at 300 ms: due once 300 ms + delay was heard, i.e. position 32 + delay + ceil(300 / 80) = 36 + delay
    ids = _ids([("hello", 0.10, 0.30)], [[1500]], delay)
    assert ids[expected] == WORD
    assert ids[expected + 1] == 1500
    others = [t for p, t in enumerate(ids) if p not in (0, expected, expected + 1)]
    assert set(others) == {PAD}
    assert len(ids) == 32 + 13 + delay + 11


def test_frame_boundaries_are_exact() -> None:
    # exactly 160 ms is two whole frames (decided at the frame whose audio ends at 160 ms), a hair more is three
    assert due_frame(0.16, 6, 32) == 32 + 6 + 2
    assert due_frame(0.1601, 6, 32) == 32 + 6 + 3
    assert due_frame(0.0, 6, 32) == 32 + 6 + 1  # a word is never due inside the prompt


def test_multi_token_words_close_words_and_backlog() -> None:
    words = [("hello", 0.05, 0.30),     # due 42: [W] at 42, token at 43
             ("world", 0.30, 0.62),     # due 38 + ceil(7.75) = 46: [W] 46, two tokens 47, 48
             ("a", 0.62, 0.63),         # due 46 as well (same frame): joins the group, token 49
             ("big", 0.63, 0.70),       # due 47 < 50 (writer busy): joins, tokens 50, 51, 52
             ("cat", 0.90, 0.95)]       # due 38 + 12 = 50 < 53: joins the backlog too, token 53
    toks = [[1001], [1002, 1003], [1004], [1005, 1006, 1007], [1008]]
    ids = _ids(words, toks, 6)
    assert ids[42:44] == [WORD, 1001]
    assert ids[44:46] == [PAD, PAD]
    assert ids[46:54] == [WORD, 1002, 1003, 1004, 1005, 1006, 1007, 1008]
    assert set(ids[54:]) == {PAD}
    groups = words_from_ids(CFG, ids, lambda t: ",".join(map(str, t)))
    assert groups == [(42, "1001"), (46, "1002,1003,1004,1005,1006,1007,1008")]


def test_new_group_after_writer_is_idle() -> None:
    # second word due exactly when the first group's last token was written: the writer is idle there
    ids = _ids([("one", 0.0, 0.08), ("two", 0.08, 0.24)], [[1001], [1002]], 6)
    assert ids[39:42] == [WORD, 1001, WORD] and ids[42] == 1002


def test_last_word_fits_in_right_padding() -> None:
    # a word ending at the very end of the audio is written inside the right padding (delay + 1 + 10)
    ids = _ids([("end", 0.9, 1.0)], [[1001, 1002, 1003]], 2)
    q = 32 + 2 + 13
    assert ids[q:q + 4] == [WORD, 1001, 1002, 1003]
    assert len(ids) == 32 + 13 + 13


def test_errors() -> None:
    with pytest.raises(TargetError):
        _ids([("late", 0.5, 1.5)], [[1001]], 6)  # ends after the audio
    with pytest.raises(TargetError):
        _ids([("b", 0.5, 0.6), ("a", 0.1, 0.2)], [[1001], [1002]], 6)  # out of order
    with pytest.raises(TargetError):
        _ids([("x", 0.9, 1.0)], [[1001] * 40], 1)  # no room left in the padding
    with pytest.raises(TargetError):
        _ids([("x", 0.1, 0.2)], [[]], 6)
