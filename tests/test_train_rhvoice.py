"""Word times by alignment (`realtime/train/align.py`) and RHVoice's four extra speakers
(`realtime/train/rhvoice.py`): the DTW aligner recovers known boundaries, on synthetic segments and on real
synthetic speech whose times are exact; RHVoice's voices train only where RHVoice is, and never `alan`."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from realtime.train.align import align_word_times, dtw_path
from realtime.train.targets import TimedWord
from realtime.train.voices import available, catalogue

RATE = 16000


def test_dtw_path_is_monotonic_and_spans_both_sequences() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(30, 8))
    b = np.repeat(a, 2, axis=0)[:50]  # b is a slowed down (and cut) a
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    path = dtw_path(a, b)
    assert tuple(path[0]) == (0, 0) and tuple(path[-1]) == (29, 49)
    steps = np.diff(path, axis=0)
    assert ((steps >= 0) & (steps <= 1)).all() and (steps.sum(axis=1) >= 1).all()
    # each frame of a pairs with the frames of b it was repeated into
    for i, j in path[:40]:
        assert j // 2 == i or abs(j // 2 - i) <= 1
    with pytest.raises(ValueError):
        dtw_path(a[:0], b)


def _segments(durations: list[float], seed: int) -> tuple[np.ndarray, list[float]]:
    """Distinct 'words': a band of noise around a different centre frequency each, 30 ms of silence between."""
    rng = np.random.default_rng(seed)
    parts, ends, t = [], [], 0.0
    for k, d in enumerate(durations):
        n = int(d * RATE)
        f = 300.0 * (1.45 ** k)
        tt = np.arange(n) / RATE
        x = np.sin(2 * np.pi * f * tt + rng.uniform(0, 6)) + 0.5 * np.sin(2 * np.pi * 1.7 * f * tt)
        parts += [0.3 * x * np.hanning(n) ** 0.2, np.zeros(int(0.03 * RATE))]
        t += d
        ends.append(t)
        t += 0.03
    return np.concatenate(parts).astype(np.float32), ends


def test_alignment_recovers_boundaries_of_resegmented_audio() -> None:
    words = ["a", "b", "c", "d", "e", "f"]
    ref_audio, ref_ends = _segments([0.20, 0.35, 0.15, 0.40, 0.25, 0.30], seed=1)
    tgt_audio, tgt_ends = _segments([0.30, 0.25, 0.25, 0.30, 0.45, 0.20], seed=2)
    tgt_audio = np.concatenate([np.zeros(int(0.25 * RATE), np.float32), tgt_audio])  # leading silence
    tgt_ends = [e + 0.25 for e in tgt_ends]
    ref = [TimedWord(w, e - d, e) for w, e, d in zip(words, ref_ends, [0.20, 0.35, 0.15, 0.40, 0.25, 0.30])]
    timed = align_word_times(tgt_audio, words, [(ref_audio, ref)])
    assert [w.text for w in timed] == words
    err = np.abs(np.array([w.end for w in timed]) - np.array(tgt_ends))
    assert err.max() < 0.03, err
    assert all(w.end >= w.start for w in timed) and all(b.start >= a.end for a, b in itertools.pairwise(timed))
    with pytest.raises(ValueError, match="differ"):
        align_word_times(tgt_audio, words[:-1], [(ref_audio, ref)])


def test_alignment_of_real_synthetic_speech_against_exact_times() -> None:
    """A voice with exact word times (espeak-ng formant en-gb-scotland+m3), its times re-derived from the
    three references the RHVoice voices use: the median error stays well inside an 80 ms frame."""
    from realtime.train.festival import festival_available

    if not festival_available():
        pytest.skip("festival with rab_diphone and ked_diphone is not installed (.ci/install_mbrola.sh installs it)")
    from realtime.train.espeak import EspeakError, EspeakSynth, EspeakVoice
    from realtime.train.festival import FestivalSynth, FestivalVoice

    try:
        esp = EspeakSynth()
    except EspeakError as exc:
        pytest.skip(f"espeak-ng not available: {exc}")
    fest = FestivalSynth()
    errors = []
    for text in ["the teacher asked her brother to close the window quickly",
                 "several old friends came to visit us during the long winter",
                 "she bought a loaf of bread and some fresh milk at the market"]:
        words = text.split()
        audio, exact = esp.synthesize(EspeakVoice("en-gb-scotland+m3"), words)
        refs = [fest.synthesize(FestivalVoice("ked_diphone"), words), fest.synthesize(FestivalVoice("rab_diphone"), words),
                esp.synthesize(EspeakVoice("en-us"), words)]
        timed = align_word_times(audio, words, refs)
        errors += [a.end - b.end for a, b in zip(timed, exact)]
    err = np.abs(np.array(errors))
    assert np.median(err) < 0.03 and np.percentile(err, 90) < 0.08, (np.median(err), np.percentile(err, 90))


def test_rhvoice_voices_train_only_where_rhvoice_is_and_never_alan() -> None:
    train, held = catalogue()
    rh = [v for v in train if v.engine == "rhvoice"]
    assert {v.base for v in rh} == {"bdl", "clb", "evgeniy-eng", "lyubov", "slt"}
    assert not [v for v in held if v.engine == "rhvoice"] and "alan" not in {v.base for v in train + held}
    assert not {v.speaker for v in rh} & {v.speaker for v in held}
    assert not [v for v in available(train, espeak=True, flite=True, festival=True) if v.engine == "rhvoice"]
    assert len([v for v in available(train, espeak=True, flite=True, rhvoice=True) if v.engine == "rhvoice"]) == 5
    voice = rh[0].render(np.random.default_rng(0))
    assert voice.name == rh[0].base and -1 <= voice.rate <= 1 and -1 <= voice.pitch <= 1


def _speech_end(audio: np.ndarray) -> float:
    n = RATE // 100
    frames = audio[: audio.size // n * n].reshape(-1, n)
    db = 20 * np.log10(np.sqrt((frames ** 2).mean(axis=1)) + 1e-9)
    return (np.flatnonzero(db > db.max() - 35)[-1] + 1) / 100


def test_rhvoice_synthesis_word_times() -> None:
    from realtime.train.festival import festival_available
    from realtime.train.rhvoice import RHVoiceError, RHVoiceSynth, RHVoiceVoice, rhvoice_available

    if not rhvoice_available() or not festival_available():
        pytest.skip("RHVoice's English voices or festival are not installed (.ci/install_mbrola.sh installs them)")
    synth = RHVoiceSynth()
    words = ["the", "teacher", "asked", "her", "brother", "to", "close", "the", "window", "quickly"]
    lengths = {}
    for name in ("bdl", "clb", "evgeniy-eng", "lyubov"):
        audio, timed = synth.synthesize(RHVoiceVoice(name), words)
        assert audio.dtype == np.float32 and np.abs(audio).max() > 0.05
        assert [w.text for w in timed] == words
        ends = np.array([w.end for w in timed])
        assert (ends > np.array([w.start for w in timed])).all() and (np.diff(ends) > 0).all()
        assert abs(ends[-1] - _speech_end(audio)) < 0.08 and ends[-1] <= audio.size / RATE
        lengths[name] = audio.size
    assert len(set(lengths.values())) == 4  # four different speakers, four different renderings
    slow, _ = synth.synthesize(RHVoiceVoice("bdl", rate=-0.5), words)
    assert slow.size > lengths["bdl"]
    with pytest.raises(RHVoiceError, match="unknown"):
        synth.synthesize(RHVoiceVoice("alan"), words)


def test_rhvoice_leaves_the_workers_espeak_engine_working() -> None:
    """A synthesis worker runs espeak, Festival and RHVoice tasks in one process; RHVoice's alignment
    references must use that process's espeak engine, not start a second one (the library is global)."""
    from realtime.train.espeak import EspeakVoice
    from realtime.train.festival import festival_available
    from realtime.train.rhvoice import RHVoiceVoice, rhvoice_available
    from realtime.train.synth import engine_for

    if not rhvoice_available() or not festival_available():
        pytest.skip("RHVoice's English voices or festival are not installed (.ci/install_mbrola.sh installs them)")
    words = ["the", "window", "is", "open"]
    first, first_times = engine_for("espeak").synthesize(EspeakVoice("en-gb-scotland"), words)
    engine_for("rhvoice").synthesize(RHVoiceVoice("clb"), words)
    again, again_times = engine_for("espeak").synthesize(EspeakVoice("en-gb-scotland"), words)
    # espeak-ng's own output varies by a few samples from call to call: compare lengths and times, not samples
    assert abs(again.size - first.size) < 0.02 * first.size and np.abs(again).max() > 0.05
    assert [w.text for w in again_times] == words
    assert max(abs(a.end - b.end) for a, b in zip(first_times, again_times)) < 0.02
