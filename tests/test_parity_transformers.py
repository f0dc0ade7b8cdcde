"""Parity with transformers' VoxtralRealtimeForConditionalGeneration on tiny random checkpoints (CPU, fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import padded_for_offline, synthetic_audio
from realtime.attention import DenseAttention
from realtime.audio import log_mel_spectrogram
from realtime.loader import load_model
from realtime.session import transcribe
from realtime.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

_HF_CACHE: dict = {}


def hf_model(path):
    if path not in _HF_CACHE:
        transformers.logging.set_verbosity_error()
        m = transformers.VoxtralRealtimeForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
        _HF_CACHE[path] = m.eval()
    return _HF_CACHE[path]


def hf_features(padded: np.ndarray) -> torch.Tensor:
    fe = transformers.VoxtralRealtimeFeatureExtractor()
    return fe(padded, sampling_rate=16000, return_tensors="pt").input_features


def hf_generate(model, cfg, audio: np.ndarray, delay: int) -> list[int]:
    padded = padded_for_offline(audio, delay)
    prompt = torch.tensor([cfg.prompt_ids(delay)])
    with torch.no_grad():
        out = model.generate(input_ids=prompt, input_features=hf_features(padded),
                             attention_mask=torch.ones_like(prompt), num_delay_tokens=delay, do_sample=False)
    return out[0, prompt.shape[1]:].tolist()


CASES = [
    # (seconds, small_windows)
    (1.0, False),
    (7.37, False),
    (6.0, True),  # longer than the encoder window (8 frames) and decoder window (6 tokens) many times over
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("seconds,small_windows", CASES)
@pytest.mark.parametrize("delay", [1, 6, 30])
def test_greedy_tokens_and_logits_match(tiny_ckpt, seed, seconds, small_windows, delay):
    path = tiny_ckpt(seed=seed, small_windows=small_windows)
    ours, _ = load_model(path)
    tok = load_tokenizer(path)
    ref = hf_model(path)
    audio = synthetic_audio(seconds, seed=seed + 10)

    expected = hf_generate(ref, ours.config, audio, delay)
    got = transcribe(ours, tok, audio, delay_ms=delay * 80)
    assert got.token_ids == expected
    assert len(set(expected)) > 1, "outputs must not be constant, or the test proves nothing"

    # logits of the whole teacher-forced sequence, both networks fed the same features (our float64
    # front-end and transformers' float32 one differ by ~1e-5 in quiet bins; that is tested apart)
    padded = padded_for_offline(audio, delay)
    feats = hf_features(padded)
    n = padded.size // 1280
    ids = torch.tensor([ours.config.prompt_ids(delay) + got.token_ids])[:, :n]
    with torch.no_grad():
        ref_logits = ref(input_ids=ids, input_features=feats, attention_mask=torch.ones_like(ids),
                         num_delay_tokens=delay).logits
        our_logits = ours(ids, feats, torch.tensor([delay]))
    assert (ref_logits - our_logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("small_windows", [False, True])
def test_encoder_and_adapter_outputs_match(tiny_ckpt, small_windows):
    path = tiny_ckpt(seed=3, small_windows=small_windows)
    ours, _ = load_model(path)
    ref = hf_model(path)
    padded = padded_for_offline(synthetic_audio(3.0, seed=3), 6)
    feats = hf_features(padded)
    with torch.no_grad():
        ref_out = ref.model.get_audio_features(input_features=feats, return_dict=True)
        mel = log_mel_spectrogram(padded, ours.config.audio)[None]
        frames, _ = ours.audio_tower.embedder(feats, ours.audio_tower.embedder.initial_state(1, "cpu", torch.float32))
        pos = torch.arange(frames.shape[1])[None]
        enc = ours.audio_tower(frames, pos, DenseAttention(pos, ours.config.encoder.sliding_window))
        adapted = ours.multi_modal_projector(enc)
    assert (feats[0] - mel[0]).abs().max().item() <= 1e-3
    assert (ref_out.last_hidden_state - enc).abs().max().item() <= 1e-4
    assert (ref_out.pooler_output - adapted).abs().max().item() <= 1e-4


def test_batch_of_two_lengths(tiny_ckpt):
    """transformers on a padded batch of two clips == our session on each clip alone."""
    path = tiny_ckpt(seed=4)
    ours, _ = load_model(path)
    tok = load_tokenizer(path)
    ref = hf_model(path)
    delay = 6
    clips = [synthetic_audio(1.3, seed=40), synthetic_audio(3.1, seed=41)]
    padded = [padded_for_offline(c, delay) for c in clips]
    longest = max(p.size for p in padded)
    batch = np.stack([np.pad(p, (0, longest - p.size)) for p in padded])
    fe = transformers.VoxtralRealtimeFeatureExtractor()
    feats = fe(list(batch), sampling_rate=16000, return_tensors="pt").input_features
    prompt = torch.tensor([ours.config.prompt_ids(delay)] * 2)
    with torch.no_grad():
        out = ref.generate(input_ids=prompt, input_features=feats, attention_mask=torch.ones_like(prompt),
                           num_delay_tokens=delay, do_sample=False)
    for i, clip in enumerate(clips):
        got = transcribe(ours, tok, clip, delay_ms=delay * 80).token_ids
        # the shorter clip's extra zero padding only adds tokens after its own end
        assert out[i, prompt.shape[1]: prompt.shape[1] + len(got)].tolist() == got


def test_different_delays_in_one_batch(tiny_ckpt):
    """Our teacher-forced forward with a per-row delay equals transformers run once per delay."""
    path = tiny_ckpt(seed=5)
    ours, _ = load_model(path)
    ref = hf_model(path)
    audio = synthetic_audio(2.0, seed=50)
    delays = [2, 15]
    n = max(padded_for_offline(audio, d).size for d in delays) // 1280
    mels, ids, refs = [], [], []
    for d in delays:
        padded = padded_for_offline(audio, d)
        padded = np.pad(padded, (0, n * 1280 - padded.size))
        feats = hf_features(padded)
        gen = hf_generate(ref, ours.config, audio, d)
        row = (ours.config.prompt_ids(d) + gen + [0] * n)[:n]
        t = torch.tensor([row])
        with torch.no_grad():
            refs.append(ref(input_ids=t, input_features=feats, attention_mask=torch.ones_like(t),
                            num_delay_tokens=d).logits[0])
        mels.append(feats[0])
        ids.append(row)
    with torch.no_grad():
        logits = ours(torch.tensor(ids), torch.stack(mels), torch.tensor(delays))
    for i in range(len(delays)):
        assert (logits[i] - refs[i]).abs().max().item() <= 1e-4
