"""A model's weights packed small enough to travel beside the training carry (warm starts).

    python -m realtime.train.warm pack MODEL_DIR OUT_FILE [--bits 4]
    python -m realtime.train.warm unpack PACK_FILE OUT_DIR --like MODEL_DIR

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

`unpack` turns a pack back into a model folder (fp16, the transformers layout; config and tokenizer from `--like`,
a model of the same size), to score a pack that a device call brought back where the fp16 model could not come
(twenty-ninth session: a short fine-tune's gain does not survive 4-bit rounding, so such scores bound nothing).
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


def unpack_to_folder(pack: Path, like: Path, out: Path) -> Path:
    """The pack's dequantised weights as a model folder: `like`'s config and tokenizer (tokenizer.json and/or
    tekken.json), fp16 weights in the transformers layout. Every weight of the model must be in the pack, and
    nothing else."""
    import shutil

    from ..loader import load_model, save_model

    model, _ = load_model(like)
    state = load_warm_state(pack)
    want = model.state_dict()
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or extra:
        raise ValueError(f"{pack} does not fit {like}: missing {missing[:4]}, unexpected {extra[:4]}")
    bad = [k for k in want if tuple(state[k].shape) != tuple(want[k].shape)]
    if bad:
        raise ValueError(f"{pack} does not fit {like}: shapes differ for {bad[:4]}")
    model.load_state_dict({k: state[k].to(want[k].dtype) for k in want})
    tokenizers = [f for f in ("tokenizer.json", "tekken.json") if (like / f).is_file()]
    if not tokenizers:
        raise ValueError(f"{like} has no tokenizer.json or tekken.json to copy")
    save_model(model.half(), out)
    for f in tokenizers:
        shutil.copy(like / f, out / f)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("model_dir")
    p.add_argument("out_file")
    p.add_argument("--bits", type=int, choices=(4, 8), default=8)
    u = sub.add_parser("unpack")
    u.add_argument("pack_file")
    u.add_argument("out_dir")
    u.add_argument("--like", required=True, help="a model folder of the same size: its config and tokenizer")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    if args.cmd == "unpack":
        out = unpack_to_folder(Path(args.pack_file), Path(args.like), Path(args.out_dir))
        logger.info("unpacked %s into %s", args.pack_file, out)
        return 0
    out = Path(args.out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(pack_state(load_warm_state(Path(args.model_dir)), args.bits), out)
    logger.info("packed %s into %s (%.1f MB)", args.model_dir, out, out.stat().st_size / 1e6)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
