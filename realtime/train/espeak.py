"""espeak-ng through its C library (ctypes): 16 kHz audio plus per-word start/end times.

Works with Debian's `libespeak-ng.so.1` (formant voices and, with the `mbrola` program on PATH,
mbrola voices) and with any other build of the library (e.g. the `espeakng-loader` wheel's, which
has no mbrola). Word times come from SSML `<mark/>`s placed before every word: each mark event
carries `audio_position` (ms) = the start of that word; a word ends where the next one starts,
minus the trailing silence (speech_data.md §1). The library is process-global: each instance initialises it,
and an instance takes its callback and voice back when another one used them last (`_OWNER`).

The SSML goes *without* a `<speak>` root (measured on espeak-ng 1.51 with mbrola voices): closing
`</speak>` pops the voice set with `espeak_SetVoiceByName` back to the default formant voice, so
every utterance after the first silently came out as formant "en" audio while still labelled as
the mbrola voice. The marks are still parsed without the root. A voice's sample rate is reported
once, on its first utterance, so it is kept for the ones after.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from html import escape
from pathlib import Path

import numpy as np

from .targets import TimedWord
from .wordtimes import OUT_RATE, to_16k, trim_word_ends

logger = logging.getLogger(__name__)

_SYNCHRONOUS = 2
_INIT_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
_SSML = 0x10
_PHONEMES = 0x100  # espeakPHONEMES: [[...]] in the text is phoneme input
_PHONEME_MNEMONICS = 0  # espeak_TextToPhonemes: espeak-ng's ASCII phoneme names (what [[...]] takes)
_EV_WORD = 1
_EV_MARK = 3
_EV_SAMPLERATE = 8
_EV_LIST_TERMINATED = 0
_PARAM_RATE, _PARAM_PITCH, _PARAM_RANGE = 1, 3, 4


class EspeakError(RuntimeError):
    """The library, its data or a voice cannot be used."""


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", _EventId)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


@dataclass(frozen=True)
class EspeakVoice:
    name: str  # espeak voice name, e.g. "en-us+f3" or "mb-us1"
    rate_wpm: int = 175
    pitch: int = 50  # 0..99
    pitch_range: int = 50  # 0..99
    # accent rule sets (accents.py): each word is spoken from its phonemes in this voice's accent, rewritten
    rewrite: tuple[str, ...] = ()


def default_library() -> tuple[str, str | None]:
    """(library path, data path or None for the library's default) from the environment."""
    lib = os.environ.get("STREAMSCRIBE_ESPEAK_LIB")
    data = os.environ.get("STREAMSCRIBE_ESPEAK_DATA")
    if lib:
        return lib, data
    for cand in ("/usr/lib/x86_64-linux-gnu/libespeak-ng.so.1", "/usr/lib/aarch64-linux-gnu/libespeak-ng.so.1"):
        if Path(cand).exists():
            return cand, data
    try:
        import espeakng_loader  # the pip wheel: a self-contained library and data (no mbrola)

        return espeakng_loader.get_library_path(), espeakng_loader.get_data_path()
    except ImportError as exc:
        raise EspeakError("no libespeak-ng found: install espeak-ng, the espeakng-loader wheel, or set "
                          "STREAMSCRIBE_ESPEAK_LIB") from exc


def _timed_words(audio: np.ndarray, words: list[str], starts_ms: list[int], end_ms: int) -> list[TimedWord]:
    """Each word from its start to the next one's (the last to the end mark, within the audio), trailing silence
    trimmed."""
    t = [x / 1000.0 for x in starts_ms] + [min(end_ms / 1000.0, audio.size / OUT_RATE)]
    spans = [(t[i], max(t[i], t[i + 1])) for i in range(len(words))]
    return trim_word_ends(audio, OUT_RATE, words, spans)


# The C library holds one callback and one current voice per process. Which EspeakSynth set them last, per
# library path: an instance that is not the owner takes them back before it synthesises (a worker or a test
# process may hold several instances, e.g. one made for RHVoice's alignment references).
_OWNER: dict[str, int] = {}


class EspeakSynth:
    """Any number per process: the C library's global callback and voice are re-taken when another
    instance used them last (`_OWNER`)."""

    def __init__(self, library: str | None = None, data_path: str | None = None) -> None:
        if library is None:  # the environment's library; its data folder unless one is given
            library, env_data = default_library()
            data_path = data_path or env_data
        self.library = library
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise EspeakError(f"cannot load {library}: {exc}") from exc
        lib = self._lib
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        rate = lib.espeak_Initialize(_SYNCHRONOUS, 0, data_path.encode() if data_path else None, _INIT_DONT_EXIT)
        if rate <= 0:
            raise EspeakError(f"espeak_Initialize failed ({rate}) with data path {data_path!r}")
        self._default_rate = rate
        self._chunks: list[np.ndarray] = []
        self._marks: list[tuple[str, int]] = []
        self._words: list[int] = []  # word events' audio positions (ms), for phoneme input (no marks inside [[...]])
        self._rate: int | None = None
        self._cb = _CALLBACK(self._on_audio)  # keep a reference: the library calls it later
        lib.espeak_SetSynthCallback(self._cb)
        _OWNER[library] = id(self)
        self._voice: str | None = None

    def _on_audio(self, wav: ctypes.POINTER(ctypes.c_short), n: int, events: ctypes.POINTER(_Event)) -> int:
        if n > 0 and wav:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        i = 0
        while events[i].type != _EV_LIST_TERMINATED:
            ev = events[i]
            if ev.type == _EV_MARK and ev.id.name:
                self._marks.append((ev.id.name.decode(), ev.audio_position))
            elif ev.type == _EV_WORD and ev.length > 0:  # a phrase's end also gives a word event, of no length
                self._words.append(ev.audio_position)
            elif ev.type == _EV_SAMPLERATE:
                self._rate = ev.id.number
            i += 1
        return 0

    def phonemes(self, voice: EspeakVoice, word: str) -> str:
        """`word` as `voice`'s accent says it: espeak-ng's phoneme mnemonics, stress marks included."""
        self._take(voice)
        buf = ctypes.create_string_buffer(word.encode("utf-8") + b"\0")
        ptr = ctypes.c_void_p(ctypes.addressof(buf))
        out = self._lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, _PHONEME_MNEMONICS)
        return (out or b"").decode("utf-8", "replace").strip()

    def _take(self, voice: EspeakVoice) -> None:
        """The library's callback and `voice` are this instance's."""
        if _OWNER.get(self.library) != id(self):  # another instance holds the library's callback and voice
            self._lib.espeak_SetSynthCallback(self._cb)
            _OWNER[self.library] = id(self)
            self._voice = None
        if voice.name != self._voice:
            if self._lib.espeak_SetVoiceByName(voice.name.encode()) != 0:
                raise EspeakError(f"espeak-ng has no usable voice {voice.name!r} (mbrola voices need the mbrola "
                                  f"program and voice files)")
            self._voice = voice.name
            self._rate = None  # the new voice reports its own on its first utterance

    def synthesize(self, voice: EspeakVoice, words: list[str]) -> tuple[np.ndarray, list[TimedWord]]:
        """16 kHz float32 audio and the time span of every input word (with `voice.rewrite`: spoken from each
        word's rewritten phonemes, accents.py)."""
        if voice.rewrite:
            return self._synthesize_rewritten(voice, words)
        return self._synthesize(voice, words)

    def _synthesize_rewritten(self, voice: EspeakVoice, words: list[str]) -> tuple[np.ndarray, list[TimedWord]]:
        """The sentence spoken as one phrase of phoneme input, each word's phonemes rewritten (accents.py). Marks
        cannot go inside a `[[...]]`, so each word's start comes from espeak-ng's word events, one per
        space-separated word. The phonemes are the sentence's own where they split into one group per word (about
        three sentences in four), each word's citation form where words run together ("for the" f3D@2). With
        citation forms for every word ("will" w'Il where the sentence says wI2l) the no-rule control cost the
        shipped model 7 points of WER; with the sentence's own, 1.4 (forty-third session)."""
        from .accents import rewrite_phonemes

        if voice.name.startswith("mb-"):
            raise EspeakError(f"accent rewrites are for formant voices, not the mbrola voice {voice.name}")
        # the sentence's own phonemes (its reduced forms: "will" wI2l) where they split into one group per word;
        # where words run together ("for the" f3D@2) each word's citation form instead
        groups = self.phonemes(voice, " ".join(words)).split()
        if len(groups) != len(words):
            groups = [self.phonemes(voice, w) for w in words]
        spoken = []
        for w, own in zip(words, groups):
            ph = rewrite_phonemes(own, voice.rewrite)
            if not ph or " " in ph or "]" in ph:  # one word each, and nothing that would close the [[...]]
                raise EspeakError(f"voice {voice.name}: no phonemes to rewrite for {w!r} ({ph!r})")
            spoken.append(ph)
        # the phrase, then an end mark; stress marks (') must reach espeak-ng as they are, not as an entity
        audio = self._speak(voice, f'{escape("[[" + " ".join(spoken) + "]]", quote=False)} <mark name="end"/>',
                            _PHONEMES)
        starts, ends = self._words, dict(self._marks)
        if len(starts) != len(words) or "end" not in ends or ends["end"] - starts[-1] < 30:
            raise EspeakError(f"voice {voice.name}: {len(starts)} word events for {len(words)} words, end "
                              f"{ends.get('end')} ms, {audio.size / OUT_RATE:.2f} s of audio")
        return audio, _timed_words(audio, words, starts, ends["end"])

    def _synthesize(self, voice: EspeakVoice, words: list[str]) -> tuple[np.ndarray, list[TimedWord]]:
        loaded = voice.name != self._voice or _OWNER.get(self.library) != id(self)
        self._take(voice)
        if loaded and voice.name.startswith("mb-"):
            # the first utterance after loading an mbrola voice has been seen cut short (its tail
            # and the end mark lost, espeak-ng 1.51): spend it on a throw-away phrase
            self._run(voice, ["hello", "there"])
        audio = self._run(voice, words)
        starts = dict(self._marks)
        missing = [i for i in range(len(words)) if f"w{i}" not in starts]
        total_s = audio.size / OUT_RATE
        if missing or "end" not in starts or starts["end"] - starts[f"w{len(words) - 1}"] < 30:
            raise EspeakError(f"voice {voice.name}: bad marks ({len(missing)} missing, end {starts.get('end')} ms, "
                              f"{total_s:.2f} s of audio)")
        return audio, _timed_words(audio, words, [starts[f"w{i}"] for i in range(len(words))], starts["end"])

    def _run(self, voice: EspeakVoice, words: list[str]) -> np.ndarray:
        # a mark before every word, and one at the end: a mark right at the end is otherwise lost
        # no <speak> root: its end would reset the voice to the default (module docstring)
        ssml = " ".join(f'<mark name="w{i}"/>{escape(w)}' for i, w in enumerate(words)) + ' <mark name="end"/>'
        return self._speak(voice, ssml, 0)

    def _speak(self, voice: EspeakVoice, ssml: str, flags: int) -> np.ndarray:
        """`ssml` (no root element) spoken at `voice`'s rate and pitch; the marks and word events it gives are in
        `_marks` and `_words` after."""
        self._lib.espeak_SetParameter(_PARAM_RATE, int(voice.rate_wpm), 0)
        self._lib.espeak_SetParameter(_PARAM_PITCH, int(voice.pitch), 0)
        self._lib.espeak_SetParameter(_PARAM_RANGE, int(voice.pitch_range), 0)
        data = ssml.encode("utf-8") + b"\0"
        self._chunks, self._marks, self._words = [], [], []
        buf = ctypes.create_string_buffer(data)
        err = self._lib.espeak_Synth(buf, len(data), 0, 0, 0, _CHARS_UTF8 | _SSML | flags, None, None)
        if err != 0:
            raise EspeakError(f"espeak_Synth failed ({err}) for voice {voice.name}")
        self._lib.espeak_Synchronize()
        rate = self._rate or self._default_rate
        pcm = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        audio = pcm.astype(np.float32) / 32768.0
        return to_16k(audio, rate)
