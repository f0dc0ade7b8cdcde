"""The voice catalogue and its split by speaker: held-out speakers never appear in training.

A *speaker* is one recorded person (flite's slt, rms, awb, kal; mbrola's us1, us2, us3, en1 and the
accented voices of `ACCENTED_MBROLA`) or, for espeak-ng's formant synthesiser, one accent + variant
pair. The held-out set is disjoint at the level that matters for generalisation: the held-out
recorded speakers are used by no training voice, and the held-out formant voices use accents *and*
variants that no training voice uses.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .espeak import EspeakVoice
from .festival import FestivalVoice
from .flite import FliteVoice
from .kokoro import KokoroVoice, speaker_language
from .kokoro_js import ENGLISH as KOKORO_JS_ENGLISH
from .kokoro_js import OTHER_LANGUAGES as KOKORO_JS_OTHER
from .mbrola_en import EXTRA_MBROLA_EN, EXTRA_NAMES
from .pico import PicoVoice
from .piper import PiperVoice
from .rhvoice import RHVoiceVoice

# espeak-ng formant accents and variants (speech_data.md §1; names as espeak_SetVoiceByName takes them)
# en-gb-x-gbcwmd is left out: it loses the final SSML mark (no end time for the last word)
TRAIN_ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan")
TRAIN_VARIANTS = ("", "f1", "f2", "f3", "f5", "m1", "m2", "m3", "m4", "m5", "m7", "klatt", "klatt2", "klatt4")
HELDOUT_ACCENTS = ("en-029", "en-us-nyc")
HELDOUT_VARIANTS = ("m6", "f4")
# espeak-ng variants that neither the training voices nor the held-out voices use (the novelty,
# whisper and robot variants are left out). With the training accents they make voices the default
# model never heard that are still not the held-out evaluation voices: distillation data on which
# the target behaves as on new speakers (`unseen_formant_voices`).
UNSEEN_VARIANTS = ("Alex", "Alicia", "Andrea", "Andy", "Annie", "Denis", "Diogo", "Gene", "Gene2", "Henrique",
                   "Hugo", "Jacky", "Lee", "Marco", "Mario", "Michael", "Mike", "Storm", "adam", "anika",
                   "announcer", "antonio", "aunty", "belinda", "benjamin", "boris", "caleb", "david", "ed",
                   "edward", "edward2", "grandma", "grandpa", "gustave", "iven", "iven2", "iven3", "iven4",
                   "john", "kaukovalta", "klatt3", "klatt5", "klatt6", "linda", "m8", "marcelo", "max",
                   "michel", "miguel", "norbert", "pablo", "paul", "pedro", "quincy", "rob", "robert",
                   "sandro", "shelby", "steph", "steph2", "steph3", "travis", "victor", "zac")
# mbrola voices that speak English through espeak-ng's mb-<v>-en entries, with the fixed wrapper's
# audio matching the espeak-ng command line (pitch, length) on four test sentences; (voice, female).
# gr2 is left out: half its sentences lose their end mark.
ACCENTED_MBROLA = (("ro1", False), ("pl1", True), ("fr1", False), ("sw2", True), ("fr4", True), ("af1", False),
                   ("hu1", True), ("sw1", False), ("de2", False), ("de1", True), ("de3", True), ("nl2", False),
                   ("de5", True), ("de4", False), ("de6", False))

# Kokoro's speakers (kokoro.SPEAKERS): four train, one is kept for evaluation only (benchmarks/score_folder.py)
KOKORO_TRAIN = ("jf_alpha", "jf_gongitsune", "jf_tebukuro", "jm_kumo")
KOKORO_EVAL = "jf_nezumi"
# A training speaker's "extended" voices (base "jf_alpha+x"): its sound pushed away from another training speaker,
# with any training speaker's speaking style (KokoroVoice.away, .prosody); speakers no mixture reaches. Their split
# key is the speaker whose sound they start from
KOKORO_EXTENDED = "+x"
# how far the sound is pushed; at 0.5 the shipped model read 8 test sentences at 84.6% WER (the speaker's own: 61.5%)
KOKORO_AWAY = (0.15, 0.45)
# The npm package's speakers (kokoro_js.py, thirty-ninth session). Four native English ones, one of each accent and
# sex, are evaluation speakers only (in no run's mixtures, like jf_nezumi); the other 24 English ones train, and
# the 21 speakers of other languages train reading English (accented voices), at half the weight each
KOKORO_EN_EVAL = ("af_sarah", "am_michael", "bf_emma", "bm_george")
KOKORO_EN_TRAIN = tuple(s for s in KOKORO_JS_ENGLISH if s not in KOKORO_EN_EVAL)
KOKORO_OTHER_TRAIN = KOKORO_JS_OTHER
KOKORO_NPM_TRAIN = KOKORO_EN_TRAIN + KOKORO_OTHER_TRAIN  # every npm speaker a run trains on


def voice_group(key: str) -> str:
    """"flite", "mbrola", "espeak-formant", "festival", "rhvoice", "pico", "piper" or "kokoro" for a voice key
    ("espeak:mb-us1")."""
    engine, _, base = key.partition(":")
    if engine == "espeak":
        return "mbrola" if base.startswith("mb-") else "espeak-formant"
    return engine


@dataclass(frozen=True)
class VoiceSpec:
    """A voice of the catalogue; `render` draws the per-utterance speed and pitch."""

    engine: str  # "espeak" | "flite" | "festival" | "rhvoice" | "pico" | "piper" | "kokoro"
    base: str  # espeak voice name (with +variant), flite, Festival, RHVoice, Pico, Piper voice or Kokoro speaker
    speaker: str  # split key
    female: bool
    weight: float  # relative share of training utterances
    rewrite: tuple[str, ...] = ()  # espeak formant voices only: accent rule sets (accents.py)

    @property
    def key(self) -> str:
        return f"{self.engine}:{self.base}" + (f"#{'+'.join(self.rewrite)}" if self.rewrite else "")

    @property
    def is_mbrola(self) -> bool:
        """An mbrola diphone voice, spoken through espeak-ng (needs its voice file and `mbrola`)."""
        return voice_group(self.key) == "mbrola"

    def render(self, rng: np.random.Generator
               ) -> EspeakVoice | FliteVoice | FestivalVoice | RHVoiceVoice | PicoVoice | PiperVoice | KokoroVoice:
        speed = math.exp(rng.uniform(math.log(0.8), math.log(1.25)))
        if self.engine == "kokoro":  # Kokoro's own speed, the speaker's own accent
            own = self.base.removesuffix(KOKORO_EXTENDED)
            group = next(g for g in (KOKORO_TRAIN, KOKORO_EN_TRAIN, KOKORO_OTHER_TRAIN) if own in g)
            others = [s for s in group if s != own]
            if self.base != own:  # extended: the sound pushed away from another speaker, any speaker's style
                away = (others[int(rng.integers(len(others)))], float(rng.uniform(*KOKORO_AWAY)))
                style = group[int(rng.integers(len(group)))]
                return KokoroVoice(((own, 1.0),), speed=speed, prosody=((style, 1.0),), away=away)
            language = speaker_language(own)
            if rng.random() < 0.5:  # half the time a blend towards another training speaker of its group
                return KokoroVoice(((own, 1.0),), speed=speed, language=language)
            weight = float(rng.uniform(0.5, 0.9))
            other = others[int(rng.integers(len(others)))]
            return KokoroVoice(((own, weight), (other, 1.0 - weight)), speed=speed, language=language)
        if self.engine == "piper":  # Piper's duration scale; generator and duration noise around the voice's own
            return PiperVoice(self.base, length_scale=1.0 / speed, noise_scale=float(rng.uniform(0.5, 0.8)),
                              noise_w=float(rng.uniform(0.6, 1.0)))
        if self.engine == "pico":  # Pico's markup in percent of the voice's own rate and pitch
            return PicoVoice(self.base, speed=round(100 * speed), pitch=rng.integers(85, 121).item())
        if self.engine == "rhvoice":  # RHVoice's own -1..1 scales; +-0.3 is about the same speed range
            return RHVoiceVoice(self.base, rate=float(rng.uniform(-0.3, 0.3)), pitch=float(rng.uniform(-0.3, 0.3)))
        if self.engine == "festival":
            return FestivalVoice(self.base, stretch=1.0 / speed, f0_mean=float(rng.uniform(85, 140)),
                                 f0_std=float(rng.uniform(9, 22)))
        if self.engine == "flite":
            f0 = 0.0
            if self.base == "kal16":
                f0 = float(rng.uniform(95, 170))
            elif self.base == "slt":
                f0 = float(rng.uniform(150, 230))
            return FliteVoice(self.base, stretch=1.0 / speed, f0_mean=f0)
        return EspeakVoice(self.base, rate_wpm=round(175 * speed), pitch=rng.integers(25, 76).item(),
                           pitch_range=rng.integers(30, 71).item(), rewrite=self.rewrite)


def _formant(accent: str, variant: str, weight: float) -> VoiceSpec:
    base = accent + (f"+{variant}" if variant else "")
    return VoiceSpec("espeak", base, f"espeak-formant:{base}", variant.startswith("f"), weight)


def catalogue(unseen_formant_weight: float = 0.0, accent_rewrite_weight: float = 0.0
              ) -> tuple[list[VoiceSpec], list[VoiceSpec]]:
    """(training voices, held-out voices). Weights: recorded-speaker voices carry most of the data;
    the formant voices (poor acoustic match to real speech, speech_data.md §8) about a quarter.

    `unseen_formant_weight` > 0 also trains on `unseen_formant_voices()`, sharing that total weight
    (the 70 usual formant voices share 2.3): more formant speakers for a run, at the price of those
    voices no longer being new to the model it trains (drafter distillation audio).
    `accent_rewrite_weight` > 0 also trains on `accent_rewrite_voices()` (pronunciation variety: accents.py),
    sharing that total weight. Both are off by default, so the default catalogue and its seeded draws stay put."""
    train = [
        VoiceSpec("flite", "slt", "slt", True, 1.5),
        VoiceSpec("flite", "rms", "rms", False, 1.5),
        VoiceSpec("flite", "kal16", "kal", False, 1.2),
        VoiceSpec("espeak", "mb-us1", "us1", True, 1.5),
        VoiceSpec("espeak", "mb-us2", "us2", False, 1.2),
    ]
    # English through foreign diphone speakers: one more recorded person each. A training call uses
    # those whose voice file its carry brings (3-17 MB each compressed; prepare_carry --mbrola)
    train += [VoiceSpec("espeak", f"mb-{v}-en", v, female, 1.0) for v, female in ACCENTED_MBROLA]
    # and through the entries written here for nine more databases (mbrola_en.py): only where the
    # espeak-ng data folder in use has them (a training call gets them pre-synthesised)
    train += [VoiceSpec("espeak", v.name, v.voice, v.female, 1.0) for v in EXTRA_MBROLA_EN]
    # Festival's two diphone speakers: only where Festival is installed, so they reach a training call
    # pre-synthesised (presynth.py)
    train += [VoiceSpec("festival", "rab_diphone", "rab", False, 1.5),
              VoiceSpec("festival", "ked_diphone", "ked", False, 1.5)]
    # RHVoice's four new speakers (+ slt once more, through another engine); never `alan` (see rhvoice.py).
    # Like Festival's, only where RHVoice is installed: a training call gets them pre-synthesised
    train += [VoiceSpec("rhvoice", "bdl", "bdl", False, 1.5), VoiceSpec("rhvoice", "clb", "clb", True, 1.5),
              VoiceSpec("rhvoice", "evgeniy-eng", "evgeniy", False, 1.2),
              VoiceSpec("rhvoice", "lyubov", "lyubov", True, 1.2), VoiceSpec("rhvoice", "slt", "slt", True, 0.5)]
    # SVOX Pico's two English speakers, statistical synthesis unlike any engine above (pico.py); also only
    # where installed, pre-synthesised for a training call
    train += [VoiceSpec("pico", "en-US", "pico-lh0", True, 1.5), VoiceSpec("pico", "en-GB", "pico-kh0", True, 1.5)]
    # Piper's joe, the first neural (natural-sounding) speaker (piper.py); only where piper-tts and the voice's
    # wheel are installed, pre-synthesised for a training call like Pico's
    train += [VoiceSpec("piper", "en_US-joe-medium", "joe", False, 1.5)]
    # Kokoro's speakers (kokoro.py), natural-sounding and new to the shipped model; pre-synthesised like Piper's.
    # KOKORO_EVAL (jf_nezumi) is in neither half: an evaluation voice that no style mixture of a run contains
    train += [VoiceSpec("kokoro", s, f"kokoro-{s}", s.startswith("jf_"), 1.0) for s in KOKORO_TRAIN]
    train += [VoiceSpec("kokoro", s + KOKORO_EXTENDED, f"kokoro-{s}", s.startswith("jf_"), 1.0) for s in KOKORO_TRAIN]
    # and the npm package's speakers (kokoro_js.py): only where their style vectors were fetched
    train += [VoiceSpec("kokoro", s, f"kokoro-{s}", s[1] == "f", 1.0) for s in KOKORO_EN_TRAIN]
    train += [VoiceSpec("kokoro", s, f"kokoro-{s}", s[1] == "f", 0.5) for s in KOKORO_OTHER_TRAIN]
    n_formant = len(TRAIN_ACCENTS) * len(TRAIN_VARIANTS)
    train += [_formant(a, v, 2.3 / n_formant) for a in TRAIN_ACCENTS for v in TRAIN_VARIANTS]
    if unseen_formant_weight > 0:
        extra = unseen_formant_voices()
        train += [replace(v, weight=unseen_formant_weight / len(extra)) for v in extra]
    if accent_rewrite_weight > 0:
        accented = accent_rewrite_voices()
        train += [replace(v, weight=accent_rewrite_weight / len(accented)) for v in accented]
    heldout = [
        VoiceSpec("flite", "awb", "awb", False, 1.0),
        VoiceSpec("espeak", "mb-us3", "us3", False, 1.0),
        VoiceSpec("espeak", "mb-en1", "en1", False, 1.0),
        _formant("en-029", "m6", 1.0),
        _formant("en-us-nyc", "f4", 1.0),
    ]
    return train, heldout


def unseen_formant_voices() -> list[VoiceSpec]:
    """Formant voices outside both halves of the catalogue: training accents with `UNSEEN_VARIANTS`.
    New to the trained model (no training voice uses the variant) and disjoint from the held-out
    voices (whose accents and variants these do not use); equal weights."""
    return [_formant(a, v, 1.0) for a in TRAIN_ACCENTS for v in UNSEEN_VARIANTS]


def accent_rewrite_voices() -> list[VoiceSpec]:
    """Training formant voices speaking through the accent rule sets of `accents.REWRITE_SETS`: each training
    accent with each rule set, on two training variants per (accent, set) pair taken in turn, so the 14 variants all
    appear; each such voice is its own speaker. Neither held-out accent is used (their accents stay unheard), and
    no rule set is read off them (accents.py); equal weights."""
    from .accents import REWRITE_SETS

    out = []
    k = 0
    for accent in TRAIN_ACCENTS:
        for rules in REWRITE_SETS:
            for _ in range(2):
                variant = TRAIN_VARIANTS[k % len(TRAIN_VARIANTS)]
                k += 1
                v = _formant(accent, variant, 1.0)
                out.append(replace(v, speaker=f"espeak-accent:{v.base}#{'+'.join(rules)}", rewrite=rules))
    return out


def mbrola_voice_available(name: str, espeak_data: str | None) -> bool:
    """mbrola voices need the voice file (in espeak-ng-data/mbrola/ or /usr/share/mbrola/) and the
    `mbrola` program on PATH, and the entries of mbrola_en.py also a data folder that has them; a
    voice missing any is left out of the catalogue."""
    from shutil import which

    short = name.removeprefix("mb-").split("-")[0]  # "mb-ro1-en" uses the voice file ro1
    if which("mbrola") is None:
        return False
    data = [p for p in (espeak_data, os.environ.get("STREAMSCRIBE_ESPEAK_DATA")) if p]
    if name in EXTRA_NAMES and not any((Path(p) / sub / "voices" / "mb" / name).is_file()
                                       for p in data for sub in (".", "espeak-ng-data")):
        return False  # an entry of mbrola_en.py: only in a data folder made by english_mbrola_data
    # an espeak-ng data folder of its own (the training machine's carried engines) finds voices only
    # there; the system library looks in Debian's /usr/share/mbrola
    roots = [Path(p) / sub for p in data for sub in ("mbrola", "espeak-ng-data/mbrola")] or [Path("/usr/share/mbrola")]
    return any((r / short).is_file() or (r / short / short).is_file() for r in roots)


def mbrola_probe_voice(voices: list[VoiceSpec], espeak_data: str | None) -> str | None:
    """The mbrola voice to test the mbrola engine with: the first one whose voice file is here. (A
    fixed choice would leave every mbrola voice out of a call whose carry lacks that one voice.)"""
    return next((v.base for v in voices if v.is_mbrola and mbrola_voice_available(v.base, espeak_data)), None)


def available(voices: list[VoiceSpec], *, espeak: bool, flite: bool, mbrola: bool = True,
              espeak_data: str | None = None, festival: bool = False, rhvoice: bool = False,
              pico: bool = False, piper: bool = False, kokoro: bool = False,
              kokoro_js: bool = False) -> list[VoiceSpec]:
    """The voices whose engine works (`espeak`, `flite`, `mbrola`, `festival`, `rhvoice`, `pico`, `piper`, `kokoro`:
    whether each does) and, for mbrola voices, whose voice file is there (a carry may bring only some of
    them). Festival, RHVoice, Pico and Piper are off unless asked: the training machine never has them (their
    voices come pre-synthesised)."""
    out = []
    for v in voices:
        if (v.engine == "festival" and not festival) or (v.engine == "rhvoice" and not rhvoice):
            continue
        if (v.engine == "pico" and not pico) or (v.engine == "piper" and not piper):
            continue
        if v.engine == "kokoro" and not kokoro:
            continue
        if v.engine == "kokoro" and v.base in KOKORO_NPM_TRAIN and not kokoro_js:
            continue  # their style vectors come from the npm package (kokoro_js.voices_present)
        if v.engine == "flite" and not flite:
            continue
        if v.engine == "espeak" and not espeak:
            continue
        if v.is_mbrola and not (mbrola and mbrola_voice_available(v.base, espeak_data)):
            continue
        out.append(v)
    return out
