"""Corpus splits: by speaker (no held-out voice in training) and by sentence (no test text trained on)."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.train.synth import plan_tasks
from realtime.train.text_corpus import Sentence, normalize, split_of
from realtime.train.voices import HELDOUT_ACCENTS, HELDOUT_VARIANTS, catalogue, unseen_formant_voices, voice_group


def _accent_variant(base: str) -> tuple[str, str]:
    accent, _, variant = base.partition("+")
    return accent, variant


def test_no_heldout_speaker_in_training() -> None:
    train, held = catalogue()
    train_speakers = {v.speaker for v in train}
    assert not train_speakers & {v.speaker for v in held}
    assert not {v.key for v in train} & {v.key for v in held}
    # formant voices: the held-out accents and variants are used by no training voice at all
    for v in train:
        if v.engine == "espeak" and not v.base.startswith("mb-"):
            accent, variant = _accent_variant(v.base)
            assert accent not in HELDOUT_ACCENTS and variant not in HELDOUT_VARIANTS, v.base
    # recorded speakers held out: awb (flite), us3 and en1 (mbrola)
    assert {"awb", "us3", "en1"} <= {v.speaker for v in held}
    assert {"awb", "us3", "en1"}.isdisjoint(train_speakers)


def test_unseen_voices_are_neither_training_nor_held_out_voices() -> None:
    """The drafter's distillation voices: new to the trained model, and not the held-out evaluation."""
    train, held = catalogue()
    unseen = unseen_formant_voices()
    assert len(unseen) >= 100
    train_variants = {_accent_variant(v.base)[1] for v in train if v.engine == "espeak" and not v.is_mbrola}
    train_accents = {_accent_variant(v.base)[0] for v in train if v.engine == "espeak" and not v.is_mbrola}
    for v in unseen:
        accent, variant = _accent_variant(v.base)
        assert variant and variant not in train_variants and variant not in HELDOUT_VARIANTS, v.base
        assert accent in train_accents and accent not in HELDOUT_ACCENTS, v.base
    keys = {v.key for v in unseen}
    assert len(keys) == len(unseen) and not keys & {v.key for v in train + held}
    assert not {v.speaker for v in unseen} & {v.speaker for v in train + held}


def test_unseen_formant_voices_join_training_only_when_asked() -> None:
    base_train, base_held = catalogue()
    train, held = catalogue(unseen_formant_weight=2.0)
    assert [v.key for v in held] == [v.key for v in base_held]
    added = train[len(base_train):]
    assert train[: len(base_train)] == base_train
    assert {v.key for v in added} == {v.key for v in unseen_formant_voices()}
    assert abs(sum(v.weight for v in added) - 2.0) < 1e-9
    assert not {v.speaker for v in train} & {v.speaker for v in held}
    for v in added:
        accent, variant = _accent_variant(v.base)
        assert accent not in HELDOUT_ACCENTS and variant not in HELDOUT_VARIANTS, v.base


def test_sentence_split_is_deterministic_and_proportioned() -> None:
    texts = [f"sentence number {i} of the corpus" for i in range(5000)]
    splits = [split_of(t) for t in texts]
    assert splits == [split_of(t) for t in texts]
    share = {s: splits.count(s) / len(splits) for s in ("train", "dev", "test")}
    assert 0.94 < share["train"] < 0.98 and 0.01 < share["test"] < 0.03 and 0.01 < share["dev"] < 0.03


def test_tasks_respect_both_splits() -> None:
    train_v, held_v = catalogue()
    sents = [Sentence(split_of(t), "x", t) for t in (f"words and more words {i}" for i in range(3000))]
    test_text = {s.text for s in sents if s.split == "test"}
    train_text = {s.text for s in sents if s.split == "train"}
    tasks = plan_tasks(sents, train_v, held_v, train_hours=0.5, eval_per_voice=10, seed=1)
    held_keys = {v.key for v in held_v}
    for t in tasks:
        if t.split == "train":
            assert t.voice.key not in held_keys
            assert set(t.texts) <= train_text
        else:
            assert set(t.texts) <= test_text
    assert {t.voice.key for t in tasks if t.split == "heldout"} == held_keys
    assert sum(1 for t in tasks if t.split == "train") > 10
    # voices are drawn by weight: recorded speakers dominate the formant filler
    keys = [t.voice.key for t in tasks if t.split == "train"]
    formant = np.mean([voice_group(k) == "espeak-formant" for k in keys])
    assert formant < 0.5


def test_normalize() -> None:
    assert normalize("It's 25 past 3, Mr. Smith!") == "it's twenty five past three mr smith"
    assert normalize("  'Quoted'  -- and   spaced ") == "quoted and spaced"


def test_accented_mbrola_voice_names_find_their_voice_file(tmp_path, monkeypatch) -> None:
    """`mb-ro1-en` (English through the Romanian voice) is synthesised from the voice file `ro1`."""
    import shutil

    from realtime.train.voices import mbrola_voice_available

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/mbrola" if name == "mbrola" else None)
    monkeypatch.delenv("STREAMSCRIBE_ESPEAK_DATA", raising=False)
    (tmp_path / "mbrola").mkdir()
    (tmp_path / "mbrola" / "ro1").write_bytes(b"x")
    assert mbrola_voice_available("mb-ro1-en", str(tmp_path))
    assert not mbrola_voice_available("mb-zz9-en", str(tmp_path))
    # a data folder of its own (the carried engines) is the only place looked in, even where
    # Debian's /usr/share/mbrola has the voice: the carried library could not load it from there
    assert not mbrola_voice_available("mb-us1", str(tmp_path))
    # what gpu_run trains on: voices of working engines whose voice file the carry brought
    from realtime.train.voices import VoiceSpec, available

    voices = [VoiceSpec("espeak", "mb-ro1-en", "ro1", False, 1.0), VoiceSpec("espeak", "mb-fr1-en", "fr1", False, 1.0),
              VoiceSpec("espeak", "en-us", "espeak-formant:en-us", False, 1.0), VoiceSpec("flite", "slt", "slt", True, 1.0)]
    keys = [v.base for v in available(voices, espeak=True, flite=True, espeak_data=str(tmp_path))]
    assert keys == ["mb-ro1-en", "en-us", "slt"]
    assert [v.base for v in available(voices, espeak=True, flite=False, mbrola=False,
                                      espeak_data=str(tmp_path))] == ["en-us"]
    # the mbrola engine is probed with a voice the carry brought (run 8 probed us1 when the carry had
    # only accented voices, and every mbrola voice was left out)
    from realtime.train.voices import mbrola_probe_voice

    us1 = VoiceSpec("espeak", "mb-us1", "us1", True, 1.0)
    assert mbrola_probe_voice([us1] + voices, str(tmp_path)) == "mb-ro1-en"
    (tmp_path / "mbrola" / "us1").write_bytes(b"x")
    assert mbrola_probe_voice([us1] + voices, str(tmp_path)) == "mb-us1"
    assert mbrola_probe_voice(voices[2:], str(tmp_path)) is None
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert not mbrola_voice_available("mb-ro1-en", str(tmp_path))  # the voice file alone is not enough


def test_staged_mbrola_databases_become_training_voices_never_held_out_ones(tmp_path, monkeypatch) -> None:
    """`gpu_run run --mbrola-dbs DIR` installs staged diphone databases (plain or xz) where the carried espeak-ng
    finds them, so those speakers are synthesised on the device with fresh sentences; a held-out speaker's
    database is refused before anything is installed."""
    import lzma
    import shutil

    from realtime.train.gpu_run import install_mbrola_databases
    from realtime.train.voices import catalogue, mbrola_voice_available

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/mbrola" if name == "mbrola" else None)
    train_v, held_v = catalogue()
    held_bases = {v.base for v in held_v}
    src, engines = tmp_path / "dbs", tmp_path / "engines"
    src.mkdir()
    (src / "us1").write_bytes(b"diphones of us1")
    (src / "ro1.xz").write_bytes(lzma.compress(b"diphones of ro1"))
    data = str(engines / "espeak-ng-data")
    assert not mbrola_voice_available("mb-us1", data)
    assert install_mbrola_databases(src, engines, held_bases) == ["ro1", "us1"]
    assert (engines / "espeak-ng-data" / "mbrola" / "ro1").read_bytes() == b"diphones of ro1"
    assert (engines / "espeak-ng-data" / "mbrola" / "us1").read_bytes() == b"diphones of us1"
    assert mbrola_voice_available("mb-us1", data) and mbrola_voice_available("mb-ro1-en", data)
    for held in ("us3", "en1.xz"):
        (src / held).write_bytes(b"x")
        with pytest.raises(ValueError, match=held.removesuffix(".xz")):
            install_mbrola_databases(src, tmp_path / "other", held_bases)
        (src / held).unlink()
    assert not (tmp_path / "other" / "espeak-ng-data" / "mbrola" / "us1").exists()


def test_mbrola_weight_scales_only_the_mbrola_voices_in_the_synthesis_plan() -> None:
    """`gpu_run run --mbrola-weight W`: on-device diphone speakers would otherwise take most of the plan (run 58)."""
    from realtime.train.gpu_run import scale_mbrola_weights

    train_v, _ = catalogue()
    scaled = scale_mbrola_weights(train_v, 0.25)
    assert [v.key for v in scaled] == [v.key for v in train_v]
    for before, after in zip(train_v, scaled):
        assert after.weight == pytest.approx(before.weight * (0.25 if before.is_mbrola else 1.0))
    assert any(v.is_mbrola for v in train_v)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="mbrola-weight"):
            scale_mbrola_weights(train_v, bad)
