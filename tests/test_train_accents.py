"""Accent rewrites (realtime/train/accents.py): phoneme rules, synthesis through them, and their catalogue voices."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from test_train_wordtimes import _espeak  # an EspeakSynth, or the test skipped without espeak-ng

from realtime.train.accents import REWRITE_RULES, REWRITE_SETS, rewrite_phonemes
from realtime.train.voices import (HELDOUT_ACCENTS, HELDOUT_VARIANTS, TRAIN_ACCENTS, accent_rewrite_voices,
                                   catalogue, voice_group)


@pytest.mark.parametrize(("rules", "word", "expected"), [
    (("non-rhotic",), "m'Il3", "m'Il@"),  # r-coloured schwa
    (("non-rhotic",), "f'o@r", "f'O:"),  # r-coloured vowel, final r
    (("non-rhotic",), "b'3:d", "b'3:d"),  # NURSE keeps its long vowel
    (("non-rhotic",), "r'Vn", "r'Vn"),  # an r before a vowel stays
    (("th-fronting",), "T'IN", "f'IN"),
    (("th-fronting",), "D'Is", "v'Is"),
    (("final-devoicing",), "dZ'VdZ", "dZ'VtS"),  # only the final one
    (("final-devoicing",), "b'3:d", "b'3:t"),
    (("monophthongs",), "h@l'oU", "h@l'o:"),
    (("h-dropping",), "h'aUs", "'aUs"),
    (("h-dropping",), "b'Vhaus", "b'Vhaus"),  # not inside a word
    (("tense-vowels",), "S'Ip", "S'i:p"),
    (("tense-vowels",), "m'aI", "m'aI"),  # diphthongs keep their I and U
    (("tense-vowels",), "h'aUs", "h'aUs"),
    (("w-to-v",), "w'O:t3", "v'O:t3"),
    (("vowel-shift",), "k'at", "k'Et"),
    (("vowel-shift",), "m'aI", "m'aI"),
    (("th-fronting", "non-rhotic"), "m'VD3", "m'Vv@"),  # in order, both
])
def test_rule_sets_rewrite_what_they_name_and_leave_the_rest(rules, word, expected) -> None:
    assert rewrite_phonemes(word, rules) == expected


def test_rule_sets_are_known_and_leave_out_the_held_out_accents_signature() -> None:
    assert all(set(s) <= set(REWRITE_RULES) for s in REWRITE_SETS)
    # every rule set but the control is used
    assert set(itertools.chain.from_iterable(REWRITE_SETS)) == set(REWRITE_RULES) - {"none"}
    assert rewrite_phonemes("T'INk", ("none",)) == "T'INk"
    # th-stopping (T -> t, D -> d) is en-029's own: no rule set makes it
    for names in REWRITE_SETS:
        assert "t" not in rewrite_phonemes("T", names) and "d" not in rewrite_phonemes("D", names)
    with pytest.raises(ValueError, match="unknown accent rewrite"):
        rewrite_phonemes("T'IN", ("th-stopping",))


def test_accented_voices_join_training_only_when_asked_and_keep_the_held_out_accents_unheard() -> None:
    base_train, base_held = catalogue()
    assert not any(v.rewrite for v in base_train + base_held)
    train, held = catalogue(accent_rewrite_weight=3.0)
    assert train[: len(base_train)] == base_train and held == base_held
    added = train[len(base_train):]
    assert [v.key for v in added] == [v.key for v in accent_rewrite_voices()] and len(added) == 80
    assert abs(sum(v.weight for v in added) - 3.0) < 1e-9
    assert len({v.key for v in added}) == len({v.speaker for v in added}) == 80  # each its own speaker
    assert not {v.speaker for v in train} & {v.speaker for v in held}
    for v in added:
        accent, _, variant = v.base.partition("+")
        assert v.engine == "espeak" and voice_group(v.key) == "espeak-formant" and v.rewrite in REWRITE_SETS
        assert accent in TRAIN_ACCENTS and accent not in HELDOUT_ACCENTS and variant not in HELDOUT_VARIANTS
        assert v.render(np.random.default_rng(0)).rewrite == v.rewrite
    assert {v.base.partition("+")[0] for v in added} == set(TRAIN_ACCENTS)


def test_a_rewritten_voice_speaks_its_words_with_their_times() -> None:
    """Through `[[phonemes]]` input between the SSML marks: every input word keeps its label and gets a span, the
    phonemes are the voice's own accent's rewritten, and the sound changes where a rule applies."""
    from realtime.train.espeak import EspeakError, EspeakVoice

    synth = _espeak()
    words = ["they", "think", "that", "the", "weather", "is", "getting", "better"]
    assert synth.phonemes(EspeakVoice("en-us"), "think") == "T'INk"
    plain, plain_times = synth.synthesize(EspeakVoice("en-us"), words)
    for rules in REWRITE_SETS:
        audio, timed = synth.synthesize(EspeakVoice("en-us", rewrite=rules), words)
        dur = audio.size / 16000
        assert [w.text for w in timed] == words and 1.0 < dur < 6.0
        for a, b in itertools.pairwise(timed):
            assert a.start <= a.end <= b.start + 1e-9
        assert timed[-1].end <= dur + 1e-6
        assert audio.size != plain.size or not np.array_equal(audio, plain)
    with pytest.raises(EspeakError, match="formant voices"):
        synth.synthesize(EspeakVoice("mb-us1", rewrite=("non-rhotic",)), words)


def test_a_rewritten_voice_sends_the_rewritten_phonemes_as_phoneme_input(monkeypatch) -> None:
    """What the library is asked to speak: the sentence as one `[[...]]` of its words' rewritten phonemes, with the
    phoneme-input flag and an end mark. The phonemes are the sentence's own (reduced forms: "will" wI2l) where they
    split into one group per word, each word's citation form where words run together ("of the" VvD@2); a plain
    voice still sends the words as text between marks, without the flag."""
    from realtime.train import espeak
    from realtime.train.espeak import EspeakVoice

    synth = _espeak()
    sent: list[tuple[str, int]] = []
    real_speak = espeak.EspeakSynth._speak

    def recording(self, voice, ssml, flags):
        sent.append((ssml, flags))
        return real_speak(self, voice, ssml, flags)

    monkeypatch.setattr(espeak.EspeakSynth, "_speak", recording)
    rules, us = ("th-fronting", "non-rhotic"), EspeakVoice("en-us")
    joined = ["think", "of", "the", "weather"]  # "of the" is one group of the sentence's phonemes
    apart = "ed sullivan will be around as long as someone else has talent".split()  # one group per word
    assert len(synth.phonemes(us, " ".join(joined)).split()) < len(joined)
    assert len(synth.phonemes(us, " ".join(apart)).split()) == len(apart)
    for words, own in ((joined, [synth.phonemes(us, w) for w in joined]),
                       (apart, synth.phonemes(us, " ".join(apart)).split())):
        synth.synthesize(EspeakVoice("en-us", rewrite=rules), words)
        phonemic, flags = sent[-1]
        assert phonemic == "[[" + " ".join(rewrite_phonemes(p, rules) for p in own) + ']] <mark name="end"/>'
        assert flags & espeak._PHONEMES
    assert "f'INk" in sent[0][0] and "w'Ev@" in sent[0][0]  # "fink", "wevva"
    assert " wI2l " in sent[1][0]  # the sentence's reduced "will", not the citation form w'Il
    synth.synthesize(us, joined)
    text, plain_flags = sent[-1]
    assert not plain_flags & espeak._PHONEMES
    assert text == ('<mark name="w0"/>think <mark name="w1"/>of <mark name="w2"/>the <mark name="w3"/>weather '
                    '<mark name="end"/>')
