"""Weight averaging ("model soup", Wortsman et al. 2022) of trained model folders.

    python -m realtime.train.soup OUT_DIR MODEL_DIR MODEL_DIR [...] [--weights 0.5 0.5] [--labels run11 run12]

Runs that continue one another (each warm-started from the last) stay in one basin of the loss, so
the average of their weights is a model of its own. It costs nothing to make and one evaluation to
judge (`benchmarks/rescore_heldout.py`). The folders must share the architecture (`config.json`)
and tokenizer. Every floating-point tensor is averaged in float64 and stored in its original
dtype; any other tensor must be equal in all folders. OUT_DIR gets the first folder's config,
generation config and tokenizer, the averaged `model.safetensors`, and a `training.json` that names
the parents and weights (no training happened).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
COPIED = ("config.json", "generation_config.json", "tokenizer.json")


class SoupError(ValueError):
    pass


def average_states(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    if len(states) != len(weights) or len(states) < 2:
        raise SoupError(f"need two or more models and one weight each, got {len(states)} and {len(weights)}")
    if any(w < 0 for w in weights) or abs(sum(weights) - 1.0) > 1e-9:
        raise SoupError(f"weights must be non-negative and sum to 1, got {weights}")
    names = set(states[0])
    for i, s in enumerate(states[1:], 1):
        if set(s) != names:
            raise SoupError(f"model #{i} has other tensors than model #0: {sorted(set(s) ^ names)[:5]}")
    out = {}
    for name in sorted(names):
        ts = [s[name] for s in states]
        if any(t.shape != ts[0].shape or t.dtype != ts[0].dtype for t in ts):
            raise SoupError(f"tensor {name}: shapes/dtypes differ: {[(tuple(t.shape), t.dtype) for t in ts]}")
        if ts[0].is_floating_point():
            acc = sum(w * t.double() for w, t in zip(weights, ts))
            out[name] = acc.to(ts[0].dtype).contiguous()
        else:
            if any(not torch.equal(t, ts[0]) for t in ts):
                raise SoupError(f"non-float tensor {name} differs between models")
            out[name] = ts[0].contiguous()
    return out


def make_soup(out_dir: Path, model_dirs: list[Path], weights: list[float] | None = None,
              labels: list[str] | None = None) -> dict:
    weights = weights if weights is not None else [1.0 / len(model_dirs)] * len(model_dirs)
    if labels is not None and len(labels) != len(model_dirs):
        raise SoupError(f"{len(labels)} labels for {len(model_dirs)} models")
    for name in ("config.json", "tokenizer.json"):
        texts = [(d / name).read_text() for d in model_dirs]
        if any(t != texts[0] for t in texts):
            raise SoupError(f"{name} differs between the models: only the same architecture and tokenizer average")
    state = average_states([load_file(str(d / WEIGHTS_FILE)) for d in model_dirs], weights)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        if (model_dirs[0] / name).exists():
            shutil.copyfile(model_dirs[0] / name, out_dir / name)
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    record = {"method": "weight average (model soup)", "parents": labels or [str(d) for d in model_dirs],
              "weights": weights,
              "parent_training": [json.loads((d / "training.json").read_text()) if (d / "training.json").exists()
                                  else None for d in model_dirs]}
    (out_dir / "training.json").write_text(json.dumps(record, indent=1))
    logger.info("averaged %d models (%s) into %s", len(model_dirs), weights, out_dir)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("models", type=Path, nargs="+")
    ap.add_argument("--weights", type=float, nargs="+", default=None, help="default: equal")
    ap.add_argument("--labels", nargs="+", default=None, help="names of the parents in training.json (default: paths)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        make_soup(args.out, args.models, args.weights, args.labels)
    except (SoupError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
