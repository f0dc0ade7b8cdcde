"""Batch augmentation in torch (runs on the GPU next to training; no sox on the training machine).

The torch equivalents of speech_data.md §4's sox recipe, all length-preserving so word times stay
valid: gain, room reverb (a synthetic exponentially decaying RIR, tail cut like `sox reverb`),
telephone band (300-3400 Hz), coloured noise at 5-30 dB SNR, and a faint noise floor (real
recordings are never digitally silent). Speed and pitch are drawn at synthesis time instead, through
the engines' duration and pitch controls, which keeps the word times exact.

Vocal tract length perturbation (VTLP, Jaitly & Hinton 2013) is drawn here too (`draw_warp`), but it
is applied inside the log-mel (`BatchLogMel(audio, warp)`): it warps the frequency axis of each row's
power spectrum by a factor alpha, moving the formants as a longer or shorter vocal tract would, and
leaves the time axis, hence the word times, untouched.

Spectral masks (SpecAugment, Park et al. 2019) are drawn last (`draw_masks`) and applied to the
log-mel (`apply_masks`): a few frequency bands and a few short time spans per row are set to the
log-mel floor, i.e. digital silence in those bins. Frequency masks make the model read a word from
several parts of the spectrum, so a voice whose energy sits elsewhere (an unseen speaker) still reads;
the time spans are kept short (at most 80 ms, one per 5 s) because the targets are word-timed: a long
span would hide a whole word whose token the model must still emit.

A random equaliser (`draw_eq`) multiplies each row's mel power by a smooth random curve over the mel
bins (a few cosines: a tilt and broad bumps of up to `eq_db` dB), applied inside the log-mel like the
warp. It changes the spectral envelope's slope and broad resonances, the part of a speaker's timbre
(and of a microphone) that VTLP's stretch does not move, and leaves timing and silence untouched.

Only the user region of each stream is touched: the left/right streaming padding stays exact
zeros, as the session pushes it at inference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AugmentConfig:
    p_reverb: float = 0.3
    p_telephone: float = 0.15
    p_noise: float = 0.6
    p_floor: float = 0.8
    snr_db: tuple[float, float] = (5.0, 30.0)
    gain_db: tuple[float, float] = (-18.0, 3.0)
    rt60_s: tuple[float, float] = (0.15, 0.7)
    rate: int = 16000
    p_warp: float = 0.6  # VTLP: share of rows whose spectrum is warped (see `draw_warp`)
    warp: tuple[float, float] = (0.85, 1.15)  # frequency warp factor alpha, uniform in this range
    p_mask: float = 0.8  # share of rows that get spectral masks (see `draw_masks`)
    freq_masks: int = 2  # frequency bands per masked row, each up to `freq_mask_bins` wide
    freq_mask_bins: int = 20
    time_mask_every_frames: int = 500  # one time span per this many frames (5 s), rounded up
    time_mask_frames: int = 8  # each at most this many 10 ms frames wide
    p_eq: float = 0.0  # share of rows whose mel power gets a random smooth gain curve (see `draw_eq`)
    eq_db: float = 6.0  # amplitude of the curve's first cosine, in dB (the j-th: eq_db / j)
    eq_terms: int = 4  # cosines in the curve

    def __post_init__(self) -> None:
        # checked here, for every caller: a bad value would otherwise surface minutes into a training call
        for name in ("p_reverb", "p_telephone", "p_noise", "p_floor", "p_warp", "p_mask", "p_eq"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} is a share of rows in [0, 1], got {getattr(self, name)}")
        lo, hi = self.warp
        if not 0.0 < lo <= 1.0 <= hi:
            raise ValueError(f"warp needs 0 < LO <= 1 <= HI (1.0 is the unwarped spectrum), got {self.warp}")
        if self.freq_masks < 0 or self.freq_mask_bins < 1:
            raise ValueError(f"freq_masks must be >= 0 and freq_mask_bins >= 1, got {self.freq_masks}, "
                             f"{self.freq_mask_bins}")


def _uniform(n: int, lo: float, hi: float, g: torch.Generator, device: torch.device) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=g, device=device)


def _coloured_noise(shape: tuple[int, int], alpha: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Noise with power spectrum 1/f^alpha per row (0 white, 1 pink, 2 brown), unit RMS."""
    n = shape[1]
    white = torch.randn(shape, generator=g, device=alpha.device)
    spec = torch.fft.rfft(white, dim=-1)
    f = torch.arange(spec.shape[-1], device=alpha.device).clamp(min=1).float()
    spec = spec * f[None, :].pow(-alpha[:, None] / 2)
    out = torch.fft.irfft(spec, n=n, dim=-1)
    return out / out.square().mean(-1, keepdim=True).sqrt().clamp(min=1e-8)


def augment(audio: torch.Tensor, user: torch.Tensor, cfg: AugmentConfig, g: torch.Generator) -> torch.Tensor:
    """audio [B, L] float32 (padding already zero); user [B, L] bool, True on the user region."""
    b, n = audio.shape
    dev = audio.device
    x = audio
    mask = user.to(x.dtype)
    # reverb: RIR = direct impulse + decaying noise, energy-normalised; FFT convolution, tail cut
    # Branches are gated on the configuration, never on the random draws: a host-side `any()` would
    # synchronise with the GPU every batch and stall the training loop's look-ahead.
    rev = torch.rand(b, generator=g, device=dev) < cfg.p_reverb
    if cfg.p_reverb > 0:
        rir_len = int(0.5 * cfg.rate)
        t = torch.arange(rir_len, device=dev).float() / cfg.rate
        rt60 = _uniform(b, *cfg.rt60_s, g, dev)
        decay = torch.exp(-6.9078 * t[None, :] / rt60[:, None])  # -60 dB at rt60
        rir = torch.randn(b, rir_len, generator=g, device=dev) * decay * _uniform(b, 0.2, 0.6, g, dev)[:, None]
        rir[:, 0] = 1.0
        rir = rir / rir.square().sum(-1, keepdim=True).sqrt()
        size = 1 << math.ceil(math.log2(n + rir_len))
        wet = torch.fft.irfft(torch.fft.rfft(x, size) * torch.fft.rfft(rir, size), size)[:, :n]
        x = torch.where(rev[:, None], wet * mask, x)
    # telephone band: zero the spectrum outside 300-3400 Hz
    tel = torch.rand(b, generator=g, device=dev) < cfg.p_telephone
    if cfg.p_telephone > 0:
        spec = torch.fft.rfft(x, dim=-1)
        hz = torch.fft.rfftfreq(n, 1.0 / cfg.rate).to(dev)
        band = ((hz >= 300) & (hz <= 3400)).to(x.dtype)
        x = torch.where(tel[:, None], torch.fft.irfft(spec * band, n=n) * mask, x)
    # gain
    x = x * (10 ** (_uniform(b, *cfg.gain_db, g, dev) / 20))[:, None]
    # noise at an SNR relative to the speech RMS of the row
    speech_rms = (x.square() * mask).sum(-1).div(mask.sum(-1).clamp(min=1)).sqrt()
    noisy = torch.rand(b, generator=g, device=dev) < cfg.p_noise
    alpha = torch.randint(0, 3, (b,), generator=g, device=dev).float()
    snr = _uniform(b, *cfg.snr_db, g, dev)
    level = torch.where(noisy, speech_rms * 10 ** (-snr / 20), torch.zeros_like(snr))
    floor = torch.rand(b, generator=g, device=dev) < cfg.p_floor
    level = level + floor * 10 ** (_uniform(b, -75.0, -55.0, g, dev) / 20)
    if cfg.p_noise > 0 or cfg.p_floor > 0:
        x = x + _coloured_noise((b, n), alpha, g) * level[:, None] * mask
    return x.clamp(-1.0, 1.0) * mask


def draw_warp(b: int, cfg: AugmentConfig, g: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """VTLP factors [b] for `BatchLogMel(audio, warp)`: uniform in `cfg.warp` with probability
    `cfg.p_warp`, exactly 1.0 otherwise.

    Call it after `augment` with the same generator: the earlier augmentations keep their random
    streams. Both draws happen whatever the configuration, and the choice is a `torch.where`, not a
    host-side branch on the draws (see `augment`)."""
    on = torch.rand(b, generator=g, device=device) < cfg.p_warp
    alpha = _uniform(b, *cfg.warp, g, device)
    return torch.where(on, alpha, torch.ones_like(alpha))


def draw_masks(b: int, n_mels: int, frames: int, cfg: AugmentConfig, g: torch.Generator,
               device: torch.device | str) -> torch.Tensor:
    """Spectral masks [b, n_mels, frames], True where `apply_masks` sets the log-mel to its floor.

    A masked row (probability `cfg.p_mask`) gets `cfg.freq_masks` bands of width uniform in
    [0, freq_mask_bins] and ceil(frames / time_mask_every_frames) spans of width uniform in
    [0, time_mask_frames], each at a uniform start. Draw after `draw_warp` with the same generator;
    the number of draws depends on the shape only (no host-side branch on the draws)."""
    on = torch.rand(b, generator=g, device=device) < cfg.p_mask

    def spans(count: int, width: int, length: int) -> torch.Tensor:  # [b, length] bool
        w = torch.randint(0, width + 1, (b, count), generator=g, device=device)
        start = (torch.rand(b, count, generator=g, device=device) * (length - w + 1)).floor().long()
        pos = torch.arange(length, device=device)
        hit = (pos[None, None, :] >= start[..., None]) & (pos[None, None, :] < (start + w)[..., None])
        return hit.any(1)

    freq = spans(cfg.freq_masks, min(cfg.freq_mask_bins, n_mels), n_mels)
    time = spans(-(-frames // cfg.time_mask_every_frames), min(cfg.time_mask_frames, frames), frames)
    return (freq[:, :, None] | time[:, None, :]) & on[:, None, None]


def apply_masks(mel: torch.Tensor, masks: torch.Tensor, floor: float) -> torch.Tensor:
    """mel [B, n_mels, T] with the masked bins at `floor` (digital silence: `realtime.audio.log_mel_floor`),
    the rest untouched."""
    return torch.where(masks, torch.full_like(mel, floor), mel)


def draw_eq(b: int, n_mels: int, cfg: AugmentConfig, g: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """Random equaliser gains [b, n_mels] (power ratios) for `BatchLogMel(audio, warp, eq)`.

    With probability `cfg.p_eq` a row's gain in dB is `sum_j c_j cos(pi j m / (n_mels - 1) + phi_j)`
    over the mel bin m, j = 1..eq_terms, c_j uniform in +-eq_db / j and phi_j uniform in [0, 2 pi):
    smooth over the bins, largest at the broadest scale. Other rows get exactly 1.0. Draw after
    `draw_masks` with the same generator; the draws depend on the shape only."""
    on = torch.rand(b, generator=g, device=device) < cfg.p_eq
    j = torch.arange(1, cfg.eq_terms + 1, device=device, dtype=torch.float32)
    amp = (torch.rand(b, cfg.eq_terms, generator=g, device=device) * 2 - 1) * cfg.eq_db / j
    phase = torch.rand(b, cfg.eq_terms, generator=g, device=device) * (2 * math.pi)
    m = torch.arange(n_mels, device=device, dtype=torch.float32) / max(1, n_mels - 1)
    db = (amp[:, :, None] * torch.cos(math.pi * j[None, :, None] * m[None, None, :] + phase[:, :, None])).sum(1)
    gain = torch.pow(10.0, db / 10.0)
    return torch.where(on[:, None], gain, torch.ones_like(gain))
