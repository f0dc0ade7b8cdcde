"""VTLP (frequency warp), spectral masks and the random equaliser: exact when off, do what they say, reproducible."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import synthetic_shard

from realtime.audio import log_mel_floor
from realtime.config import AudioFrontendConfig
from realtime.tokenizer import load_tokenizer
from realtime.tokenizer_build import NUM_CONTROL_TOKENS, shipped_tekken_ranks, write_tokenizer_json
from realtime.train.augment import AugmentConfig, apply_masks, augment, draw_eq, draw_masks, draw_warp
from realtime.train.data import BatchConfig, Corpus, StreamBatcher
from realtime.train.features import BatchLogMel
from realtime.train.model_size import SIZES
from realtime.train.train import NO_AUGMENT

RATE = 16000


def _noise(b: int, seconds: float = 1.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, int(seconds * RATE), generator=g) * 0.1
    x[:, : RATE // 4] = 0.0  # a silent lead, like the streaming padding
    return x


def test_warp_of_ones_is_bitwise_the_unwarped_log_mel() -> None:
    mel = BatchLogMel(AudioFrontendConfig())
    x = _noise(4)
    plain = mel(x)
    assert torch.equal(mel(x, torch.ones(4)), plain)
    # in a mixed batch the rows at 1.0 are untouched, the others are not
    mixed = mel(x, torch.tensor([1.0, 0.9, 1.0, 1.1]))
    assert torch.equal(mixed[0], plain[0]) and torch.equal(mixed[2], plain[2])
    assert not torch.equal(mixed[1], plain[1]) and not torch.equal(mixed[3], plain[3])
    # silent frames stay at the floor (a zero spectrum warps to zero)
    assert torch.equal(mixed[:, :, :20], plain[:, :, :20])


def _peak_bin(mel: BatchLogMel, hz: float, warp: float | None = None) -> int:
    t = torch.arange(RATE) / RATE
    x = (0.3 * torch.sin(2 * torch.pi * hz * t))[None]
    out = mel(x, None if warp is None else torch.tensor([warp]))
    return int(out[0, :, 5:-5].mean(-1).argmax())


@pytest.mark.parametrize("hz", [1000.0, 3000.0])
@pytest.mark.parametrize("alpha", [1.1, 0.9])
def test_warp_moves_a_sine_to_alpha_times_its_frequency(hz: float, alpha: float) -> None:
    mel = BatchLogMel(AudioFrontendConfig())
    moved = _peak_bin(mel, hz, alpha)
    assert moved == _peak_bin(mel, alpha * hz)
    assert moved != _peak_bin(mel, hz)  # 10% is several mel bins


def test_band_edge_repeats_the_nyquist_bin_for_alpha_below_one() -> None:
    mel = BatchLogMel(AudioFrontendConfig())
    f = mel.warped_filters(torch.tensor([0.9, 1.1]))
    n_freq = mel.filters.shape[-1]
    top = n_freq - 1
    # alpha < 1: output bins above 0.9 * Nyquist read past Nyquist -> clamped onto the Nyquist bin, so the
    # top mel filters take all their weight from it (no digital-zero hole)
    assert torch.allclose(f[0, -1, top], mel.filters[-1].sum(), rtol=1e-5)
    assert float(f[0, -1, :top].abs().max()) == 0.0
    # alpha > 1: source content above Nyquist / 1.1 leaves the band
    assert float(f[1, :, int(top / 1.1) + 2:].abs().max()) == 0.0
    out = mel(_noise(1), torch.tensor([0.9]))
    assert float(out[0, -5:, 30:].min()) > (AudioFrontendConfig().global_log_mel_max - 8.0 + 4.0) / 4.0 + 0.1


def test_draw_warp_is_seeded_and_off_rows_are_exactly_one() -> None:
    cfg = AugmentConfig(p_warp=0.5, warp=(0.9, 1.1))

    def draw(seed: int, c: AugmentConfig = cfg, b: int = 2000) -> torch.Tensor:
        return draw_warp(b, c, torch.Generator().manual_seed(seed), "cpu")

    a = draw(7)
    assert torch.equal(a, draw(7)) and not torch.equal(a, draw(8))
    on = a != 1.0
    assert 0.45 < float(on.float().mean()) < 0.55  # p_warp 0.5
    assert float(a[on].min()) >= 0.9 and float(a[on].max()) <= 1.1
    assert float(a[on].std()) > 0.05  # spread over the range, not a constant
    assert torch.equal(draw(7, replace(cfg, p_warp=0.0)), torch.ones(2000))
    assert bool((draw(7, replace(cfg, p_warp=1.0)) != 1.0).all())
    assert NO_AUGMENT.p_warp == 0





@pytest.fixture(scope="module")
def batcher_parts(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("augment")
    data, tok = root / "shards", root / "tok"
    data.mkdir()
    tok.mkdir()
    for s in range(2):
        synthetic_shard(s, "train", 6).save(data / f"train-{s:05d}.npz")
    write_tokenizer_json(tok / "tokenizer.json", shipped_tekken_ranks(500))
    tokenizer = load_tokenizer(tok)
    cfg = SIZES["test"].config(tokenizer.vocab_size - NUM_CONTROL_TOKENS)
    corpus = Corpus(Path(data), tokenizer, torch.device("cpu"))
    assert corpus.refresh() == 2
    return cfg, corpus


def _batcher(parts, augment: AugmentConfig) -> StreamBatcher:
    cfg, corpus = parts
    bc = BatchConfig(tokens_per_batch=1000, min_seconds=0.8, max_seconds=1.5, augment=augment)
    return StreamBatcher(cfg, corpus, bc, seed=11)


@pytest.mark.usefixtures("one_thread")
def test_warped_batches_are_a_pure_function_of_seed_and_index(batcher_parts) -> None:
    cfg = AugmentConfig(p_warp=0.5, p_mask=0.0, p_eq=0.0)
    a = _batcher(batcher_parts, cfg)
    first = a.batch(3)
    other = a.batch(4)
    again = _batcher(batcher_parts, cfg).batch(3)  # a fresh batcher, after another batch
    for name in ("mel", "input_ids", "labels", "delay_tokens"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name
    assert first.mel.shape != other.mel.shape or not torch.equal(first.mel, other.mel)

    # Replay the batch's generator (augment's draws depend on the shapes only, not on the audio) to get
    # the warp factors the batch used: the warp is drawn after the other augmentations, so without it
    # the batch is the same except for the spectra of the warped rows.
    b, _, frames = first.mel.shape
    n = frames * AudioFrontendConfig().hop_length
    g = torch.Generator().manual_seed(11 * 1_000_003 + 3)
    augment(torch.zeros(b, n), torch.ones(b, n, dtype=torch.bool), cfg, g)
    alpha = draw_warp(b, cfg, g, "cpu")
    warped = alpha != 1.0
    assert 0 < int(warped.sum()) < b  # the case has both kinds of rows
    flat = _batcher(batcher_parts, replace(cfg, p_warp=0.0)).batch(3)
    assert torch.equal(flat.input_ids, first.input_ids)
    for r in range(b):
        assert torch.equal(flat.mel[r], first.mel[r]) != bool(warped[r]), r


def _runs(row: torch.Tensor) -> list[int]:
    """Lengths of the runs of True in a 1-D bool tensor."""
    runs, n = [], 0
    for v in row.tolist() + [False]:
        if v:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


def test_draw_masks_is_seeded_bounded_and_off_when_disabled() -> None:
    cfg = AugmentConfig(p_mask=0.5, freq_masks=2, freq_mask_bins=20, time_mask_every_frames=500,
                        time_mask_frames=8)
    b, n_mels, frames = 400, 128, 1200  # 12 s: three time spans per row

    def draw(seed: int, c: AugmentConfig = cfg) -> torch.Tensor:
        return draw_masks(b, n_mels, frames, c, torch.Generator().manual_seed(seed), "cpu")

    m = draw(3)
    assert m.shape == (b, n_mels, frames) and m.dtype == torch.bool
    assert torch.equal(m, draw(3)) and not torch.equal(m, draw(4))
    masked = m.flatten(1).any(1)
    assert 0.4 < float(masked.float().mean()) < 0.6  # p_mask 0.5 (a zero-width draw can leave a row clean)
    freq_rows = m.all(2)  # [b, n_mels]: bins masked over the whole row
    time_cols = m.all(1)  # [b, frames]
    for r in range(b):
        f, t = _runs(freq_rows[r]), _runs(time_cols[r])
        # bands may overlap and merge into one run; separate runs are single bands
        assert len(f) <= 2 and sum(f) <= 40 and (len(f) < 2 or max(f) <= 20)
        assert len(t) <= 3 and sum(t) <= 24 and (len(t) < 3 or max(t) <= 8)
        # the mask is exactly the union of those bands and spans, nothing else
        assert torch.equal(m[r], freq_rows[r][:, None] | time_cols[r][None, :])
    assert float(freq_rows.sum(1).float().mean()) > 10  # widths spread up to 20, not stuck at 0
    assert not draw(3, AugmentConfig(p_mask=0.0)).any()


def test_masked_bins_read_as_silence_and_the_rest_is_untouched() -> None:
    mel_fn = BatchLogMel(AudioFrontendConfig())
    x = _noise(3)
    mel = mel_fn(x)
    floor = log_mel_floor(AudioFrontendConfig())
    assert torch.equal(mel[:, :, :20], torch.full_like(mel[:, :, :20], floor))  # the silent lead is the floor
    masks = draw_masks(3, mel.shape[1], mel.shape[2], AugmentConfig(p_mask=1.0, freq_mask_bins=30),
                       torch.Generator().manual_seed(0), "cpu")
    out = apply_masks(mel, masks, floor)
    assert masks.any() and bool((out[masks] == floor).all())
    assert torch.equal(out[~masks], mel[~masks])
    assert NO_AUGMENT.p_mask == 0


@pytest.mark.usefixtures("one_thread")
def test_batches_with_masks_differ_only_in_masked_bins(batcher_parts) -> None:
    cfg = AugmentConfig(p_warp=0.5, p_mask=1.0, freq_mask_bins=30, p_eq=0.0)
    masked = _batcher(batcher_parts, cfg).batch(5)
    plain = _batcher(batcher_parts, replace(cfg, p_mask=0.0)).batch(5)
    assert torch.equal(masked.input_ids, plain.input_ids) and torch.equal(masked.labels, plain.labels)
    floor = log_mel_floor(AudioFrontendConfig())
    changed = masked.mel != plain.mel
    assert changed.any() and bool((masked.mel[changed] == floor).all())
    # replay the generator (draws depend on shapes only) to get the very masks the batch used
    b, n_mels, frames = masked.mel.shape
    n = frames * AudioFrontendConfig().hop_length
    g = torch.Generator().manual_seed(11 * 1_000_003 + 5)
    augment(torch.zeros(b, n), torch.ones(b, n, dtype=torch.bool), cfg, g)
    draw_warp(b, cfg, g, "cpu")
    masks = draw_masks(b, n_mels, frames, cfg, g, "cpu")
    assert torch.equal(masked.mel, apply_masks(plain.mel, masks, floor))


def test_draw_eq_is_seeded_smooth_bounded_and_off_when_disabled() -> None:
    cfg = AugmentConfig(p_eq=0.5, eq_db=6.0, eq_terms=4)
    b, n_mels = 400, 128

    def draw(seed: int, c: AugmentConfig = cfg) -> torch.Tensor:
        return draw_eq(b, n_mels, c, torch.Generator().manual_seed(seed), "cpu")

    gain = draw(3)
    assert gain.shape == (b, n_mels) and torch.equal(gain, draw(3)) and not torch.equal(gain, draw(4))
    db = 10 * gain.log10()
    on = (gain != 1.0).any(1)
    assert 0.4 < float(on.float().mean()) < 0.6  # p_eq 0.5
    assert torch.equal(gain[~on], torch.ones_like(gain[~on]))  # off rows: exactly 1, not merely close
    bound = 6.0 * sum(1 / j for j in range(1, 5))
    assert float(db.abs().max()) <= bound + 1e-3 and float(db.abs().max()) > 4.0  # bounded, not tiny
    # smooth: neighbouring bins differ by at most the curve's steepest slope, sum_j c_j * pi * j / 127
    assert float((db[:, 1:] - db[:, :-1]).abs().max()) <= 6.0 * 4 * torch.pi / (n_mels - 1) + 1e-3
    assert torch.equal(draw(3, AugmentConfig(p_eq=0.0)), torch.ones(b, n_mels))


def test_eq_scales_mel_power_and_keeps_silence_silent() -> None:
    mel_fn = BatchLogMel(AudioFrontendConfig())
    x = _noise(3)
    plain = mel_fn(x)
    assert torch.equal(mel_fn(x, eq=torch.ones(3, plain.shape[1])), plain)  # gain 1: bit for bit
    gain = draw_eq(3, plain.shape[1], AugmentConfig(p_eq=1.0), torch.Generator().manual_seed(1), "cpu")
    out = mel_fn(x, eq=gain)
    floor = log_mel_floor(AudioFrontendConfig())
    assert torch.equal(out[:, :, :20], torch.full_like(out[:, :, :20], floor))  # the silent lead stays silent
    # above the floor, a power gain g is a shift of log10(g) / 4 in the features (x -> (log10 x + 4) / 4)
    loud = (plain > floor + 0.5) & (out > floor + 0.5)
    shift = (gain.log10() / 4)[:, :, None].expand_as(plain)
    assert loud.float().mean() > 0.5
    torch.testing.assert_close(out[loud], plain[loud] + shift[loud], atol=1e-4, rtol=0)
    assert NO_AUGMENT.p_eq == 0


@pytest.mark.usefixtures("one_thread")
def test_batches_with_eq_differ_only_in_the_equalised_rows(batcher_parts) -> None:
    cfg = AugmentConfig(p_warp=0.5, p_mask=1.0, p_eq=0.5)
    eq = _batcher(batcher_parts, cfg).batch(5)
    plain = _batcher(batcher_parts, replace(cfg, p_eq=0.0)).batch(5)
    assert torch.equal(eq.input_ids, plain.input_ids) and torch.equal(eq.labels, plain.labels)
    b, n_mels, frames = eq.mel.shape
    n = frames * AudioFrontendConfig().hop_length
    g = torch.Generator().manual_seed(11 * 1_000_003 + 5)
    augment(torch.zeros(b, n), torch.ones(b, n, dtype=torch.bool), cfg, g)
    draw_warp(b, cfg, g, "cpu")
    draw_masks(b, n_mels, frames, cfg, g, "cpu")  # the masks come before the equaliser: unchanged by it
    gains = draw_eq(b, n_mels, cfg, g, "cpu")
    on = (gains != 1.0).any(1)
    assert 0 < int(on.sum()) < b
    for r in range(b):
        assert torch.equal(eq.mel[r], plain.mel[r]) != bool(on[r]), r


def test_gpu_run_command_line_sets_the_augmentation_and_refuses_bad_values() -> None:
    """`gpu_run run --warp LO HI --p-warp P --freq-masks N --freq-mask-bins W --p-eq E` reaches the
    batches' AugmentConfig; the defaults are AugmentConfig's own (what runs 11-22 used, with --p-eq);
    bad values stop the call before it synthesises anything."""
    import argparse

    from realtime.train.gpu_run import augment_config

    def args(**kw: object) -> argparse.Namespace:
        d = AugmentConfig()
        base = {"warp": list(d.warp), "p_warp": d.p_warp, "freq_masks": d.freq_masks,
                "freq_mask_bins": d.freq_mask_bins, "p_eq": 0.0}
        return argparse.Namespace(**(base | kw))

    assert augment_config(args()) == AugmentConfig()
    cfg = augment_config(args(warp=[0.78, 1.25], p_warp=0.8, freq_masks=3, freq_mask_bins=27, p_eq=0.25))
    assert cfg == replace(AugmentConfig(), warp=(0.78, 1.25), p_warp=0.8, freq_masks=3, freq_mask_bins=27,
                          p_eq=0.25)
    for bad in ({"warp": [1.1, 1.2]}, {"warp": [0.0, 1.2]}, {"warp": [0.9, 0.95]}, {"p_warp": 1.5},
                {"p_eq": -0.1}, {"freq_masks": -1}, {"freq_mask_bins": 0}):
        with pytest.raises(ValueError):
            augment_config(args(**bad))
    # the check lives in AugmentConfig itself, so every caller gets it, not only this command line
    for bad in ({"p_noise": 1.5}, {"p_reverb": -0.1}, {"p_mask": 2.0}, {"warp": (0.9, 0.95)}, {"freq_mask_bins": 0}):
        with pytest.raises(ValueError):
            AugmentConfig(**bad)
