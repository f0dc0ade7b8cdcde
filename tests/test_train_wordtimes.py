"""Word times: engine-word mapping, silence trimming, and a short real espeak-ng synthesis."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from realtime.audio import log_mel_spectrogram
from realtime.config import AudioFrontendConfig
from realtime.train.features import BatchLogMel
from realtime.train.wordtimes import map_engine_words, trim_word_ends


def test_engine_words_mapped_back_to_input_words() -> None:
    words = ["it", "wasn't", "the", "dictionary's", "tlc"]
    engine = [("it", 0.1, 0.2), ("wasnt", 0.2, 0.5), ("the", 0.5, 0.6), ("dictionary", 0.6, 1.1),
              ("'s", 1.1, 1.2), ("t", 1.2, 1.3), ("l", 1.3, 1.4), ("c", 1.4, 1.6)]
    timed = map_engine_words(words, engine)
    assert [(w.text, w.start, w.end) for w in timed] == [
        ("it", 0.1, 0.2), ("wasn't", 0.2, 0.5), ("the", 0.5, 0.6), ("dictionary's", 0.6, 1.2), ("tlc", 1.2, 1.6)]
    assert map_engine_words(["hello", "world"], [("hello", 0.0, 0.4), ("word", 0.4, 0.8)]) is None


def test_trailing_silence_is_trimmed() -> None:
    rate = 16000
    audio = np.zeros(rate, np.float32)
    audio[: rate // 2] = 0.5 * np.sin(np.arange(rate // 2) * 0.3)  # sound for 0.5 s, then silence
    (w,) = trim_word_ends(audio, rate, ["a"], [(0.0, 0.9)])
    assert w.end == pytest.approx(0.5, abs=0.011)


def test_batch_log_mel_equals_the_shipped_front_end() -> None:
    cfg = AudioFrontendConfig()
    rng = np.random.default_rng(0)
    clips = [np.concatenate([np.zeros(1280 * 3), rng.standard_normal(1280 * n) * 0.1, np.zeros(1280 * 2)])
             for n in (10, 10)]
    batch = BatchLogMel(cfg)(torch.from_numpy(np.stack(clips).astype(np.float32)))
    for i, clip in enumerate(clips):
        ref = log_mel_spectrogram(clip.astype(np.float32), cfg)
        assert batch[i].shape == ref.shape
        assert float((batch[i] - ref).abs().max()) < 1e-4


def _espeak():
    from realtime.train.espeak import EspeakError, EspeakSynth

    try:
        return EspeakSynth()
    except EspeakError as exc:
        pytest.skip(f"espeak-ng not available: {exc}")


def test_espeak_synthesis_word_times() -> None:
    from realtime.train.espeak import EspeakVoice

    synth = _espeak()
    words = ["the", "quick", "brown", "fox", "jumps", "over", "twenty", "lazy", "dogs"]
    for voice in (EspeakVoice("en-us"), EspeakVoice("en-us+f3", rate_wpm=210, pitch=70)):
        audio, timed = synth.synthesize(voice, words)
        dur = audio.size / 16000
        assert audio.dtype == np.float32 and 1.0 < dur < 6.0
        assert [w.text for w in timed] == words
        for a, b in itertools.pairwise(timed):
            assert a.start <= a.end <= b.start + 1e-9
        assert timed[-1].end <= dur + 1e-6
        # the last word really ends with the sound: nothing loud after its end
        tail = audio[int(timed[-1].end * 16000) + 160:]
        assert tail.size == 0 or np.abs(tail).max() < 0.05 * np.abs(audio).max()
    fast, _ = synth.synthesize(EspeakVoice("en-us", rate_wpm=260), words)
    slow, _ = synth.synthesize(EspeakVoice("en-us", rate_wpm=130), words)
    assert slow.size > 1.5 * fast.size  # the rate control works (timings stay exact, unlike resampling)


def test_synthesis_task_writes_a_loadable_shard(tmp_path) -> None:
    from realtime.train.synth import RawShard, Task, run_task
    from realtime.train.voices import VoiceSpec

    _espeak()
    voice = VoiceSpec("espeak", "en-us+m3", "espeak-formant:en-us+m3", False, 1.0)
    texts = ("set a timer for ten minutes", "the cat sat on the mat")
    _, n, secs, fails = run_task(Task("train-00000", voice, "train", texts, seed=1), tmp_path)
    assert (n, fails) == (2, 0) and secs > 1.0
    raw = RawShard.load(tmp_path / "train-00000.npz")
    assert raw.texts == list(texts) and raw.audio.dtype == np.int16 and raw.split == "train"
    assert [w.text for w in raw.words(1)] == texts[1].split()
    assert raw.words(1)[-1].end <= (raw.offsets[2] - raw.offsets[1]) / 16000 + 1e-6


def test_wer_scoring_groups() -> None:
    from realtime.train.evaluate import EvalItem, score

    a = np.zeros(10, np.float32)
    items = [EvalItem("heldout", "v1", 480, "the cat sat", a), EvalItem("heldout", "v1", 480, "a dog", a),
             EvalItem("heldout", "v2", 160, "go home", a)]
    result = score(items, [" the cat sat", " a frog", ""])
    assert result["heldout"]["v1"]["480"] == {"wer": 20.0, "n": 2}
    assert result["heldout"]["v2"]["160"]["wer"] == 100.0  # nothing decoded counts as all deleted
    assert result["heldout"]["*"]["480"]["n"] == 2
