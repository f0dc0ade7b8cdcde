"""Festival's diphone voices (Debian `festival` + `festvox-rablpc16k`, `festvox-kdlpc16k`): 16 kHz
audio plus the time span of every input word, read from the utterance's own Word relation.

Two recorded speakers no other engine here has: rab (British English, male, CSTR) and ked (American
English, male). Festival's voices are not carried to the training machine (it has no Festival): their
speech travels pre-synthesised as Opus (presynth.py), like the accented mbrola voices.

Each utterance runs one `festival -b` on a small Scheme script (about 0.2 s of start-up; Festival's
pipe mode buffers its standard output, so a long-lived process could not be read turn by turn). The
script synthesises the text, saves the wave and prints one line per Festival word with its
`word_start` and `word_end` (the word's segments; pauses are segments of no word). Festival splits
some input words ("Mary's" -> "Mary" + "'s") and gives a split-off clitic no segments (times 0, 0):
such a word takes the end of the word before it, and `map_engine_words` maps Festival's words back to
the input words by their letters.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .targets import TimedWord
from .wordtimes import OUT_RATE, map_engine_words, to_16k, trim_word_ends

# voice name -> Festival's own Duration_Stretch for it (set by its voice file; our speed multiplies it)
VOICES = {"rab_diphone": 1.05, "ked_diphone": 1.1}


class FestivalError(RuntimeError):
    """Festival or a voice is missing, or an utterance cannot be used."""


@dataclass(frozen=True)
class FestivalVoice:
    name: str  # a key of VOICES
    stretch: float = 1.0  # > 1 speaks slower
    f0_mean: float = 105.0  # Hz, the intonation model's target mean
    f0_std: float = 14.0


def festival_available() -> bool:
    """Festival on PATH with both voices installed (this machine, not the training machine)."""
    exe = shutil.which("festival")
    if exe is None:
        return False
    root = Path("/usr/share/festival/voices/english")
    return all((root / v / "festvox" / f"{v}.scm").is_file() for v in VOICES)


def _scheme_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _script(voice: FestivalVoice, text: str, wav: Path) -> str:
    if voice.name not in VOICES:
        raise FestivalError(f"unknown Festival voice {voice.name!r} (known: {sorted(VOICES)})")
    return "\n".join([
        f"(voice_{voice.name})",
        f"(Parameter.set 'Duration_Stretch {VOICES[voice.name] * voice.stretch:.4f})",
        # the voice file set these; only the target mean and spread change (the model's stay)
        (f"(set! int_lr_params '((target_f0_mean {voice.f0_mean:.1f}) (target_f0_std {voice.f0_std:.1f})"
         " (model_f0_mean 170) (model_f0_std 34)))"),
        f"(set! utt (SynthText {_scheme_string(text)}))",
        f"(utt.save.wave utt {_scheme_string(str(wav))} 'riff)",
        ("(mapcar (lambda (w) (format t \"W\\t%s\\t%f\\t%f\\n\" (item.name w) (item.feat w \"word_start\")"
         " (item.feat w \"word_end\"))) (utt.relation.items utt 'Word))"),
        "",
    ])


def parse_words(stdout: str) -> list[tuple[str, float, float]]:
    """Festival's printed words -> (word, start, end); a word without segments (0, 0) gets the end of
    the word before it, so a split-off clitic ends where its host word does."""
    out: list[tuple[str, float, float]] = []
    for line in stdout.splitlines():
        if not line.startswith("W\t"):
            continue
        _, name, s, e = line.split("\t")
        start, end = float(s), float(e)
        if end <= start:
            prev = out[-1][2] if out else 0.0
            start = end = prev
        out.append((name, start, end))
    return out


class FestivalSynth:
    def __init__(self) -> None:
        if not festival_available():
            raise FestivalError("festival with the rab_diphone and ked_diphone voices is not installed here")

    def synthesize(self, voice: FestivalVoice, words: list[str]) -> tuple[np.ndarray, list[TimedWord]]:
        """16 kHz float32 audio and the time span of every input word."""
        import soundfile as sf

        text = " ".join(words)
        with tempfile.TemporaryDirectory() as tmp:
            wav = Path(tmp) / "utt.wav"
            script = Path(tmp) / "utt.scm"
            script.write_text(_script(voice, text, wav))
            try:
                proc = subprocess.run(["festival", "-b", str(script)], capture_output=True, text=True, timeout=60,
                                      check=False)
            except subprocess.TimeoutExpired as exc:
                raise FestivalError(f"festival timed out on {text!r}") from exc
            if proc.returncode != 0 or not wav.exists():
                raise FestivalError(f"festival failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
            audio, rate = sf.read(wav, dtype="float32")
        if audio.ndim > 1:
            audio = audio.mean(axis=1)
        audio = to_16k(audio, rate)
        engine = parse_words(proc.stdout)
        timed = map_engine_words(words, engine)
        if timed is None:
            raise FestivalError(f"festival's words {[w for w, _, _ in engine]} do not spell the input {words}")
        return audio, trim_word_ends(audio, OUT_RATE, [t.text for t in timed], [(t.start, t.end) for t in timed])
