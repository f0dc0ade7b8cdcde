"""The Eagle drafter: a small decoder over [fused input embedding; target hidden state].

At LM position q the target reads `x_q = embed(token_q) + audio_q` and its final hidden state
`h_q` decides token q+1. The drafter at position q reads `fc([x_q; h_{q-1}])`, runs its decoder
layer(s) (same block as the target's, delay conditioning included) and a final norm, giving
`g_q`, its estimate of `h_q`; the target's LM head turns `g_q` into the draft of token q+1. The
next draft step (position q+1) has no target hidden state yet, so it reads `g_q` in its place.
`ParallelEagleDrafter` drafts the positions after the first in the same pass instead, and
`TwoPassEagleDrafter` in one more pass (see there).

`x_q` includes the audio embedding of position q itself at *every* draft step (the look-ahead
that public Eagle implementations drop after the first step). A drafter without the declared
capability (see `capability`) gets `x_q = embed(token_q)` only.

The token embedding and the LM head are the target's (tied, read-only, never saved with the
drafter): `tie_to(target)` binds them after construction or loading.

Checkpoint: `drafter_config.json` (architecture, format version, `DrafterConfig`) and
`drafter.safetensors` (the drafter's own parameters). Loading is strict.
"""

from __future__ import annotations

import json
import logging
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from kernels.linear import linear
from realtime.config import DecoderConfig, ModelConfig
from realtime.loader import CheckpointError, describe_misfit
from realtime.model import (
    Attention,
    AttentionBackend,
    DecoderLayer,
    RMSNorm,
    SwiGLU,
    delay_embedding,
    delay_inv_freq,
    rope_cos_sin,
    rope_inv_freq,
)

from .capability import SupportsMultiModalEmbeddings, SupportsParallelDrafting, SupportsTwoPassDrafting

logger = logging.getLogger(__name__)

CONFIG_FILE = "drafter_config.json"
WEIGHTS_FILE = "drafter.safetensors"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int  # must equal the target LM's hidden size (fc input, tied head)
    vocab_size: int  # must equal the target's vocabulary (tied embedding / head)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_layers: int = 1
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    sliding_window: int | None = 512  # the drafter's own attention window (its KV ring)
    ada_cond_dim: int = 32
    # drafts per round it was trained to make (a parallel or two-pass drafter's `--unroll`): the engine's k when the
    # user gives none. None (drafters saved before the forty-sixth session): the kind's measured default
    draft_tokens: int | None = None
    # drafts per round a GPU engine makes by default where a benchmark measured a number other than draft_tokens
    # better (a parallel drafter's GPU round costs about the same for any k, and its depths past training still
    # accept some drafts): the shipped drafter, trained for 10, drafts 12 on a GPU (forty-seventh session, H100,
    # batch 1: mean acceptance length 4.09 at 12 against 3.99 at 10, the same speed within run-to-run noise; issue 5).
    # None: draft_tokens. Never used on the CPU, where every verified row costs compute
    gpu_draft_tokens: int | None = None

    @classmethod
    def for_target(cls, target: ModelConfig, **overrides: object) -> DrafterConfig:
        """A drafter shaped like one layer of the target's LM (the usual Eagle choice)."""
        d = target.decoder
        base: dict[str, object] = {
            "hidden_size": d.hidden_size, "vocab_size": d.vocab_size, "num_heads": d.num_heads,
            "num_kv_heads": d.num_kv_heads, "head_dim": d.head_dim, "intermediate_size": d.intermediate_size,
            "rms_norm_eps": d.rms_norm_eps, "rope_theta": d.rope_theta, "ada_cond_dim": d.ada_cond_dim,
            "sliding_window": min(512, d.sliding_window) if d.sliding_window else 512}
        base.update(overrides)
        return cls(**base).validate()

    def validate(self) -> DrafterConfig:
        for name in ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "num_layers", "ada_cond_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CheckpointError(f"drafter config: {name} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"drafter config: num_heads {self.num_heads} is not a multiple of num_kv_heads "
                                  f"{self.num_kv_heads}")
        if self.head_dim % 2:
            raise CheckpointError(f"drafter config: head_dim must be even (RoPE), got {self.head_dim}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise CheckpointError(f"drafter config: sliding_window must be None or >= 1, got {self.sliding_window!r}")
        for name in ("draft_tokens", "gpu_draft_tokens"):
            n = getattr(self, name)
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise CheckpointError(f"drafter config: {name} must be None or a positive integer, got {n!r}")
        return self

    def decoder_config(self) -> DecoderConfig:
        return DecoderConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_layers=self.num_layers,
                             num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                             intermediate_size=self.intermediate_size, rms_norm_eps=self.rms_norm_eps,
                             rope_theta=self.rope_theta, sliding_window=self.sliding_window,
                             tie_word_embeddings=True, ada_cond_dim=self.ada_cond_dim)

    @classmethod
    def from_dict(cls, data: dict) -> DrafterConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CheckpointError(f"drafter config: unknown fields {unknown}")
        required = {f.name for f in fields(cls) if f.default is MISSING}
        missing = sorted(required - set(data))
        if missing:
            raise CheckpointError(f"drafter config: missing fields {missing}")
        return cls(**data).validate()


class _Tied:
    """The target's token embedding table, held outside the module tree (never saved, never trained)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight


class EagleModel(nn.Module):
    """The Eagle drafter network. It has `embed_input_ids` but does NOT declare the multimodal
    capability: used as is, it drafts text-only (see `EagleDrafter`)."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config.validate()
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        dec = config.decoder_config()
        self.layers = nn.ModuleList([DecoderLayer(dec) for _ in range(config.num_layers)])
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta)
        self.delay_inv_freq = delay_inv_freq(h)
        self._tied: _Tied | None = None
        # [layers, delays, H]: 1 + ada(t_cond(d)) of every layer for every delay (`prepare_for_inference`)
        self.ada_table: torch.Tensor | None = None

    # -- binding to the target -----------------------------------------------------------------
    def tie_to(self, target_embedding: torch.Tensor) -> EagleModel:
        """Share the target's token embedding (= LM head, tied). Shapes must match the config."""
        want = (self.config.vocab_size, self.config.hidden_size)
        if tuple(target_embedding.shape) != want:
            raise CheckpointError(f"drafter expects a target embedding of shape {list(want)}, the target has "
                                  f"{list(target_embedding.shape)}")
        if target_embedding.device != self.device or target_embedding.dtype != self.dtype:
            raise ValueError(f"drafter is on {self.device}/{self.dtype}, the target embedding on "
                             f"{target_embedding.device}/{target_embedding.dtype}: load them alike")
        self._tied = _Tied(target_embedding)
        return self

    @property
    def embed_weight(self) -> torch.Tensor:
        if self._tied is None:
            raise RuntimeError("drafter is not tied to a target: call tie_to(target embedding) first")
        return self._tied.weight

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    # -- steps -----------------------------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor, multimodal_embeddings: torch.Tensor | None = None, *,
                        is_multimodal: torch.Tensor | None = None) -> torch.Tensor:
        """The one place where the drafter merges token and audio embeddings (see the protocol)."""
        emb = self._token_embeddings(input_ids)
        if multimodal_embeddings is None:
            return emb
        if is_multimodal is None:
            return emb + multimodal_embeddings
        # where(), not a product: rows without audio may hold anything (stale ring rows)
        return torch.where(is_multimodal[..., None], emb + multimodal_embeddings, emb)

    def _token_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        # ids < 0 are padding rows (their output is never read)
        return F.embedding(input_ids.clamp(0, self.config.vocab_size - 1), self.embed_weight)

    def t_cond(self, delay_tokens: torch.Tensor) -> torch.Tensor:
        return delay_embedding(delay_tokens, self.delay_inv_freq, self.dtype)

    @torch.no_grad()
    def prepare_for_inference(self, max_delay_tokens: int = 30) -> None:
        """What the target's `prepare_for_inference` does, for the drafter: fused q/k/v and gate/up projections
        (one `linear` each instead of three cuBLAS calls and two, at batch 1 most of a drafter pass's kernels), and
        the delay scales of every layer for every delay as one table (`ada_scales_for`: one gather instead of the
        delay embedding and two small matmuls a layer). Idempotent; training keeps the separate leaves (the fused
        paths run only without autograd)."""
        for m in self.modules():
            if isinstance(m, (Attention, SwiGLU)):
                m.fuse()
        delays = torch.arange(max_delay_tokens + 1, device=self.device)
        t = self.t_cond(delays)
        self.ada_table = torch.stack([1 + layer.ada_rms_norm(t) for layer in self.layers])

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]  (nn.Module's own signature)
        """`.to()`, `.half()`, ...: a prepared drafter's fused matrices and delay table follow its weights (they are
        plain attributes, which nn.Module would leave behind on the old device or dtype)."""
        out = super()._apply(fn, recurse)
        if self.ada_table is not None:
            self.prepare_for_inference(self.ada_table.shape[1] - 1)
        return out

    def ada_scales_for(self, delay_tokens: torch.Tensor) -> torch.Tensor | None:
        """[L, 1, T, H] delay scales for the delays [T] of a pass's rows (None without `prepare_for_inference`)."""
        if self.ada_table is None:
            return None
        return self.ada_table.index_select(1, delay_tokens.reshape(-1))[:, None]

    def forward(self, inputs_embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                t_cond: torch.Tensor | None, backend: AttentionBackend,
                ada_scales: torch.Tensor | None = None) -> torch.Tensor:
        """inputs_embeds, hidden: [B, T, H] (x_q and h_{q-1}); positions [B, T] -> g [B, T, H]. The delay enters as
        t_cond [B, T, H], or as the layers' scales from the table (`ada_scales_for`)."""
        x = linear(torch.cat([inputs_embeds, hidden], dim=-1), self.fc.weight)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        residual = None  # the target's layer API: (branch output, residual stream), added in the next norm
        for i, layer in enumerate(self.layers):
            scale = ada_scales[i] if ada_scales is not None else 1 + layer.ada_rms_norm(t_cond)
            x, residual = layer(x, residual, cos, sin, scale, backend, i)
        return self.norm(x, residual)[0]

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return linear(g, self.embed_weight)


class EagleDrafter(EagleModel, SupportsMultiModalEmbeddings):
    """The Eagle drafter that declares `supports_multimodal_embeddings`: it receives the audio
    embedding of its own position at every draft step (when the target produces them)."""


class MaskRowsDrafter(EagleDrafter):
    """Base of the drafters with draft rows whose token is not known yet when they run: such a row
    reads a learned mask embedding in place of the token, plus its own position's audio embedding.

    `mask_token_id` (= vocab_size, one past the vocabulary) marks those rows in `embed_input_ids`,
    which stays the one place where token, mask and audio embeddings are merged. Not a checkpoint
    architecture itself: its subclasses declare how the engine lays the rows out."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__(config)
        self.mask_embedding = nn.Parameter(torch.zeros(config.hidden_size))

    @property
    def mask_token_id(self) -> int:
        return self.config.vocab_size

    def _token_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        emb = super()._token_embeddings(input_ids)
        is_mask = (input_ids == self.mask_token_id)[..., None]
        return torch.where(is_mask, self.mask_embedding.to(emb.dtype), emb)


class ParallelEagleDrafter(MaskRowsDrafter, SupportsParallelDrafting):
    """A multimodal drafter that drafts all k tokens of a round in ONE pass (declares
    `supports_parallel_drafting`).

    The audio of every draft position is already buffered when a stream drafts, so the positions
    p+1 .. p+k-1 need not wait for the drafts before them: each reads the mask embedding in place
    of its unknown token, plus its own audio embedding, and zeros in place of the target hidden
    state. These rows run in the same pass as the catch-up rows (whose last row, position p,
    drafts token p+1), under causal attention, and each row's head output is the next draft. A
    round then costs one drafter pass instead of k dependent ones: at batch 1 a drafter pass is
    launch-bound, so this is most of the drafting time (`speculative.train --parallel` trains it)."""

    supports_parallel_drafting: ClassVar[Literal[True]] = True


class TwoPassEagleDrafter(MaskRowsDrafter, SupportsTwoPassDrafting):
    """A multimodal drafter that drafts the k tokens of a round in TWO passes (declares
    `supports_two_pass_drafting`).

    Pass 1 is the catch-up pass; its row at position p drafts token p+1, as in the chained drafter.
    Pass 2 runs positions p+1 .. p+k-1 at once: row p+1 reads that first draft's token and pass 1's
    output at p in place of the target hidden state (the chained drafter's second step), rows
    p+2 .. p+k-1 the mask embedding and zeros (the parallel drafter's rows); every row also reads
    its own audio embedding, and the heads of pass 2 give drafts 2 .. k. Why: the parallel drafter's
    weak point is the rows right after p (a second draft is accepted about half the time after a
    right first draft, two times in three for the chained drafter, which reads the first draft's
    token). Two passes per round instead of k (`speculative.train --two-pass` trains it)."""

    supports_two_pass_drafting: ClassVar[Literal[True]] = True


ARCHITECTURES: dict[str, type[EagleModel]] = {"EagleDrafter": EagleDrafter, "EagleModel": EagleModel,
                                              "ParallelEagleDrafter": ParallelEagleDrafter,
                                              "TwoPassEagleDrafter": TwoPassEagleDrafter}


def save_drafter(drafter: EagleModel, out_dir: str | Path) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arch = type(drafter).__name__
    if arch not in ARCHITECTURES:
        raise ValueError(f"cannot save drafter class {arch}: known architectures are {sorted(ARCHITECTURES)}")
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in drafter.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    meta = {"architecture": arch, "format_version": FORMAT_VERSION, "config": asdict(drafter.config)}
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
    return out


def load_drafter_config(path: str | Path) -> tuple[str, DrafterConfig]:
    d = Path(path)
    f = d / CONFIG_FILE
    try:
        meta = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{d} holds no drafter ({CONFIG_FILE} is missing)") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{f}: cannot read: {exc}") from exc
    if not isinstance(meta, dict) or set(meta) != {"architecture", "format_version", "config"}:
        raise CheckpointError(f"{f}: expected exactly the keys architecture, format_version, config")
    if meta["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{f}: format_version {meta['format_version']!r}, this code reads {FORMAT_VERSION}")
    if meta["architecture"] not in ARCHITECTURES:
        raise CheckpointError(f"{f}: unknown architecture {meta['architecture']!r} (known: {sorted(ARCHITECTURES)})")
    if not isinstance(meta["config"], dict):
        raise CheckpointError(f"{f}: config must be an object")
    return meta["architecture"], DrafterConfig.from_dict(meta["config"])


def load_drafter(path: str | Path, *, target_embedding: torch.Tensor | None = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> EagleModel:
    """Strictly load a drafter, prepared for inference (`EagleModel.prepare_for_inference`); with
    `target_embedding`, check it fits the target and tie to it."""
    from safetensors import safe_open

    d = Path(path)
    arch, cfg = load_drafter_config(d)
    model = ARCHITECTURES[arch](cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wfile = d / WEIGHTS_FILE
    if not wfile.exists():
        raise CheckpointError(f"{d}: {WEIGHTS_FILE} is missing")
    try:
        with safe_open(str(wfile), framework="pt", device="cpu") as st:
            tensors = {k: st.get_tensor(k) for k in st.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{wfile}: cannot read (corrupt or truncated?): {exc}") from exc
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    mismatched = [f"{k}: checkpoint {list(tensors[k].shape)} vs model {list(expected[k])}"
                  for k in sorted(set(expected) & set(tensors)) if tuple(tensors[k].shape) != expected[k]]
    bad = [k for k, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    problems = describe_misfit({"missing tensors": missing, "unexpected tensors": unexpected,
                                "shape mismatches": mismatched, "NaN/inf in": bad})
    if problems:
        raise CheckpointError(f"drafter in {d} does not fit its config: {problems}")
    model.load_state_dict(tensors, strict=True)
    model = model.to(device=device, dtype=dtype).eval()
    model.prepare_for_inference()  # fused projections and the delay table (engines run it; training copies it)
    if target_embedding is not None:
        model.tie_to(target_embedding)
    logger.info("loaded %s drafter (%d layer(s), window %s) from %s", arch, cfg.num_layers, cfg.sliding_window, d)
    return model
