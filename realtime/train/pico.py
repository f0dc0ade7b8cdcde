"""SVOX Pico's two English voices (Debian non-free `libttspico-utils`, `pico2wave`): 16 kHz audio plus the
time span of every input word.

Two recorded speakers of a kind no other engine here has: en-US (lh0, female) and en-GB (kh0, female),
rendered by Pico's own statistical (HMM) synthesis from SVOX's recordings. Every earlier voice here is a
diphone (mbrola, Festival, flite's kal), a formant, or a flite/Festival/RHVoice unit or HTS voice, and
adding more speakers of those engines stopped moving the held-out voices (model card, tenth to twelfth
sessions). Pico's other languages are left out: they read English text with their own language's
letter-to-sound rules, so the words said would not be the transcript.

`pico2wave` reports no word times, so they come from `align.align_word_times` (the references RHVoice
uses), which keeps them ordered and inside the audio. The check in place of engine events: an utterance
whose audio is far shorter than its words need (words skipped) is refused.

Speed and pitch: Pico's `<speed level>` and `<pitch level>` markup, in percent of the voice's own.
Like Festival's and RHVoice's voices, these reach a training call pre-synthesised (presynth.py).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np

from .targets import TimedWord
from .wordtimes import OUT_RATE, trim_word_ends

PROGRAM = "pico2wave"
LANG_DIR = Path("/usr/share/pico/lang")
VOICES = {"en-US": "en-US_lh0_sg.bin", "en-GB": "en-GB_kh0_sg.bin"}  # language -> its speaker's file
MIN_SECONDS_PER_WORD = 0.08  # far below any speech rate here (0.34 s per word measured)


class PicoError(RuntimeError):
    """The program, a voice or an utterance cannot be used."""


@dataclass(frozen=True)
class PicoVoice:
    name: str  # a key of VOICES
    speed: int = 100  # percent of the voice's own rate
    pitch: int = 100  # percent of the voice's own pitch


def pico_available() -> bool:
    """`pico2wave` and both English voices are installed (this machine, not the training machine)."""
    return shutil.which(PROGRAM) is not None and all((LANG_DIR / f).is_file() for f in VOICES.values())


class PicoSynth:
    def __init__(self) -> None:
        if not pico_available():
            raise PicoError(f"{PROGRAM} with the voices {sorted(VOICES)} is not installed here "
                            "(apt-get install libttspico-utils, non-free)")

    def _speak(self, voice: PicoVoice, text: str) -> np.ndarray:
        if voice.name not in VOICES:
            raise PicoError(f"unknown Pico voice {voice.name!r} (known: {sorted(VOICES)})")
        markup = f'<speed level="{voice.speed}"><pitch level="{voice.pitch}">{escape(text)}</pitch></speed>'
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "out.wav"  # pico2wave writes only to a .wav path
            run = subprocess.run([PROGRAM, "-l", voice.name, "-w", str(path), markup], check=False, capture_output=True,
                                 text=True, timeout=60)
            if run.returncode != 0 or not path.exists():
                raise PicoError(f"{PROGRAM} failed on {text!r}: {run.stderr.strip()[:200]}")
            with wave.open(str(path)) as w:
                if w.getframerate() != OUT_RATE or w.getsampwidth() != 2 or w.getnchannels() != 1:
                    raise PicoError(f"{PROGRAM} wrote {w.getframerate()} Hz, {w.getsampwidth()} bytes, "
                                    f"{w.getnchannels()} channels; expected {OUT_RATE} Hz 16-bit mono")
                audio = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        if audio.size == 0:
            raise PicoError(f"{PROGRAM} produced no audio for {text!r}")
        return audio.astype(np.float32) / 32768.0

    def synthesize(self, voice: PicoVoice, words: list[str]) -> tuple[np.ndarray, list[TimedWord]]:
        """16 kHz float32 audio and the time span of every input word (aligned; see the module docstring)."""
        from .align import align_word_times, reference_renderings

        audio = self._speak(voice, " ".join(words))
        duration = audio.size / OUT_RATE
        if duration < MIN_SECONDS_PER_WORD * len(words):
            raise PicoError(f"{duration:.2f} s of audio for {len(words)} words: words were skipped")
        timed = align_word_times(audio, words, reference_renderings(words))
        return audio, trim_word_ends(audio, OUT_RATE, words, [(w.start, w.end) for w in timed])
