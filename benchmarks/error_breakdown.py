"""What kind of errors a model makes on the held-out voices: substitutions, deletions, insertions, by voice.

    python benchmarks/error_breakdown.py --model models/default --seed 8 --workers 2 --out DIR/errors.json

The items are `rescore_heldout.py`'s (the shards it synthesised into /tmp/streamscribe-eval-seed<N>; run it once
first), decoded at 480 ms. For each voice: the three error kinds as a share of the reference words (they add up to
the WER), where deleted words sat in their sentence (its first two words, its last two, or between), and the most
frequent substitutions over all voices. The output keeps every reference and hypothesis, so later analyses need no
decoding. It tells whether a model mishears (substitutions) or drops and loops (deletions, insertions): only the
second can move with decoding alone.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from pathlib import Path

logger = logging.getLogger(__name__)

EDGE_WORDS = 2  # a deletion among a sentence's first or last EDGE_WORDS words counts as at its start or end


def breakdown(rows: list[tuple[str, str, str]], top: int = 25) -> dict:
    """rows: (voice, normalised reference, normalised hypothesis). Per voice and over all ("*"): words, the
    substitution / deletion / insertion shares of them in %, and where the deletions sat; the `top` substitutions."""
    import jiwer

    counts: dict[str, Counter] = {}
    subs: Counter = Counter()
    for voice, ref, hyp in rows:
        out = jiwer.process_words(ref, hyp)  # an empty hypothesis: every word deleted
        ref_w, hyp_w = out.references[0], out.hypotheses[0]
        for key in (voice, "*"):
            c = counts.setdefault(key, Counter())
            c["words"] += len(ref_w)
            c["substitutions"] += out.substitutions
            c["deletions"] += out.deletions
            c["insertions"] += out.insertions
            for a in out.alignments[0]:
                if a.type != "delete":
                    continue
                for k in range(a.ref_start_idx, a.ref_end_idx):
                    place = "start" if k < EDGE_WORDS else "end" if k >= len(ref_w) - EDGE_WORDS else "middle"
                    c[f"deleted_at_{place}"] += 1
        for a in out.alignments[0]:
            if a.type == "substitute":
                for k in range(a.ref_end_idx - a.ref_start_idx):
                    subs[f"{ref_w[a.ref_start_idx + k]} -> {hyp_w[a.hyp_start_idx + k]}"] += 1
    voices = {}
    for key, c in sorted(counts.items()):
        n = max(1, c["words"])
        voices[key] = {"words": c["words"],
                       **{f"{kind}_pct": round(100 * c[kind] / n, 2) for kind in ("substitutions", "deletions",
                                                                                 "insertions")},
                       "deletions_at": {p: c[f"deleted_at_{p}"] for p in ("start", "middle", "end")}}
    return {"voices": voices, "top_substitutions": subs.most_common(top)}


def main(argv: list[str] | None = None) -> int:
    from realtime.train.evaluate import build_items, decode_items, normalize_text

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--shards", default=None, help="default: /tmp/streamscribe-eval-seed<N> (rescore_heldout.py's)")
    ap.add_argument("--group", default="heldout", choices=["heldout", "seen"])
    ap.add_argument("--per-voice", type=int, default=40)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    shards = Path(args.shards or f"/tmp/streamscribe-eval-seed{args.seed}")
    if not any(shards.glob(f"{args.group}-*.npz")):
        ap.error(f"no {args.group} shards in {shards}: run benchmarks/rescore_heldout.py --seed {args.seed} first")
    items = [it for it in build_items(shards, delays=[480], per_voice=args.per_voice, sweep_per_voice=0,
                                      real_dir=None) if it.group == args.group]
    hyps = decode_items(Path(args.model), items, workers=args.workers)
    rows = [(it.voice, it.ref, normalize_text(hyps[i]) or "") for i, it in enumerate(items)]
    result = {"model": args.model, "seed": args.seed, "group": args.group, "delay_ms": 480, **breakdown(rows),
              "items": [{"voice": v, "ref": r, "hyp": h} for v, r, h in rows]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for voice, v in result["voices"].items():
        logger.info("%-24s %4d words: substitutions %5.1f%%, deletions %4.1f%%, insertions %4.1f%%; deletions at %s",
                    voice, v["words"], v["substitutions_pct"], v["deletions_pct"], v["insertions_pct"],
                    v["deletions_at"])
    logger.info("top substitutions: %s", result["top_substitutions"][:10])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
