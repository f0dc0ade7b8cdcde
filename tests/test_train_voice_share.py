"""BatchConfig.voice_share: streams drawn by voice weight instead of uniformly over shards, so that a few
hundred small carried shards of many recorded speakers are not outnumbered by a call's own large shards."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from realtime.train.data import BatchConfig, StreamBatcher
from realtime.train.model_size import SIZES


@dataclass
class ShardList:
    """What StreamBatcher reads of a Corpus when it picks shards: one entry per shard, and its voice."""

    voices: list[str]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    by_shard: list[list] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_shard = [[] for _ in self.voices]


def _batcher(corpus: ShardList, share: float, weights: dict[str, float]) -> StreamBatcher:
    bc = BatchConfig(voice_share=share, voice_weights=tuple(sorted(weights.items())))
    return StreamBatcher(SIZES["test"].config(64), corpus, bc, seed=0)


def _voice_counts(b: StreamBatcher, corpus: ShardList, n: int, seed: int = 1) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    picks = [corpus.voices[b.pick_shard(rng)] for _ in range(n)]
    return {v: picks.count(v) / n for v in sorted(set(corpus.voices))}


# 90 shards of a call's own voice, 10 of carried ones (two speakers), as in a training call
VOICES = ["flite:slt"] * 90 + ["espeak:mb-fr2-en"] * 6 + ["rhvoice:bdl"] * 4
WEIGHTS = {"flite:slt": 1.0, "espeak:mb-fr2-en": 1.5, "rhvoice:bdl": 1.5}


def test_uniform_by_default_and_by_weight_with_full_share() -> None:
    corpus = ShardList(list(VOICES))
    uniform = _voice_counts(_batcher(corpus, 0.0, WEIGHTS), corpus, 20000)
    assert uniform["flite:slt"] == pytest.approx(0.90, abs=0.01)
    by_weight = _voice_counts(_batcher(corpus, 1.0, WEIGHTS), corpus, 20000)
    # weights 1 : 1.5 : 1.5, whatever the shard counts (90 : 6 : 4)
    assert by_weight["flite:slt"] == pytest.approx(0.25, abs=0.01)
    assert by_weight["espeak:mb-fr2-en"] == pytest.approx(0.375, abs=0.01)
    assert by_weight["rhvoice:bdl"] == pytest.approx(0.375, abs=0.01)


def test_partial_share_mixes_the_two_draws_and_unlisted_voices_weigh_one() -> None:
    corpus = ShardList(list(VOICES) + ["espeak:en-us+m3"] * 10)  # a voice the weights do not list
    got = _voice_counts(_batcher(corpus, 0.5, WEIGHTS), corpus, 40000)
    n = len(corpus.voices)
    for voice, w in [*WEIGHTS.items(), ("espeak:en-us+m3", 1.0)]:
        want = 0.5 * corpus.voices.count(voice) / n + 0.5 * w / 5.0
        assert got[voice] == pytest.approx(want, abs=0.012), voice


def test_a_growing_corpus_is_regrouped_and_every_shard_of_a_voice_is_used() -> None:
    corpus = ShardList(["flite:slt"] * 3)
    b = _batcher(corpus, 1.0, WEIGHTS)
    rng = np.random.default_rng(3)
    assert {b.pick_shard(rng) for _ in range(200)} == {0, 1, 2}
    corpus.voices += ["rhvoice:bdl"] * 2  # shards synthesised while training runs
    corpus.by_shard += [[], []]
    picks = [b.pick_shard(rng) for _ in range(3000)]
    assert {3, 4} <= set(picks)
    assert sum(p >= 3 for p in picks) / len(picks) == pytest.approx(1.5 / 2.5, abs=0.03)


def test_share_zero_draws_exactly_as_before() -> None:
    """0 must keep earlier runs' batches: the same single integer draw per stream from the same generator."""
    corpus = ShardList(list(VOICES))
    b = _batcher(corpus, 0.0, WEIGHTS)
    r1, r2 = np.random.default_rng(7), np.random.default_rng(7)
    assert [b.pick_shard(r1) for _ in range(50)] == [int(r2.integers(len(VOICES))) for _ in range(50)]


def test_share_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="voice_share"):
        _batcher(ShardList(["flite:slt"]), 1.5, WEIGHTS)


def test_the_mix_trained_is_counted_by_voice_group() -> None:
    """`stream_shares` (written into a run's metrics) reports the streams actually cut, by engine group."""
    corpus = ShardList(["flite:slt"] * 6 + ["espeak:mb-fr2-en"] * 2 + ["espeak:en-us+m3"] * 2)
    b = _batcher(corpus, 0.0, WEIGHTS)
    rng = np.random.default_rng(5)
    picks = [corpus.voices[b.pick_shard(rng)] for _ in range(5000)]
    assert sum(b.streams_by_voice.values()) == 5000
    shares = b.stream_shares()
    assert set(shares) == {"flite", "mbrola", "espeak-formant"}
    assert shares["mbrola"] == pytest.approx(picks.count("espeak:mb-fr2-en") / 5000, abs=1e-4)
    assert shares["espeak-formant"] == pytest.approx(picks.count("espeak:en-us+m3") / 5000, abs=1e-4)
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)


def test_validation_batches_stay_uniform_and_unaugmented() -> None:
    """Held-out-voice validation must not follow the training draw: its losses compare across runs."""
    from realtime.train.train import NO_AUGMENT, validation_batches

    train = BatchConfig(voice_share=0.5, voice_weights=(("flite:slt", 2.0),), max_seconds=12.0)
    val = validation_batches(train)
    assert val.voice_share == 0.0 and val.augment == NO_AUGMENT and val.max_seconds == 12.0


def test_gpu_run_voice_weight_overrides_catalogue_weights_and_refuses_bad_ones() -> None:
    """`gpu_run run --voice-weight KEY=W`: a voice key or an engine prefix ("pico:") replaces the catalogue
    weight of those voices in the --voice-share draw, every other voice keeps its own; a key that names no
    training voice, a bad weight, all weights 0, or an override without --voice-share is refused."""
    from realtime.train.gpu_run import weights_with_overrides
    from realtime.train.voices import catalogue

    train_v, held_v = catalogue(0.0)
    base = dict(weights_with_overrides(train_v, [], 0.0))
    assert base == {v.key: v.weight for v in train_v}
    got = dict(weights_with_overrides(train_v, ["pico:=6", "flite:slt=0.5"], 0.25))
    assert got["pico:en-US"] == got["pico:en-GB"] == 6.0 and got["flite:slt"] == 0.5
    assert {k: w for k, w in got.items() if not k.startswith("pico:") and k != "flite:slt"} == \
        {k: w for k, w in base.items() if not k.startswith("pico:") and k != "flite:slt"}
    held_key = held_v[0].key
    for bad, share in ([f"{held_key}=2"], 0.25), (["pico:en-US"], 0.25), (["pico:en-US=-1"], 0.25), \
            (["pico:en-US=x"], 0.25), (["pico:en-US=inf"], 0.25), (["nosuch:=1"], 0.25), (["pico:=2"], 0.0), \
            ([f"{k}=0" for k in base], 0.25):
        with pytest.raises(ValueError):
            weights_with_overrides(train_v, bad, share)
