"""Every evaluation a candidate default model is shipped on, for several model folders at once, and one table.

    python benchmarks/rescore_candidates.py --models shipped=models/default run40=/tmp/run40 \
        --folders joe=.joe_eval jf_nezumi=.kokoro_eval kokoro_en=.kokoro_en_eval/all --out /tmp/rescore

Runs `rescore_heldout.py` on both fixed draws (seeds 8 and 9: the five held-out voices, the seen voices and the real
recordings) and `score_folder.py --by-speaker` on each folder of natural voices, writes their JSON into OUT, and
OUT/summary.md: one row per model, WER at 480 ms. The rule since the thirtieth session ships a model only if it is
better on both draws and on the natural voices (models/default_model_card.md). Decoding is on the CPU, fp32.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import rescore_heldout
import score_folder

logger = logging.getLogger("benchmarks.rescore_candidates")
SEEDS = (8, 9)


def _wer(result: dict, group: str, key: str = "*") -> float | None:
    cell = result.get(group, {}).get(key, {}).get("480")
    return None if cell is None else cell["wer"]


def summary_table(models: list[str], heldout: dict[int, dict], folders: dict[str, dict]) -> str:
    """A markdown table of the reports: `heldout[seed]` is rescore_heldout's, `folders[name]` score_folder's."""
    head = ["model", *(f"held-out, seed {s}" for s in heldout), "seen (" + " / ".join(map(str, heldout)) + ")",
            "real", *folders]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def pct(v: float | None) -> str:
        return "" if v is None else f"{v:.1f}%"

    for m in models:
        cells = [m, *(pct(_wer(heldout[s][m], "heldout")) for s in heldout)]
        cells.append(" / ".join(pct(_wer(heldout[s][m], "seen")) for s in heldout))
        first = next(iter(heldout.values()))[m]
        cells.append(pct(_wer(first, "real")))
        cells += [pct(_wer(folders[f][m], score_folder.GROUP)) for f in folders]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True, help="NAME=FOLDER ...")
    ap.add_argument("--folders", nargs="*", default=[], help="NAME=DIR of recordings with transcripts (SPEAKER_NN.wav)")
    ap.add_argument("--carry", default=".train_carry", help="corpus and real recordings (rescore_heldout --carry)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    names = [m.partition("=")[0] for m in args.models]
    heldout: dict[int, dict] = {}
    for seed in SEEDS:
        path = args.out / f"heldout_seed{seed}.json"
        rescore_heldout.main(["--seed", str(seed), "--carry", args.carry, "--workers", str(args.workers),
                              "--out", str(path), "--models", *args.models])
        heldout[seed] = json.loads(path.read_text())
    folders: dict[str, dict] = {}
    for spec in args.folders:
        name, _, folder = spec.partition("=")
        path = args.out / f"folder_{name}.json"
        score_folder.main(["--folder", folder, "--by-speaker", "--workers", str(args.workers), "--out", str(path),
                           "--models", *args.models])
        folders[name] = json.loads(path.read_text())
    table = summary_table(names, heldout, folders)
    (args.out / "summary.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
