"""Helpers of the benchmark scripts whose figures the docs quote: position kinds, speed warp, median run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_speculative import median_run
from drafter_accuracy import position_kinds
from make_speech_clips import RATE, speed_warp

PAD = 32


def test_position_kinds_partition_the_kept_positions() -> None:
    g = torch.Generator().manual_seed(0)
    words = torch.randint(40, 90, (400,), generator=g)
    tokens = torch.where(torch.rand(400, generator=g) < 0.5, torch.full((400,), PAD), words)
    target, previous = tokens[1:], tokens[:-1]
    keep = torch.arange(399) >= 30  # the prompt is left out
    k = position_kinds(target, previous, PAD, keep)
    assert torch.equal(k["all"], keep)
    parts = torch.stack([k["pad"], k["word_start"], k["in_word"]]).int()
    assert torch.equal(parts.sum(0), keep.int())  # every kept position in exactly one of the three
    assert bool((k["word_end"] <= k["pad"]).all()) and k["word_end"].any()
    for r in torch.nonzero(k["in_word"]).flatten().tolist():
        assert target[r] != PAD and previous[r] != PAD
    for r in torch.nonzero(k["word_start"]).flatten().tolist():
        assert target[r] != PAD and previous[r] == PAD


def _peak_hz(x: np.ndarray) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spec)) * RATE / x.size


def test_speed_warp_moves_pitch_and_length_together() -> None:
    t = np.arange(RATE) / RATE
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    faster, f = speed_warp(tone, 1.1)
    assert f == 1.1 and abs(faster.size - RATE / 1.1) <= 2
    assert abs(_peak_hz(faster) - 484.0) < 3.0
    slower, f = speed_warp(tone, 0.8537)  # rounded to a multiple of 1/160
    assert f == 13700 / RATE and abs(slower.size - RATE / f) <= 2 and abs(_peak_hz(slower) - 440 * f) < 3.0
    same, f = speed_warp(tone, 1.0)
    assert f == 1.0 and same is tone


def test_median_run_reports_the_middle_wall_time() -> None:
    runs = [({"wall_seconds": w}, [[i]]) for i, w in enumerate([0.9, 0.5, 0.7, 1.4, 0.6])]
    out, tokens = median_run(runs)
    assert out["wall_seconds"] == 0.7 and tokens == [[2]]
