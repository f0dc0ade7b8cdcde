"""streamscribe's model core: config, audio front-end, tokenizer, network, loader, sessions, engine.

May import torch, numpy, safetensors, soundfile, mistral-common, tokenizers and `kernels`; never
`stream_server` or `speculative`.
"""
