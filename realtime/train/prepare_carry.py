"""Build `.train_carry/`: everything the GPU training call needs that its machine lacks.

    python -m realtime.train.prepare_carry [--out .train_carry] [--mbrola us1 us2 us3 en1 ro1 pl1]

The training machine has torch, numpy, scipy, matplotlib and tokenizers but no TTS engines, no sox,
no network and no apt. This folder brings, within the 64 MiB a call may carry (with the repo):
- `corpus.tsv.gz`: the normalised, split sentences (text_corpus.py; needs fortunes, wordnet-base,
  wamerican, num2words here);
- `tok/tokenizer.json`: the trained BPE (tokenizer_train.py);
- `engines.tar.xz`: Debian's libespeak-ng (+ English data and the chosen mbrola voices), the
  `mbrola` program, flite's libraries and our compiled `flitew` helper, libasound and libsonic, and
  a stub libpcaudio (pcaudio_stub.c) in place of the PulseAudio chain espeak-ng would otherwise pull
  in. Everything links only against glibc (2.34 at most) beyond what is inside;
- `real/`: pocketsphinx-testdata's recordings with transcripts (evaluation only);
- `wheels/`: jiwer, rapidfuzz and soundfile (+ cffi, pycparser) for Python 3.12 (the training
  machine's Python);
- optionally `presynth/` (made by `python -m realtime.train.presynth pack --out .train_carry/presynth`):
  speech of voices the carry has no room for, as Opus;
- `MANIFEST.json`: what came from which Debian package, under which licence, and the sizes.
Needs, here: apt packages espeak-ng, flite1-dev, mbrola + voices, pocketsphinx-testdata, fortunes,
wordnet-base, wamerican; gcc; pip.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from .flite import build_helper

logger = logging.getLogger(__name__)

LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
ESPEAK_DATA = LIBDIR / "espeak-ng-data"
MBROLA_DIR = Path("/usr/share/mbrola")
FLITE_LIBS = ["libflite.so.1", "libflite_usenglish.so.1", "libflite_cmulex.so.1", "libflite_cmu_us_slt.so.1",
              "libflite_cmu_us_rms.so.1", "libflite_cmu_us_awb.so.1", "libflite_cmu_us_kal16.so.1"]
SYSTEM_LIBS = ["libespeak-ng.so.1", "libsonic.so.0", "libasound.so.2"] + FLITE_LIBS
POCKETSPHINX = Path("/usr/share/pocketsphinx/test/data")
# jiwer for the evaluation; soundfile (bundling libsndfile with Opus) decodes pre-synthesised shards (presynth.py)
WHEELS = ["jiwer==4.0.0", "rapidfuzz==3.14.6", "soundfile==0.14.0", "cffi==2.1.1", "pycparser==3.12"]
LICENCES = {
    "espeak-ng": "GPL-3+", "libsonic0": "Apache-2.0", "libasound2": "LGPL-2.1+", "libflite1": "BSD-like (CMU)",
    "mbrola": "AGPL-3 (contrib)", "pocketsphinx-testdata": "BSD-2-Clause",
    # non-free: use only for synthesis with the MBROLA program; copies free of charge with the notice;
    # not to be sold or built into a sold product without the database owner's permission
    "mbrola-us1": "non-free MBROLA database licence (owner BaBel Technology)",
    "mbrola-us2": "non-free MBROLA database licence (owner BaBel Technology)",
    "mbrola-us3": "non-free MBROLA database licence (owner OGI)",
    "mbrola-en1": "non-free MBROLA licence + Edinburgh ROGER terms (free copying with notice)",
    "mbrola-ro1": "non-free MBROLA database licence (owner Politehnica University of Timisoara, M. Boldea)",
    "mbrola-pl1": "non-free MBROLA database licence (diphone database owner K. Szklanny, PJWSTK)",
}


def _package_of(path: Path) -> str:
    out = subprocess.run(["dpkg", "-S", str(path.resolve())], capture_output=True, text=True, check=False)
    return out.stdout.split(":")[0] if out.returncode == 0 else "?"


def _espeak_data_filter(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    name = info.name.split("espeak-ng-data/", 1)[-1]
    # English only: the other languages' dictionaries are most of the 13 MB
    if name.endswith("_dict") and not name.endswith("/en_dict") and name != "en_dict":
        return None
    if name.startswith("lang/") and not (name == "lang" or name.startswith("lang/gmw")):
        return None
    return info


def build_engines(out: Path, mbrola_voices: list[str], work: Path) -> dict:
    stage = work / "engines"
    if stage.exists():
        shutil.rmtree(stage)
    (stage / "bin").mkdir(parents=True)
    (stage / "lib").mkdir()
    sources: dict[str, str] = {}
    for lib in SYSTEM_LIBS:
        src = next((d / lib for d in (LIBDIR, Path("/lib/x86_64-linux-gnu")) if (d / lib).exists()), None)
        if src is None:
            raise FileNotFoundError(f"{lib} not installed (apt-get install espeak-ng flite1-dev)")
        shutil.copy(src.resolve(), stage / "lib" / lib)
        sources[f"lib/{lib}"] = _package_of(src)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wl,-soname,libpcaudio.so.0",
                    str(Path(__file__).with_name("pcaudio_stub.c")), "-o", str(stage / "lib" / "libpcaudio.so.0")],
                   check=True)
    sources["lib/libpcaudio.so.0"] = "built here from realtime/train/pcaudio_stub.c"
    build_helper(stage / "bin" / "flitew")
    sources["bin/flitew"] = "built here from realtime/train/flitew.c against flite1-dev"
    shutil.copy("/usr/bin/mbrola", stage / "bin" / "mbrola")
    sources["bin/mbrola"] = _package_of(Path("/usr/bin/mbrola"))
    voices_dir = stage / "espeak-ng-data" / "mbrola"
    with tarfile.open(work / "data.tar", "w") as t:
        t.add(ESPEAK_DATA, arcname="espeak-ng-data", filter=_espeak_data_filter)
    with tarfile.open(work / "data.tar") as t:
        t.extractall(stage, filter="data")
    (work / "data.tar").unlink()
    sources["espeak-ng-data"] = _package_of(ESPEAK_DATA / "phontab") + " (English subset)"
    voices_dir.mkdir(parents=True, exist_ok=True)
    for v in mbrola_voices:
        src = MBROLA_DIR / v / v
        if not src.exists():
            raise FileNotFoundError(f"mbrola voice {v} not installed (apt-get install mbrola-{v}, non-free)")
        shutil.copy(src, voices_dir / v)
        sources[f"espeak-ng-data/mbrola/{v}"] = _package_of(src)
    # the voices' and programs' licences ask for their notices to travel with every copy
    (stage / "licenses").mkdir()
    for pkg in sorted({s.split(" ")[0] for s in sources.values() if not s.startswith("built")}):
        doc = Path("/usr/share/doc") / pkg / "copyright"
        if doc.exists():
            shutil.copy(doc, stage / "licenses" / f"{pkg}.copyright")
    tar = out / "engines.tar.xz"
    with tarfile.open(tar, "w:xz", preset=9) as t:
        t.add(stage, arcname="engines")
    return sources


def copy_real(out: Path) -> None:
    real = out / "real"
    if real.exists():
        shutil.rmtree(real)
    for sub in ("librivox", "cards"):
        (real / sub).mkdir(parents=True)
        for f in (POCKETSPHINX / sub).iterdir():
            if f.suffix == ".wav" or "transcription" in f.name:
                shutil.copy(f, real / sub / f.name)
    (real / "tidigits").mkdir()
    shutil.copy(POCKETSPHINX / "goforward.raw", real / "goforward.raw")
    shutil.copy(POCKETSPHINX / "tidigits" / "dhd.2934z.raw", real / "tidigits" / "dhd.2934z.raw")


def download_wheels(out: Path) -> None:
    wheels = out / "wheels"
    wheels.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform",
           "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", str(wheels)] + WHEELS
    subprocess.run(cmd, check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".train_carry")
    ap.add_argument("--mbrola", nargs="*", default=["us1", "us2", "us3", "en1", "ro1", "pl1"])
    ap.add_argument("--ranks", type=int, default=3096)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from . import text_corpus, tokenizer_train

    text_corpus.main(["--out", str(out / "corpus.tsv.gz")])
    tokenizer_train.main(["--corpus", str(out / "corpus.tsv.gz"), "--out", str(out / "tok"), "--ranks",
                          str(args.ranks)])
    work = Path("/tmp/streamscribe-carry-work")
    work.mkdir(exist_ok=True)
    sources = build_engines(out, args.mbrola, work)
    copy_real(out)
    download_wheels(out)
    sizes = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    packages = sorted({s.split(" ")[0] for s in sources.values() if not s.startswith("built")})
    manifest = {"files": sizes, "total_bytes": sum(sizes.values()), "engine_sources": sources,
                "licences": {p: LICENCES.get(p, "see /usr/share/doc/" + p + "/copyright") for p in packages}}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))
    logger.info("carry folder %s: %.1f MiB", out, manifest["total_bytes"] / 2 ** 20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
