"""Where models live: the embedded default model shipped in the repository, or a folder on disk."""

from __future__ import annotations

from pathlib import Path

import torch

from .loader import load_model
from .model import VoxtralRealtime
from .tokenizer import TextTokenizer, load_tokenizer

# The embedded default model (models/default in the repository).
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "default"
DEFAULT_MODEL_NAME = "streamscribe-default"
# its Eagle drafter (speculative/), distilled from it: offline transcription uses it by default
DEFAULT_DRAFTER_DIR = DEFAULT_MODEL_DIR.parent / "default_drafter"


def resolve_model_dir(model: str | Path) -> Path:
    if str(model) == "default":
        return DEFAULT_MODEL_DIR
    return Path(model)


def default_drafter_dir(model: str | Path) -> Path | None:
    """The drafter that goes with `model` when none is named: the embedded drafter for the embedded model (if the
    checkout has it), none for any other checkpoint (a drafter is distilled for one target)."""
    embedded = resolve_model_dir(model).resolve() == DEFAULT_MODEL_DIR.resolve()
    if embedded and (DEFAULT_DRAFTER_DIR / "drafter_config.json").is_file():
        return DEFAULT_DRAFTER_DIR
    return None


def load_model_and_tokenizer(model: str | Path, *, device: str | torch.device = "cpu",
                             dtype: torch.dtype = torch.float32) -> tuple[VoxtralRealtime, TextTokenizer]:
    d = resolve_model_dir(model)
    net, _ = load_model(d, device=device, dtype=dtype)
    tok = load_tokenizer(d, net.config.tokens.num_control_tokens)
    return net, tok
