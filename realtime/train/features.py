"""Batched log-mel on any device, equal to `realtime.audio.log_mel_spectrogram` frame for frame.

The shipped front-end computes in float64 on the CPU, one stream at a time; training needs the same
features for a whole batch on the GPU. Same recipe (DESIGN §1.1): zero-extended centred frames,
periodic Hann window, power spectrum, Slaney mel filters, log10 floored at the fixed
`global_log_mel_max - 8`, `(x + 4) / 4`; frames `0 .. len // hop - 1`. A test checks the two agree.

Optionally a per-row frequency warp (VTLP, drawn by `augment.draw_warp`): `power_w[f] = power[f / alpha]`,
linear interpolation between FFT bins. It is folded into per-row filters `F_b = filters @ W_b`, so a
warped batch costs one extra small batched matmul and no per-row Python work.
"""

from __future__ import annotations

import torch

from ..audio import normalised_log_mel, slaney_mel_filters
from ..config import AudioFrontendConfig


class BatchLogMel:
    def __init__(self, cfg: AudioFrontendConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.cfg = cfg
        self.dtype = dtype
        self.window = torch.hann_window(cfg.n_fft, dtype=dtype, device=device)
        self.filters = torch.from_numpy(
            slaney_mel_filters(cfg.n_fft, cfg.num_mel_bins, cfg.sampling_rate, cfg.mel_fmax)).to(device, dtype)

    def warped_filters(self, warp: torch.Tensor) -> torch.Tensor:
        """Per-row mel filters [B, n_mels, n_freq] = `filters @ W_b` for warp factors `warp` [B].

        `W_b[k, j]` is the linear-interpolation weight of source bin j for output bin k, whose source
        position is `k / alpha` bins. Band edge: for alpha < 1 the top output bins (above
        `alpha * Nyquist`) would read above Nyquist; their source is clamped to the Nyquist bin, so they
        repeat its power (the edge of the spectrum extends flat) rather than dropping to digital zero,
        a hole that real audio, with its noise floor, never shows. For alpha > 1 the content above
        `Nyquist / alpha` is pushed out of the band. A zero-power frame (streaming padding) stays zero.

        alpha == 1 gives `W_b` == identity and `F_b` == `filters` exactly (1 * x plus exact zeros)."""
        n_freq = self.filters.shape[-1]
        k = torch.arange(n_freq, dtype=self.dtype, device=self.filters.device)
        src = (k[None, :] / warp.to(self.filters.device, self.dtype)[:, None]).clamp(max=n_freq - 1)
        w = (1.0 - (src[:, :, None] - k[None, None, :]).abs()).clamp(min=0.0)  # hat weights [B, out, src]
        return self.filters @ w

    def __call__(self, audio: torch.Tensor, warp: torch.Tensor | None = None,
                 eq: torch.Tensor | None = None) -> torch.Tensor:
        """audio [B, L] (L a multiple of hop) -> log-mel [B, n_mels, L // hop].

        warp: optional VTLP factors [B] (1.0 = unwarped row), see `warped_filters`.
        eq: optional power gains [B, n_mels] applied to the mel power before the log (a random
        equaliser, `augment.draw_eq`); a zero-power frame stays zero, so padding stays digital silence."""
        n_fft, hop = self.cfg.n_fft, self.cfg.hop_length
        x = audio.to(self.dtype)
        n_frames = x.shape[-1] // hop
        spec = torch.stft(x, n_fft, hop_length=hop, window=self.window, center=True, pad_mode="constant",
                          return_complex=True)[..., :n_frames]
        power = spec.real.square() + spec.imag.square()
        # [n_mels, F] @ [B, F, T] runs as a bmm over the filters expanded to the batch (torch.matmul
        # does not fold a 3-D right operand whose transpose is not contiguous), so the warped path,
        # `F_b @ power` with F_b == filters for alpha == 1, computes an unwarped row bit for bit alike.
        filters = self.filters if warp is None else self.warped_filters(warp)
        mel = filters @ power
        if eq is not None:
            mel = mel * eq.to(mel.dtype)[:, :, None]
        return normalised_log_mel(mel, self.cfg)
