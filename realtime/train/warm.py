"""A model's weights packed small enough to travel beside the training carry (warm starts).

    python -m realtime.train.warm pack MODEL_DIR OUT_FILE [--bits 4]

A device call carries at most 64 MiB and the carry folder takes 37 of them, so the 39 MB fp16
export of the default model cannot go along to continue training on a fresh machine. Packed, every
matrix is int8 with one fp16 scale per output row (absmax), vectors stay fp16: about half the bytes.
The rounding error (under 0.4% of each row's largest weight) is noise that the continued training
removes; this format is for warm starts only, never for shipping.

`--bits 4` packs every matrix whose rows split into groups of 64 as 4-bit integers (-7..7, two per
byte) with one fp16 scale per group: about a quarter of the fp16 bytes (10 MB for the default model
against 19.5 MB at int8), so a call carries ~9 MB more training speech. The error is larger (up to
half of 1/7 of each group's largest weight), so it is measured before a run relies on it: the model
card gives the dequantised model's held-out WER.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


GROUP = 64  # weights per fp16 scale in the 4-bit format


def _pack4(rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """[R, C] float (C a multiple of GROUP) -> 4-bit codes, two per byte, and one scale per group."""
    g = rows.reshape(rows.shape[0], -1, GROUP)
    scale = g.abs().amax(dim=2).clamp(min=1e-12) / 7.0
    q = (torch.round(g / scale[..., None]).clamp(-7, 7) + 8).to(torch.uint8).reshape(rows.shape)
    return {"q4": q[:, 0::2] | (q[:, 1::2] << 4), "scale4": scale.half()}


def _unpack4(p: dict[str, torch.Tensor], shape: torch.Size) -> torch.Tensor:
    codes = torch.stack([p["q4"] & 15, p["q4"] >> 4], dim=2).reshape(p["q4"].shape[0], -1)
    g = (codes.float() - 8).reshape(codes.shape[0], -1, GROUP) * p["scale4"].float()[..., None]
    return g.reshape(shape)


def pack_state(state: dict[str, torch.Tensor], bits: int = 8) -> dict[str, dict[str, torch.Tensor]]:
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, not {bits}")
    packed = {}
    for name, t in state.items():
        t = t.detach().float().cpu()
        if bits == 4 and t.ndim >= 2 and (t.numel() // t.shape[0]) % GROUP == 0:
            packed[name] = _pack4(t.reshape(t.shape[0], -1)) | {"shape": torch.tensor(t.shape)}
        elif t.ndim >= 2:
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
        if "q4" in p:
            out[name] = _unpack4(p, torch.Size(p["shape"].tolist()))
        elif "q" in p:
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
    p.add_argument("--bits", type=int, choices=(4, 8), default=8)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    out = Path(args.out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(pack_state(load_warm_state(Path(args.model_dir)), args.bits), out)
    logger.info("packed %s into %s (%.1f MB)", args.model_dir, out, out.stat().st_size / 1e6)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
