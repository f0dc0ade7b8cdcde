"""A model's weights packed small enough to travel beside the training carry (warm starts).

    python -m realtime.train.warm pack MODEL_DIR OUT_FILE

A device call carries at most 64 MiB and the carry folder takes 37 of them, so the 39 MB fp16
export of the default model cannot go along to continue training on a fresh machine. Packed, every
matrix is int8 with one fp16 scale per output row (absmax), vectors stay fp16: about half the bytes.
The rounding error (under 0.4% of each row's largest weight) is noise that the continued training
removes; this format is for warm starts only, never for shipping.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def pack_state(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    packed = {}
    for name, t in state.items():
        t = t.detach().float().cpu()
        if t.ndim >= 2:
            rows = t.reshape(t.shape[0], -1)
            scale = rows.abs().amax(dim=1).clamp(min=1e-12) / 127.0
            q = torch.round(rows / scale[:, None]).clamp(-127, 127).to(torch.int8).reshape(t.shape)
            packed[name] = {"q": q, "scale": scale.half()}
        else:
            packed[name] = {"v": t.half()}
    return packed


def unpack_state(packed: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in packed.items():
        if "q" in p:
            q = p["q"].float()
            out[name] = (q.reshape(q.shape[0], -1) * p["scale"].float()[:, None]).reshape(q.shape)
        else:
            out[name] = p["v"].float()
    return out


def load_warm_state(path: Path) -> dict[str, torch.Tensor]:
    """Float32 weights from a packed file or from an exported model folder."""
    if path.is_file():
        return unpack_state(torch.load(path, map_location="cpu", weights_only=True))
    from ..loader import load_model

    model, _ = load_model(path)
    return {k: v.float() for k, v in model.state_dict().items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("model_dir")
    p.add_argument("out_file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    out = Path(args.out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(pack_state(load_warm_state(Path(args.model_dir))), out)
    logger.info("packed %s into %s (%.1f MB)", args.model_dir, out, out.stat().st_size / 1e6)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
