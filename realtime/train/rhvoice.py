"""RHVoice's English voices (Debian non-free `rhvoice-english` + `librhvoice5`) through its C library
(ctypes): 16 kHz audio plus the time span of every input word.

Four recorded speakers no other engine here has: bdl (American English, male) and clb (American English,
female), both from CMU ARCTIC recordings, and evgeniy-eng (male) and lyubov (female), Russian speakers of
English. (`slt` is the flite training speaker again; `alan`, a Scottish male, may be built on the held-out
speaker awb's recordings, so it is never used.)

RHVoice's own word events are too coarse for targets placed by 80 ms frame: they arrive only between its
~100 ms output blocks, and ran up to 140 ms ahead of the silence that ends a phrase (ninth session). So the
word times come from `align.align_word_times`: the same words rendered by voices with exact times (Festival's
ked and rab, espeak-ng's en-us), each aligned to the RHVoice audio by DTW, median over the three. RHVoice's
events stay as a check: an utterance whose aligned word ends stray more than 0.3 s from them is refused.

Like Festival's voices, these reach a training call pre-synthesised (presynth.py).
"""

from __future__ import annotations

import ctypes as C
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .targets import TimedWord
from .wordtimes import OUT_RATE, to_16k, trim_word_ends

LIBRARY = "libRHVoice.so.5"
DATA = Path("/usr/share/RHVoice")
VOICES = ("bdl", "clb", "evgeniy-eng", "lyubov", "slt")
# aligned ends may sit this far from RHVoice's own (block-quantised, early) word-end events
EVENT_TOLERANCE_S = 0.3


class RHVoiceError(RuntimeError):
    """The library, a voice or an utterance cannot be used."""


@dataclass(frozen=True)
class RHVoiceVoice:
    name: str  # one of VOICES
    rate: float = 0.0  # RHVoice's absolute rate, -1..1 (0 = the voice's default)
    pitch: float = 0.0  # absolute pitch, -1..1


def rhvoice_available() -> bool:
    """The library loads and every voice of VOICES is installed (this machine, not the training machine)."""
    try:
        C.CDLL(LIBRARY)
    except OSError:
        return False
    return all((DATA / "voices" / v).is_dir() for v in VOICES)


_SR = C.CFUNCTYPE(C.c_int, C.c_int, C.c_void_p)
_PLAY = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_short), C.c_uint, C.c_void_p)
_MARK = C.CFUNCTYPE(C.c_int, C.c_char_p, C.c_void_p)
_WORD = C.CFUNCTYPE(C.c_int, C.c_uint, C.c_uint, C.c_void_p)
_AUDIO = C.CFUNCTYPE(C.c_int, C.c_char_p, C.c_void_p)
_DONE = C.CFUNCTYPE(None, C.c_void_p)


class _Callbacks(C.Structure):
    _fields_ = [("set_sample_rate", _SR), ("play_speech", _PLAY), ("process_mark", _MARK),
                ("word_starts", _WORD), ("word_ends", _WORD), ("sentence_starts", _WORD),
                ("sentence_ends", _WORD), ("play_audio", _AUDIO), ("done", _DONE)]


class _InitParams(C.Structure):
    _fields_ = [("data_path", C.c_char_p), ("config_path", C.c_char_p), ("resource_paths", C.POINTER(C.c_char_p)),
                ("callbacks", _Callbacks), ("options", C.c_uint)]


class _SynthParams(C.Structure):
    _fields_ = [("voice_profile", C.c_char_p), ("absolute_rate", C.c_double), ("absolute_pitch", C.c_double),
                ("absolute_volume", C.c_double), ("relative_rate", C.c_double), ("relative_pitch", C.c_double),
                ("relative_volume", C.c_double), ("punctuation_mode", C.c_int), ("punctuation_list", C.c_char_p),
                ("capitals_mode", C.c_int), ("flags", C.c_int)]


_PUNCTUATION_NONE = 1


class RHVoiceSynth:
    def __init__(self) -> None:
        if not rhvoice_available():
            raise RHVoiceError(f"{LIBRARY} with the voices {VOICES} is not installed here")
        self._lib = C.CDLL(LIBRARY)
        self._lib.RHVoice_new_tts_engine.restype = C.c_void_p
        self._lib.RHVoice_new_tts_engine.argtypes = [C.POINTER(_InitParams)]
        self._lib.RHVoice_new_message.restype = C.c_void_p
        self._lib.RHVoice_new_message.argtypes = [C.c_void_p, C.c_char_p, C.c_uint, C.c_int,
                                                  C.POINTER(_SynthParams), C.c_void_p]
        self._lib.RHVoice_speak.argtypes = [C.c_void_p]
        self._lib.RHVoice_delete_message.argtypes = [C.c_void_p]
        self._rate = 0
        self._chunks: list[np.ndarray] = []
        self._samples = 0
        self._ends: list[tuple[int, int]] = []  # (character offset, samples emitted) of each word-end event
        # the callbacks must outlive the engine: kept on self
        self._cbs = (_SR(self._on_rate), _PLAY(self._on_speech), _WORD(self._on_word_end))
        cbs = _Callbacks(set_sample_rate=self._cbs[0], play_speech=self._cbs[1], word_ends=self._cbs[2])
        params = _InitParams(data_path=str(DATA).encode(), config_path=b"/etc/RHVoice", resource_paths=None,
                             callbacks=cbs, options=0)
        self._engine = self._lib.RHVoice_new_tts_engine(C.byref(params))
        if not self._engine:
            raise RHVoiceError("RHVoice_new_tts_engine failed")

    def _on_rate(self, rate: int, _user: object) -> int:
        self._rate = rate
        return 1

    def _on_speech(self, samples, count: int, _user: object) -> int:
        self._chunks.append(np.ctypeslib.as_array(samples, (count,)).copy())
        self._samples += count
        return 1

    def _on_word_end(self, position: int, _length: int, _user: object) -> int:
        self._ends.append((position, self._samples))
        return 1

    def _speak(self, voice: RHVoiceVoice, text: str) -> tuple[np.ndarray, list[tuple[int, float]]]:
        if voice.name not in VOICES:
            raise RHVoiceError(f"unknown RHVoice voice {voice.name!r} (known: {VOICES})")
        self._chunks, self._samples, self._ends = [], 0, []
        params = _SynthParams(voice_profile=voice.name.encode(), absolute_rate=voice.rate, absolute_pitch=voice.pitch,
                              absolute_volume=0.0, relative_rate=1.0, relative_pitch=1.0, relative_volume=1.0,
                              punctuation_mode=_PUNCTUATION_NONE, punctuation_list=None, capitals_mode=0, flags=0)
        data = text.encode()
        msg = self._lib.RHVoice_new_message(self._engine, data, len(data), 0, C.byref(params), None)
        if not msg:
            raise RHVoiceError(f"RHVoice refused the text {text!r}")
        try:
            if not self._lib.RHVoice_speak(msg):
                raise RHVoiceError(f"RHVoice failed on {text!r}")
        finally:
            self._lib.RHVoice_delete_message(msg)
        if not self._chunks or not self._rate:
            raise RHVoiceError(f"RHVoice produced no audio for {text!r}")
        audio = np.concatenate(self._chunks).astype(np.float32) / 32768.0
        return to_16k(audio, self._rate), [(pos, n / self._rate) for pos, n in self._ends]

    def synthesize(self, voice: RHVoiceVoice, words: list[str]) -> tuple[np.ndarray, list[TimedWord]]:
        """16 kHz float32 audio and the time span of every input word (aligned; see the module docstring)."""
        from .align import align_word_times, reference_renderings

        text = " ".join(words)
        audio, events = self._speak(voice, text)
        offsets = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
        event_end = {int(np.searchsorted(offsets, pos, side="right")) - 1: t for pos, t in events}
        timed = align_word_times(audio, words, reference_renderings(words))
        for k, w in enumerate(timed):
            if k in event_end and abs(w.end - event_end[k]) > EVENT_TOLERANCE_S:
                raise RHVoiceError(f"aligned end of {w.text!r} ({w.end:.2f} s) is far from RHVoice's own "
                                   f"({event_end[k]:.2f} s)")
        return audio, trim_word_ends(audio, OUT_RATE, words, [(w.start, w.end) for w in timed])
