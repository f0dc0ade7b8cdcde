"""Festival's two diphone speakers (rab, ked): word times read back from Festival's Word relation map onto
the input words; the voices train only where Festival is, and are never held-out speakers."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.train.festival import FestivalError, FestivalVoice, _script, festival_available, parse_words
from realtime.train.voices import available, catalogue


def test_word_lines_parsed_and_clitics_take_the_host_words_end() -> None:
    out = "noise line\nW\tSaint\t0.957888\t1.266290\nW\tMary\t1.266290\t1.703180\nW\t's\t0.000000\t0.000000\n"
    assert parse_words(out) == [("Saint", 0.957888, 1.26629), ("Mary", 1.26629, 1.70318), ("'s", 1.70318, 1.70318)]
    assert parse_words("W\t's\t0\t0\n") == [("'s", 0.0, 0.0)]  # nothing before it: time zero, not a crash


def test_script_quotes_text_and_refuses_unknown_voices(tmp_path) -> None:
    s = _script(FestivalVoice("rab_diphone", stretch=1.2, f0_mean=120.0), 'say "hi" \\ now', tmp_path / "a.wav")
    assert '(SynthText "say \\"hi\\" \\\\ now")' in s
    assert "(voice_rab_diphone)" in s and "Duration_Stretch 1.2600" in s and "target_f0_mean 120.0" in s
    with pytest.raises(FestivalError, match="unknown Festival voice"):
        _script(FestivalVoice("kal_diphone"), "x", tmp_path / "a.wav")


def test_festival_voices_train_only_where_festival_is() -> None:
    train, held = catalogue()
    fest = [v for v in train if v.engine == "festival"]
    assert {v.speaker for v in fest} == {"rab", "ked"}
    assert not {v.speaker for v in fest} & {v.speaker for v in held}
    assert not [v for v in held if v.engine == "festival"]
    # the training machine has no Festival: left out there, kept here when asked
    assert not [v for v in available(train, espeak=True, flite=True) if v.engine == "festival"]
    assert {v.speaker for v in available(train, espeak=True, flite=True, festival=True)
            if v.engine == "festival"} == {"rab", "ked"}
    rendered = fest[0].render(np.random.default_rng(0))
    assert isinstance(rendered, FestivalVoice) and rendered.name == fest[0].base and 0.8 <= rendered.stretch <= 1.25


def _speech_end(audio: np.ndarray, rate: int) -> float:
    n = rate // 100
    frames = audio[: audio.size // n * n].reshape(-1, n)
    db = 20 * np.log10(np.sqrt((frames ** 2).mean(axis=1)) + 1e-9)
    loud = np.flatnonzero(db > db.max() - 35)
    return (loud[-1] + 1) / 100


@pytest.mark.parametrize("voice", ["rab_diphone", "ked_diphone"])
def test_festival_synthesis_word_times(voice: str) -> None:
    if not festival_available():
        pytest.skip("festival with rab_diphone and ked_diphone is not installed (.ci/install_mbrola.sh installs it)")
    from realtime.train.festival import FestivalSynth

    synth = FestivalSynth()
    words = ["the", "teacher", "asked", "mary's", "brother", "to", "close", "the", "window", "quickly"]
    audio, timed = synth.synthesize(FestivalVoice(voice), words)
    assert audio.dtype == np.float32 and audio.ndim == 1 and np.abs(audio).max() > 0.05
    assert [w.text for w in timed] == words
    starts, ends = np.array([w.start for w in timed]), np.array([w.end for w in timed])
    assert (ends > starts).all() and (np.diff(starts) > 0).all() and (starts[1:] >= ends[:-1] - 1e-6).all()
    # the last word ends where the speech does (within one 80 ms frame), inside the audio
    assert abs(ends[-1] - _speech_end(audio, 16000)) < 0.08 and ends[-1] <= audio.size / 16000
    slow, _ = synth.synthesize(FestivalVoice(voice, stretch=1.25), words)
    fast, _ = synth.synthesize(FestivalVoice(voice, stretch=0.8), words)
    assert fast.size < audio.size < slow.size
