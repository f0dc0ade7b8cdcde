"""Audio front-end: log-mel vs transformers and float64, incremental == offline, resampling, errors."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import soundfile as sf
import torch

from conftest import padded_for_offline, synthetic_audio
from realtime.audio import (
    AudioError,
    IncrementalLogMel,
    LogMel,
    StreamingResampler,
    as_mono_float32,
    decode_audio_bytes,
    load_audio_file,
    log_mel_spectrogram,
    pcm16_to_float,
    resample,
    slaney_mel_filters,
)
from realtime.config import AudioFrontendConfig

CFG = AudioFrontendConfig()


def test_log_mel_matches_transformers_feature_extractor():
    transformers = pytest.importorskip("transformers")
    fe = transformers.VoxtralRealtimeFeatureExtractor()
    padded = padded_for_offline(synthetic_audio(2.3, seed=1), 6)
    ref = fe(padded, sampling_rate=16000, return_tensors="pt").input_features[0]
    ours = log_mel_spectrogram(padded, CFG)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= 1e-2
    # the filters are the same matrix
    np.testing.assert_allclose(slaney_mel_filters(400, 128, 16000, 8000.0).T, fe.mel_filters, rtol=0, atol=1e-12)


def _numpy_float64_log_mel(padded: np.ndarray) -> np.ndarray:
    """Independent float64 implementation of DESIGN §1.1 (numpy only)."""
    x = np.pad(padded.astype(np.float64), 200, mode="reflect")
    n_frames = 1 + (x.size - 400) // 160
    frames = np.lib.stride_tricks.sliding_window_view(x, 400)[::160][:n_frames]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)  # periodic Hann
    power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
    power = power[:-1]  # the last STFT frame is dropped
    mel = slaney_mel_filters(400, 128, 16000, 8000.0) @ power.T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, 1.5 - 8.0)
    return (log_spec + 4.0) / 4.0


def test_log_mel_fp32_vs_float64():
    padded = padded_for_offline(synthetic_audio(1.7, seed=2), 6)
    ours = log_mel_spectrogram(padded, CFG)
    assert ours.dtype == torch.float32
    ref = _numpy_float64_log_mel(padded)
    assert ours.shape == ref.shape
    assert np.abs(ours.double().numpy() - ref).max() <= 1e-5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_mel_equals_offline_for_any_chunking(seed):
    rng = np.random.default_rng(seed)
    audio = padded_for_offline(synthetic_audio(1.5, seed=seed), 3)
    offline = log_mel_spectrogram(audio, CFG)
    inc = IncrementalLogMel(CFG)
    got = []
    pos = 0
    while pos < audio.size:
        n = int(rng.choice([1, 7, 160, 399, 1280, 5000]))
        inc.push(torch.from_numpy(audio[pos: pos + n]))
        pos += n
        k = inc.available()
        if k and rng.random() < 0.7:
            got.append(inc.compute(int(rng.integers(1, k + 1))))
    got.append(inc.compute(inc.available()))
    stream = torch.cat(got, dim=1)
    # the stream lacks only the final frames whose window runs past the end (offline sees zeros there)
    assert stream.shape[1] == offline.shape[1] - 1
    assert torch.equal(stream, offline[:, : stream.shape[1]])


def test_incremental_mel_keeps_memory_bounded():
    inc = IncrementalLogMel(CFG)
    for _ in range(200):
        inc.push(torch.zeros(1600))
        inc.compute(inc.available())
    assert inc.buffered_samples < 1000


@pytest.mark.parametrize("rate", [8000, 24000, 44100, 48000])
def test_resampler_accuracy_and_streaming(rate):
    seconds = 1.0
    t = np.arange(int(rate * seconds)) / rate
    x = (0.5 * np.sin(2 * np.pi * 440 * t) + 0.25 * np.sin(2 * np.pi * 1500 * t)).astype(np.float32)
    whole = resample(x, rate, 16000)
    assert abs(whole.size - 16000 * seconds) <= 1
    ts = np.arange(whole.size) / 16000
    ideal = 0.5 * np.sin(2 * np.pi * 440 * ts) + 0.25 * np.sin(2 * np.pi * 1500 * ts)
    mid = slice(800, whole.size - 800)  # away from the edges, where the signal starts/stops abruptly
    assert np.abs(whole[mid] - ideal[mid]).max() < 1e-3
    # chunked == whole, for awkward chunk sizes
    r = StreamingResampler(rate, 16000)
    rng = np.random.default_rng(rate)
    parts, pos = [], 0
    while pos < x.size:
        n = int(rng.integers(1, 3000))
        parts.append(r.push(x[pos: pos + n]))
        pos += n
    parts.append(r.flush())
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_resampler_blocks_do_not_change_samples_and_bound_memory(monkeypatch):
    """The outputs are computed in blocks (`OUTPUT_BLOCK`): any block size gives the same samples, and one push of
    a minute of 8 kHz audio (a large G.711 append) allocates a few MB of temporaries, not the gigabytes of doing
    all its outputs at once."""
    x = np.random.default_rng(5).standard_normal(8000 * 60).astype(np.float32) * 0.1
    whole = resample(x, 8000, 16000)
    monkeypatch.setattr(StreamingResampler, "OUTPUT_BLOCK", 7)
    np.testing.assert_array_equal(resample(x, 8000, 16000), whole)
    monkeypatch.undo()
    tracemalloc.start()
    try:
        r = StreamingResampler(8000, 16000)
        out = np.concatenate([r.push(x), r.flush()])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, whole)
    # the input in float64 (3.8 MB), the buffer and the output, plus one block's temporaries
    assert peak < 32e6, peak


def test_resampler_removes_content_above_new_nyquist():
    rate = 48000
    t = np.arange(rate) / rate
    x = np.sin(2 * np.pi * 12000 * t).astype(np.float32)  # above 8 kHz: must not alias into the output
    y = resample(x, rate, 16000)
    assert np.abs(y[1000:-1000]).max() < 1e-2


def test_input_validation_errors():
    with pytest.raises(AudioError, match="NaN"):
        as_mono_float32(np.array([0.0, np.nan], np.float32))
    with pytest.raises(AudioError, match="infinite"):
        as_mono_float32(np.array([0.0, np.inf], np.float32))
    with pytest.raises(AudioError, match="shape"):
        as_mono_float32(np.zeros((2, 100), np.float32))
    with pytest.raises(AudioError, match="shape"):
        as_mono_float32(np.zeros((1, 2, 3), np.float32))
    with pytest.raises(AudioError, match="integer"):
        as_mono_float32(np.zeros(10, np.int16))
    with pytest.raises(AudioError, match="numpy array"):
        as_mono_float32("not audio")
    with pytest.raises(AudioError, match="even number"):
        pcm16_to_float(b"\x00\x01\x02")
    assert as_mono_float32(np.zeros((1, 5))).shape == (5,)
    np.testing.assert_allclose(pcm16_to_float(np.array([-32768, 0, 16384], "<i2").tobytes()), [-1.0, 0.0, 0.5])
    # half-precision tensors (bfloat16 has no numpy dtype) are converted; complex ones are an AudioError
    half = torch.tensor([0.5, -0.25, 0.125])
    for dt in (torch.bfloat16, torch.float16):
        np.testing.assert_array_equal(as_mono_float32(half.to(dt)), [0.5, -0.25, 0.125])
    with pytest.raises(AudioError, match="must hold numbers"):
        as_mono_float32(torch.zeros(4, dtype=torch.complex64))
    # `owned`: the result never shares memory with the caller's buffer (float32 arrays and CPU tensors alike)
    buf, tensor = np.zeros(8, np.float32), torch.zeros(8)
    assert np.shares_memory(as_mono_float32(buf), buf)  # the default may return the caller's array itself
    for src in (buf, buf[None, :], tensor, tensor[None, :]):
        out = as_mono_float32(src, owned=True)
        src[..., 0] = 1.0
        assert out[0] == 0.0
        src[..., 0] = 0.0


def test_load_audio_file_formats(tmp_path):
    x = synthetic_audio(0.5, seed=3)
    stereo = np.stack([x, x * 0.5], axis=1)
    sf.write(tmp_path / "a.wav", stereo, 48000)
    sf.write(tmp_path / "b.flac", x, 16000)
    a = load_audio_file(tmp_path / "a.wav")
    assert abs(a.size - int(0.5 * 16000 * 16000 / 48000)) <= 1
    b = load_audio_file(tmp_path / "b.flac")
    assert b.size == x.size and np.abs(b - x).max() < 1e-4  # FLAC is 16-bit here
    (tmp_path / "c.mp3").write_bytes(b"ID3\x03\x00not really an mp3")
    with pytest.raises(AudioError, match="not a readable audio file"):
        load_audio_file(tmp_path / "c.mp3")
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)
    sf.write(tmp_path / "d.ogg", tone, 16000, subtype="OPUS")  # Opus decodes at 48 kHz: resampled back
    d = load_audio_file(tmp_path / "d.ogg")
    assert abs(d.size - tone.size) <= 2 and np.corrcoef(d[1000:15000], tone[1000:15000])[0, 1] > 0.99
    sf.write(tmp_path / "f.aiff", x, 16000)
    with pytest.raises(AudioError, match="not supported"):
        load_audio_file(tmp_path / "f.aiff")
    with pytest.raises(AudioError, match="does not exist"):
        load_audio_file(tmp_path / "missing.wav")
    sf.write(tmp_path / "e.wav", np.zeros(0, np.float32), 16000)
    with pytest.raises(AudioError, match="no audio"):
        load_audio_file(tmp_path / "e.wav")


def test_mp3_files_and_audio_bytes(tmp_path):
    """MP3 reads like the others (the HTTP upload's most common format), and `decode_audio_bytes` reads a file's bytes
    from memory exactly as `load_audio_file` reads the file; bad bytes give an AudioError naming the upload."""
    import io

    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(24000) / 24000)).astype(np.float32)
    sf.write(tmp_path / "t.mp3", tone, 24000)
    m = load_audio_file(tmp_path / "t.mp3")
    assert abs(m.size - 16000) < 1200  # the encoder's padding adds a few milliseconds
    ref = (0.5 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)
    lag = int(np.argmax(np.correlate(m[2000:6000], ref[2000:3000], mode="valid")))
    assert np.corrcoef(m[2000 + lag:2000 + lag + 1000], ref[2000:3000])[0, 1] > 0.98
    x = synthetic_audio(0.5, seed=4)
    buf = io.BytesIO()
    sf.write(buf, np.stack([x, 0.5 * x], axis=1), 44100, format="FLAC")
    (tmp_path / "s.flac").write_bytes(buf.getvalue())
    np.testing.assert_array_equal(decode_audio_bytes(buf.getvalue()), load_audio_file(tmp_path / "s.flac"))
    with pytest.raises(AudioError, match="up.wav: not a readable audio file"):
        decode_audio_bytes(b"RIFF\x00\x00garbage", name="up.wav")
    with pytest.raises(AudioError, match="empty"):
        decode_audio_bytes(b"")


def test_decoding_stops_at_the_audio_limit(monkeypatch):
    """`max_seconds` holds while decoding too, for files whose header says less than they hold (the header check
    alone would let them through): decoding stops a block past the limit instead of filling memory."""
    import io

    import realtime.audio as audio_mod

    buf = io.BytesIO()
    sf.write(buf, np.zeros(48000 * 30, np.float32), 48000, format="FLAC")
    data = buf.getvalue()
    assert decode_audio_bytes(data, max_seconds=31).size == 16000 * 30
    with pytest.raises(audio_mod.AudioTooLong, match="longer than the 20 s"):
        decode_audio_bytes(data, max_seconds=20)  # by the header
    real_info = sf.info

    def lying_info(source):
        info = real_info(source)
        info.frames = 48000  # "1 s"
        return info

    monkeypatch.setattr(sf, "info", lying_info)
    pushed = []
    real_push = audio_mod.StreamingResampler.push
    monkeypatch.setattr(audio_mod.StreamingResampler, "push",
                        lambda self, x: pushed.append(x.size) or real_push(self, x))
    with pytest.raises(audio_mod.AudioTooLong):
        decode_audio_bytes(data, max_seconds=20)
    assert 20 * 48000 < sum(pushed) <= 20 * 48000 + 2 * audio_mod.DECODE_BLOCK_FRAMES  # stopped near the limit


def test_log_mel_runs_on_the_device_of_its_input():
    """CPU part of the GPU check below: the window and filters follow the input to its device (here
    PyTorch's shape-only "meta" device), copied there once, and the output stays there."""
    mel = LogMel(CFG)
    x = torch.zeros(3, mel.samples_needed(8), device="meta")
    out = mel.from_padded(x, 8)
    assert out.device.type == "meta" and out.shape == (3, CFG.num_mel_bins, 8)
    window, filters = mel._constants(torch.device("meta"))
    assert window.device.type == filters.device.type == "meta"
    assert mel._constants(torch.device("meta"))[0] is window  # cached, not copied per step
    assert mel._constants(torch.device("cpu"))[0] is mel.window


@pytest.mark.gpu
def test_log_mel_on_the_gpu_matches_the_host():
    """The GPU engine computes its log-mel on the device (LogMel follows its input's device): a batch
    of sample windows gives the host's float64 result to rounding, and the model-dtype output the same
    values; the incremental front-end asked for device frames returns them on that device."""
    g = torch.Generator().manual_seed(5)
    windows = 0.3 * torch.randn(64, LogMel(CFG).samples_needed(8), generator=g)
    windows[:8] = 0.0  # silent rows: the clamp at the log floor must agree too
    exact = LogMel(CFG, torch.float64)
    host, dev = exact.from_padded(windows, 8), exact.from_padded(windows.cuda(), 8)
    assert dev.device.type == "cuda" and dev.shape == host.shape == (64, CFG.num_mel_bins, 8)
    assert torch.allclose(dev.cpu(), host, rtol=0, atol=1e-12)
    f32 = LogMel(CFG)
    assert (f32.from_padded(windows.cuda(), 8).cpu() - f32.from_padded(windows, 8)).abs().max() <= 1e-6
    inc = IncrementalLogMel(CFG)
    inc.push(torch.from_numpy(synthetic_audio(1.0, seed=3)))
    ref = IncrementalLogMel(CFG)
    ref.push(torch.from_numpy(synthetic_audio(1.0, seed=3)))
    got, want = inc.compute(40, "cuda"), ref.compute(40)
    assert got.device.type == "cuda" and torch.allclose(got.cpu(), want, rtol=0, atol=1e-6)
