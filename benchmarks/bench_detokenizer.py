"""Time and memory of incremental detokenisation over a long stream: the current `IncrementalDetokenizer` against
the two ways it kept its transcript before (one string appended to at every text token; every delta kept as its own
part), on the same token stream.

    python benchmarks/bench_detokenizer.py --model models/default --words 30000 --out DIR/detok.json

The stream is `--words` corpus-like words (README text, repeated), each word's tokens preceded by 0-3 pad tokens,
as a stream emits them (one token an 80 ms frame: 30,000 words is about three hours of speech). Reported per
variant: microseconds a push (the best of `--repeats` runs) and the bytes the detokeniser holds at the end
(tracemalloc), plus a check that all three give the same text.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
import tracemalloc
from pathlib import Path

from realtime.tokenizer import IncrementalDetokenizer, load_tokenizer

log = logging.getLogger("bench_detokenizer")


class AppendedString(IncrementalDetokenizer):
    """Before the fiftieth session: the transcript one string, appended to at every text token."""

    def _append(self, delta: str) -> None:
        self._parts[:] = [self._parts[0] + delta] if self._parts else [delta]


class EveryPart(IncrementalDetokenizer):
    """Earlier in the fiftieth session: every delta kept as its own part until the text is read."""

    def _append(self, delta: str) -> None:
        self._parts.append(delta)


def token_stream(tok, words: int, seed: int = 0) -> list[int]:
    text = Path(__file__).resolve().parent.parent.joinpath("README.md").read_text().split()
    rng = random.Random(seed)
    ids: list[int] = []
    for i in range(words):
        for t in tok.encode(" " + text[i % len(text)]):
            ids.extend([33] * rng.randint(0, 3))
            ids.append(t)
    return ids


def run(cls, tok, ids: list[int], repeats: int) -> dict:
    best = float("inf")
    for _ in range(repeats):
        d = cls(tok)
        t0 = time.perf_counter()
        for i in ids:
            d.push(i)
        best = min(best, time.perf_counter() - t0)
    tracemalloc.start()
    d = cls(tok)
    for i in ids:
        d.push(i)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"us_per_push": 1e6 * best / len(ids), "bytes_held": held, "text": d.text}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--words", type=int, default=30000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tok = load_tokenizer(args.model)
    ids = token_stream(tok, args.words)
    report = {"words": args.words, "pushes": len(ids), "variants": {}}
    texts = set()
    for name, cls in (("appended_string", AppendedString), ("every_part", EveryPart),
                      ("current", IncrementalDetokenizer)):
        r = run(cls, tok, ids, args.repeats)
        texts.add(r.pop("text"))
        report["variants"][name] = r
        log.info("%-16s %.3f us a push, %.2f MB held", name, r["us_per_push"], r["bytes_held"] / 1e6)
    if len(texts) != 1:
        raise SystemExit("the variants gave different texts")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
