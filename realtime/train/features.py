"""Batched log-mel on any device, equal to `realtime.audio.log_mel_spectrogram` frame for frame.

The shipped front-end computes in float64 on the CPU, one stream at a time; training needs the same
features for a whole batch on the GPU. Same recipe (DESIGN §1.1): zero-extended centred frames,
periodic Hann window, power spectrum, Slaney mel filters, log10 floored at the fixed
`global_log_mel_max - 8`, `(x + 4) / 4`; frames `0 .. len // hop - 1`. A test checks the two agree.
"""

from __future__ import annotations

import torch

from ..audio import slaney_mel_filters
from ..config import AudioFrontendConfig


class BatchLogMel:
    def __init__(self, cfg: AudioFrontendConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.cfg = cfg
        self.dtype = dtype
        self.window = torch.hann_window(cfg.n_fft, dtype=dtype, device=device)
        self.filters = torch.from_numpy(
            slaney_mel_filters(cfg.n_fft, cfg.num_mel_bins, cfg.sampling_rate, cfg.mel_fmax)).to(device, dtype)

    def __call__(self, audio: torch.Tensor) -> torch.Tensor:
        """audio [B, L] (L a multiple of hop) -> log-mel [B, n_mels, L // hop]."""
        n_fft, hop = self.cfg.n_fft, self.cfg.hop_length
        x = audio.to(self.dtype)
        n_frames = x.shape[-1] // hop
        spec = torch.stft(x, n_fft, hop_length=hop, window=self.window, center=True, pad_mode="constant",
                          return_complex=True)[..., :n_frames]
        power = spec.real.square() + spec.imag.square()
        mel = self.filters @ power
        log_spec = torch.clamp(mel, min=1e-10).log10()
        log_spec = torch.clamp(log_spec, min=self.cfg.global_log_mel_max - 8.0)
        return (log_spec + 4.0) / 4.0
