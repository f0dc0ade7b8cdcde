"""A folder of test sentences read by one voice, for `benchmarks/score_folder.py`: NAME_II.wav (16 kHz) with
NAME_II.txt (the transcript) beside it. Shared by the neural engines whose speakers are kept for evaluation
(`kokoro.py`'s jf_nezumi, `piper.py`'s joe), so a folder is drawn the same way for every engine."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .text_corpus import read_corpus
from .wordtimes import OUT_RATE

Say = Callable[[list[str]], np.ndarray]  # words -> 16 kHz float audio


def write_test_folder(corpus: Path, name: str, say: Say, count: int, seed: int, out: Path) -> int:
    """`count` test-split sentences (drawn with `seed`) said by `say`, as out/NAME_II.wav + .txt; returns how
    many were written (fewer when the corpus has fewer test sentences)."""
    import soundfile as sf

    test = [s.text for s in read_corpus(corpus) if s.split == "test"]
    picked = random.Random(seed).sample(test, min(count, len(test)))
    out.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(picked):
        sf.write(out / f"{name}_{i:02d}.wav", say(text.split()), OUT_RATE)
        (out / f"{name}_{i:02d}.txt").write_text(text + "\n", encoding="utf-8")
    return len(picked)
