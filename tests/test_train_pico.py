"""SVOX Pico's two English speakers (`realtime/train/pico.py`): training voices only, of speakers no other
voice uses; synthesis with speed and pitch; word times by alignment that respect a known boundary in Pico's
own audio; and pre-synthesis into a carry."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest

from realtime.train.pico import PicoError, PicoSynth, PicoVoice, pico_available
from realtime.train.voices import available, catalogue

needs_pico = pytest.mark.skipif(not (pico_available() and shutil.which("festival") and shutil.which("espeak-ng")),
                                reason="pico2wave (libttspico-utils, non-free), festival and espeak-ng are needed: "
                                       ".ci/install_mbrola.sh installs them")


def test_pico_speakers_train_only_and_are_new() -> None:
    train_v, held_v = catalogue()
    pico = [v for v in train_v if v.engine == "pico"]
    assert {v.base for v in pico} == {"en-US", "en-GB"} and not any(v.engine == "pico" for v in held_v)
    others = {v.speaker for v in train_v + held_v if v.engine != "pico"}
    assert not others & {v.speaker for v in pico}
    assert not available(pico, espeak=True, flite=True)  # the training machine has no Pico: pre-synthesised
    assert available(pico, espeak=True, flite=True, pico=True) == pico
    rng = np.random.default_rng(0)
    drawn = [pico[0].render(rng) for _ in range(200)]
    assert all(isinstance(d, PicoVoice) and 80 <= d.speed <= 125 and 85 <= d.pitch <= 120 for d in drawn)
    assert len({d.speed for d in drawn}) > 20


@needs_pico
def test_speed_and_pitch_change_the_audio_and_bad_voices_are_refused() -> None:
    synth = PicoSynth()
    words = ["the", "birch", "canoe", "slid", "on", "the", "smooth", "planks"]
    slow, _ = synth.synthesize(PicoVoice("en-US", speed=80), words)
    fast, timed = synth.synthesize(PicoVoice("en-US", speed=125), words)
    assert slow.dtype == np.float32 and slow.size > 1.3 * fast.size
    assert [w.text for w in timed] == words
    assert all(a.end <= b.start + 1e-6 for a, b in itertools.pairwise(timed))
    assert 0 <= timed[0].start and timed[-1].end <= fast.size / 16000
    high, _ = synth.synthesize(PicoVoice("en-GB", pitch=120), words)
    low, _ = synth.synthesize(PicoVoice("en-GB", pitch=85), words)
    assert high.size != low.size or not np.array_equal(high, low)
    with pytest.raises(PicoError, match="unknown Pico voice"):
        synth.synthesize(PicoVoice("de-DE"), words)


@needs_pico
def test_alignment_respects_a_known_boundary_in_pico_audio() -> None:
    """Two utterances said separately and joined by 0.4 s of silence: every word of the first must end
    before the silence, every word of the second after it (within 40 ms, half a frame). Word ends are what
    the streaming targets use (targets.py); a start may take in the pause before it, which no reference has."""
    from realtime.train.align import align_word_times, reference_renderings

    synth = PicoSynth()
    first, second = ["glue", "the", "sheet", "to", "the", "dark", "blue"], ["background", "it", "is", "easy", "to", "tell"]
    a = synth._speak(PicoVoice("en-GB"), " ".join(first))
    b = synth._speak(PicoVoice("en-GB"), " ".join(second))
    gap = np.zeros(int(0.4 * 16000), np.float32)
    joined = np.concatenate([a, gap, b])
    words = first + second
    timed = align_word_times(joined, words, reference_renderings(words))
    join_start, join_end = a.size / 16000, (a.size + gap.size) / 16000
    assert all(w.end <= join_start + 0.04 for w in timed[:len(first)])
    assert all(w.end >= join_end + 0.1 for w in timed[len(first):])  # "background" alone lasts longer


@needs_pico
def test_pico_voices_are_pre_synthesised_into_a_carry(tmp_path) -> None:
    from realtime.train.presynth import main
    from realtime.train.synth import RawShard
    from realtime.train.text_corpus import Sentence, write_corpus

    corpus = tmp_path / "corpus.tsv.gz"
    write_corpus([Sentence("train", "t", t) for t in ("six spoons of fresh snow peas", "we also need a small snake")]
                 + [Sentence("test", "t", "never trained on this")], corpus)
    packed, shards = tmp_path / "packed", tmp_path / "shards"
    assert main(["pack", "--corpus", str(corpus), "--out", str(packed), "--voices", "en-US", "en-GB",
                 "--hours", "0.002", "--sentences-per-shard", "1", "--workers", "1"]) == 0
    assert set(json.loads((packed / "index.json").read_text())["voices"]) <= {"pico:en-US", "pico:en-GB"}
    main(["unpack", "--src", str(packed), "--dst", str(shards), "--workers", "1"])
    raws = [RawShard.load(f) for f in shards.glob("*.npz")]
    assert raws and all(r.voice.startswith("pico:") and r.split == "train" for r in raws)
    assert {t for r in raws for t in r.texts} <= {"six spoons of fresh snow peas", "we also need a small snake"}


@needs_pico
def test_audio_too_short_for_its_words_is_refused(monkeypatch) -> None:
    """Pico skipping words would give targets for words never said: 0.3 s for eight words is refused."""
    synth = PicoSynth()
    monkeypatch.setattr(synth, "_speak", lambda voice, text: np.zeros(int(0.3 * 16000), np.float32))
    with pytest.raises(PicoError, match="words were skipped"):
        synth.synthesize(PicoVoice("en-US"), ["the", "birch", "canoe", "slid", "on", "the", "smooth", "planks"])
