"""Writing tokenizer files whose control tokens sit at the real model's ids (DESIGN §1.1).

- `write_tekken_json`: a tekken.json (mistral-common) from a byte-level BPE rank list, with an
  `audio` section so mistral-common reads it as a streaming transcription tokenizer.
- `write_tokenizer_json`: the same vocabulary as a `tokenizers` ByteLevel BPE `tokenizer.json`.
- `shipped_tekken_ranks(n)`: the first `n` ranks of the v3 Tekken vocabulary that mistral-common
  ships; a prefix of a BPE rank list is itself a valid BPE vocabulary.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from .tokenizer import _bytes_to_unicode

NUM_CONTROL_TOKENS = 1000
# Control tokens at the ids the real model uses; the rest of the 1000 are fillers.
CONTROL_TOKENS: dict[int, str] = {
    0: "<unk>",
    1: "<s>",
    2: "</s>",
    3: "[INST]",
    4: "[/INST]",
    10: "[IMG]",
    11: "<pad>",
    12: "[IMG_BREAK]",
    13: "[IMG_END]",
    24: "[AUDIO]",
    25: "[BEGIN_AUDIO]",
    32: "[STREAMING_PAD]",
    33: "[STREAMING_WORD]",
}
# tiktoken split pattern of the Tekken v3 vocabulary
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)


def control_token_names() -> list[str]:
    return [CONTROL_TOKENS.get(i, f"<SPECIAL_{i}>") for i in range(NUM_CONTROL_TOKENS)]


def shipped_tekken_ranks(n: int) -> list[bytes]:
    """First `n` byte strings of mistral-common's bundled tekken_240911.json (rank order)."""
    import mistral_common

    path = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["vocab"]
    if n > len(vocab):
        raise ValueError(f"asked for {n} ranks, the shipped vocabulary has {len(vocab)}")
    return [base64.b64decode(v["token_bytes"]) for v in vocab[:n]]


def write_tekken_json(path: Path, ranks: list[bytes], audio: dict[str, Any] | None) -> None:
    if len(ranks) < 256 or any(ranks[i] != bytes([i]) for i in range(256)):
        raise ValueError("a byte-level BPE vocabulary starts with the 256 single bytes in order")
    vocab = [
        {"rank": i, "token_bytes": base64.b64encode(b).decode("ascii"), "token_str": b.decode("utf-8", "replace")}
        for i, b in enumerate(ranks)
    ]
    specials = [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(control_token_names())]
    data: dict[str, Any] = {
        "config": {
            "pattern": TEKKEN_PATTERN,
            "num_vocab_tokens": len(ranks),
            "default_vocab_size": NUM_CONTROL_TOKENS + len(ranks),
            "default_num_special_tokens": NUM_CONTROL_TOKENS,
            "version": "v13",
        },
        "vocab": vocab,
        "special_tokens": specials,
    }
    if audio is not None:
        data["audio"] = audio
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def _bpe_parts(token: bytes, rank_of: dict[bytes, int], max_rank: int) -> list[bytes]:
    """Split `token` with BPE using only ranks below `max_rank` (tiktoken's merge order)."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best, best_i = None, -1
        for i in range(len(parts) - 1):
            r = rank_of.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best):
                best, best_i = r, i
        if best is None:
            break
        parts[best_i: best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def write_tokenizer_json(path: Path, ranks: list[bytes]) -> None:
    """The rank list as a `tokenizers` ByteLevel BPE with the 1000 control tokens in front."""
    to_uni = _bytes_to_unicode()

    def uni(b: bytes) -> str:
        return "".join(to_uni[x] for x in b)

    rank_of = {b: i for i, b in enumerate(ranks)}
    merges: list[list[str]] = []
    for r, tok in enumerate(ranks):
        if len(tok) < 2:
            continue
        parts = _bpe_parts(tok, rank_of, r)
        if len(parts) != 2:
            raise ValueError(f"rank {r} ({tok!r}) is not a merge of two lower ranks")
        merges.append([uni(parts[0]), uni(parts[1])])
    vocab = {uni(b): NUM_CONTROL_TOKENS + i for i, b in enumerate(ranks)}
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for i, s in enumerate(control_token_names())
    ]
    # control tokens occupy ids 0..999 in the model vocabulary too
    for i, s in enumerate(control_token_names()):
        if s in vocab:
            raise ValueError(f"control token {s!r} collides with a vocabulary entry")
        vocab[s] = i
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": TEKKEN_PATTERN}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
