"""Write a small random-weight Voxtral-Realtime checkpoint for tests and tools.

    python -m realtime.testing.tiny_checkpoint --out DIR [--format hf|mistral] [--seed N] [--small-windows]

The weights are re-drawn with a large standard deviation so greedy outputs vary from frame to
frame (with the usual tiny init every output is the same control token). A tekken.json (and, with
`--tokenizer-json`, an equivalent tokenizer.json) is written beside the weights.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from ..config import DecoderConfig, EncoderConfig, ModelConfig, tekken_audio_section
from ..loader import save_model
from ..model import VoxtralRealtime
from ..tokenizer_build import NUM_CONTROL_TOKENS, shipped_tekken_ranks, write_tekken_json, write_tokenizer_json

logger = logging.getLogger(__name__)

TINY_TEXT_RANKS = 500  # byte-level BPE ranks after the 1000 control tokens


def tiny_config(*, small_windows: bool = False, encoder_window: int | None = None,
                decoder_window: int | None = None) -> ModelConfig:
    enc = EncoderConfig(hidden_size=64, num_layers=2, num_heads=4, head_dim=16, intermediate_size=128,
                        rope_theta=1e6, sliding_window=8 if small_windows else 750)
    dec = DecoderConfig(vocab_size=NUM_CONTROL_TOKENS + TINY_TEXT_RANKS, hidden_size=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, intermediate_size=128, rope_theta=1e6,
                        sliding_window=6 if small_windows else 8192)
    if encoder_window is not None:
        enc = replace(enc, sliding_window=encoder_window)
    if decoder_window is not None:
        dec = replace(dec, sliding_window=decoder_window)
    return ModelConfig(encoder=enc, decoder=dec).validate()


def random_model(cfg: ModelConfig, seed: int, std: float = 0.3) -> VoxtralRealtime:
    """A model whose every weight is N(0, std) (norm weights N(1, std/3)), reproducible by seed."""
    gen = torch.Generator().manual_seed(seed)
    model = VoxtralRealtime(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or "layer_norm" in name:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * (std / 3))
            elif p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            else:
                fan_in = p.shape[1] * (p.shape[2] if p.ndim == 3 else 1)
                # keep activations O(1) for any width while staying far from the tiny init
                scale = std if fan_in <= 128 else std * math.sqrt(128 / fan_in)
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return model.eval()


def write_tiny_checkpoint(out: str | Path, *, fmt: str = "hf", seed: int = 0, small_windows: bool = False,
                          tokenizer_json: bool = False, tekken: bool = True,
                          config: ModelConfig | None = None) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config or tiny_config(small_windows=small_windows)
    model = random_model(cfg, seed)
    save_model(model, out, layout="mistral" if fmt == "mistral" else "transformers")
    ranks = shipped_tekken_ranks(cfg.decoder.vocab_size - NUM_CONTROL_TOKENS)
    if tekken:
        write_tekken_json(out / "tekken.json", ranks, tekken_audio_section(cfg))
    if tokenizer_json:
        write_tokenizer_json(out / "tokenizer.json", ranks)
    logger.info("wrote %s checkpoint (seed %d) to %s", fmt, seed, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--format", choices=["hf", "mistral"], default="hf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small-windows", action="store_true", help="encoder window 8, decoder window 6")
    ap.add_argument("--tokenizer-json", action="store_true", help="also write tokenizer.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    write_tiny_checkpoint(args.out, fmt=args.format, seed=args.seed, small_windows=args.small_windows,
                          tokenizer_json=args.tokenizer_json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
