"""Accents made by rewriting espeak-ng's phonemes before synthesis (issue 6's pronunciation lever).

The default model fails on the held-out formant voices for their accent, not their timbre: espeak-ng's Caribbean
accent costs it about 38 points of WER whatever the variant, a held-out variant with a training accent about one
(`benchmarks/accent_variant_probe.py`, docs/benchmarks.md issue 6). So training needs pronunciation variety. Here
each word's phonemes, as a training accent says them (`EspeakSynth.phonemes`: espeak-ng's ASCII mnemonics), are
rewritten by rule sets modelled on well-known features of other Englishes, and spoken back with `[[...]]` phoneme
input (`EspeakVoice.rewrite`); the SSML marks still give each word's times, and the text is unchanged.

The rules are not read off the held-out accents (en-029, en-us-nyc): th-stopping, en-029's signature, is left out
on purpose, so that the held-out evaluation keeps its meaning. Each rule set is a list of regular-expression
replacements applied in order to one word's phonemes (stress marks ' and , included).
"""

from __future__ import annotations

import re

# vowels and vowel-like mnemonics of espeak-ng's English phoneme set, for the rules' contexts
_VOWEL = r"[aeiouAEIOUV@3{]"

REWRITE_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    # no change: a control, what speaking each word from its phonemes costs by itself (no training voice uses it)
    "none": (),
    # British-style non-rhoticity: r-coloured schwa to schwa, r-coloured vowels to long ones, no r before a
    # consonant or at the end of the word
    "non-rhotic": ((r"3(?!:)", "@"), (r"A@", "A:"), (r"o@", "O:"),
                   (rf"(?<={_VOWEL}|:)r(?!{_VOWEL})", "")),
    # London-style th-fronting: "think" as "fink", "brother" as "bruvver"
    "th-fronting": ((r"T", "f"), (r"D", "v")),
    # final obstruent devoicing (German, Dutch, Russian and other first languages)
    "final-devoicing": ((r"dZ$", "tS"), (r"b$", "p"), (r"d$", "t"), (r"g$", "k"), (r"v$", "f"), (r"z$", "s"),
                        (r"Z$", "S")),
    # monophthongal FACE and GOAT (Scottish, Northern English, many second-language Englishes)
    "monophthongs": ((r"eI", "e:"), (r"oU", "o:")),
    # h-dropping at the start of a word (many English accents)
    "h-dropping": ((r"^(['%,]?)h", r"\1"),),
    # tense KIT and FOOT (a common second-language merger: "ship" near "sheep", "full" near "fool")
    "tense-vowels": ((r"(?<![aeoO])I(?!2)", "i:"), (r"(?<![aoO])U(?!@)", "u:")),
    # w/v merged towards v (German-, Hindi- and Russian-accented English)
    "w-to-v": ((r"w", "v"),),
    # a rounded STRUT (Northern English "foot-strut" merger) and a raised TRAP (as in New Zealand or South African
    # English); the a of the diphthongs aI, aU and of a# stays
    "vowel-shift": ((r"V", "U"), (r"a(?![IU#:])", "E")),
}

# The combinations the accented training voices use (accent_rewrite_voices in voices.py)
REWRITE_SETS: tuple[tuple[str, ...], ...] = (
    ("non-rhotic",), ("th-fronting", "non-rhotic"), ("final-devoicing",), ("monophthongs", "non-rhotic"),
    ("h-dropping", "th-fronting"), ("tense-vowels",), ("w-to-v", "final-devoicing"), ("vowel-shift", "monophthongs"),
)

_COMPILED = {name: tuple((re.compile(p), r) for p, r in rules) for name, rules in REWRITE_RULES.items()}


def check_rewrite(names: tuple[str, ...]) -> tuple[str, ...]:
    """`names` if every one is a known rule set (ValueError naming the unknown ones otherwise)."""
    unknown = [n for n in names if n not in REWRITE_RULES]
    if unknown:
        raise ValueError(f"unknown accent rewrite(s) {unknown}; known: {sorted(REWRITE_RULES)}")
    return names


def rewrite_phonemes(phonemes: str, names: tuple[str, ...]) -> str:
    """One word's espeak-ng phoneme mnemonics rewritten by the rule sets `names`, in order."""
    out = phonemes
    for name in check_rewrite(names):
        for pattern, repl in _COMPILED[name]:
            out = pattern.sub(repl, out)
    return out
