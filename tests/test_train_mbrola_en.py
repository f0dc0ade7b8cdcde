"""English entries for more mbrola speakers (realtime/train/mbrola_en.py): the private espeak-ng data
folder lists them, the catalogue uses them only where that folder is in use, and each one speaks
with complete word times through the mbrola database it names."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from realtime.train.mbrola_en import (
    EXTRA_MBROLA_EN,
    EXTRA_NAMES,
    MAX_VOICES,
    SYSTEM_ESPEAK_DATA,
    SYSTEM_MBROLA,
    english_mbrola_data,
)
from realtime.train.voices import catalogue, mbrola_voice_available

needs_espeak_data = pytest.mark.skipif(not (SYSTEM_ESPEAK_DATA / "phontab").is_file(),
                                       reason="needs Debian's espeak-ng-data")
_missing_db = [v.voice for v in EXTRA_MBROLA_EN if not (SYSTEM_MBROLA / v.voice / v.voice).is_file()]
needs_databases = pytest.mark.skipif(shutil.which("mbrola") is None or bool(_missing_db),
                                     reason=f"needs mbrola and the databases {_missing_db} (.ci/install_mbrola.sh)")


def test_entries_name_english_and_their_database() -> None:
    for v in EXTRA_MBROLA_EN:
        lines = v.entry().splitlines()
        assert lines[0] == "language en 10"
        assert f"mbrola {v.voice} {v.table}" in v.entry()
        assert ("gender female" in lines) == v.female
    assert len(EXTRA_NAMES) == len(EXTRA_MBROLA_EN)


def test_catalogue_trains_on_them_and_never_holds_them_out() -> None:
    train, held = catalogue()
    train_names = {v.base for v in train}
    assert EXTRA_NAMES <= train_names
    assert not EXTRA_NAMES & {v.base for v in held}
    assert len({v.speaker for v in train if v.base in EXTRA_NAMES}) == len(EXTRA_NAMES)  # one speaker each
    assert not {v.speaker for v in train if v.base in EXTRA_NAMES} & {v.speaker for v in held}


@needs_espeak_data
def test_entries_are_the_native_entries_in_english(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of the nine keeps its native entry's gender, pitch range, voicing, phoneme table and sample rate,
    as the probe (benchmarks/probe_mbrola_voices.py) derives them from Debian's espeak-ng data."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from probe_mbrola_voices import english_from_native

    for v in EXTRA_MBROLA_EN:
        assert english_from_native(SYSTEM_ESPEAK_DATA, v.voice) == v


@needs_espeak_data
def test_private_data_folder_lists_every_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = english_mbrola_data(tmp_path / "espeak-ng-data")
    mb = sorted(p.name for p in (data / "voices" / "mb").iterdir())
    assert EXTRA_NAMES <= set(mb)
    assert all(n.endswith("-en") or n in ("mb-us1", "mb-us2", "mb-us3", "mb-en1") for n in mb)  # natives dropped
    n = sum(1 for sub in ("voices", "lang") for p in (data / sub).rglob("*") if p.is_file())
    assert n <= MAX_VOICES
    for v in EXTRA_MBROLA_EN:
        assert (data / "mbrola_ph" / v.table).is_file(), f"{v.name}: espeak-ng has no table {v.table}"
    # an entry counts as available only with a data folder that has it
    monkeypatch.delenv("STREAMSCRIBE_ESPEAK_DATA", raising=False)
    if shutil.which("mbrola") and (SYSTEM_MBROLA / "fr2" / "fr2").is_file():
        assert mbrola_voice_available("mb-fr2-en", str(data))
    assert not mbrola_voice_available("mb-fr2-en", None)
    assert not mbrola_voice_available("mb-fr2-en", str(tmp_path / "elsewhere"))


_SPEAK = r"""
import json, sys
import numpy as np
from realtime.train.espeak import EspeakSynth, EspeakVoice
data, names = sys.argv[1], sys.argv[2].split(",")
synth = EspeakSynth(data_path=data)  # the environment's library, this data folder
words = "the quick brown fox jumps over the lazy dog".split()
ref, _ = synth.synthesize(EspeakVoice("en"), words)
out = {}
for name in names:
    audio, times = synth.synthesize(EspeakVoice(name), words)
    n = min(ref.size, audio.size)
    out[name] = {"seconds": audio.size / 16000, "starts": [t.start for t in times], "ends": [t.end for t in times],
                 "same_as_formant": bool(audio.size == ref.size and np.allclose(audio[:n], ref[:n]))}
print(json.dumps(out))
"""


@needs_espeak_data
@needs_databases
def test_each_entry_speaks_with_word_times(tmp_path: Path) -> None:
    data = english_mbrola_data(tmp_path / "espeak-ng-data")
    # a process of its own: the library's data folder is process-global
    proc = subprocess.run([sys.executable, "-c", _SPEAK, str(data), ",".join(sorted(EXTRA_NAMES))],
                          capture_output=True, text=True, timeout=300, check=False, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, r in result.items():
        assert not r["same_as_formant"], name
        assert 1.5 < r["seconds"] < 6.0, (name, r["seconds"])
        starts, ends = r["starts"], r["ends"]
        assert all(a <= b for a, b in itertools.pairwise(starts)), name
        assert all(s <= e for s, e in zip(starts, ends)), name
        assert ends[-1] <= r["seconds"] + 1e-6 and ends[-1] > r["seconds"] - 1.0, name


@needs_espeak_data
@needs_databases
def test_pack_speaks_the_new_voices_and_restores_the_environment(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`presynth pack` with two of the nine: it builds the private data folder for its workers, the shards
    are theirs, and the process's espeak-ng environment is as before once it returns."""
    import os

    from realtime.train.presynth import SUFFIX, main, unpack
    from realtime.train.synth import RawShard
    from realtime.train.text_corpus import Sentence, write_corpus

    monkeypatch.delenv("STREAMSCRIBE_ESPEAK_DATA", raising=False)
    monkeypatch.setenv("STREAMSCRIBE_ESPEAK_LIB", "/usr/lib/x86_64-linux-gnu/libespeak-ng.so.1")
    train = ["please call stella and ask her to bring these things", "we also need a small plastic snake",
             "six spoons of fresh snow peas", "the birch canoe slid on the smooth planks"]
    corpus = tmp_path / "corpus.tsv.gz"
    write_corpus([Sentence("train", "t", t) for t in train], corpus)
    packed, shards = tmp_path / "packed", tmp_path / "shards"
    assert main(["pack", "--corpus", str(corpus), "--out", str(packed), "--voices", "mb-fr2-en", "mb-cr1-en",
                 "--hours", "0.006", "--sentences-per-shard", "2", "--workers", "2"]) == 0
    assert "STREAMSCRIBE_ESPEAK_DATA" not in os.environ
    assert os.environ["STREAMSCRIBE_ESPEAK_LIB"] == "/usr/lib/x86_64-linux-gnu/libespeak-ng.so.1"
    index = json.loads((packed / "index.json").read_text())
    assert sorted(index["voices"]) == ["espeak:mb-cr1-en", "espeak:mb-fr2-en"]
    assert len(list(packed.glob("*" + SUFFIX))) == index["shards"] >= 2
    unpack(packed, shards, workers=1)
    voices = {RawShard.load(f).voice for f in shards.glob("*.npz")}
    assert voices == {"espeak:mb-cr1-en", "espeak:mb-fr2-en"}
