"""The batched realtime engine: many streams per step, paged sliding-window KV, CUDA graphs.

Files: `kv_cache` (paged caches, ring block tables, admission arithmetic), `stream` (per-stream
state), `scheduler` (who runs this step), `attention` (the paged attention backend),
`model_runner` (buffers and the network steps), `cuda_graph` (decode-step graphs), `lookahead` (the
encoder step), `prompt_prefix` (joins without a prefill: the prompt's silent prefix from a cache),
`speculation` (drafts and verification), `chained_rounds` (a lone stream's speculative rounds back to back
on the device), `offline` (files through the engine), `engine` (thread,
client interface, the step loop).
"""

from .engine import BatchedEngine
from .model_runner import RunnerOptions

__all__ = ["BatchedEngine", "RunnerOptions"]
