"""English text for the synthetic corpus: fortunes + WordNet examples + number/time templates.

    python -m realtime.train.text_corpus --out corpus.tsv.gz [--templates 6000]

Every sentence is normalised to what the model writes: lowercase words of letters and
apostrophes, numbers spelled out (num2words), no punctuation. Natural sentences are kept only if
every word is in `wamerican`'s word list (this drops names, typos and archaic spellings the TTS
engines would mangle). The split is by sentence and deterministic (a hash of the text): test and
dev sentences are never trained on.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import logging
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

FORTUNES_DIR = Path("/usr/share/games/fortunes")
WORDNET_DIR = Path("/usr/share/wordnet")
WORDLIST = Path("/usr/share/dict/american-english")
MIN_WORDS, MAX_WORDS = 4, 25
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Sentence:
    split: str
    source: str
    text: str

    @property
    def words(self) -> list[str]:
        return self.text.split()


def split_of(text: str, dev_frac: float = 0.02, test_frac: float = 0.02) -> str:
    h = int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big") / 2 ** 64
    return "test" if h < test_frac else "dev" if h < test_frac + dev_frac else "train"


_NUM = re.compile(r"\d+(?:\.\d+)?")


def spell_numbers(text: str) -> str:
    if not _NUM.search(text):
        return text  # (num2words is then not needed: the training machine does not have it)
    from num2words import num2words

    return _NUM.sub(lambda m: " " + num2words(float(m.group()) if "." in m.group() else int(m.group())) + " ", text)


def normalize(text: str) -> str:
    """Lowercase words of letters and inner apostrophes; numbers spelled out; '' if nothing left."""
    t = spell_numbers(text.replace("’", "'").replace("`", "'"))
    t = t.lower().replace("-", " ")
    t = re.sub(r"[^a-z' ]+", " ", t)
    words = [w.strip("'") for w in t.split()]
    return " ".join(w for w in words if w)


def load_wordlist(path: Path = WORDLIST) -> set[str]:
    return {w.strip().lower() for w in path.read_text(encoding="utf-8", errors="replace").splitlines() if w.strip()}


def _sentences_of(block: str) -> list[str]:
    block = re.sub(r"\s+", " ", block).strip()
    return [s for s in re.split(r"(?<=[.!?])\s+", block) if s]


def fortune_sentences(root: Path = FORTUNES_DIR) -> list[str]:
    out: list[str] = []
    for f in sorted(root.iterdir()):
        if f.suffix in (".dat", ".u8") or f.is_dir() or f.name.startswith("."):
            continue
        text = f.read_text(encoding="utf-8", errors="replace")
        for cookie in text.split("\n%\n"):
            # attributions ("-- Mark Twain") and indented quote headers carry names, not speech
            lines = [ln for ln in cookie.splitlines() if not re.match(r"^\s*(--|—)", ln)]
            out.extend(_sentences_of(" ".join(lines)))
    return out


def wordnet_examples(root: Path = WORDNET_DIR) -> list[str]:
    out: list[str] = []
    for pos in ("noun", "verb", "adj", "adv"):
        path = root / f"data.{pos}"
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("  ") or " | " not in line:
                continue  # licence header
            gloss = line.split(" | ", 1)[1]
            out.extend(re.findall(r'"([^"]+)"', gloss))
    return out


_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"]
_TEMPLATES = (
    "set a timer for {n} minutes", "wake me up at {time}", "the meeting starts at {time}",
    "it costs {n} dollars and {m} cents", "there are {n} people in the room", "call me back in {m} minutes",
    "the train leaves at {time} from platform {d}", "my number is {digits}", "the code is {digits}",
    "we moved here in {year}", "she was born on the {ord} of {month}", "turn to page {n}",
    "it is {n} degrees outside", "add {n} and {m} to get the total", "the flight lands at {time}",
    "order {d} pizzas for {n} people", "the score was {d} to {d2}", "go forward {n} meters",
    "the package weighs {n} pounds", "room {n} is on the {ord} floor", "remind me on {month} {ord}",
    "the year {year} was a good year", "about {n} percent of them agreed", "i need {d} more minutes",
)


def _time_words(rng: random.Random) -> str:
    from num2words import num2words

    h, m = rng.randint(1, 12), rng.choice([0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, rng.randint(1, 59)])
    mm = "o'clock" if m == 0 else ("oh " + num2words(m) if m < 10 else num2words(m))
    return f"{num2words(h)} {mm}" + rng.choice(["", " in the morning", " in the evening", " pm", " am"])


def template_sentences(n: int, seed: int = 0) -> list[str]:
    from num2words import num2words

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t = rng.choice(_TEMPLATES)
        fill = {
            "n": num2words(rng.choice([rng.randint(2, 100), rng.randint(100, 2000)])),
            "m": num2words(rng.randint(2, 99)),
            "d": num2words(rng.randint(1, 9)),
            "d2": num2words(rng.randint(0, 9)),
            "digits": " ".join(num2words(rng.randint(0, 9)) for _ in range(rng.randint(4, 7))),
            "time": _time_words(rng),
            "year": num2words(rng.randint(1950, 2030), to="year"),
            "ord": num2words(rng.randint(1, 31), to="ordinal"),
            "month": rng.choice(_MONTHS),
        }
        out.append(normalize(t.format(**fill)))
    return out


def build_corpus(templates: int = 6000, seed: int = 0) -> list[Sentence]:
    vocab = load_wordlist()
    seen: set[str] = set()
    out: list[Sentence] = []

    def add(source: str, raw: str, check_vocab: bool) -> None:
        text = normalize(raw)
        words = text.split()
        if not MIN_WORDS <= len(words) <= MAX_WORDS or text in seen:
            return
        if check_vocab and not all(w in vocab for w in words):
            return
        seen.add(text)
        out.append(Sentence(split_of(text), source, text))

    for s in fortune_sentences():
        add("fortunes", s, True)
    for s in wordnet_examples():
        add("wordnet", s, True)
    for s in template_sentences(templates, seed):
        add("numbers", s, False)  # num2words output; "o'clock" and "pm" are not all in wamerican
    return out


def write_corpus(sentences: list[Sentence], path: Path) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for s in sentences:
            f.write(f"{s.split}\t{s.source}\t{s.text}\n")


def read_corpus(path: Path) -> list[Sentence]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [Sentence(*line.rstrip("\n").split("\t")) for line in f if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--templates", type=int, default=6000)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    sents = build_corpus(args.templates)
    write_corpus(sents, Path(args.out))
    for split in SPLITS:
        part = [s for s in sents if s.split == split]
        logger.info("%s: %d sentences, %d words", split, len(part), sum(len(s.words) for s in part))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
