"""Declared capabilities of targets and drafters, and the load-time audio decision.

A drafter gets the audio embedding of each drafted position only when both sides declare it:
- the target *produces* per-position multimodal embeddings (`produces_multimodal_embeddings`
  class flag, True for the realtime engine's target: its encoder cache holds one audio embedding
  per LM position);
- the drafter *accepts* them: it subclasses / declares `SupportsMultiModalEmbeddings`
  (`supports_multimodal_embeddings: ClassVar[Literal[True]]`). Having an `embed_input_ids`
  method with the right signature is not a declaration: capabilities are declared, not probed
  (DESIGN §4), so a look-alike drafter drafts text-only, with one warning naming its class.

The decision is made once, at drafter load; buffers that depend on it are allocated afterwards.
"""

from __future__ import annotations

import logging
from typing import ClassVar, Literal, Protocol

import torch
from typing_extensions import TypeIs

logger = logging.getLogger(__name__)


class SupportsMultiModalEmbeddings(Protocol):
    """A drafter whose input embedding can merge per-position multimodal (audio) embeddings.

    `embed_input_ids` is the one entry point where token and audio embeddings are merged:
    `input_ids` [T] -> [T, H]; `multimodal_embeddings` [T, H] aligned with `input_ids` (None:
    text only); `is_multimodal` [T] bool marks the rows whose multimodal embedding is valid
    (None: all rows of a given `multimodal_embeddings`).
    """

    # The value makes explicit subclasses declare the capability (as vLLM's SupportsMultiModal).
    supports_multimodal_embeddings: ClassVar[Literal[True]] = True

    def embed_input_ids(self, input_ids: torch.Tensor, multimodal_embeddings: torch.Tensor | None = None, *,
                        is_multimodal: torch.Tensor | None = None) -> torch.Tensor: ...


def supports_multimodal_embeddings(model: object) -> TypeIs[SupportsMultiModalEmbeddings]:
    """True only if the model's class declares the capability (the flag is exactly True)."""
    return getattr(type(model), "supports_multimodal_embeddings", False) is True


class SupportsParallelDrafting(Protocol):
    """A drafter that drafts all positions of a round in one pass: the rows after the first carry
    `mask_token_id` in place of their (not yet drafted) token, plus their own audio embedding."""

    supports_parallel_drafting: ClassVar[Literal[True]] = True
    mask_token_id: int


def supports_parallel_drafting(model: object) -> TypeIs[SupportsParallelDrafting]:
    """True only if the drafter's class declares parallel drafting (the flag is exactly True)."""
    return getattr(type(model), "supports_parallel_drafting", False) is True


class SupportsTwoPassDrafting(Protocol):
    """A drafter that drafts a round in two passes: the catch-up pass drafts the first token, then
    one pass over the positions after it, the first of which reads that draft and the rest
    `mask_token_id` (see `speculative.drafter.TwoPassEagleDrafter`)."""

    supports_two_pass_drafting: ClassVar[Literal[True]] = True
    mask_token_id: int


def supports_two_pass_drafting(model: object) -> TypeIs[SupportsTwoPassDrafting]:
    """True only if the drafter's class declares two-pass drafting (the flag is exactly True)."""
    return getattr(type(model), "supports_two_pass_drafting", False) is True


# the most drafts per round a CPU engine makes by default: there every verified row costs compute, and on the 2-core
# CPU box the shipped drafter (trained for 10) ran offline at 19.7x real time with 10 drafts, 21.1x with 6 and 21.2x
# with 4 (fp32, batch 1; docs/benchmarks.md, issue 5, forty-sixth session), where a GPU's round costs about the same
# for any k and 10 was fastest
CPU_MAX_DEFAULT_DRAFTS = 6


def default_num_speculative_tokens(drafter: object, device: torch.device | str | None = None) -> int:
    """Drafts per round when the user gives no number. A chained drafter pays one more dependent
    drafter pass per draft, so its best measured k on the H200 was 3-4 (docs/benchmarks.md, issue 5);
    a parallel or two-pass drafter pays the same passes whatever k, and measured best at 6 with the drafters
    trained to draft 6. A drafter whose config records the drafts it was trained for (`draft_tokens`) gets that
    many, on the CPU (`device`) at most `CPU_MAX_DEFAULT_DRAFTS`; off the CPU its config's `gpu_draft_tokens`,
    where a benchmark recorded one, comes first."""
    config = getattr(drafter, "config", None)
    trained = getattr(config, "draft_tokens", None)  # both validated by DrafterConfig
    on_gpu = getattr(config, "gpu_draft_tokens", None)
    on_cpu = device is not None and torch.device(device).type == "cpu"
    if on_gpu is not None and not on_cpu:
        return on_gpu
    if trained is not None:
        return min(trained, CPU_MAX_DEFAULT_DRAFTS) if on_cpu else trained
    return 6 if supports_parallel_drafting(drafter) or supports_two_pass_drafting(drafter) else 4


def produces_multimodal_embeddings(target: object) -> bool:
    """True if the target declares that it produces one multimodal embedding per LM position."""
    return getattr(type(target), "produces_multimodal_embeddings", False) is True


def drafter_receives_audio(target: object, drafter: object) -> bool:
    """The load-time decision: audio embeddings go to the drafter only if both sides declare it.

    Logs one warning (naming the drafter class) when the drafter will draft text-only.
    """
    name = type(drafter).__qualname__
    if not produces_multimodal_embeddings(target):
        logger.info("target %s produces no multimodal embeddings: drafter %s drafts text-only",
                    type(target).__qualname__, name)
        return False
    if not supports_multimodal_embeddings(drafter):
        has_method = callable(getattr(drafter, "embed_input_ids", None))
        logger.warning("drafter %s does not declare supports_multimodal_embeddings%s: it drafts text-only "
                       "(no audio embeddings), expect a lower acceptance rate", name,
                       " (it has an embed_input_ids method, but a signature is not a declaration)"
                       if has_method else "")
        return False
    return True
