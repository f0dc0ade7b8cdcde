"""streamscribe's model core: config, audio front-end, tokenizer, network, loader, sessions, engine.

May import torch, numpy, safetensors, soundfile, mistral-common, tokenizers, `kernels`, and (in the
engine, to run drafters) `speculative`; never `stream_server`.
"""
