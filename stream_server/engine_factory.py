"""Builds the transcription engine the server talks to (through `realtime.serving` only).

One function, so that a new engine (`--engine batched`) is one more branch here.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from realtime.model_store import load_model_and_tokenizer
from realtime.serving import TranscriptionEngine

logger = logging.getLogger(__name__)

ENGINES = ("batched", "sequential")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_engine(kind: str, model: str, *, model_name: str, device: str = "cpu", dtype: str | None = None,
                 max_streams: int = 64, cuda_graphs: bool = True, encoder_stream: bool = True,
                 max_session_seconds: float | None = None,
                 kv_memory_fraction: float = 0.9, drafter: str | None = None,
                 num_speculative_tokens: int | None = None, tree_nodes: int | None = None,
                 tree_max_streams: int | None = 1, max_verify_rows: int | None = None) -> TranscriptionEngine:
    """Load `model` (a folder or "default") and wrap it in the engine `kind` (not started).
    `num_speculative_tokens` None: the drafter's kind decides (`default_num_speculative_tokens`);
    `tree_nodes`: tree verification of that many draft nodes per round (parallel drafters), in steps
    where at most `tree_max_streams` streams draft (None: every step); `max_verify_rows`: the most verify rows a
    step takes across its streams (None: the device's default, 32 on the CPU, no limit on CUDA)."""
    if kind not in ENGINES:
        raise ValueError(f"unknown engine {kind!r} (available: {', '.join(ENGINES)})")
    if tree_nodes is not None and drafter is None:
        raise ValueError("--tree-nodes needs --drafter (a parallel drafter)")
    if max_verify_rows is not None and drafter is None:
        raise ValueError("--max-verify-rows needs --drafter")
    torch_dtype = DTYPES[dtype or ("bfloat16" if device.startswith("cuda") else "float32")]
    net, tokenizer = load_model_and_tokenizer(model, device=device, dtype=torch_dtype)
    logger.info("loaded model %s on %s (%s)", model, device, torch_dtype)
    if kind == "sequential":
        if drafter is not None:
            raise ValueError("--drafter needs the batched engine")
        from realtime.sequential_engine import SequentialEngine

        return SequentialEngine(net, tokenizer, model_name=model_name, max_streams=max_streams)
    if kind == "batched":
        from realtime.engine import BatchedEngine, RunnerOptions
        from realtime.engine.engine import bytes_per_stream
        from realtime.engine.speculation import step_tokens_for

        speculative = None
        if drafter is not None:  # lossless speculation for backlogged streams (catch-up, flush, files)
            from realtime.engine.offline import speculative_config

            speculative = speculative_config(net, drafter, k=num_speculative_tokens, tree_nodes=tree_nodes,
                                             tree_max_streams=tree_max_streams, max_verify_rows=max_verify_rows)
            logger.info("drafter %s, %d draft tokens per round%s", type(speculative.drafter).__name__,
                        speculative.num_speculative_tokens, f", a tree of {tree_nodes} nodes" if tree_nodes else "")
        # a verify runs k + 1 rows a stream (12 drafts: the shipped drafter's on a GPU)
        step_tokens = step_tokens_for(speculative.num_speculative_tokens if speculative is not None else 0)
        opts = RunnerOptions(max_streams=max_streams, max_batch=max_streams, cuda_graphs=cuda_graphs,
                             encoder_stream=encoder_stream, max_session_seconds=max_session_seconds,
                             max_step_tokens=step_tokens)
        if net.device.type == "cuda":
            # capacity is known up front: never admit more streams than their worst-case memory fits
            # (with speculation: the drafter's KV, a tree's scratch blocks and the deeper audio ring too)
            per_stream = bytes_per_stream(net, opts, speculative)
            free = torch.cuda.mem_get_info(net.device)[0]
            fit = int(kv_memory_fraction * free // per_stream)
            if fit < max_streams:
                logger.warning("KV memory fits %d streams of %.0f MiB worst case (asked for %d)", fit,
                               per_stream / 2**20, max_streams)
                opts = dataclasses.replace(opts, max_streams=max(1, fit), max_batch=max(1, fit))
        return BatchedEngine(net, tokenizer, opts=opts, model_name=model_name, speculative=speculative)
    raise AssertionError(kind)  # unreachable: checked above
