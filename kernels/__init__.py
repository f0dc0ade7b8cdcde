"""GPU kernels of the engine's hot path, each with a plain-PyTorch reference that defines it.

Dependency rule: this package imports only `torch` and `triton` (plus the standard library): never
numpy, never `realtime` or any other project package, so it can be tested, benchmarked and reused
on its own. Triton is imported lazily, only when a kernel runs: without it (e.g. torch builds for
macOS) the torch references still work.

- `gather_add_embeddings`: the decode step's `embed(token) + audio_embedding` gather into the
  persistent `inputs_embeds` buffer.
- `write_kv` / `paged_attention`: short-query attention (decode, encoder step, speculative
  verify) over paged key/value caches addressed through per-sequence ring block tables.
- `fused_ops`: residual add + RMS norm (+ delay scale), RoPE for q and k, SiLU·mul.
- `linear`: projections of 1-16 rows in one launch (batch 1's step), `F.linear` otherwise.
- `one_row`: an LM layer's projections for ONE row with their neighbours folded in (norm + qkv + RoPE +
  KV write, o + residual, norm + gate/up + SiLU·mul, down + residual, final norm + head): the engine's
  batch-1 LM step on CUDA (8 kernels a layer instead of 11: its gate/up stays unfused by default,
  STREAMSCRIBE_ONE_ROW_GATE_UP=1 fuses it; STREAMSCRIBE_ONE_ROW=0 turns the path off).
- `spec_round`: a speculative round's step metadata and its greedy acceptance, computed from one stream's state on
  the device, one launch each (the engine's chained rounds: no host round trip between rounds).

The dispatching functions take `backend="auto" | "triton" | "torch"`: "auto" runs Triton on CUDA
tensors and the reference elsewhere; "triton" on CPU tensors works only under the Triton interpreter
(`TRITON_INTERPRET=1`, which is how the CPU test suite runs the kernels).

On sm_90+ every Triton kernel but `spec_round`'s two (one small program each) launches with programmatic dependent
launch (`_dispatch.pdl_enabled`):
it may start while the previous kernel runs and waits for its results before reading them. Switches
for A/B runs (read at launch, so at graph capture): STREAMSCRIBE_PDL=0 (no PDL),
STREAMSCRIBE_SKINNY_ROWS=N (the Triton projection for at most N rows; 0: always `F.linear`),
STREAMSCRIBE_ONE_ROW_CONFIGS (launch configurations of `one_row`, JSON: operation -> [BLOCK_N, BLOCK_K,
warps, stages, dot]), STREAMSCRIBE_SPLIT_K=0 (`linear` never cuts its K loop), STREAMSCRIBE_ATTN_MIN_KEYS=N (the
fewest keys per attention split).
"""

from ._dispatch import HAVE_TRITON
from .gather_add import gather_add_embeddings, gather_add_reference
from .paged_attention import (
    RunsPlan,
    paged_attention,
    paged_attention_reference,
    paged_attention_runs,
    ring_table_width,
    write_kv,
    write_kv_reference,
)

__all__ = [
    "HAVE_TRITON",
    "RunsPlan",
    "gather_add_embeddings",
    "gather_add_reference",
    "paged_attention",
    "paged_attention_reference",
    "paged_attention_runs",
    "ring_table_width",
    "write_kv",
    "write_kv_reference",
]
