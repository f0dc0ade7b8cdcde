"""Training-only residual dropout (realtime.train.regularize): it drops in training mode only, on
every encoder and LM sublayer, at the rate asked for; the model in eval mode (validation, export,
serving) computes exactly what it computes without it; and a training run uses it."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_train_loop import _config, setup  # noqa: F401  (the module fixture is used by name)

from realtime.model import VoxtralRealtime
from realtime.testing.tiny_checkpoint import random_model, tiny_config
from realtime.train.regularize import add_residual_dropout, check_dropout
from realtime.train.train import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs(model: VoxtralRealtime, t: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.decoder.vocab_size, (2, t), generator=g)
    mel = torch.randn(2, model.config.audio.num_mel_bins, t * model.config.streaming.mel_frames_per_token,
                      generator=g)
    return ids, mel, torch.tensor([3, 6])


def test_eval_mode_is_untouched_and_training_mode_drops() -> None:
    torch.manual_seed(0)
    model = random_model(tiny_config(), seed=0)
    args = _inputs(model)
    model.eval()
    with torch.no_grad():
        plain = model(*args)
    handles = add_residual_dropout(model, 0.3)
    n_layers = len(model.audio_tower.layers) + len(model.language_model.layers)
    assert len(handles) == 2 * n_layers  # attention and MLP of every layer
    with torch.no_grad():
        assert torch.equal(model(*args), plain)  # eval: every hook is the identity
        model.train()
        torch.manual_seed(5)
        dropped = model(*args)
        torch.manual_seed(5)
        again = model(*args)
    assert not torch.allclose(dropped, plain, atol=1e-3)
    assert torch.equal(dropped, again)  # the drop follows torch's generator
    for h in handles:
        h.remove()
    with torch.no_grad():  # without the hooks, training mode computes the eval output again
        assert torch.equal(model(*args), plain)


def test_every_sublayer_output_drops_at_the_rate_asked() -> None:
    torch.manual_seed(0)
    model = random_model(tiny_config(), seed=0)
    add_residual_dropout(model, 0.25)
    seen: dict[str, list[torch.Tensor]] = {}

    def keep(name: str):  # registered after the dropout hooks, so it sees their output
        return lambda _m, _i, out: seen.setdefault(name, []).append(out.detach())

    subs = {f"enc{i}.{s}": getattr(layer, s) for i, layer in enumerate(model.audio_tower.layers)
            for s in ("self_attn", "mlp")}
    subs |= {f"lm{i}.{s}": getattr(layer, s) for i, layer in enumerate(model.language_model.layers)
             for s in ("self_attn", "mlp")}
    for name, sub in subs.items():
        sub.register_forward_hook(keep(name))
    model.train()
    with torch.no_grad():
        model(*_inputs(model, t=24))
    assert sorted(seen) == sorted(subs)
    for name, outs in seen.items():
        out = torch.cat([o.flatten() for o in outs])
        zero = (out == 0).float().mean().item()
        # binomial share of n draws: within 5 standard deviations of p
        sd = math.sqrt(0.25 * 0.75 / out.numel())
        assert abs(zero - 0.25) < 5 * sd + 1e-3, (name, zero, out.numel())


def test_zero_adds_nothing_and_bad_rates_are_refused() -> None:
    model = random_model(tiny_config(), seed=0)
    assert add_residual_dropout(model, 0.0) == []
    assert not any(m._forward_hooks for m in model.modules())
    for bad in (1.0, -0.1, float("nan"), 1.5):
        with pytest.raises(ValueError, match="dropout"):
            check_dropout(bad)
        with pytest.raises(ValueError, match="dropout"):
            add_residual_dropout(model, bad)
    assert check_dropout(0.1) == 0.1


def test_a_training_run_uses_it_and_records_it(setup: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811
    data, tok = setup
    plain = Trainer(_config(data, tok, tmp_path / "plain", max_steps=3))
    plain.train()
    tr = Trainer(replace(_config(data, tok, tmp_path / "drop", max_steps=3), dropout=0.2))
    assert sum(len(m._forward_hooks) for m in tr.model.modules()) == 2 * (
        len(tr.model.audio_tower.layers) + len(tr.model.language_model.layers))
    tr.train()
    # same start and batches: only the dropout makes the losses differ
    assert tr.history["loss"][0] != plain.history["loss"][0]
    folder = tr.export(tmp_path / "model")
    assert json.loads((folder / "training.json").read_text())["dropout"] == 0.2
    assert json.loads((plain.export(tmp_path / "plain_model") / "training.json").read_text())["dropout"] == 0.0


def test_gpu_run_refuses_a_bad_rate_before_it_starts(tmp_path: Path) -> None:
    """`gpu_run run --dropout P` with P outside [0, 1): a clear error before anything is set up
    (the out folder is not even made), not minutes into a device call."""
    from realtime.train.gpu_run import main

    out = tmp_path / "out"
    for bad in ("1.0", "-0.2", "nan"):
        with pytest.raises(ValueError, match="dropout"):
            main(["run", "--carry", str(tmp_path / "no_carry"), "--out", str(out), "--dropout", bad])
        assert not out.exists()


def test_drafter_layers_drop_from_their_own_generator() -> None:
    """`add_sublayer_dropout` on the Eagle drafter's layers (speculative.train --dropout): with a generator
    the masks come from it (same seed, same masks; the global generator plays no part), at the rate asked,
    and eval mode is the identity."""
    from realtime.attention import DenseAttention
    from realtime.train.regularize import add_sublayer_dropout
    from speculative import DrafterConfig, EagleDrafter

    target = random_model(tiny_config(), seed=0)
    drafter = EagleDrafter(DrafterConfig.for_target(target.config)).tie_to(
        target.language_model.embed_tokens.weight)
    h = drafter.config.hidden_size
    g = torch.Generator().manual_seed(3)
    x, hid = torch.randn(2, 40, h, generator=g), torch.randn(2, 40, h, generator=g)
    pos = torch.arange(40).expand(2, 40)
    cond = drafter.t_cond(torch.tensor([6, 6]))

    def run() -> torch.Tensor:
        with torch.no_grad():
            return drafter(x, hid, pos, cond[:, None], DenseAttention(pos, drafter.config.sliding_window))

    drafter.eval()
    plain = run()
    seen: list[torch.Tensor] = []
    gen = torch.Generator().manual_seed(11)
    handles = add_sublayer_dropout(drafter.layers, 0.3, generator=gen)
    assert len(handles) == 2 * len(drafter.layers)
    for layer in drafter.layers:
        layer.mlp.register_forward_hook(lambda _m, _i, out: seen.append(out.detach()))
    assert torch.equal(run(), plain)  # eval: identity
    drafter.train()
    torch.manual_seed(0)
    first = run()
    gen.manual_seed(11)
    torch.manual_seed(99)  # another global state: the masks do not follow it
    assert torch.equal(run(), first)
    assert not torch.allclose(first, plain, atol=1e-3)
    out = torch.cat([o.flatten() for o in seen[-len(drafter.layers):]])
    zero = (out == 0).float().mean().item()
    assert abs(zero - 0.3) < 5 * math.sqrt(0.3 * 0.7 / out.numel()) + 1e-3
