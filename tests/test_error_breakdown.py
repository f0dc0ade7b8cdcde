"""benchmarks/error_breakdown.py: error kinds by voice, where deletions sit, the frequent substitutions."""

from __future__ import annotations

import sys
from pathlib import Path

import jiwer
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from error_breakdown import breakdown, main  # noqa: E402

ROWS = [
    ("a", "the cat sat on the mat", "the cat sat on a mat"),  # one substitution
    ("a", "one two three four five six", "two three four five"),  # deleted: the first word and the last
    ("b", "hello there world", ""),  # nothing heard: every word deleted
    ("b", "red green blue", "red green green blue"),  # one insertion
    ("b", "the cat sat", "a cat sat"),  # "the -> a" again
]


def test_error_kinds_add_up_to_the_wer_of_each_voice():
    out = breakdown(ROWS)
    for voice in ("a", "b", "*"):
        rows = [r for r in ROWS if voice in ("*", r[0])]
        wer = 100 * jiwer.wer([r[1] for r in rows], [r[2] for r in rows])
        v = out["voices"][voice]
        assert v["substitutions_pct"] + v["deletions_pct"] + v["insertions_pct"] == pytest.approx(wer, abs=0.02)
    a, b = out["voices"]["a"], out["voices"]["b"]
    assert (a["words"], b["words"], out["voices"]["*"]["words"]) == (12, 9, 21)
    assert (a["substitutions_pct"], a["deletions_pct"], a["insertions_pct"]) == (8.33, 16.67, 0.0)
    assert (b["substitutions_pct"], b["deletions_pct"], b["insertions_pct"]) == (11.11, 33.33, 11.11)


def test_deletions_are_placed_in_their_sentence():
    out = breakdown(ROWS)
    assert out["voices"]["a"]["deletions_at"] == {"start": 1, "middle": 0, "end": 1}
    # three words: the first two are its start, the last its end
    assert out["voices"]["b"]["deletions_at"] == {"start": 2, "middle": 0, "end": 1}
    mid = breakdown([("c", "one two three four five six", "one two four five six")])
    assert mid["voices"]["c"]["deletions_at"] == {"start": 0, "middle": 1, "end": 0}


def test_the_most_frequent_substitution_comes_first():
    out = breakdown(ROWS)
    assert out["top_substitutions"][0] == ("the -> a", 2)
    assert sum(n for _, n in out["top_substitutions"]) == 2
    # by count, not by name: "bat -> hat" sorts first by name and comes second
    out = breakdown([("c", "the bat", "a hat"), ("c", "the cat", "a cat"), ("c", "the dog", "a dog")])
    assert out["top_substitutions"] == [("the -> a", 3), ("bat -> hat", 1)]


def test_cli_asks_for_the_shards_it_needs(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--model", "models/default", "--shards", str(tmp_path), "--out", str(tmp_path / "e.json")])
    assert "run benchmarks/rescore_heldout.py --seed 8 first" in capsys.readouterr().err
