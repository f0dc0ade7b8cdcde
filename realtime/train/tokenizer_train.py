"""Train the small model's byte-level BPE on the corpus text and write `tokenizer.json`.

    python -m realtime.train.tokenizer_train --corpus corpus.tsv.gz --out DIR [--ranks 3096]

The vocabulary is the Tekken layout: ids 0..999 are the control tokens of
`realtime.tokenizer_build` (BOS 1, EOS 2, [STREAMING_PAD] 32, [STREAMING_WORD] 33, ...), then the
256 single bytes in byte order, then merges in training order. Text is pre-split with the Tekken
pattern, so words carry their leading space (" hello"), as the real model writes them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..tokenizer import _bytes_to_unicode
from ..tokenizer_build import NUM_CONTROL_TOKENS, TEKKEN_PATTERN, _bpe_parts, write_tokenizer_json
from .text_corpus import read_corpus

logger = logging.getLogger(__name__)


def train_ranks(texts: list[str], n_ranks: int) -> list[bytes]:
    """A BPE rank list (256 bytes + merges) of at most `n_ranks` entries trained on `texts`.

    The `tokenizers` trainer gives merges in the order it learnt them; a merge is kept only if
    re-splitting its token with the kept lower ranks (tiktoken's rule, which `tokenizer.json`
    and `tekken.json` both follow) gives exactly its two parts, so the list is a valid BPE.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TEKKEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=n_ranks, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # words are spoken with a leading space: train on " word word ..." as the model will write them
    tok.train_from_iterator((" " + t for t in texts), trainer=trainer)
    uni_to_byte = {c: b for b, c in _bytes_to_unicode().items()}
    spec_merges = tok.get_vocab()  # token -> id; merges appear in id order after the alphabet
    merged = sorted(((i, t) for t, i in spec_merges.items() if len(t) > 1), key=lambda x: x[0])
    ranks = [bytes([b]) for b in range(256)]
    rank_of = {b: i for i, b in enumerate(ranks)}
    for _, t in merged:
        if len(ranks) >= n_ranks:
            break
        b = bytes(uni_to_byte[c] for c in t)
        if b in rank_of:
            continue
        if len(_bpe_parts(b, rank_of, len(ranks))) == 2:
            rank_of[b] = len(ranks)
            ranks.append(b)
    return ranks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True, help="folder for tokenizer.json")
    ap.add_argument("--ranks", type=int, default=3096, help="text ranks (vocab = 1000 control ids + this)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    texts = [s.text for s in read_corpus(Path(args.corpus)) if s.split == "train"]
    ranks = train_ranks(texts, args.ranks)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer_json(out / "tokenizer.json", ranks)
    logger.info("tokenizer.json: %d control + %d text ranks = vocab %d", NUM_CONTROL_TOKENS, len(ranks),
                NUM_CONTROL_TOKENS + len(ranks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
