"""benchmarks/device_speech_clips.py: the plan of parallel clip jobs that makes the drafter's distillation
audio on the GPU device. The real runs use espeak-ng's formant voices (the `unseen` kind), which CI has."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from device_speech_clips import PlanItem, child_env, command, run_plan

from realtime.train.text_corpus import Sentence, write_corpus

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None and not os.environ.get("CI"),
                                  reason="espeak-ng is not installed (CI installs it)")


def test_plan_items_parse_and_reject_bad_text() -> None:
    assert PlanItem.parse("warp:5:3001") == PlanItem("warp", 5, 3001)
    assert PlanItem.parse("train:1:7").folder == "train_7"
    for bad, why in (("speak:5:1", "KIND"), ("train:5", "KIND:COUNT:SEED"), ("train:x:1", "integers"),
                     ("train:0:1", "at least 1")):
        with pytest.raises(ValueError, match=why):
            PlanItem.parse(bad)


def test_command_asks_make_speech_clips_for_the_kind_count_and_seed(tmp_path: Path) -> None:
    cmd = command(PlanItem("warp", 5, 3001), tmp_path, 60.0, tmp_path / "c.tsv.gz")
    assert cmd[1].endswith("make_speech_clips.py")
    args = cmd[2:]
    assert args[args.index("--voices") + 1] == "train"
    assert args[args.index("--speed-warp") + 1: args.index("--speed-warp") + 3] == ["0.85", "1.18"]
    assert args[args.index("--count") + 1] == "5" and args[args.index("--seed") + 1] == "3001"
    assert args[args.index("--seconds") + 1] == "60.0"
    assert args[args.index("--out") + 1] == str(tmp_path / "warp_3001")
    plain = command(PlanItem("unseen", 2, 9), tmp_path, 10.0, tmp_path / "c.tsv.gz")
    assert "--speed-warp" not in plain and plain[plain.index("--voices") + 1] == "unseen"


def test_the_clip_jobs_find_the_repository_without_an_install(tmp_path: Path) -> None:
    # -S: no site-packages, so an editable install of this checkout cannot be what finds `realtime`
    # (the device runs a plain copy of the repository)
    probe = [sys.executable, "-S", "-c", "import realtime, sys; sys.stdout.write(realtime.__file__)"]
    p = subprocess.run(probe, env=child_env(), cwd=tmp_path, capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout).resolve().parent.parent == Path(__file__).resolve().parent.parent
    bare = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    assert subprocess.run(probe, env=bare, cwd=tmp_path, capture_output=True, check=False).returncode != 0


def test_two_items_with_one_folder_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="share a kind and a seed"):
        run_plan([PlanItem("train", 1, 4), PlanItem("train", 2, 4)], tmp_path, 5.0, tmp_path / "c.tsv.gz", 2)


def _corpus(path: Path) -> Path:
    texts = ["the cat sat on the mat", "we walked home after the long day", "please call me back tomorrow",
             "the river ran fast and cold"]
    write_corpus([Sentence("train", "test", t) for t in texts], path)
    return path


@needs_espeak
def test_run_plan_makes_each_items_clips_and_the_same_seed_makes_the_same_audio(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus.tsv.gz")
    items = [PlanItem("unseen", 2, 5), PlanItem("unseen", 1, 6)]
    stats = run_plan(items, tmp_path / "a", 2.0, corpus, jobs=2)
    assert stats["failed"] == {} and stats["folders"] == ["unseen_5", "unseen_6"]
    five = sorted((tmp_path / "a" / "unseen_5").glob("*.flac"))
    six = sorted((tmp_path / "a" / "unseen_6").glob("*.flac"))
    assert len(five) == 2 and len(six) == 1 and stats["clips"] == 3
    lengths = [sf.info(str(f)).duration for f in five + six]
    assert all(d >= 2.0 for d in lengths)  # each clip is filled up to --seconds with whole sentences
    assert stats["hours"] == pytest.approx(sum(lengths) / 3600)
    again = run_plan([PlanItem("unseen", 1, 6)], tmp_path / "b", 2.0, corpus, jobs=1)
    assert again["failed"] == {}
    (b,) = sorted((tmp_path / "b" / "unseen_6").glob("*.flac"))
    assert b.name == six[0].name
    assert np.array_equal(sf.read(str(b))[0], sf.read(str(six[0]))[0])


def test_failed_items_are_reported_with_their_error(tmp_path: Path) -> None:
    items = [PlanItem("unseen", 1, 5), PlanItem("unseen", 1, 6)]
    (tmp_path / "bad" / "train_1").mkdir(parents=True)  # clips of an earlier plan are not this plan's
    sf.write(str(tmp_path / "bad" / "train_1" / "old.flac"), np.zeros(1600, np.float32), 16000)
    stats = run_plan(items, tmp_path / "bad", 1.0, tmp_path / "missing.tsv.gz", jobs=2)
    assert set(stats["failed"]) == {"unseen_5", "unseen_6"} and stats["clips"] == 0
    assert all("missing.tsv.gz" in tail for tail in stats["failed"].values())
