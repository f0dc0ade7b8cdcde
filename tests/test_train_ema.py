"""The weight average of a training run (realtime.train.ema): its arithmetic, that export and
validation use it while training goes on from the model's own weights, and that a resumed run
continues it exactly."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_train_loop import _config, setup  # noqa: F401  (the module fixture is used by name)

from realtime.loader import load_model
from realtime.train.ema import WeightAverage
from realtime.train.train import TrainConfig, Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_average_follows_the_closed_form_and_swaps_back_bit_for_bit() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    start = [p.detach().clone() for p in model.parameters()]
    avg = WeightAverage(model, decay=0.75)
    seen = []
    for _ in range(4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        seen.append([p.detach().clone() for p in model.parameters()])
        avg.update(model)
    # avg_n = d^n * start + sum_i (1 - d) d^(n - i) * w_i
    for k, a in enumerate(avg.avg):
        want = 0.75 ** 4 * start[k] + sum(0.25 * 0.75 ** (3 - i) * seen[i][k] for i in range(4))
        torch.testing.assert_close(a, want, rtol=1e-6, atol=1e-6)

    own = [p.detach().clone() for p in model.parameters()]
    with avg.swapped_into(model):
        for p, a in zip(model.parameters(), avg.avg):
            assert torch.equal(p, a)
    for p, o in zip(model.parameters(), own):
        assert torch.equal(p, o)
    with pytest.raises(ValueError, match="decay"):
        WeightAverage(model, decay=1.0)


def test_export_holds_the_average_and_training_continues_from_its_own_weights(
        setup: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811
    data, tok = setup
    plain = Trainer(_config(data, tok, tmp_path / "plain", max_steps=5))
    plain.train()
    tr = Trainer(replace(_config(data, tok, tmp_path / "ema", max_steps=5), ema_decay=0.6))
    tr.train()
    # the average never feeds back into the steps: same batches, same updates as without it
    assert tr.history["loss"] == plain.history["loss"]
    for p, q in zip(tr.model.parameters(), plain.model.parameters()):
        assert torch.equal(p, q)

    exported, _ = load_model(tr.export(tmp_path / "model"))
    average = tr.ema.state_dict()
    differs = 0
    for name, p in exported.named_parameters():
        assert torch.equal(p, average[name].half().float()), name
        differs += not torch.equal(p, tr.model.state_dict()[name].half().float())
    assert differs > 0
    # and it moved away from the start, where a run of this seed begins
    start = Trainer(replace(_config(data, tok, tmp_path / "start", max_steps=5), ema_decay=0.6)).model.state_dict()
    assert not any(torch.equal(average[name], start[name]) for name in average)
    loss_avg, _ = tr.validate()
    loss_own, _ = plain.validate()
    assert loss_avg != loss_own


def test_resume_continues_the_average(setup: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811
    data, tok = setup

    def cfg(out: str) -> TrainConfig:
        return replace(_config(data, tok, tmp_path / out, max_steps=6), ema_decay=0.6)

    straight = Trainer(cfg("a"))
    straight.train()
    first = Trainer(cfg("b"))
    first.train(until_step=3)
    resumed = Trainer(cfg("b"))
    assert resumed.load_checkpoint() and resumed.step == 3
    resumed.train()
    for name, a in straight.ema.state_dict().items():
        assert torch.equal(a, resumed.ema.state_dict()[name]), name

    no_average = Trainer(replace(cfg("c"), ema_decay=0.0))
    no_average.train(until_step=2)
    with pytest.raises(ValueError, match="no weight average"):
        Trainer(replace(cfg("c"), ema_decay=0.6)).load_checkpoint()
