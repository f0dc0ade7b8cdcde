"""Tokenizer backends and incremental detokenisation."""

from __future__ import annotations

import random

import pytest

from realtime.tokenizer import HFTokenizer, IncrementalDetokenizer, TekkenTokenizer, TokenizerError, load_tokenizer

TEXTS = [
    " First words I spoke in the original phonograph.",
    " Mary had a little lamb, it's fleece was white as snow!",
    " naïve café — déjà vu 東京 🎉",
    "  two  spaces\tand tabs\nnewline",
]


@pytest.fixture(scope="module")
def backends(tiny_ckpt):
    d = tiny_ckpt(seed=0, tokenizer_json=True)
    return TekkenTokenizer(d / "tekken.json"), HFTokenizer(d / "tokenizer.json", 1000)


def test_both_backends_agree(backends):
    tekken, hf = backends
    assert tekken.vocab_size == hf.vocab_size == 1500
    for text in TEXTS:
        ids = tekken.encode(text)
        assert ids == hf.encode(text)
        assert all(i >= 1000 for i in ids)
        assert tekken.decode(ids) == hf.decode(ids) == text
        for i in ids:
            assert tekken.token_bytes(i) == hf.token_bytes(i)


def test_control_tokens_give_no_text(backends):
    for tok in backends:
        for cid in (0, 1, 2, 11, 32, 33, 999):
            assert tok.token_bytes(cid) == b""
        with pytest.raises(TokenizerError, match="outside the vocabulary"):
            tok.token_bytes(tok.vocab_size)


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_deltas_concatenate_and_never_split_characters(backends, text):
    tok = backends[0]
    ids = tok.encode(text)
    rng = random.Random(0)
    # interleave control tokens the model emits between words
    stream = []
    for i in ids:
        stream.extend([32] * rng.randint(0, 2) + [i] + [33] * rng.randint(0, 1))
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in stream]
    deltas.append(detok.flush())
    assert "".join(deltas) == text == detok.text
    for d in deltas:
        assert "\ufffd" not in d  # no half characters


def test_multibyte_character_held_back_until_complete(backends):
    tok = backends[0]
    ids = tok.encode(" 東")
    # the tiny vocabulary spells this character with several byte tokens
    assert len(ids) >= 2
    detok = IncrementalDetokenizer(tok)
    outs = [detok.push(i) for i in ids]
    assert all("\ufffd" not in o for o in outs)
    assert "" in outs  # at least one token carried only part of the character and was held back
    assert outs[-1].endswith("東") and "".join(outs) == " 東"
    # a stream cut inside a character shows the replacement character only at flush()
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.push(i) for i in ids[:-1]) in ("", " ")
    assert detok.flush().endswith("\ufffd")


def test_a_token_reused_with_and_without_bytes_pending(backends):
    """push() keeps the work of a token pushed with nothing pending and reuses it; a token that completes a pending
    character must still join those bytes. The same byte tokens, alone and inside characters, in every order."""
    tok = backends[0]
    _, lead, *rest = tok.encode(" 東")  # the tiny vocabulary spells 東 with a token a byte
    assert [len(tok.token_bytes(i)) for i in (lead, *rest)] == [1, 1, 1]
    # `rest` alone (nothing pending) gives replacement characters; after `lead` it must give 東
    pieces = [[lead], rest, [lead, *rest], tok.encode(" 東京"), [lead, *rest], tok.encode(" café"), rest]
    detok = IncrementalDetokenizer(tok)
    seen = []
    for ids in pieces * 2:
        bytes_in = b"".join(tok.token_bytes(i) for i in ids)
        seen.append("".join(detok.push(i) for i in ids))
        assert detok.text == "".join(seen)  # read mid-stream, then pushed to again
        assert bytes_in  # every piece carries bytes: the cache is exercised on real text
    detok.flush()
    want = b"".join(tok.token_bytes(i) for ids in pieces * 2 for i in ids).decode("utf-8", errors="replace")
    assert detok.text == want
    # a second detokeniser sharing the first one's cache (as an engine's streams do) gives the same text
    other = IncrementalDetokenizer(tok, detok.text_cache)
    for ids in pieces * 2:
        for i in ids:
            other.push(i)
    other.flush()
    assert other.text == want and other.text_cache is detok.text_cache and len(detok.text_cache) > 3


def test_a_long_stream_keeps_few_parts(backends):
    """Deltas are joined every PARTS_JOINED of them: a long stream holds one string and a few parts, not one object a
    word, and its text is every delta in order."""
    from realtime.tokenizer import PARTS_JOINED

    tok = backends[0]
    ids = tok.encode(" " + " ".join(f"word{i}" for i in range(2000)))
    detok = IncrementalDetokenizer(tok)
    deltas = []
    for i in ids:
        deltas.append(detok.push(i))
        assert len(detok._parts) <= PARTS_JOINED
    assert detok.text == "".join(deltas) == tok.decode(ids)


def test_leading_space_kept(backends):
    tok = backends[0]
    detok = IncrementalDetokenizer(tok)
    first = "".join(detok.push(i) for i in tok.encode(" Hello"))
    assert first == " Hello"


def test_load_tokenizer_prefers_tekken_and_errors(tiny_ckpt, tmp_path):
    d = tiny_ckpt(seed=0, tokenizer_json=True)
    assert isinstance(load_tokenizer(d), TekkenTokenizer)
    with pytest.raises(TokenizerError, match="neither tekken.json nor tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tekken.json").write_text('{"config": {"version": "v99"}}')
    with pytest.raises(TokenizerError, match="tekken"):
        load_tokenizer(tmp_path)
