"""Single-stream streaming session: any chunking equals offline; ordering; bad input; the CLI."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import torch

from conftest import synthetic_audio
from realtime.audio import AudioError
from realtime.loader import load_model
from realtime.session import SessionError, StreamingSession, transcribe
from realtime.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tiny(tiny_ckpt):
    path = tiny_ckpt(seed=0)
    model, _ = load_model(path)
    return model, load_tokenizer(path), path


def _stream(model, tok, audio, chunks, delay_ms=None):
    s = StreamingSession(model, tok, delay_ms=delay_ms)
    events, pos = [], 0
    for n in chunks:
        events += s.push_audio(audio[pos: pos + n])
        pos += n
    assert pos >= audio.size
    events += s.finish()
    return s, events


@pytest.mark.parametrize("small_windows", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_chunkings_equal_offline(tiny_ckpt, small_windows, seed):
    path = tiny_ckpt(seed=seed, small_windows=small_windows)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    audio = synthetic_audio(4.0, seed=seed)
    offline = transcribe(model, tok, audio)
    rng = np.random.default_rng(seed)
    chunkings = {
        "single": [audio.size],
        "random": [],
        "odd_sizes": [],
    }
    total = 0
    while total < audio.size:
        n = int(rng.choice([1, 3, 17, 160, 1279, 1280, 1281, 4000, 16000]))
        chunkings["random"].append(n)
        total += n
    chunkings["odd_sizes"] = [1] * 3000 + [7] * 2000 + [audio.size]  # 1-sample chunks through the prompt
    for name, chunks in chunkings.items():
        s, events = _stream(model, tok, audio, chunks)
        assert s.generated == offline.token_ids, name
        assert s.text == offline.text, name
        assert "".join(e.text for e in events) == offline.text, name


def test_tokens_arrive_as_soon_as_frames_are_decodable(tiny):
    model, tok, _ = tiny
    s = StreamingSession(model, tok, delay_ms=480)
    # the prompt needs 39 audio tokens = 32 (left pad) + 7 tokens of user audio + 40 samples of look-ahead
    need = 7 * 1280 + 40
    audio = synthetic_audio(3.0, seed=5)
    assert s.push_audio(audio[: need - 1]) == []
    ev = s.push_audio(audio[need - 1: need])
    assert len(ev) == 1 and ev[0].position == 39 and ev[0].audio_end_ms == 560
    # then one token per further 1280 samples
    assert s.push_audio(audio[need: need + 1279]) == []
    ev = s.push_audio(audio[need + 1279: need + 1280])
    assert len(ev) == 1 and ev[0].position == 40 and ev[0].audio_end_ms == 640


def test_output_length_matches_offline_convention(tiny):
    model, tok, _ = tiny
    audio = synthetic_audio(1.0, seed=6)
    for delay_ms in (80, 480, 2400):
        r = transcribe(model, tok, audio, delay_ms=delay_ms)
        d = delay_ms // 80
        n_audio_tokens = 32 + -(-audio.size // 1280) + d + 11
        assert r.prompt_tokens + len(r.token_ids) == n_audio_tokens


def test_eos_ends_the_stream(tiny):
    model, tok, _ = tiny
    # make EOS the argmax everywhere by boosting its embedding row (tied head)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.language_model.embed_tokens.weight[2] *= 0
        model.language_model.embed_tokens.weight[2] += model.language_model.norm.weight.sign() * 50
    try:
        s = StreamingSession(model, tok)
        events = s.push_audio(synthetic_audio(2.0, seed=7))
        ids = [e.token_id for e in events]
        assert 2 in ids and ids.index(2) == len(ids) - 1  # nothing after the first EOS
        assert len(ids) < 10 and s.ended_by_eos and s.done
        assert s.push_audio(synthetic_audio(0.5, seed=8)) == []  # logged, not transcribed
        assert s.finish() == []
    finally:
        model.load_state_dict(state)


def test_bad_input_errors(tiny):
    model, tok, _ = tiny
    s = StreamingSession(model, tok)
    with pytest.raises(AudioError, match="NaN"):
        s.push_audio(np.array([0.1, np.nan], np.float32))
    with pytest.raises(AudioError, match="infinite"):
        s.push_audio(np.array([np.inf], np.float32))
    with pytest.raises(AudioError, match="shape"):
        s.push_audio(np.zeros((2, 10), np.float32))
    s.push_audio(np.zeros(100, np.float32))  # the session goes on after errors
    s.finish()
    with pytest.raises(SessionError):
        s.push_audio(np.zeros(10, np.float32))
    with pytest.raises(SessionError):
        s.finish()
    with pytest.raises(AudioError, match="empty"):
        transcribe(model, tok, np.zeros(0, np.float32))
    from realtime.config import ConfigError

    with pytest.raises(ConfigError, match="multiple of 80"):
        StreamingSession(model, tok, delay_ms=100)


def test_cli_prints_transcript_only(tiny, tmp_path):
    model, tok, path = tiny
    audio = synthetic_audio(2.0, seed=9)
    sf.write(tmp_path / "a.wav", audio, 16000, subtype="FLOAT")
    expected = transcribe(model, tok, audio).text.strip()
    proc = subprocess.run([sys.executable, "-m", "realtime.transcribe", "--model", str(path), str(tmp_path / "a.wav")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected + "\n"
    (tmp_path / "b.txt").write_text("hello")
    proc = subprocess.run([sys.executable, "-m", "realtime.transcribe", "--model", str(path), str(tmp_path / "b.txt")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "not a readable audio file" in proc.stderr
