"""Pre-synthesised shards carried as Opus: the round trip keeps texts, word times and sample counts;
a shard whose audio would no longer match its offsets is refused; held-out voices are never packed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from realtime.train.presynth import (SUFFIX, main, pack_shard, read_packed_audio, select_training_voices, unpack,
                                     unpack_shard)
from realtime.train.synth import RATE, RawShard

pytest.importorskip("soundfile")


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Voiced-sounding test audio: a pitch-varying harmonic tone with syllable-rate amplitude."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    x = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2)
    return (0.3 * x / np.abs(x).max() * 32767).astype(np.int16)


def make_shard(path, seed: int) -> RawShard:
    parts = [speechlike(1.3, seed), speechlike(0.77, seed + 1)]  # odd lengths: no frame-size luck
    raw = RawShard("espeak:mb-ro1-en", "mbrola-ro1", "train", ["hello there world", "fine"],
                   np.concatenate(parts), np.array([0, parts[0].size, parts[0].size + parts[1].size]),
                   np.array([[0.1, 0.4], [0.45, 0.8], [0.85, 1.2], [0.05, 0.6]], np.float32), np.array([0, 3, 4]))
    raw.save(path)
    return raw


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return 10 * np.log10((ref ** 2).sum() / ((ref - got) ** 2).sum())


def test_packed_shard_round_trip(tmp_path):
    src, packed, out = tmp_path / "train-00001.npz", tmp_path / ("pre-train-00001" + SUFFIX), tmp_path / "out"
    out.mkdir()
    raw = make_shard(src, 0)
    samples, size = pack_shard(src, packed, 0.95)
    assert samples == raw.audio.size and size < raw.audio.nbytes / 5  # Opus: several times smaller than int16
    seconds = unpack_shard(packed, out)
    assert seconds == pytest.approx(raw.audio.size / RATE)
    back = RawShard.load(out / "pre-train-00001.npz")
    assert (back.voice, back.speaker, back.split, back.texts) == (raw.voice, raw.speaker, raw.split, raw.texts)
    np.testing.assert_array_equal(back.offsets, raw.offsets)
    np.testing.assert_array_equal(back.word_times, raw.word_times)
    np.testing.assert_array_equal(back.word_offsets, raw.word_offsets)
    assert back.audio.dtype == np.int16 and back.audio.size == raw.audio.size
    assert snr_db(raw.audio, back.audio) > 10  # lossy, but the same speech, in place (no shift)
    assert [w.text for w in back.words(0)] == ["hello", "there", "world"]


def test_unpack_folder_and_refuse_mismatched_audio(tmp_path):
    packed, out = tmp_path / "packed", tmp_path / "shards"
    packed.mkdir()
    for i in range(3):
        make_shard(tmp_path / f"s{i}.npz", 10 + i)
        pack_shard(tmp_path / f"s{i}.npz", packed / f"pre-{i}{SUFFIX}", 0.95)
    stats = unpack(packed, out, workers=2)
    assert stats["shards"] == 3 and sorted(p.name for p in out.glob("*.npz")) == ["pre-0.npz", "pre-1.npz", "pre-2.npz"]
    with np.load(packed / f"pre-0{SUFFIX}") as z:
        fields = dict(z)
    fields["offsets"] = fields["offsets"] + 160  # offsets that no longer match the audio
    np.savez(packed / f"bad{SUFFIX}", **fields)
    with pytest.raises(ValueError, match="decoded .* samples, the offsets say"):
        unpack_shard(packed / f"bad{SUFFIX}", out)
    with pytest.raises(ValueError, match="decoded .* samples, the offsets say"):  # what speculative.train reads
        read_packed_audio(packed / f"bad{SUFFIX}")
    audio, meta = read_packed_audio(packed / f"pre-0{SUFFIX}")
    assert audio.dtype == np.float32 and audio.size == int(fields["offsets"][-1]) - 160 and meta["split"]


def test_held_out_voices_are_never_packed(tmp_path):
    with pytest.raises(SystemExit, match="not training voices of the catalogue: \\['mb-us3'\\]"):
        main(["pack", "--corpus", str(tmp_path / "none.tsv.gz"), "--out", str(tmp_path / "o"),
              "--voices", "mb-ro1-en", "mb-us3"])


def test_voices_are_chosen_by_name_or_by_engine_key() -> None:
    assert {v.key for v in select_training_voices(["slt"])} == {"flite:slt", "rhvoice:slt"}
    assert {v.key for v in select_training_voices(["rhvoice:slt", "bdl"])} == {"rhvoice:bdl", "rhvoice:slt"}
    for refused in (["flite:awb"], ["awb"], ["rhvoice:alan"], ["slt", "mb-us3"]):
        with pytest.raises(SystemExit, match="not training voices"):
            select_training_voices(refused)


def test_pack_synthesises_training_shards_that_unpack_into_a_corpus(tmp_path):
    """End to end with a real mbrola voice (CI installs us1): training sentences only, split "train",
    names that cannot collide with the device's own shards, and a trainer's Corpus reads them."""
    import json
    import shutil

    import torch

    from realtime.tokenizer import load_tokenizer
    from realtime.train.data import Corpus
    from realtime.train.text_corpus import Sentence, write_corpus
    from realtime.train.voices import mbrola_voice_available

    if shutil.which("espeak-ng") is None or not mbrola_voice_available("mb-us1", None):
        pytest.skip("mbrola with the us1 voice is not installed (.ci/install_mbrola.sh installs it)")
    train = ["please call stella and ask her to bring these things", "we also need a small plastic snake",
             "six spoons of fresh snow peas", "the birch canoe slid on the smooth planks"]
    corpus = tmp_path / "corpus.tsv.gz"
    write_corpus([Sentence("train", "t", t) for t in train] + [Sentence("test", "t", "never trained on this")], corpus)
    packed, shards = tmp_path / "packed", tmp_path / "shards"
    assert main(["pack", "--corpus", str(corpus), "--out", str(packed), "--voices", "mb-us1", "--hours", "0.004",
                 "--sentences-per-shard", "2", "--workers", "1"]) == 0
    index = json.loads((packed / "index.json").read_text())
    assert index["voices"] == ["espeak:mb-us1"] and index["shards"] >= 2
    files = sorted(packed.glob("*" + SUFFIX))
    assert len(files) == index["shards"] and all(f.name.startswith("pre-train-") for f in files)
    assert unpack(packed, shards, workers=1)["hours"] == pytest.approx(index["hours"])
    tok = load_tokenizer(Path(__file__).resolve().parent.parent / "models" / "default")
    corpus_obj = Corpus(shards, tok, torch.device("cpu"))
    corpus_obj.refresh()
    assert set(corpus_obj.voices) == {"espeak:mb-us1"} and corpus_obj.num_utterances >= 2
    texts = {t for f in shards.glob("*.npz") for t in RawShard.load(f).texts}
    assert texts <= set(train)  # training sentences only


def test_pack_stops_starting_shards_at_its_time_limit(tmp_path):
    """--max-seconds (a device call's limit): a plan of hours stops early and packs the shards that were done; with
    the limit already past, queued shards are dropped and only those a worker had already taken finish."""
    import shutil

    from realtime.train.text_corpus import Sentence, write_corpus
    from realtime.train.voices import mbrola_voice_available

    if shutil.which("espeak-ng") is None or not mbrola_voice_available("mb-us1", None):
        pytest.skip("mbrola with the us1 voice is not installed (.ci/install_mbrola.sh installs it)")
    corpus = tmp_path / "corpus.tsv.gz"
    write_corpus([Sentence("train", "t", "six spoons of fresh snow peas"), Sentence("test", "t", "not this")], corpus)
    packed = tmp_path / "packed"
    assert main(["pack", "--corpus", str(corpus), "--out", str(packed), "--voices", "mb-us1", "--hours", "5",
                 "--sentences-per-shard", "1", "--workers", "2", "--max-seconds", "0"]) == 0
    index = json.loads((packed / "index.json").read_text())
    # The queue holds two shards a worker (4). A process pool hands at most workers + 1 (3) to its workers before
    # one finishes; past the limit the others are dropped, so at most 3 finish (all 4 did before the drop); the
    # first is handed over while the others are still being queued, so at least 1 does (1-3 in 12 runs here).
    assert 1 <= index["shards"] <= 3 and len(list(packed.glob("*" + SUFFIX))) == index["shards"]
    assert index["hours"] < 0.01  # of a 5-hour plan


def packed_part(folder: Path, voices: list[str], seed: int) -> None:
    """A folder as `pack` leaves it: pre-train-NNNNN shards (the same names in every part) + index.json."""
    folder.mkdir()
    for i, voice in enumerate(voices):
        raw = make_shard(folder / f"raw{i}.npz", seed + i)
        RawShard(voice, voice, raw.split, raw.texts, raw.audio, raw.offsets, raw.word_times,
                 raw.word_offsets).save(folder / f"raw{i}.npz")
        pack_shard(folder / f"raw{i}.npz", folder / f"pre-train-{i:05d}{SUFFIX}", 0.95)
        (folder / f"raw{i}.npz").unlink()
    (folder / "index.json").write_text(f'{{"voices": {sorted(set(voices))!r}, "seed": {seed}}}'.replace("'", '"'))


def test_merge_renames_parts_apart_and_trims_only_the_named_voices(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    packed_part(a, ["festival:rab_diphone", "espeak:mb-us1", "festival:ked_diphone", "festival:rab_diphone"], 0)
    packed_part(b, ["rhvoice:bdl", "rhvoice:clb"], 10)
    out = tmp_path / "merged"
    main(["merge", "--out", str(out), "pre-=" + str(a), "rh-=" + str(b)])
    names = sorted(f.name for f in out.glob("*" + SUFFIX))
    assert names == [f"pre-train-{i:05d}{SUFFIX}" for i in range(4)] + [f"rh-train-{i:05d}{SUFFIX}" for i in range(2)]
    index = json.loads((out / "index.json").read_text())
    assert index["parts"]["rh-"]["seed"] == 10 and index["parts"]["pre-"]["merged_shards"] == 4
    shards = tmp_path / "shards"
    assert unpack(out, shards, 1)["shards"] == 6  # nothing overwritten on the way
    assert sorted(RawShard.load(f).voice for f in shards.glob("rh-*.npz")) == ["rhvoice:bdl", "rhvoice:clb"]

    # trimming: only part "pre-", only its espeak voices, until the folder fits; the count is written down
    sizes = {f.name: f.stat().st_size for f in out.glob("*" + SUFFIX)}
    budget = sum(sizes.values()) - 1  # one shard must go
    trimmed = tmp_path / "trimmed"
    main(["merge", "--out", str(trimmed), "pre-=" + str(a), "rh-=" + str(b), "--max-mb", str(budget / 1e6),
          "--trim", "pre-", "--trim-voices", "espeak:"])
    left = {f.name for f in trimmed.glob("*" + SUFFIX)}
    gone = set(sizes) - left
    assert gone == {f"pre-train-00001{SUFFIX}"}  # the one espeak shard of part pre-: Festival's are kept
    assert sum(sizes[n] for n in left) <= budget
    index = json.loads((trimmed / "index.json").read_text())
    assert index["parts"]["pre-"]["dropped_to_fit"] == 1 and index["shards"] == 5

    # a budget that even dropping every allowed shard cannot meet is an error, not a silent overshoot
    with pytest.raises(SystemExit, match="still"):
        main(["merge", "--out", str(tmp_path / "x"), "pre-=" + str(a), "rh-=" + str(b), "--max-mb", "0.000001",
              "--trim", "pre-", "--trim-voices", "espeak:"])
    with pytest.raises(SystemExit, match="not empty"):
        main(["merge", "--out", str(out), "pre-=" + str(a)])


def test_pack_eval_takes_only_held_out_voices(tmp_path):
    with pytest.raises(SystemExit, match="not held-out voices of the catalogue: \\['mb-us1'\\]"):
        main(["pack-eval", "--corpus", str(tmp_path / "none.tsv.gz"), "--out", str(tmp_path / "o"),
              "--voices", "mb-us3", "mb-us1"])


def test_pack_eval_carries_the_cpu_evaluation_set_to_the_device_evaluation(tmp_path):
    """A held-out voice's evaluation shards, packed here, merged and unpacked as on the device: the
    sentences and synthesis seeds of rescore_heldout's plan for that seed, split "heldout", found by the
    device's evaluation and validation, never by a trainer's corpus. Uses a held-out formant voice
    (espeak-ng is all CI has); the mbrola speakers us3 and en1 go the same way."""
    import shutil

    import torch

    from realtime.tokenizer import load_tokenizer
    from realtime.train.data import Corpus
    from realtime.train.evaluate import build_items
    from realtime.train.presynth import heldout_eval_tasks, select_heldout_voices
    from realtime.train.synth import plan_tasks
    from realtime.train.text_corpus import Sentence, read_corpus, write_corpus
    from realtime.train.voices import catalogue

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    test = ["the birch canoe slid on the smooth planks", "glue the sheet to the dark blue background",
            "it is easy to tell the depth of a well", "these days a chicken leg is a rare dish"]
    corpus = tmp_path / "corpus.tsv.gz"
    write_corpus([Sentence("train", "t", "a training sentence only")] + [Sentence("test", "t", t) for t in test], corpus)
    packed, merged, shards = tmp_path / "packed", tmp_path / "merged", tmp_path / "shards"
    assert main(["pack-eval", "--corpus", str(corpus), "--out", str(packed), "--voices", "en-us-nyc+f4",
                 "--per-voice", "3", "--seed", "8", "--workers", "1"]) == 0
    voice = select_heldout_voices(["en-us-nyc+f4"])
    (task,) = heldout_eval_tasks(corpus, voice, per_voice=3, seed=8)
    train_v, held_v = catalogue()  # the plan exactly as benchmarks/rescore_heldout.py --seed 8 makes it
    (cpu_task,) = [t for t in plan_tasks(read_corpus(corpus), train_v, held_v, train_hours=0, eval_per_voice=3,
                                         seed=8) if t.voice.key == "espeak:en-us-nyc+f4"]
    assert (task.name, task.split, task.texts, task.seed) == ("pre-" + cpu_task.name, "heldout", cpu_task.texts,
                                                             cpu_task.seed)
    assert [f.name for f in packed.glob("*" + SUFFIX)] == [task.name + SUFFIX]
    # a training part beside it, as in a real carry
    packed_part(tmp_path / "train_part", ["espeak:mb-us1"], seed=40)
    main(["merge", "--out", str(merged), f"pre-={tmp_path / 'train_part'}", f"ev-={packed}"])
    unpack(merged, shards, workers=1)
    (shard,) = [RawShard.load(f) for f in shards.glob("ev-*.npz")]
    assert shard.split == "heldout" and shard.voice == "espeak:en-us-nyc+f4" and tuple(shard.texts) == task.texts
    assert set(shard.texts) <= set(test)

    items = build_items(shards, delays=[480], per_voice=3, sweep_per_voice=0, real_dir=None)
    assert [(i.group, i.voice, i.ref) for i in items] == [("heldout", "espeak:en-us-nyc+f4", t) for t in task.texts]
    tok = load_tokenizer(Path(__file__).resolve().parent.parent / "models" / "default")
    train = Corpus(shards, tok, torch.device("cpu"))
    train.refresh()
    assert set(train.voices) == {"espeak:mb-us1"}
    held = Corpus(shards, tok, torch.device("cpu"), splits=("heldout",))
    held.refresh()
    assert set(held.voices) == {"espeak:en-us-nyc+f4"} and held.num_utterances == 3

    # The device also synthesises its own draw (heldout-NN) of the voices its engines speak. For a voice
    # that came carried, only the carried utterances count; other voices keep the device's own.
    from realtime.train.synth import Shard

    own = Shard.load(next(shards.glob("ev-*.npz")))
    own.utterances = own.utterances[:1]
    own.utterances[0].text = "a sentence of the device's own draw"
    own.save(shards / "heldout-00.npz")
    own.voice = "flite:awb"
    own.save(shards / "heldout-01.npz")
    items = build_items(shards, delays=[480], per_voice=3, sweep_per_voice=0, real_dir=None)
    assert sorted((i.voice, i.ref) for i in items) == sorted(
        [("espeak:en-us-nyc+f4", t) for t in task.texts] + [("flite:awb", "a sentence of the device's own draw")])
