"""Pre-synthesised shards carried as Opus: the round trip keeps texts, word times and sample counts;
a shard whose audio would no longer match its offsets is refused; held-out voices are never packed."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.train.presynth import SUFFIX, main, pack_shard, unpack, unpack_shard
from realtime.train.synth import RATE, RawShard

pytest.importorskip("soundfile")


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Voiced-sounding test audio: a pitch-varying harmonic tone with syllable-rate amplitude."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    x = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2)
    return (0.3 * x / np.abs(x).max() * 32767).astype(np.int16)


def make_shard(path, seed: int) -> RawShard:
    parts = [speechlike(1.3, seed), speechlike(0.77, seed + 1)]  # odd lengths: no frame-size luck
    raw = RawShard("espeak:mb-ro1-en", "mbrola-ro1", "train", ["hello there world", "fine"],
                   np.concatenate(parts), np.array([0, parts[0].size, parts[0].size + parts[1].size]),
                   np.array([[0.1, 0.4], [0.45, 0.8], [0.85, 1.2], [0.05, 0.6]], np.float32), np.array([0, 3, 4]))
    raw.save(path)
    return raw


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return 10 * np.log10((ref ** 2).sum() / ((ref - got) ** 2).sum())


def test_packed_shard_round_trip(tmp_path):
    src, packed, out = tmp_path / "train-00001.npz", tmp_path / ("pre-train-00001" + SUFFIX), tmp_path / "out"
    out.mkdir()
    raw = make_shard(src, 0)
    samples, size = pack_shard(src, packed, 0.95)
    assert samples == raw.audio.size and size < raw.audio.nbytes / 5  # Opus: several times smaller than int16
    seconds = unpack_shard(packed, out)
    assert seconds == pytest.approx(raw.audio.size / RATE)
    back = RawShard.load(out / "pre-train-00001.npz")
    assert (back.voice, back.speaker, back.split, back.texts) == (raw.voice, raw.speaker, raw.split, raw.texts)
    np.testing.assert_array_equal(back.offsets, raw.offsets)
    np.testing.assert_array_equal(back.word_times, raw.word_times)
    np.testing.assert_array_equal(back.word_offsets, raw.word_offsets)
    assert back.audio.dtype == np.int16 and back.audio.size == raw.audio.size
    assert snr_db(raw.audio, back.audio) > 10  # lossy, but the same speech, in place (no shift)
    assert [w.text for w in back.words(0)] == ["hello", "there", "world"]


def test_unpack_folder_and_refuse_mismatched_audio(tmp_path):
    packed, out = tmp_path / "packed", tmp_path / "shards"
    packed.mkdir()
    for i in range(3):
        make_shard(tmp_path / f"s{i}.npz", 10 + i)
        pack_shard(tmp_path / f"s{i}.npz", packed / f"pre-{i}{SUFFIX}", 0.95)
    stats = unpack(packed, out, workers=2)
    assert stats["shards"] == 3 and sorted(p.name for p in out.glob("*.npz")) == ["pre-0.npz", "pre-1.npz", "pre-2.npz"]
    with np.load(packed / f"pre-0{SUFFIX}") as z:
        fields = dict(z)
    fields["offsets"] = fields["offsets"] + 160  # offsets that no longer match the audio
    np.savez(packed / f"bad{SUFFIX}", **fields)
    with pytest.raises(ValueError, match="decoded .* samples, the offsets say"):
        unpack_shard(packed / f"bad{SUFFIX}", out)


def test_held_out_voices_are_never_packed(tmp_path):
    with pytest.raises(SystemExit, match="not training voices of the catalogue: \\['mb-us3'\\]"):
        main(["pack", "--corpus", str(tmp_path / "none.tsv.gz"), "--out", str(tmp_path / "o"),
              "--voices", "mb-ro1-en", "mb-us3"])
