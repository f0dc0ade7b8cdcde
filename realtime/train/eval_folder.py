"""A folder of test sentences read by one voice, for `benchmarks/score_folder.py`: NAME_II.wav (16 kHz) with
NAME_II.txt (the transcript) beside it. Shared by the neural engines whose speakers are kept for evaluation
(`kokoro.py`'s jf_nezumi, `piper.py`'s joe), so a folder is drawn the same way for every engine."""

from __future__ import annotations

import argparse
import logging
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .text_corpus import read_corpus
from .wordtimes import OUT_RATE

logger = logging.getLogger(__name__)

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


def folder_parser(description: str) -> argparse.ArgumentParser:
    """The options every engine's evaluation-folder command shares; the engine adds how to pick its voice."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--corpus", required=True, type=Path)
    ap.add_argument("--count", type=int, default=30)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--out", required=True, type=Path)
    return ap


def write_from_args(args: argparse.Namespace, name: str, say: Say) -> int:
    """`write_test_folder` with `folder_parser`'s options, logged; the command's exit status."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    n = write_test_folder(args.corpus, name, say, args.count, args.seed, args.out)
    logger.info("wrote %d recordings of %s to %s", n, name, args.out)
    return 0
