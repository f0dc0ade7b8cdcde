"""Drafter distillation (speculative.train): the CLI end to end, resumption, and that it learns."""

from __future__ import annotations

import dataclasses
import json

import pytest
import soundfile as sf
import torch
from conftest import synthetic_audio

from realtime.loader import load_model
from speculative import (DrafterConfig, EagleDrafter, ParallelEagleDrafter, TwoPassEagleDrafter,
                         default_num_speculative_tokens, load_drafter, save_drafter)
from speculative.train import STATE_FILE, TEACHER_FILE, TrainConfig, main, target_fingerprint, train_drafter

pytestmark = pytest.mark.usefixtures("one_thread")


def test_cli_trains_resumes_and_the_drafter_is_accepted(tiny_ckpt, tmp_path, caplog):
    target = tiny_ckpt(seed=1)
    (tmp_path / "clips").mkdir()
    for i in range(3):
        sf.write(tmp_path / "clips" / f"clip{i}.wav", synthetic_audio(2.5, seed=600 + i), 16000)
    out = tmp_path / "drafter"
    args = ["--target", str(target), "--audio", str(tmp_path / "clips"), "--out", str(out), "--device", "cpu", "--batch", "6",
            "--seq-len", "48", "--lr", "3e-3", "--unroll", "2", "--save-every", "10", "--log-every", "5", "--k", "4"]
    assert main(args + ["--steps", "20"]) == 0
    first = torch.load(out / STATE_FILE, weights_only=False)
    assert first["step"] == 20 and len(first["history"]) == 20
    assert (out / TEACHER_FILE).exists()
    caplog.clear()
    with caplog.at_level("INFO", logger="speculative.train"):
        assert main(args + ["--steps", "60"]) == 0  # the same command with more steps: resumes at 20
    msgs = [r.getMessage() for r in caplog.records]
    assert any("resuming from step 20" in m for m in msgs)
    assert any("reusing" in m for m in msgs)  # the teacher pass is not redone
    assert any("step 60/60" in m for m in msgs)  # progress display
    state = torch.load(out / STATE_FILE, weights_only=False)
    assert state["step"] == 60 and state["history"][:20] == first["history"]
    losses = [h["loss"] for h in state["history"]]
    assert sum(losses[-5:]) < 0.3 * sum(losses[:5])
    report = json.loads((out / "train_report.json").read_text())
    ev = report["480"]
    assert ev["identical_outputs"] == "3/3"
    # measured in the engine on its training audio: most drafts are accepted
    assert ev["acceptance_rate"] > 0.5 and ev["mean_acceptance_length"] > 2.5
    assert ev["steps_with"] < ev["steps_without"]
    model, _ = load_model(target)
    d = load_drafter(out, target_embedding=model.language_model.embed_tokens.weight)
    assert type(d) is EagleDrafter and d.config.sliding_window == 48  # its training windows' length (--seq-len)


def test_the_drafters_window_is_at_most_what_its_training_windows_show_it(tiny_ckpt, tmp_path, capsys):
    """A drafter trained on windows of seq_len positions never sees a longer attention distance, so its window is
    seq_len by default, may be smaller, and a larger one is refused (on the command line before any labelling): the
    shipped drafter once had 512 on 256-position windows and accepted 2.58 instead of 3.79 on 45 s clips."""
    from speculative.train import attention_window

    assert attention_window(TrainConfig(seq_len=32)) == 32
    assert attention_window(TrainConfig(seq_len=32, window=16)) == 16
    model, _ = load_model(tiny_ckpt(seed=1))
    with pytest.raises(ValueError, match="seq_len"):
        train_drafter(model, [synthetic_audio(1.0, seed=1)], tmp_path / "never", TrainConfig(seq_len=32, window=64),
                      eval_audios=[])
    small = train_drafter(model, [synthetic_audio(1.5, seed=2)], tmp_path / "small",
                          TrainConfig(steps=1, batch=2, seq_len=16, window=8), eval_audios=[]).out_dir
    assert load_drafter(small).config.sliding_window == 8
    audio = _clips(tmp_path / "audio", [905])
    with pytest.raises(SystemExit) as stop:
        main(["--target", str(tiny_ckpt(seed=1)), "--audio", audio, "--out", str(tmp_path / "bad"), "--device", "cpu",
              "--seq-len", "32", "--window", "64"])
    assert stop.value.code == 2
    assert "--window must be 1..--seq-len (32), got 64" in capsys.readouterr().err
    assert not (tmp_path / "bad" / TEACHER_FILE).exists()


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_resumed_training_equals_uninterrupted(tiny_ckpt, tmp_path, dropout):
    """Also with dropout: its masks come from a generator saved in the train state."""
    model, _ = load_model(tiny_ckpt(seed=1))
    clips = [synthetic_audio(2.0, seed=700 + i) for i in range(2)]
    tc = TrainConfig(steps=16, batch=4, seq_len=32, lr=3e-3, unroll=2, save_every=100, log_every=100,
                     dropout=dropout)
    straight = train_drafter(model, clips, tmp_path / "a", tc, eval_audios=[])
    cut = train_drafter(model, clips, tmp_path / "b", tc, eval_audios=[], stop_after=7)  # e.g. a job's time ran out
    assert cut.steps == 7 and cut.report == {}
    # a state saved before DrafterConfig had gpu_draft_tokens (forty-sixth session's code) still resumes
    st = torch.load(tmp_path / "b" / STATE_FILE, weights_only=False)
    del st["drafter_config"]["gpu_draft_tokens"]
    torch.save(st, tmp_path / "b" / STATE_FILE)
    resumed = train_drafter(model, clips, tmp_path / "b", tc, eval_audios=[])
    assert resumed.resumed_from == 7 and resumed.steps == 16
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in straight.history]
    a, b = load_drafter(tmp_path / "a"), load_drafter(tmp_path / "b")
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    with pytest.raises(ValueError, match="different drafter"):
        train_drafter(model, clips, tmp_path / "b", TrainConfig(**{**tc.__dict__, "layers": 2}), eval_audios=[])


def test_dropout_is_used_in_training_only_and_bad_rates_are_refused_before_labelling(tiny_ckpt, tmp_path, capsys):
    model, _ = load_model(tiny_ckpt(seed=1))
    clips = [synthetic_audio(2.0, seed=700 + i) for i in range(2)]
    tc = TrainConfig(steps=6, batch=4, seq_len=32, lr=3e-3, unroll=2, save_every=100, log_every=100)
    plain = train_drafter(model, clips, tmp_path / "plain", tc, eval_audios=clips[:1])
    drop = train_drafter(model, clips, tmp_path / "drop", TrainConfig(**{**tc.__dict__, "dropout": 0.3}),
                         eval_audios=clips[:1])
    # same start, same batches; the branches start at zero (init_drafter), so the first losses agree and
    # only the dropout makes the later ones differ
    assert drop.history[0]["loss"] == plain.history[0]["loss"]
    assert all(d["loss"] != p["loss"] for d, p in zip(drop.history[1:], plain.history[1:]))
    assert drop.report["480"]["identical_outputs"] == "1/1"  # the saved drafter is a plain one
    assert json.loads(json.dumps(torch.load(tmp_path / "drop" / STATE_FILE, weights_only=False)
                                 ["train_config"]))["dropout"] == 0.3
    for bad in ("1.0", "-0.1", "nan"):
        with pytest.raises(SystemExit):
            main(["--target", str(tiny_ckpt(seed=1)), "--audio", str(tmp_path / "nowhere"), "--out",
                  str(tmp_path / "bad"), "--device", "cpu", "--dropout", bad])
        assert "--dropout must be in [0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def _clips(folder, seeds):
    folder.mkdir()
    for s in seeds:
        sf.write(folder / f"clip{s}.wav", synthetic_audio(2.0, seed=s), 16000)
    return str(folder)


def test_teacher_files_labelled_apart_train_the_same_drafter_as_one_labelling(tiny_ckpt, tmp_path, capsys):
    """--label-only on two halves (e.g. one per GPU), then --teacher-from both: the same sequences in the
    same order as labelling everything in one run, so the same drafter, bit for bit."""
    target = str(tiny_ckpt(seed=1))
    half_a, half_b = _clips(tmp_path / "a", [801, 802]), _clips(tmp_path / "b", [803, 804])
    every = _clips(tmp_path / "all", [801, 802, 803, 804])
    common = ["--target", target, "--device", "cpu", "--batch", "4", "--seq-len", "32", "--lr", "3e-3",
              "--unroll", "2", "--steps", "8", "--save-every", "100", "--log-every", "100"]
    for half, name in ((half_a, "la"), (half_b, "lb")):
        assert main(common + ["--audio", half, "--out", str(tmp_path / name), "--label-only"]) == 0
        assert (tmp_path / name / TEACHER_FILE).exists()
        assert not (tmp_path / name / STATE_FILE).exists() and not (tmp_path / name / "drafter_config.json").exists()
    assert '"sequences": 2' in capsys.readouterr().out
    evals = ["--eval-audio", str(tmp_path / "a" / "clip801.wav")]
    assert main(common + ["--teacher-from", str(tmp_path / "la"), str(tmp_path / "lb"),
                          "--out", str(tmp_path / "apart")] + evals) == 0
    assert main(common + ["--audio", every, "--out", str(tmp_path / "together")] + evals) == 0
    apart = torch.load(tmp_path / "apart" / STATE_FILE, weights_only=False)
    together = torch.load(tmp_path / "together" / STATE_FILE, weights_only=False)
    assert [h["loss"] for h in apart["history"]] == [h["loss"] for h in together["history"]]
    for k, v in together["drafter"].items():
        assert torch.equal(apart["drafter"][k], v), k
    report = json.loads((tmp_path / "apart" / "train_report.json").read_text())
    assert report["eval_audio"] == "held-out" and report["480"]["identical_outputs"] == "1/1"


def test_teacher_files_of_another_target_or_delay_are_refused(tiny_ckpt, tmp_path, capsys):
    one, other = str(tiny_ckpt(seed=1)), str(tiny_ckpt(seed=2))
    clips = _clips(tmp_path / "c", [811])
    base = ["--device", "cpu", "--steps", "2", "--batch", "2", "--seq-len", "16"]
    assert main(base + ["--target", one, "--audio", clips, "--out", str(tmp_path / "l"), "--label-only"]) == 0
    evals = ["--eval-audio", clips]
    use = base + ["--teacher-from", str(tmp_path / "l"), "--out", str(tmp_path / "t")] + evals
    capsys.readouterr()
    assert main(use + ["--target", other]) == 2
    assert "labelled by another target" in capsys.readouterr().err
    assert main(use + ["--target", one, "--delays", "160"]) == 2
    assert "labelled at delays [480] ms, not [160]" in capsys.readouterr().err
    blob = torch.load(tmp_path / "l" / TEACHER_FILE, weights_only=False)
    del blob["target"]  # a teacher file from before fingerprints were recorded
    torch.save(blob, tmp_path / "l" / TEACHER_FILE)
    assert main(use + ["--target", one]) == 2
    assert "another target" in capsys.readouterr().err
    missing = base + ["--target", one, "--teacher-from", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m")]
    assert main(missing + evals) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "t" / STATE_FILE).exists()
    for bad in (["--audio", clips, "--teacher-from", str(tmp_path / "l")] + evals,  # both sources
                ["--teacher-from", str(tmp_path / "l")],  # nothing to measure on
                ["--teacher-from", str(tmp_path / "l"), "--label-only"] + evals):  # nothing to label
        with pytest.raises(SystemExit):
            main(base + ["--target", one, "--out", str(tmp_path / "x")] + bad)


def test_new_weights_under_the_same_folder_are_labelled_again_and_not_resumed(tiny_ckpt, tmp_path, caplog, capsys):
    """`models/default` changes weights under one path: the cached teacher of the old weights must not be
    reused, nor a drafter half-trained for them resumed."""
    import shutil

    target = tmp_path / "target"
    shutil.copytree(tiny_ckpt(seed=1), target)
    clips = _clips(tmp_path / "c", [821])
    args = ["--target", str(target), "--audio", clips, "--out", str(tmp_path / "d"), "--device", "cpu",
            "--batch", "2", "--seq-len", "16", "--save-every", "100", "--eval-audio", clips]
    assert main(args + ["--steps", "3"]) == 0
    shutil.copytree(tiny_ckpt(seed=2), target, dirs_exist_ok=True)  # same folder, other weights
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level("INFO", logger="speculative.train"):
        assert main(args + ["--steps", "6"]) == 2
    assert not any("reusing" in r.getMessage() for r in caplog.records)  # labelled again
    assert "trained against another target" in capsys.readouterr().err
    model, _ = load_model(target)
    assert torch.load(tmp_path / "d" / TEACHER_FILE, weights_only=False)["target"] == target_fingerprint(model)
    assert main(args + ["--steps", "6", "--fresh"]) == 0
    assert torch.load(tmp_path / "d" / STATE_FILE, weights_only=False)["step"] == 6


@pytest.mark.parametrize("window", [None, 5])
def test_parallel_training_rows_see_what_one_engine_pass_shows_them(tiny_ckpt, tmp_path, window):
    """The training layout (real rows + U-1 mask rows per anchor under one mask) gives every draft row
    the output it gets in the engine, where anchor i's pass holds the real rows up to i and its own
    mask rows after it, attending causally within the drafter's window."""
    from realtime.attention import DenseAttention
    from speculative.train import parallel_row_layout

    model, _ = load_model(tiny_ckpt(seed=1))
    cfg = DrafterConfig.for_target(model.config, num_layers=2, sliding_window=window)
    d = ParallelEagleDrafter(cfg).eval().tie_to(model.language_model.embed_tokens.weight)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    length, depths, h = 12, 4, cfg.hidden_size
    tok = torch.randint(0, cfg.vocab_size, (length,), generator=g)
    audio, hid = torch.randn(length, h, generator=g), torch.randn(length, h, generator=g)
    pos = torch.arange(length) + 40
    t_cond = d.t_cond(torch.tensor([6]))[:, None, :]
    src, depth, allowed = parallel_row_layout(length, depths, window)
    idx = src.clamp(max=length - 1)
    ids = torch.where(depth > 0, d.mask_token_id, tok[idx])
    with torch.no_grad():
        x = d.embed_input_ids(ids, audio[idx])
        out = d(x[None], torch.where((depth > 0)[:, None], 0.0, hid[idx])[None], pos[idx][None], t_cond,
                DenseAttention.with_mask(allowed))[0]
        checked = 0
        for anchor in range(length):
            n_draft = min(depths - 1, length - 1 - anchor)
            q = torch.arange(anchor + 1 + n_draft)  # one engine pass: real rows 0..anchor, then mask rows
            is_draft = q > anchor
            xs = d.embed_input_ids(torch.where(is_draft, d.mask_token_id, tok[q]), audio[q])
            hs = torch.where(is_draft[:, None], 0.0, hid[q])
            ref = d(xs[None], hs[None], pos[q][None], t_cond, DenseAttention(pos[q][None], window))[0]
            for j in range(n_draft + 1):
                row = j * length + anchor  # depth j's row of this anchor (j = 0: the real row)
                torch.testing.assert_close(out[row], ref[anchor + j], rtol=1e-4, atol=1e-4)
                checked += 1
    assert checked == sum(min(depths, length - a) for a in range(length))
    with pytest.raises(ValueError, match="text_only"):
        train_drafter(model, [synthetic_audio(1.0, seed=1)], tmp_path / "never",
                      TrainConfig(steps=1, parallel=True, text_only=True), eval_audios=[])


def test_cli_trains_a_parallel_drafter_and_refuses_it_text_only(tiny_ckpt, tmp_path, capsys):
    audio = _clips(tmp_path / "audio", [900, 901])
    out = tmp_path / "par"
    rc = main(["--target", str(tiny_ckpt(seed=1)), "--audio", audio, "--out", str(out), "--device", "cpu",
               "--steps", "6", "--batch", "4", "--seq-len", "32", "--unroll", "3", "--parallel", "--k", "3",
               "--log-every", "100"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["480"]["identical_outputs"] == "2/2" and len(report["480"]["per_position_acceptance"]) == 3
    assert type(load_drafter(out)) is ParallelEagleDrafter
    with pytest.raises(SystemExit):
        main(["--target", str(tiny_ckpt(seed=1)), "--audio", audio, "--out", str(tmp_path / "bad"),
              "--device", "cpu", "--parallel", "--text-only"])
    assert "not with --text-only" in capsys.readouterr().err
    for bad in ("0", "1.5"):
        with pytest.raises(SystemExit):
            main(["--target", str(tiny_ckpt(seed=1)), "--audio", audio, "--out", str(tmp_path / "bad"),
                  "--device", "cpu", "--parallel", "--depth-decay", bad])
        assert "--depth-decay must be in (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_a_parallel_drafter_starts_from_a_chained_drafters_weights(tiny_ckpt, tmp_path, capsys):
    """--init-from: every tensor of the saved drafter is copied (the mask embedding keeps its zeros); a
    checkpoint of another shape is refused, on the command line before any labelling."""
    from speculative.train import init_from_checkpoint

    model, _ = load_model(tiny_ckpt(seed=1))
    clips = [synthetic_audio(1.5, seed=11)]
    chained = train_drafter(model, clips, tmp_path / "chained", TrainConfig(steps=3, batch=2, seq_len=16),
                            eval_audios=[]).out_dir
    par = train_drafter(model, clips, tmp_path / "par",
                        TrainConfig(steps=0, parallel=True, seq_len=16, init_from=str(chained)), eval_audios=[]).out_dir
    a, b = load_drafter(chained).state_dict(), load_drafter(par).state_dict()
    assert set(b) - set(a) == {"mask_embedding"} and not b["mask_embedding"].any()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the parallel drafter records the depths it was trained on (--unroll), the engine's default k; a chained one not
    assert load_drafter(chained).config.draft_tokens is None
    assert load_drafter(par).config.draft_tokens == TrainConfig().unroll
    assert default_num_speculative_tokens(load_drafter(par)) == TrainConfig().unroll
    assert load_drafter(par).config.gpu_draft_tokens is None  # a benchmark's finding, never training's
    fresh = load_drafter(train_drafter(model, clips, tmp_path / "fresh", TrainConfig(steps=0, parallel=True),
                                       eval_audios=[]).out_dir).state_dict()
    assert not torch.equal(fresh["fc.weight"], a["fc.weight"])  # the copy is what made them equal
    # a drafter trained for other depths whose config records a GPU count (as the shipped one's) still seeds one
    measured = load_drafter(par)
    measured.config = dataclasses.replace(measured.config, draft_tokens=10, gpu_draft_tokens=12)
    save_drafter(measured, tmp_path / "measured")
    assert init_from_checkpoint(load_drafter(par), tmp_path / "measured") == []
    two_layers = ParallelEagleDrafter(DrafterConfig.for_target(model.config, num_layers=2))
    with pytest.raises(ValueError, match="differs"):
        init_from_checkpoint(two_layers, chained)
    audio = _clips(tmp_path / "audio", [904])
    assert main(["--target", str(tiny_ckpt(seed=1)), "--audio", audio, "--out", str(tmp_path / "bad"),
                 "--device", "cpu", "--parallel", "--layers", "2", "--init-from", str(chained)]) == 2
    assert "differs" in capsys.readouterr().err
    assert main(["--target", str(tiny_ckpt(seed=1)), "--audio", audio, "--out", str(tmp_path / "bad"),
                 "--device", "cpu", "--parallel", "--init-from", str(tmp_path / "nothing")]) == 2
    assert "holds no drafter" in capsys.readouterr().err
    assert not (tmp_path / "bad" / TEACHER_FILE).exists()


def test_cli_trains_a_two_pass_drafter_and_refuses_bad_combinations(tiny_ckpt, tmp_path, capsys):
    audio = _clips(tmp_path / "audio", [902, 903])
    out = tmp_path / "two"
    base = ["--target", str(tiny_ckpt(seed=1)), "--audio", audio, "--device", "cpu"]
    rc = main([*base, "--out", str(out), "--steps", "6", "--batch", "4", "--seq-len", "32", "--unroll", "4",
               "--two-pass", "--k", "4", "--log-every", "100"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["480"]["identical_outputs"] == "2/2" and len(report["480"]["per_position_acceptance"]) == 4
    assert type(load_drafter(out)) is TwoPassEagleDrafter
    for bad, says in ((["--two-pass", "--text-only"], "not with --text-only"),
                      (["--two-pass", "--parallel"], "give one")):
        with pytest.raises(SystemExit):
            main([*base, "--out", str(tmp_path / "bad"), *bad])
        assert says in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="not both"):
        train_drafter(load_model(tiny_ckpt(seed=1))[0], [synthetic_audio(1.0, seed=1)], tmp_path / "never",
                      TrainConfig(steps=1, parallel=True, two_pass=True), eval_audios=[])


@pytest.mark.parametrize("cls", [ParallelEagleDrafter, TwoPassEagleDrafter])
def test_parallel_training_loss_is_the_loss_of_engine_passes(tiny_ckpt, cls):
    """`_parallel_train_step`'s loss and accuracies, recomputed anchor by anchor from explicit engine passes:
    the anchor's real rows (real tokens, audio and previous hidden states), then mask rows (mask token,
    their own audio, zero hidden), each row's loss against the next token and hidden state of its own
    position, weighted by depth_decay ** depth, counted only where anchor and row are generated positions.
    A two-pass drafter's first draft comes from a pass over the real rows alone, and its row after the
    anchor reads the real token there and that pass's output at the anchor instead of the mask and zeros."""
    import torch.nn.functional as F

    from realtime.attention import DenseAttention
    from speculative.train import _train_step

    model, _ = load_model(tiny_ckpt(seed=1))
    cfg = DrafterConfig.for_target(model.config, sliding_window=6)
    d = cls(cfg).eval().tie_to(model.language_model.embed_tokens.weight)
    two_pass = cls is TwoPassEagleDrafter
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    b, length, depths, h, v = 2, 10, 3, cfg.hidden_size, cfg.vocab_size
    batch = {"tok_in": torch.randint(0, v, (b, length), generator=g), "audio": torch.randn(b, length, h, generator=g),
             "hid_prev": torch.randn(b, length, h, generator=g), "hid_tgt": torch.randn(b, length, h, generator=g),
             "tok_tgt": torch.randint(0, v, (b, length), generator=g),
             "pos": torch.arange(length)[None].repeat(b, 1) + torch.tensor([[3], [20]]),
             "mask": torch.ones(b, length, dtype=torch.bool), "delay": torch.tensor([6, 2])}
    batch["mask"][0, :2] = False  # prompt positions
    batch["mask"][1, 8:] = False  # a short sequence's padded tail
    tc = TrainConfig(unroll=depths, parallel=not two_pass, two_pass=two_pass, depth_decay=0.7, hidden_loss=0.3)
    with torch.no_grad():
        loss, accs, _ = _train_step(d, batch, tc, True, False)
        total, n_first = torch.zeros(()), 0
        hits, counts = [0] * depths, [0] * depths
        for s in range(b):
            t_cond = d.t_cond(batch["delay"][s: s + 1])[:, None, :]

            def engine_pass(q, masked, hidden, s=s, t_cond=t_cond):
                x = d.embed_input_ids(torch.where(masked, d.mask_token_id, batch["tok_in"][s, q]), batch["audio"][s, q])
                pos = batch["pos"][s, q][None]
                return d(x[None], hidden[None], pos, t_cond, DenseAttention(pos, cfg.sliding_window))[0]

            for anchor in range(length):
                n_draft = min(depths - 1, length - 1 - anchor)
                q = torch.arange(anchor + 1 + n_draft)
                is_draft = q > anchor
                if two_pass:  # pass 1: the real rows up to the anchor; pass 2 adds the draft rows
                    first = engine_pass(q[: anchor + 1], is_draft[: anchor + 1], batch["hid_prev"][s, : anchor + 1])
                    hid = torch.where(is_draft[:, None], 0.0, batch["hid_prev"][s, q])
                    if n_draft:
                        hid[anchor + 1] = first[anchor]
                    out = engine_pass(q, q > anchor + 1, hid)
                    out[: anchor + 1] = first
                else:
                    out = engine_pass(q, is_draft, torch.where(is_draft[:, None], 0.0, batch["hid_prev"][s, q]))
                for j in range(n_draft + 1):
                    r = anchor + j
                    if not (batch["mask"][s, anchor] and batch["mask"][s, r]):
                        continue
                    logits = d.logits(out[r])
                    ce = F.cross_entropy(logits[None], batch["tok_tgt"][s, r][None])
                    reg = F.smooth_l1_loss(out[r], batch["hid_tgt"][s, r])
                    total += tc.depth_decay ** j * (ce + tc.hidden_loss * reg)
                    n_first += j == 0
                    hits[j] += int(logits.argmax() == batch["tok_tgt"][s, r])
                    counts[j] += 1
    torch.testing.assert_close(loss, total / n_first, rtol=1e-4, atol=1e-5)
    assert accs == pytest.approx([hi / c for hi, c in zip(hits, counts)])


def test_packed_training_shards_are_training_audio_and_held_out_ones_are_refused(tiny_ckpt, tmp_path, capsys):
    """`--audio` takes the default model's packed training shards (realtime.train.presynth: the natural and recorded
    voices a device cannot synthesise): a folder of them is expanded, each decodes to its voice's utterances back to
    back, and they label like any clip. A shard of held-out voices (split "heldout", as `pack-eval` makes for the
    device's evaluation) is refused, never trained on."""
    from pathlib import Path

    import numpy as np

    from realtime.train.presynth import SUFFIX, pack_shard
    from realtime.train.synth import RATE, RawShard
    from speculative.train import audio_paths, load_training_audio

    parts = tmp_path / "ps_part"
    parts.mkdir()
    raws = []
    for i, split in enumerate(["train", "train", "heldout"]):
        audio = (np.clip(synthetic_audio(1.5 + 0.25 * i, seed=40 + i), -1, 1) * 20000).astype(np.int16)
        raw = RawShard("kokoro:af_x", "af_x", split, ["a few words"], audio, np.array([0, audio.size]),
                       np.array([[0.1, 0.3], [0.35, 0.6], [0.7, 1.0]], np.float32), np.array([0, 3]))
        raw.save(tmp_path / f"raw{i}.npz")
        pack_shard(tmp_path / f"raw{i}.npz", parts / f"pre-{split}-{i:05d}{SUFFIX}", 0.95)
        raws.append(raw)
    (parts / "index.json").write_text("{}")
    found = audio_paths([str(parts)])
    assert all(f.endswith(SUFFIX) for f in found)  # presynth's own suffix: index.json is not audio
    assert [Path(f).name for f in found] == [f"pre-heldout-00002{SUFFIX}", f"pre-train-00000{SUFFIX}",
                                             f"pre-train-00001{SUFFIX}"]
    got = load_training_audio(found[1], RATE)
    assert got.dtype == np.float32 and got.size == raws[0].audio.size and 0 < np.abs(got).max() < 1
    ref = raws[0].audio / 32768.0
    assert np.corrcoef(ref, got)[0, 1] > 0.9  # Opus is lossy: the same signal, not the same samples
    with pytest.raises(ValueError, match="'heldout' shard .*never trained on"):
        load_training_audio(found[0], RATE)
    with pytest.raises(ValueError, match="packed shards are 16000 Hz"):
        load_training_audio(found[1], 24000)
    (tmp_path / f"broken{SUFFIX}").write_bytes(b"not a shard")
    with pytest.raises(ValueError, match="not a readable packed shard"):
        load_training_audio(str(tmp_path / f"broken{SUFFIX}"), RATE)
    # the command line: a folder with a held-out shard is refused before any labelling; the training shards label
    assert main(["--target", str(tiny_ckpt(seed=1)), "--audio", str(parts), "--out", str(tmp_path / "bad"),
                 "--device", "cpu", "--label-only"]) == 2
    assert "never trained on" in capsys.readouterr().err
    assert not (tmp_path / "bad" / TEACHER_FILE).exists()
    assert main(["--target", str(tiny_ckpt(seed=1)), "--audio", *found[1:], "--out", str(tmp_path / "lab"),
                 "--device", "cpu", "--label-only"]) == 0
    assert json.loads(capsys.readouterr().out)["sequences"] == 2
