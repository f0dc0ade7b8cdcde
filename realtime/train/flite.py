"""flite voices (slt, rms, awb, kal16) through the small C helper `flitew.c`, with word times.

The helper is one long-running child process per worker; requests and replies go over pipes
(see flitew.c for the format). `build_helper` compiles it against Debian's flite1-dev; on a
machine without flite the compiled helper and flite's shared libraries can be carried in a folder
(`STREAMSCRIBE_FLITEW` = the helper, `LD_LIBRARY_PATH` = the folder with the libraries).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .targets import TimedWord
from .wordtimes import map_engine_words

logger = logging.getLogger(__name__)

FLITE_VOICES = ("slt", "rms", "awb", "kal16")
_SOURCE = Path(__file__).with_name("flitew.c")
_LIBS = ["flite_cmu_us_slt", "flite_cmu_us_rms", "flite_cmu_us_awb", "flite_cmu_us_kal16", "flite_usenglish",
         "flite_cmulex", "flite", "m"]


class FliteError(RuntimeError):
    """The helper is missing, cannot start, or rejected an utterance."""


@dataclass(frozen=True)
class FliteVoice:
    name: str  # one of FLITE_VOICES
    stretch: float = 1.0  # duration_stretch: > 1 is slower
    f0_mean: float = 0.0  # Hz; 0 keeps the voice's own (works on kal16 and slt, not rms)


def build_helper(out: Path) -> Path:
    """Compile flitew.c into `out` (needs gcc and flite1-dev)."""
    if shutil.which("gcc") is None or not Path("/usr/include/flite/flite.h").exists():
        raise FliteError("building the flite helper needs gcc and flite1-dev")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["gcc", "-O2", str(_SOURCE), "-o", str(out), "-I/usr/include/flite"] + [f"-l{lib}" for lib in _LIBS]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def find_helper() -> Path:
    env = os.environ.get("STREAMSCRIBE_FLITEW")
    if env:
        return Path(env)
    cached = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "streamscribe" / "flitew"
    if cached.exists() and cached.stat().st_mtime >= _SOURCE.stat().st_mtime:
        return cached
    return build_helper(cached)


class FliteSynth:
    def __init__(self, helper: Path | None = None) -> None:
        self.helper = helper or find_helper()
        try:
            self._proc = subprocess.Popen([str(self.helper)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL)
        except OSError as exc:
            raise FliteError(f"cannot start {self.helper}: {exc}") from exc

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=10)

    def synthesize(self, voice: FliteVoice, words: list[str]) -> tuple[np.ndarray, list[TimedWord]]:
        """16 kHz float32 audio and the time span of every input word."""
        text = " ".join(words)
        if "\t" in text or "\n" in text:
            raise FliteError("text must not hold tabs or newlines")
        req = f"{voice.name}\t{voice.stretch:.4f}\t{voice.f0_mean:.1f}\t{text}\n".encode()
        try:
            self._proc.stdin.write(req)
            self._proc.stdin.flush()
            header = self._proc.stdout.readline().decode("utf-8", "replace").rstrip("\n")
        except (BrokenPipeError, OSError) as exc:
            raise FliteError(f"flite helper died: {exc}") from exc
        if not header.startswith("U "):
            raise FliteError(f"flite: {header or 'no reply (helper died)'}")
        fields = header.split("\t")
        n = int(fields[0][2:])
        raw = self._proc.stdout.read(2 * n)
        if len(raw) != 2 * n:
            raise FliteError("flite helper reply truncated")
        audio = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
        engine = []
        for f in fields[1:]:
            name, s, e = f.rsplit(" ", 2)
            engine.append((name, float(s), float(e)))
        timed = map_engine_words(words, engine)
        if timed is None:
            raise FliteError(f"flite's words {[w for w, _, _ in engine]} do not spell the input {words}")
        return audio, timed
