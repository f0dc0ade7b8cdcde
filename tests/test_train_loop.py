"""A tiny training run on CPU: the loss goes down, a resumed run is identical, the export loads and
transcribes through the shipped session."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import synthetic_audio, synthetic_shard

from realtime.loader import load_model
from realtime.session import transcribe
from realtime.tokenizer import load_tokenizer
from realtime.tokenizer_build import shipped_tekken_ranks, write_tokenizer_json
from realtime.train.data import BatchConfig, Corpus
from realtime.train.distributed import train_data_parallel, weight_checksum
from realtime.train.train import TrainConfig, Trainer
from realtime.train.warm import load_warm_state, pack_state

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("train")
    data, tok = root / "shards", root / "tok"
    data.mkdir()
    tok.mkdir()
    for s in range(3):
        synthetic_shard(s, "train").save(data / f"train-{s:05d}.npz")
    synthetic_shard(9, "heldout", 4).save(data / "heldout-00.npz")
    write_tokenizer_json(tok / "tokenizer.json", shipped_tekken_ranks(500))
    return data, tok


def _config(data: Path, tok: Path, out: Path, max_steps: int) -> TrainConfig:
    return TrainConfig(data=str(data), tokenizer=str(tok), out=str(out), size="test", device="cpu", seed=3,
                       max_steps=max_steps, lr=6e-3, warmup_steps=3, log_every=1, val_every=10_000,
                       ckpt_every_s=1e9, ckpt_every_steps=10_000, min_utterances=10,
                       batch=BatchConfig(tokens_per_batch=250, min_seconds=0.8, max_seconds=1.5))


def test_loss_goes_down_and_export_transcribes(setup: tuple[Path, Path], tmp_path: Path) -> None:
    data, tok = setup
    tr = Trainer(_config(data, tok, tmp_path / "run", max_steps=15))
    tr.train()
    losses = tr.history["loss"]
    assert len(losses) == 15
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:3]), losses
    assert (tmp_path / "run" / "loss.png").stat().st_size > 1000

    folder = tr.export(tmp_path / "model")
    model, _ = load_model(folder)  # fp16 on disk, float32 after loading
    trained = tr.model.state_dict()
    for name, p in model.named_parameters():
        assert torch.equal(p, trained[name].half().float()), name
    result = transcribe(model, load_tokenizer(folder), synthetic_audio(1.5, seed=5), delay_ms=480)
    # one decided token per position after the prompt: 32 left + 19 user (1.5 s) + 17 right - 39 prompt
    assert len(result.token_ids) == 32 + 19 + 17 - 39
    assert all(t in (32, 33) or t >= 1000 for t in result.token_ids)


def test_resume_is_identical(setup: tuple[Path, Path], tmp_path: Path) -> None:
    data, tok = setup
    straight = Trainer(_config(data, tok, tmp_path / "a", max_steps=6))
    straight.train()

    first = Trainer(_config(data, tok, tmp_path / "b", max_steps=6))
    first.train(until_step=3)  # as if the run were killed after its step-3 checkpoint
    resumed = Trainer(_config(data, tok, tmp_path / "b", max_steps=6))
    assert resumed.load_checkpoint() and resumed.step == 3
    resumed.train()
    assert resumed.step == straight.step == 6
    assert resumed.history["loss"] == straight.history["loss"]
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name


def test_warm_start_continues_from_an_export(setup: tuple[Path, Path], tmp_path: Path) -> None:
    data, tok = setup
    first = Trainer(_config(data, tok, tmp_path / "a", max_steps=4))
    first.train()
    folder = first.export(tmp_path / "model")
    cfg = _config(data, tok, tmp_path / "b", max_steps=4)
    cfg.init_from = str(folder)
    cfg.seed = 11  # another machine, other batches: the weights are what carries over
    warm = Trainer(cfg)
    cold = Trainer(replace(cfg, init_from=None, out=str(tmp_path / "c")))
    for name, p in warm.model.named_parameters():
        assert torch.equal(p, first.model.state_dict()[name].half().float()), name
    assert not all(torch.equal(p, q) for p, q in zip(warm.model.parameters(), cold.model.parameters()))

    # the packed int8 form (what travels to a fresh GPU machine) starts from nearly the same weights
    packed = tmp_path / "warm.pt"
    torch.save(pack_state(load_warm_state(folder)), packed)
    assert packed.stat().st_size < 0.7 * sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    from_pack = Trainer(replace(cfg, init_from=str(packed), out=str(tmp_path / "e")))
    for (name, p), q in zip(warm.model.named_parameters(), from_pack.model.parameters()):
        assert torch.allclose(p, q, atol=p.abs().max().item() / 200 + 1e-6), name

    other = replace(cfg, size="tiny", out=str(tmp_path / "d"))
    with pytest.raises(ValueError, match="another architecture"):
        Trainer(other)


@pytest.mark.parametrize("profile_at, steps", [(1, 6), (4, 5)])
def test_profile_of_training_steps_is_logged(setup: tuple[Path, Path], tmp_path: Path, caplog,
                                             profile_at: int, steps: int) -> None:
    """Host and device time per op land in the log, also when the budget ends inside the profiled
    steps (the second case: profiling starts at step 4 of 5)."""
    data, tok = setup
    cfg = _config(data, tok, tmp_path / "run", max_steps=steps)
    cfg.profile_at = profile_at
    with caplog.at_level("INFO", logger="realtime.train.train"):
        Trainer(cfg).train()
    tables = [r.getMessage() for r in caplog.records if "profile of the training steps" in r.getMessage()]
    assert len(tables) == 2 and all("aten::" in t for t in tables), tables


def test_corpus_parts_are_disjoint_and_cover_the_shards(setup: tuple[Path, Path]) -> None:
    data, tok = setup
    tokenizer = load_tokenizer(tok)
    whole = Corpus(data, tokenizer, torch.device("cpu"))
    whole.refresh()
    parts = [Corpus(data, tokenizer, torch.device("cpu"), part=(r, 2)) for r in range(2)]
    for p in parts:
        p.refresh()
    assert sorted(v for p in parts for v in p.voices) == sorted(whole.voices)
    assert all(p.by_shard for p in parts), "the test shards should land on both ranks"


def test_data_parallel_ranks_stay_identical(setup: tuple[Path, Path], tmp_path: Path) -> None:
    """Two gloo ranks: each reads its own shards, DDP keeps the replicas bitwise equal, only rank 0
    checkpoints, and the weights move away from the start."""
    data, tok = setup
    cfg = _config(data, tok, tmp_path / "dp", max_steps=5)
    start = weight_checksum(Trainer(replace(cfg, out=str(tmp_path / "init"))).model)
    reports = train_data_parallel(cfg, world=2)
    assert [r["step"] for r in reports] == [5, 5]
    assert reports[0]["checksum"] == reports[1]["checksum"] != start
    assert sum(r["shards"] for r in reports) == 3 and min(r["shards"] for r in reports) >= 1
    state = torch.load(tmp_path / "dp" / "ckpt.pt", weights_only=False)
    assert state["step"] == 5 and state["audio_seen_s"] > 0


def test_data_parallel_time_budget_stops_all_ranks_after_the_same_step(setup: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    data, tok = setup
    cfg = replace(_config(data, tok, tmp_path / "dp", max_steps=100_000), max_minutes=0.04, sync_every=2)
    reports = train_data_parallel(cfg, world=2)  # raises if the ranks stopped at different steps
    assert reports[0]["step"] == reports[1]["step"] >= 2
    assert all(r["train_s"] >= 0.04 * 60 for r in reports)


def test_data_parallel_rank_failure_is_reported_not_hung(setup: tuple[Path, Path], tmp_path: Path) -> None:
    data, tok = setup
    cfg = replace(_config(data, tok, tmp_path / "dp", max_steps=3), init_from=str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="rank"):
        train_data_parallel(cfg, world=2)


class _FakeRank:
    def __init__(self, name: str, exitcode: int | None) -> None:
        self.name, self.exitcode = name, exitcode

    def is_alive(self) -> bool:
        return self.exitcode is None


def test_a_rank_that_dies_after_reporting_keeps_the_run() -> None:
    """A rank that aborts in teardown after writing its result (a CI run saw exit code -6 there) does not fail the
    run; one that dies before reporting does, and a peer left waiting is given up on once all have reported."""
    from realtime.train.distributed import supervise

    supervise([_FakeRank("rank0", 0), _FakeRank("rank1", -6)], reported=lambda r: True, poll_s=0.0)
    with pytest.raises(RuntimeError, match="rank1 failed \\(exit code -6\\)"):
        supervise([_FakeRank("rank0", 0), _FakeRank("rank1", -6)], reported=lambda r: r == 0, poll_s=0.0)
    stuck = _FakeRank("rank0", None)  # in the closing barrier of a peer that died after reporting
    supervise([stuck, _FakeRank("rank1", -6)], reported=lambda r: True, poll_s=0.01, grace_s=0.05)
    with pytest.raises(RuntimeError, match="rank1 failed"):  # still alive peers: a failure before reporting
        supervise([_FakeRank("rank0", None), _FakeRank("rank1", 1)], reported=lambda r: False, poll_s=0.0)


def test_a_failed_data_parallel_run_keeps_what_it_can() -> None:
    """gpu_run's choice after the ranks raise: evaluate what finished training, retry on one GPU
    when a multi-GPU start failed with time left, and give up otherwise."""
    from realtime.train.gpu_run import after_training_failure

    assert after_training_failure(2, 10.0, finished=True) == "evaluate"  # e.g. replicas that differ
    assert after_training_failure(1, 400.0, finished=True) == "evaluate"
    assert after_training_failure(2, 400.0, finished=False) == "one_gpu"
    assert after_training_failure(2, 100.0, finished=False) == "raise"  # too late to start again
    assert after_training_failure(1, 400.0, finished=False) == "raise"  # already on one GPU


def test_four_bit_warm_pack_round_trips_within_half_a_step(tmp_path: Path) -> None:
    """`warm pack --bits 4`: every group of 64 weights comes back within half of its own step (its largest
    weight / 7 / 2); vectors and matrices whose rows do not split into groups keep the 8-bit/fp16 forms;
    the file is about a quarter of the fp16 bytes."""
    from realtime.train.warm import GROUP, unpack_state

    g = torch.Generator().manual_seed(0)
    state = {"big": torch.randn(96, 4 * GROUP, generator=g) * torch.linspace(0.01, 3.0, 96)[:, None],
             "conv": torch.randn(8, 2, GROUP // 2, generator=g), "odd": torch.randn(5, 33, generator=g),
             "bias": torch.randn(7, generator=g)}
    state["big"][3, 5] = 40.0  # one outlier widens only its own group's step
    packed = pack_state(state, bits=4)
    assert "q4" in packed["big"] and "q4" in packed["conv"] and "q" in packed["odd"] and "v" in packed["bias"]
    back = unpack_state(packed)
    for name in ("big", "conv"):
        groups = state[name].reshape(state[name].shape[0], -1, GROUP)
        half_step = groups.abs().amax(dim=2, keepdim=True) / 7 / 2
        err = (back[name] - state[name]).reshape(groups.shape).abs()
        assert back[name].shape == state[name].shape
        assert (err <= half_step * 1.01 + 1e-6).all(), name
    assert (back["big"][3, GROUP:] - state["big"][3, GROUP:]).abs().max() < 0.1  # the outlier's neighbours only
    assert torch.allclose(back["odd"], state["odd"], atol=state["odd"].abs().max().item() / 200)
    path = tmp_path / "w4.pt"
    torch.save(pack_state({"w": torch.randn(512, 1024, generator=g)}, bits=4), path)
    assert path.stat().st_size < 0.3 * 512 * 1024 * 2
    with pytest.raises(ValueError, match="bits"):
        pack_state(state, bits=2)


def test_warm_pack_unpacks_to_a_model_folder_that_loads(tiny_ckpt, tmp_path: Path) -> None:
    """`warm unpack`: a pack becomes an fp16 model folder in the transformers layout with `--like`'s config and
    tokenizer; its weights are the pack's dequantised ones (the int8 pack: within half a step of each row); a pack
    of another model size is refused with the names that do not fit."""
    from realtime.loader import load_model
    from realtime.train.warm import main as warm_main

    source, like = tiny_ckpt(seed=1), tiny_ckpt(seed=3, tokenizer_json=True)  # the same size, other weights
    pack = tmp_path / "w8.pt"
    assert warm_main(["pack", str(source), str(pack)]) == 0
    assert warm_main(["unpack", str(pack), str(tmp_path / "back"), "--like", str(like)]) == 0
    assert (tmp_path / "back" / "tokenizer.json").read_bytes() == (like / "tokenizer.json").read_bytes()
    original, _ = load_model(source)
    back, _ = load_model(tmp_path / "back")
    a, b = original.state_dict(), back.state_dict()
    assert set(a) == set(b)
    other = load_model(like)[0].state_dict()
    assert not torch.allclose(b["language_model.layers.0.mlp.down_proj.weight"].float(),
                              other["language_model.layers.0.mlp.down_proj.weight"].float(), atol=1e-2)
    for k in a:
        x, y = a[k].float(), b[k].float()
        if x.dim() > 1:  # int8: one scale per output row; then fp16 in the folder
            rows = x.reshape(x.shape[0], -1)
            bound = (rows.abs().amax(dim=1, keepdim=True) / 127 * 0.51 + rows.abs() * 2e-3).reshape(x.shape)
        else:  # vectors travel in fp16
            bound = x.abs() * 2e-3 + 1e-6
        assert ((y - x).abs() <= bound).all(), k
    torch.save({"stray": {"v": torch.zeros(3)}}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="does not fit"):
        warm_main(["unpack", str(tmp_path / "bad.pt"), str(tmp_path / "x"), "--like", str(like)])
