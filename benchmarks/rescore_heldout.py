"""Score several model folders on one and the same evaluation set, on this machine (CPU is fine).

    python benchmarks/rescore_heldout.py --seed 8 --models run6=/tmp/run6 run7=models/default \
        --out docs/results/heldout_rescore.json

The set is the one `realtime.train.gpu_run run --seed N` evaluates: `plan_tasks(..., seed=N)`'s
evaluation tasks (40 test sentences per held-out voice and per seen voice), synthesised here into
`--shards` (kept, so later calls reuse it), plus the real recordings of `.train_carry/real`.
Decoded at 480 ms (per-voice WER for each model, side by side); `--delays 160 480 960 2400
--sweep-per-voice 12` adds the other delays on `--sweep-per-voice` utterances per voice, as the
device's own evaluation does.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from realtime.train.evaluate import evaluate, summary_lines
from realtime.train.synth import plan_tasks, synthesize
from realtime.train.text_corpus import read_corpus
from realtime.train.voices import catalogue

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True, help="NAME=FOLDER ...")
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--per-voice", type=int, default=40)
    ap.add_argument("--carry", default=".train_carry")
    ap.add_argument("--shards", default=None, help="default: /tmp/streamscribe-eval-seed<N>")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--delays", type=int, nargs="+", default=[480], help="ms; 480 is always scored in full")
    ap.add_argument("--sweep-per-voice", type=int, default=0, help="utterances per voice at the other delays")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    carry = Path(args.carry)
    shards = Path(args.shards or f"/tmp/streamscribe-eval-seed{args.seed}")
    if not shards.exists():
        train_v, held_v = catalogue()
        tasks = plan_tasks(read_corpus(carry / "corpus.tsv.gz"), train_v, held_v, train_hours=0,
                           eval_per_voice=args.per_voice, seed=args.seed)
        synthesize(tasks, shards, workers=args.workers)
    real = carry / "real"
    delays = sorted(set(args.delays) | {480})
    report: dict = {"seed": args.seed, "per_voice": args.per_voice, "delay_ms": 480, "delays": delays,
                    "sweep_per_voice": args.sweep_per_voice}
    for spec in args.models:
        name, _, folder = spec.partition("=")
        t0 = time.time()
        result = evaluate(Path(folder), shards, delays=delays, per_voice=args.per_voice,
                          sweep_per_voice=args.sweep_per_voice if len(delays) > 1 else 0,
                          real_dir=real if real.exists() else None, workers=args.workers)
        report[name] = {"folder": folder, **result}
        logger.info("%s scored in %.0f s", name, time.time() - t0)
        for line in summary_lines(result):
            logger.info("%s %s", name, line)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
