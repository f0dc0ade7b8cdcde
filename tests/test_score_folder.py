"""benchmarks/score_folder.py, the WER of model folders on a folder of recordings with transcripts: its
figure is jiwer's over every recording, each hypothesis is what the model transcribes, transcripts are
normalised like the training evaluation's, and a recording without a transcript is an error."""

from __future__ import annotations

import json
import sys
import wave
from pathlib import Path

import jiwer
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from score_folder import main, pairs, speaker_of

from realtime.audio import load_audio_file
from realtime.model_store import load_model_and_tokenizer
from realtime.session import transcribe
from realtime.train.evaluate import normalize_text

MODEL = Path(__file__).resolve().parent.parent / "models" / "default"


def _wav(path: Path, audio: np.ndarray) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes())


def test_scores_every_recording_against_its_transcript(tmp_path: Path) -> None:
    g = np.random.default_rng(0)
    folder = tmp_path / "rec"
    folder.mkdir()
    t = np.arange(16000 * 2) / 16000
    clips = {"a": 0.3 * np.sin(2 * np.pi * 220 * t) * (t % 0.5 < 0.3), "b": 0.05 * g.standard_normal(24000)}
    for name, audio in clips.items():
        _wav(folder / f"{name}.wav", audio.astype(np.float32))
    (folder / "a.txt").write_text("Hello, World: 2 birds!\n")
    (folder / "b.txt").write_text("the quick brown fox")
    (folder / "notes.md").write_text("not a recording")
    assert [(p.name, ref) for p, ref in pairs(folder)] == [("a.wav", "hello world two birds"),
                                                          ("b.wav", "the quick brown fox")]
    out = tmp_path / "r.json"
    assert main(["--folder", str(folder), "--models", f"shipped={MODEL}", "--out", str(out)]) == 0
    r = json.loads(out.read_text())["shipped"]
    model, tok = load_model_and_tokenizer(str(MODEL), device="cpu", dtype=torch.float32)
    hyps = []
    for ex, name in zip(sorted(r["examples"], key=lambda e: e["voice"]), ("a", "b")):
        assert ex["voice"] == f"{name}.wav"
        direct = transcribe(model, tok, load_audio_file(str(folder / f"{name}.wav"), 16000), delay_ms=480).text
        assert normalize_text(ex["hyp"]) == normalize_text(direct)
        hyps.append(normalize_text(ex["hyp"]) or "<empty>")
        # and each recording's own figure
        assert r["folder"][f"{name}.wav"]["480"]["wer"] == round(100 * jiwer.wer(ex["ref"], hyps[-1]), 2)
    refs = [ex["ref"] for ex in sorted(r["examples"], key=lambda e: e["voice"])]
    assert refs == ["hello world two birds", "the quick brown fox"]  # scored against the files' transcripts
    assert r["folder"]["*"]["480"]["n"] == 2 and r["wer"] == round(100 * jiwer.wer(refs, hyps), 2)


def test_a_recording_without_transcript_is_an_error(tmp_path: Path) -> None:
    _wav(tmp_path / "x.wav", np.zeros(1600, np.float32))
    with pytest.raises(FileNotFoundError, match="x.txt"):
        pairs(tmp_path)
    (tmp_path / "x.wav").unlink()
    with pytest.raises(FileNotFoundError, match="no recordings"):
        pairs(tmp_path)


def test_by_speaker_scores_each_speakers_recordings_together(tmp_path: Path) -> None:
    """--by-speaker: a speaker's figure is jiwer's over all its recordings, not a mean of per-recording figures
    (here 0% and several hundred % for one speaker's two recordings: the two differ widely)."""
    import shutil

    samples = Path(__file__).resolve().parent.parent / "demo" / "samples"
    folder = tmp_path / "rec"
    folder.mkdir()
    for name, sample, text in (("bf_emma_00", "heldout_nyc_f4", "my children finally got me to buy a computer"),
                               ("bf_emma_01", "sample_en", "the quick brown fox"), ("am_x_00", "heldout_nyc_f4", "eight")):
        shutil.copyfile(samples / f"{sample}.wav", folder / f"{name}.wav")
        (folder / f"{name}.txt").write_text(text)
    out = tmp_path / "r.json"
    assert main(["--folder", str(folder), "--models", f"shipped={MODEL}", "--by-speaker", "--out", str(out)]) == 0
    r = json.loads(out.read_text())["shipped"]
    assert set(r["folder"]) == {"*", "bf_emma", "am_x"} and r["folder"]["bf_emma"]["480"]["n"] == 2
    hyp = {e["ref"]: normalize_text(e["hyp"]) or "<empty>" for e in r["examples"] if e["voice"] == "bf_emma"}
    refs = sorted(hyp)
    each = [jiwer.wer(ref, hyp[ref]) for ref in refs]
    assert max(each) - min(each) > 0.5  # so a mean of the two would not be the jiwer figure over both
    assert r["folder"]["bf_emma"]["480"]["wer"] == round(100 * jiwer.wer(refs, [hyp[x] for x in refs]), 2)
    assert speaker_of(Path("af_sarah_12.wav")) == "af_sarah"
    with pytest.raises(ValueError, match="cannot tell its speaker"):
        speaker_of(Path("recording.wav"))
