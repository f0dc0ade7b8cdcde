"""benchmarks/seen_voice_wer.py: the new-sentence draw takes only test-split sentences, the same for the same seed,
and refuses voices outside the catalogue; the trained-utterance set is one carried training shard per asked voice,
scored by the evaluation like a held-out shard."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from realtime.train.evaluate import build_items
from realtime.train.presynth import SUFFIX, pack_shard
from realtime.train.synth import RawShard
from realtime.train.text_corpus import Sentence, write_corpus
from seen_voice_wer import carried_utterances, new_sentence_tasks


def test_new_sentences_are_test_sentences_drawn_by_seed(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.tsv.gz"
    sentences = [Sentence("train", "x", f"trained words {i}") for i in range(20)]
    sentences += [Sentence("test", "x", f"new words {i}") for i in range(20)]
    write_corpus(sentences, corpus)
    keys = ["espeak:mb-us1", "flite:slt"]
    tasks = new_sentence_tasks(corpus, keys, per_voice=5, seed=3)
    assert [t.voice.key for t in tasks] == keys and [t.name for t in tasks] == ["heldout-00", "heldout-01"]
    assert all(len(t.texts) == 5 and all(x.startswith("new words") for x in t.texts) for t in tasks)
    assert tasks == new_sentence_tasks(corpus, keys, per_voice=5, seed=3)
    assert [t.texts for t in tasks] != [t.texts for t in new_sentence_tasks(corpus, keys, per_voice=5, seed=4)]
    with pytest.raises(SystemExit, match="espeak:mb-zz9"):
        new_sentence_tasks(corpus, ["espeak:mb-zz9"], per_voice=5, seed=3)


def test_trained_utterances_are_one_carried_training_shard_per_voice(tmp_path: Path) -> None:
    pytest.importorskip("soundfile")
    rng = np.random.default_rng(0)
    carried = tmp_path / "ps_A"
    carried.mkdir()
    for i, (voice, split) in enumerate([("espeak:mb-us1", "train"), ("espeak:mb-us1", "train"),
                                        ("espeak:mb-us2", "test"), ("flite:slt", "train")]):
        audio = (rng.standard_normal(8000) * 3000).astype(np.int16)
        raw = RawShard(voice, voice, split, [f"utterance {i}"], audio, np.array([0, 8000]),
                       np.array([[0.1, 0.2], [0.2, 0.4]], np.float32), np.array([0, 2]))
        raw.save(tmp_path / f"raw{i}.npz")
        pack_shard(tmp_path / f"raw{i}.npz", carried / f"part-{i:03d}{SUFFIX}", 0.98)
    out = tmp_path / "trained"
    assert carried_utterances(carried, ["espeak:mb-us1", "espeak:mb-us2"], out) == ["espeak:mb-us1"]
    items = build_items(out, delays=[480], per_voice=10, sweep_per_voice=0, real_dir=None)
    assert [(it.group, it.voice, it.ref) for it in items] == [("heldout", "espeak:mb-us1", "utterance 0")]


def test_opus_round_trip_keeps_texts_times_and_sample_counts(tmp_path: Path) -> None:
    pytest.importorskip("soundfile")
    from seen_voice_wer import opus_round_trip

    t = np.arange(12345) / 16000
    audio = (8000 * np.sin(2 * np.pi * 220 * t)).astype(np.int16)
    src = tmp_path / "new"
    src.mkdir()
    raw = RawShard("espeak:mb-us1", "mbrola-us1", "heldout", ["a tone"], audio, np.array([0, audio.size]),
                   np.array([[0.1, 0.3], [0.3, 0.7]], np.float32), np.array([0, 2]))
    raw.save(src / "heldout-00.npz")
    opus_round_trip(src, tmp_path / "coded", 0.98)
    got = RawShard.load(tmp_path / "coded" / "heldout-00.npz")
    assert got.texts == raw.texts and got.audio.size == audio.size and not np.array_equal(got.audio, audio)
    assert np.array_equal(got.word_times, raw.word_times) and np.array_equal(got.offsets, raw.offsets)
    assert np.corrcoef(got.audio.astype(float), audio.astype(float))[0, 1] > 0.9
