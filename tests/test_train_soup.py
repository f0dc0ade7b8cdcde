"""Weight averaging of model folders (`realtime.train.soup`): the loaded soup is the weighted mean of
its parents, and mismatched folders or weights are refused with a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from realtime.loader import load_model
from realtime.testing.tiny_checkpoint import write_tiny_checkpoint
from realtime.train.soup import SoupError, main, make_soup


def _ckpt(path: Path, seed: int, small_windows: bool = False) -> Path:
    return write_tiny_checkpoint(path, seed=seed, small_windows=small_windows, tokenizer_json=True, tekken=False)


def test_soup_is_the_weighted_mean_of_its_parents(tmp_path: Path) -> None:
    a, b = _ckpt(tmp_path / "a", 0), _ckpt(tmp_path / "b", 1)
    record = make_soup(tmp_path / "soup", [a, b], [0.25, 0.75], labels=["first", "second"])
    assert record["weights"] == [0.25, 0.75] and record["parents"] == ["first", "second"]
    assert json.loads((tmp_path / "soup" / "training.json").read_text())["method"].startswith("weight average")
    pa, pb, ps = (dict(load_model(d)[0].named_parameters()) for d in (a, b, tmp_path / "soup"))
    assert pa.keys() == ps.keys() and len(ps) > 10
    for name, p in ps.items():
        expect = (0.25 * pa[name].double() + 0.75 * pb[name].double()).float()
        assert torch.allclose(p.detach(), expect, atol=1e-7, rtol=0), name
        assert not torch.equal(p, pa[name])  # the seeds differ: every tensor moved
    assert (tmp_path / "soup" / "tokenizer.json").read_text() == (a / "tokenizer.json").read_text()


def test_soup_refuses_other_architectures_and_bad_weights(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = _ckpt(tmp_path / "a", 0), _ckpt(tmp_path / "b", 1)
    other = _ckpt(tmp_path / "c", 2, small_windows=True)
    with pytest.raises(SoupError, match="config.json differs"):
        make_soup(tmp_path / "s1", [a, other])
    with pytest.raises(SoupError, match="sum to 1"):
        make_soup(tmp_path / "s2", [a, b], [0.5, 0.6])
    with pytest.raises(SoupError, match="two or more"):
        make_soup(tmp_path / "s3", [a])
    assert main([str(tmp_path / "s4"), str(a), str(other)]) == 2
    assert "differs" in capsys.readouterr().err
    assert not (tmp_path / "s1").exists() and not (tmp_path / "s4").exists()
