"""More recorded speakers: English voice entries for mbrola speakers that espeak-ng speaks only natively.

espeak-ng ships English (`mb-<v>-en`) entries for 17 mbrola databases (the catalogue's accented
speakers). Debian packages many more: an entry is four lines (`language en`, gender, pitch range and
the database with its phoneme table), so the same English front end can speak through them. Which
ones are usable was measured (tenth session, 8 test sentences each, the shipped model at 480 ms, and
mbrola's "unknown diphone" warnings on 40 training sentences, i.e. phonemes replaced by silence):

| voice | WER | unknown diphones | | voice | WER | unknown diphones |
|---|---|---|---|---|---|---|
| fr2 | 17.7 | 0 | | de7 | 16.1 | 0 |
| fr3 | 17.7 | 0 | | es1 | 50.0 | 0 |
| fr5 | 30.6 | 3 | | es2 | 43.5 | 1 |
| fr6 | 30.6 | 0 | | cr1 | 38.7 | 20 |
| fr7 | 46.8 | 0 | | | | |

For comparison, the held-out us3 read 27.4 and the training voice fr1-en 14.5 on the same sentences.
Left out: de8, nl1, it1/3/4, es3/4, mx2, cz2, nz1 (read at 85-97%), br3, ca2, tr1/2 (66-81%), and
nl3, ca1, gr1, pt1, br1/4, mx1 (27-273 silent diphones).

The entries live in a private copy of espeak-ng's data folder (`english_mbrola_data`). Adding files
to the system folder would not do: espeak-ng lists at most 349 voices and Debian's folder already
holds about 350, so new entries fall off the list. The copy drops the native-language mbrola entries,
which nothing here uses.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# Debian's data folder, beside the library that espeak.default_library finds
SYSTEM_ESPEAK_DATA = next((p for p in (Path("/usr/lib/x86_64-linux-gnu/espeak-ng-data"),
                                       Path("/usr/lib/aarch64-linux-gnu/espeak-ng-data")) if p.is_dir()),
                          Path("/usr/lib/x86_64-linux-gnu/espeak-ng-data"))
SYSTEM_MBROLA = Path("/usr/share/mbrola")
MAX_VOICES = 349  # espeak-ng's N_VOICES_LIST - 1: voice files past it are silently not listed


@dataclass(frozen=True)
class MbrolaEnglish:
    """An English entry for one mbrola database, from the native entry's gender, pitch and table."""

    voice: str  # the mbrola database, e.g. "fr2"
    female: bool
    pitch: tuple[int, int]  # espeak-ng's pitch range (Hz) for the voice
    table: str  # espeak-ng's phoneme translation table for the database's phone set
    rate: int | None = None  # the database's sample rate when not 16 kHz
    voicing: int | None = None

    @property
    def name(self) -> str:
        return f"mb-{self.voice}-en"

    def entry(self) -> str:
        lines = ["language en 10", f"name en-{self.voice}", f"gender {'female' if self.female else 'male'}",
                 f"pitch {self.pitch[0]} {self.pitch[1]}"]
        if self.voicing is not None:
            lines.append(f"voicing {self.voicing}")
        lines.append(f"mbrola {self.voice} {self.table}" + (f" {self.rate}" if self.rate else ""))
        return "\n".join(lines) + "\n"


_MALE, _FEMALE = (82, 117), (140, 220)
EXTRA_MBROLA_EN = (
    MbrolaEnglish("fr2", True, _FEMALE, "fr_phtrans"),
    MbrolaEnglish("fr3", False, _MALE, "fr_phtrans"),
    MbrolaEnglish("fr5", False, _MALE, "fr_phtrans"),
    MbrolaEnglish("fr6", False, _MALE, "fr_phtrans"),
    MbrolaEnglish("fr7", False, _MALE, "fr_phtrans"),
    MbrolaEnglish("de7", True, _FEMALE, "de6_phtrans", rate=22050, voicing=150),
    MbrolaEnglish("es1", False, _MALE, "es_phtrans", voicing=120),
    MbrolaEnglish("es2", False, _MALE, "es_phtrans", rate=22050),
    MbrolaEnglish("cr1", False, _MALE, "cr1_phtrans", voicing=150),
)
EXTRA_NAMES = frozenset(v.name for v in EXTRA_MBROLA_EN)


def _count_voices(data: Path) -> int:
    return sum(1 for sub in ("voices", "lang") if (data / sub).is_dir()
               for p in (data / sub).rglob("*") if p.is_file())


def english_mbrola_data(dst: Path, src: Path = SYSTEM_ESPEAK_DATA, mbrola: Path = SYSTEM_MBROLA) -> Path:
    """A copy of the espeak-ng data folder `src` at `dst` with the extra English mbrola entries, the
    native-language mbrola entries dropped, and `mbrola/` pointing at the databases. Returns `dst`."""
    if not (src / "phontab").is_file():
        raise FileNotFoundError(f"no espeak-ng data folder at {src}")
    if dst.exists():
        shutil.rmtree(dst)

    def native_mbrola(folder: str, names: list[str]) -> list[str]:
        if Path(folder).name != "mb" or Path(folder).parent.name != "voices":
            return []
        return [n for n in names if not (n.endswith("-en") or n in ("mb-us1", "mb-us2", "mb-us3", "mb-en1"))]

    shutil.copytree(src, dst, ignore=native_mbrola, symlinks=True)
    for v in EXTRA_MBROLA_EN:
        (dst / "voices" / "mb" / v.name).write_text(v.entry())
    if not (dst / "mbrola").exists() and mbrola.is_dir():
        # espeak-ng looks for a database in <data>/mbrola/ first; `voices.mbrola_voice_available` only there
        os.symlink(mbrola, dst / "mbrola")
    n = _count_voices(dst)
    if n > MAX_VOICES:
        raise RuntimeError(f"{dst} lists {n} voice files, more than espeak-ng's {MAX_VOICES}: some would be lost")
    return dst
