"""Make many speech clips at once on a machine without TTS engines (the GPU device), from carried engines.

    python benchmarks/device_speech_clips.py --carry .drafter_carry --out /tmp/distill --jobs 28 \
        --plan train:20:101 unseen:20:102 warp:20:103 --seconds 60

Each plan item `KIND:COUNT:SEED` is one `make_speech_clips.py` process making COUNT clips of `--seconds`
into `OUT/KIND_SEED/`: `train` (training voices, train sentences), `unseen` (formant voices neither half
of the catalogue uses, train sentences) or `warp` (training voices played at a random speed in
0.85-1.18), the three kinds of the drafter's distillation audio (models/README.md). Up to `--jobs`
processes run at a time; clips are FLAC (they stay on that machine, so no Opus). The engines come from
`CARRY/engines.tar.xz`, unpacked as the training run does (`realtime.train.gpu_run.setup_engines`), the
sentences from `CARRY/corpus.tsv.gz`; soundfile must be importable (the caller installs its wheels).
Seeds say which clips: the same plan item makes the same audio on any machine with the same engines (and
`train` and `warp` items with one seed speak the same sentences with the same voices: give them different seeds).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from realtime.train.gpu_run import WORK, setup_engines

logger = logging.getLogger("device_speech_clips")
KINDS = {"train": ["--voices", "train"], "unseen": ["--voices", "unseen"],
         "warp": ["--voices", "train", "--speed-warp", "0.85", "1.18"]}


@dataclass(frozen=True)
class PlanItem:
    kind: str
    count: int
    seed: int

    @classmethod
    def parse(cls, text: str) -> PlanItem:
        parts = text.split(":")
        if len(parts) != 3 or parts[0] not in KINDS:
            raise ValueError(f"plan item {text!r}: expected KIND:COUNT:SEED with KIND one of {sorted(KINDS)}")
        try:
            count, seed = int(parts[1]), int(parts[2])
        except ValueError:
            raise ValueError(f"plan item {text!r}: COUNT and SEED must be integers") from None
        if count < 1:
            raise ValueError(f"plan item {text!r}: COUNT must be at least 1")
        return cls(parts[0], count, seed)

    @property
    def folder(self) -> str:
        return f"{self.kind}_{self.seed}"


def command(item: PlanItem, out: Path, seconds: float, corpus: Path) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "make_speech_clips.py"), *KINDS[item.kind],
            "--count", str(item.count), "--seed", str(item.seed), "--seconds", str(seconds),
            "--corpus", str(corpus), "--out", str(out / item.folder)]


def child_env() -> dict[str, str]:
    """This environment with the repository root first on PYTHONPATH: make_speech_clips imports `realtime`,
    which a checkout that is not pip-installed (the device's copy) only finds that way."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def run_plan(items: list[PlanItem], out: Path, seconds: float, corpus: Path, jobs: int) -> dict:
    """Run every item (at most `jobs` at a time); a failed item is reported with its log's tail."""
    if len({i.folder for i in items}) != len(items):
        raise ValueError("two plan items share a kind and a seed (they would make the same clips)")
    out.mkdir(parents=True, exist_ok=True)
    env = child_env()

    def one(item: PlanItem) -> tuple[PlanItem, int, str]:
        p = subprocess.run(command(item, out, seconds, corpus), check=False, capture_output=True,
                           text=True, env=env)
        return item, p.returncode, p.stderr[-2000:]

    t0 = time.time()
    failed = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for item, rc, tail in pool.map(one, items):
            if rc != 0:
                failed[item.folder] = tail
                logger.error("%s failed (rc %d): %s", item.folder, rc, tail)
    clips = sorted(c for i in items for c in (out / i.folder).glob("*.flac"))  # this plan's, not older ones
    seconds_made = sum(sf.info(str(c)).duration for c in clips)
    return {"clips": len(clips), "hours": seconds_made / 3600, "wall_s": time.time() - t0, "failed": failed,
            "folders": sorted(i.folder for i in items)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--carry", required=True, help="folder with engines.tar.xz and corpus.tsv.gz")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plan", nargs="+", required=True, help="KIND:COUNT:SEED items (KIND: train, unseen, warp)")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each clip")
    ap.add_argument("--jobs", type=int, default=8, help="processes at a time")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        items = [PlanItem.parse(p) for p in args.plan]
    except ValueError as exc:
        ap.error(str(exc))
    if args.seconds <= 0 or args.jobs < 1:
        ap.error("--seconds must be positive and --jobs at least 1")
    carry = Path(args.carry)
    for name in ("engines.tar.xz", "corpus.tsv.gz"):
        if not (carry / name).is_file():
            ap.error(f"{carry / name} is missing")
    setup_engines(carry, WORK)  # the children inherit PATH, LD_LIBRARY_PATH and the engine paths
    stats = run_plan(items, Path(args.out), args.seconds, carry / "corpus.tsv.gz", args.jobs)
    logger.info("%s", json.dumps({k: v for k, v in stats.items() if k != "failed"}))
    (Path(args.out) / "clips_stats.json").write_text(json.dumps(stats, indent=2))
    return 1 if stats["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
