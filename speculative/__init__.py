"""Speculative decoding for streamscribe: a multimodal Eagle drafter, its capability contract, training.

Job: propose several tokens per stream per step so that a stream with buffered audio (catch-up,
end-of-stream flush, offline files) advances faster than one token per step; the batched engine
(`realtime.engine.speculation`) verifies the proposals with the target model, losslessly.

Files:
- `capability`: the `SupportsMultiModalEmbeddings`, `SupportsParallelDrafting` and
  `SupportsTwoPassDrafting` protocols, their
  `TypeIs` guards, the target-side flag, and the load-time decision whether a drafter receives audio
  embeddings.
- `drafter`: the Eagle drafter network (fc over [fused input embedding; target hidden], decoder
  layer(s), tied embedding/head borrowed from the target), its one-pass and two-pass variants
  (`ParallelEagleDrafter`, `TwoPassEagleDrafter`) and the checkpoint format.
- `train`: distillation of a drafter from a target checkpoint on audio (CLI).

Imports allowed: torch, safetensors, numpy, typing_extensions and the model-level parts of
`realtime` (config, model, attention, audio, loader, session, tokenizer); `train` may also use
`realtime.engine` (its offline path labels the training audio), `realtime.train.regularize`
(dropout) and `realtime.train.presynth` / `.synth` (the default model's packed training shards as audio). Nothing under `realtime.engine` is imported by `capability` or `drafter`, so the engine can import them without a cycle.
"""

from .capability import (
    CPU_MAX_DEFAULT_DRAFTS,
    SupportsMultiModalEmbeddings,
    SupportsParallelDrafting,
    SupportsTwoPassDrafting,
    default_num_speculative_tokens,
    drafter_receives_audio,
    produces_multimodal_embeddings,
    supports_multimodal_embeddings,
    supports_parallel_drafting,
    supports_two_pass_drafting,
)
from .drafter import (
    DrafterConfig,
    EagleDrafter,
    EagleModel,
    ParallelEagleDrafter,
    TwoPassEagleDrafter,
    load_drafter,
    save_drafter,
)

__all__ = [
    "DrafterConfig",
    "EagleDrafter",
    "EagleModel",
    "ParallelEagleDrafter",
    "SupportsMultiModalEmbeddings",
    "SupportsParallelDrafting",
    "SupportsTwoPassDrafting",
    "TwoPassEagleDrafter",
    "CPU_MAX_DEFAULT_DRAFTS",
    "default_num_speculative_tokens",
    "drafter_receives_audio",
    "load_drafter",
    "produces_multimodal_embeddings",
    "save_drafter",
    "supports_multimodal_embeddings",
    "supports_parallel_drafting",
    "supports_two_pass_drafting",
]
