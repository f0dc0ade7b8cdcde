"""The small model's tokenizer: control tokens at the real model's ids, Tekken-style word pieces."""

from __future__ import annotations

import json
from pathlib import Path

from realtime.tokenizer import HFTokenizer, IncrementalDetokenizer, load_tokenizer
from realtime.tokenizer_build import CONTROL_TOKENS, NUM_CONTROL_TOKENS, write_tokenizer_json
from realtime.train.tokenizer_train import train_ranks

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "set a timer for twenty five minutes",
    "she sells sea shells by the sea shore",
    "the meeting starts at nine thirty in the morning",
    "a critic is a man who creates nothing",
] * 40


def _tokenizer(tmp_path: Path, n_ranks: int = 400) -> HFTokenizer:
    ranks = train_ranks(TEXTS, n_ranks)
    assert ranks[:256] == [bytes([b]) for b in range(256)]
    assert 256 < len(ranks) <= n_ranks
    write_tokenizer_json(tmp_path / "tokenizer.json", ranks)
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, HFTokenizer)
    return tok


def test_control_ids_and_vocab(tmp_path: Path) -> None:
    tok = _tokenizer(tmp_path)
    inner = tok._tok
    assert inner.token_to_id("[STREAMING_PAD]") == 32
    assert inner.token_to_id("[STREAMING_WORD]") == 33
    assert inner.token_to_id("<s>") == 1 and inner.token_to_id("</s>") == 2 and inner.token_to_id("<pad>") == 11
    for i, name in CONTROL_TOKENS.items():
        assert inner.id_to_token(i) == name
    assert all(tok.token_bytes(i) == b"" for i in range(NUM_CONTROL_TOKENS))
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    assert min(spec["model"]["vocab"][t] for t in spec["model"]["vocab"] if t not in
               {a["content"] for a in spec["added_tokens"]}) == NUM_CONTROL_TOKENS


def test_words_carry_their_leading_space(tmp_path: Path) -> None:
    tok = _tokenizer(tmp_path)
    for word in ("the", "quick", "twenty", "sea"):
        ids = tok.encode(" " + word)
        assert len(ids) == 1, (word, ids)  # frequent corpus words are single tokens
        assert tok.token_bytes(ids[0]) == b" " + word.encode()
        assert ids[0] >= NUM_CONTROL_TOKENS
    ids = tok.encode(" zebra")  # unseen word: still encodes, from smaller pieces
    assert tok.decode(ids) == " zebra"


def test_stream_of_ids_decodes_to_text_without_control_tokens(tmp_path: Path) -> None:
    tok = _tokenizer(tmp_path)
    stream = [1] + [32] * 5 + [33] + tok.encode(" the") + [32, 32, 33] + tok.encode(" lazy") + tok.encode(" dog")
    detok = IncrementalDetokenizer(tok)
    text = "".join(detok.push(t) for t in stream) + detok.flush()
    assert text == " the lazy dog"
