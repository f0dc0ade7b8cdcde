"""benchmarks/rescore_candidates.py: one row per model, the held-out draws, the seen voices, the real recordings
and every folder of natural voices, each read from its own report."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from rescore_candidates import summary_table


def _cell(wer: float) -> dict:
    return {"480": {"wer": wer, "n": 10}}


def test_summary_table_reads_each_figure_from_its_report() -> None:
    heldout = {
        8: {"a": {"heldout": {"*": _cell(31.8), "flite:awb": _cell(1.0)}, "seen": {"*": _cell(5.7)},
                  "real": {"*": _cell(50.5)}},
            "b": {"heldout": {"*": _cell(29.0)}, "seen": {"*": _cell(6.0)}, "real": {"*": _cell(48.0)}}},
        9: {"a": {"heldout": {"*": _cell(30.0)}, "seen": {"*": _cell(9.1)}, "real": {"*": _cell(99.0)}},
            "b": {"heldout": {"*": _cell(28.5)}, "seen": {"*": _cell(9.5)}, "real": {"*": _cell(99.0)}}},
    }
    folders = {"joe": {"a": {"folder": {"*": _cell(43.5), "joe": _cell(43.5)}},
                       "b": {"folder": {"*": _cell(40.0)}}},
               "kokoro_en": {"a": {"folder": {"*": _cell(28.0), "bf_emma": _cell(36.2)}},
                             "b": {"folder": {}}}}
    table = summary_table(["a", "b"], heldout, folders)
    lines = table.strip().split("\n")
    assert lines[0] == "| model | held-out, seed 8 | held-out, seed 9 | seen (8 / 9) | real | joe | kokoro_en |"
    assert lines[2] == "| a | 31.8% | 30.0% | 5.7% / 9.1% | 50.5% | 43.5% | 28.0% |"
    assert lines[3] == "| b | 29.0% | 28.5% | 6.0% / 9.5% | 48.0% | 40.0% |  |"  # no figure: an empty cell
    assert len(lines) == 4
