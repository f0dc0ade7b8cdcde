"""The Voxtral-Realtime network in plain PyTorch: causal audio encoder, adapter, delay-conditioned LM.

Parameter names follow transformers' `VoxtralRealtimeModel` (`audio_tower.*`,
`multi_modal_projector.*`, `language_model.*`) so checkpoints map one to one.

Every tensor is laid out `[batch, tokens, ...]`. Attention layers never own a cache: each call
gets an `AttentionBackend` that stores keys/values and knows the positions and windows of the
current tokens (dense for training and parity tests, a sliding cache for one stream, paged blocks
in the batched engine). The network code is therefore the same everywhere.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import DecoderConfig, EncoderConfig, ModelConfig


class AttentionBackend(Protocol):
    """Stores the new keys/values of layer `layer` and returns attention outputs for `q`.

    q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] (RoPE already applied). Returns [B, T, Hq, D].
    """

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32, cast back, then scale: the reference's order of operations.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class FrequencyTable:
    """Inverse frequencies of a sinusoidal table, built once per device.

    Kept out of the module's buffers on purpose: models are built on the meta device and then
    materialised with `to_empty`, which would leave buffers uninitialised; and a step replayed
    from a CUDA graph must not copy anything from the host.
    """

    def __init__(self, make: "callable[[], torch.Tensor]") -> None:
        self._make = make
        self._per_device: dict[torch.device, torch.Tensor] = {}

    def on(self, device: torch.device) -> torch.Tensor:
        t = self._per_device.get(device)
        if t is None:
            t = self._per_device[device] = self._make().to(device)
        return t


def rope_inv_freq(head_dim: int, theta: float) -> FrequencyTable:
    return FrequencyTable(lambda: 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)))


def rope_cos_sin(positions: torch.Tensor, inv_freq: FrequencyTable, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for integer `positions` (any shape) -> [..., head_dim] in `dtype`."""
    freqs = positions.float()[..., None] * inv_freq.on(positions.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos/sin: [B, T, D] (rotate_half convention)."""
    return x * cos[:, :, None, :] + _rotate_half(x) * sin[:, :, None, :]


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, *, q_bias: bool, v_bias: bool,
                 o_bias: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=q_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=v_bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=o_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend,
                layer: int) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = backend.attend(layer, q, k, v)
        return self.o_proj(out.reshape(b, t, self.heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int, *, down_bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=down_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ---------------------------------------------------------------------------------------
# Audio encoder
# ---------------------------------------------------------------------------------------
class ConvStem(nn.Module):
    """Two causal convolutions (k3 s1, k3 s2) with exact GELU: 100 Hz mel -> 50 Hz frames.

    Causality is carried by an explicit state: the last 2 mel frames (conv1) and the last conv1
    output frame (conv2); a fresh state is zeros, which equals the reference's causal zero pad.
    """

    def __init__(self, n_mels: int, hidden: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, hidden, kernel_size=3)
        self.conv2 = nn.Conv1d(hidden, hidden, kernel_size=3, stride=2)

    def initial_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros(batch, self.conv1.in_channels, 2, device=device, dtype=dtype),
                torch.zeros(batch, self.conv2.in_channels, 1, device=device, dtype=dtype))

    def forward(self, mel: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """mel: [B, n_mels, F] with F even -> frames [B, F/2, hidden] and the new state."""
        if mel.shape[-1] % 2:
            raise ValueError(f"conv stem needs an even number of mel frames, got {mel.shape[-1]}")
        x1 = torch.cat([state[0], mel], dim=-1)
        y1 = F.gelu(self.conv1(x1))
        x2 = torch.cat([state[1], y1], dim=-1)
        y2 = F.gelu(self.conv2(x2))
        return y2.transpose(1, 2), (x1[..., -2:], x2[..., -1:])


class EncoderLayer(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.num_heads, c.num_heads, c.head_dim, q_bias=True, v_bias=True,
                                   o_bias=True)
        self.self_attn_layer_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.final_layer_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size, down_bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend,
                layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), cos, sin, backend, layer)
        return x + self.mlp(self.final_layer_norm(x))


class AudioEncoder(nn.Module):
    def __init__(self, c: EncoderConfig, n_mels: int) -> None:
        super().__init__()
        self.config = c
        self.embedder = ConvStem(n_mels, c.hidden_size)
        self.layers = nn.ModuleList([EncoderLayer(c) for _ in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta)

    def forward(self, frames: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        """frames: [B, T, hidden] conv-stem output; positions: [B, T] encoder frame indices."""
        cos, sin = rope_cos_sin(positions, self.inv_freq, frames.dtype)
        x = frames
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, backend, i)
        return self.norm(x)


class AudioAdapter(nn.Module):
    """Stacks `factor` consecutive encoder frames and projects them to one LM embedding."""

    def __init__(self, enc_hidden: int, factor: int, lm_hidden: int) -> None:
        super().__init__()
        self.factor = factor
        self.linear_1 = nn.Linear(enc_hidden * factor, lm_hidden, bias=False)
        self.linear_2 = nn.Linear(lm_hidden, lm_hidden, bias=False)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        b, t, h = frames.shape
        if t % self.factor:
            raise ValueError(f"adapter needs a multiple of {self.factor} encoder frames, got {t}")
        return self.linear_2(F.gelu(self.linear_1(frames.reshape(b, t // self.factor, h * self.factor))))


# ---------------------------------------------------------------------------------------
# Language model
# ---------------------------------------------------------------------------------------
def delay_inv_freq(dim: int) -> FrequencyTable:
    half = dim // 2
    return FrequencyTable(lambda: torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half))


def delay_embedding(delay_tokens: torch.Tensor, inv_freq: FrequencyTable, dtype: torch.dtype) -> torch.Tensor:
    """Sinusoidal embedding of the number of delay tokens: [..] -> [.., dim].

    Computed in `dtype` like the reference (which uses the embedding dtype).
    """
    t = delay_tokens.to(dtype)[..., None] * inv_freq.on(delay_tokens.device).to(dtype)
    return torch.cat([t.cos(), t.sin()], dim=-1)


class DelayConditioning(nn.Module):
    """`1 + W2 gelu(W1 t_cond)`: the per-layer scale of the MLP input."""

    def __init__(self, hidden: int, cond_dim: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(hidden, cond_dim, bias=False)
        self.linear2 = nn.Linear(cond_dim, hidden, bias=False)

    def forward(self, t_cond: torch.Tensor) -> torch.Tensor:
        return self.linear2(F.gelu(self.linear1(t_cond)))


class DecoderLayer(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, q_bias=False,
                                   v_bias=False, o_bias=False)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size, down_bias=False)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.ada_rms_norm = DelayConditioning(c.hidden_size, c.ada_cond_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, t_cond: torch.Tensor,
                backend: AttentionBackend, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, backend, layer)
        h = self.post_attention_layernorm(x) * (1 + self.ada_rms_norm(t_cond))
        return x + self.mlp(h)


class LanguageModel(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta)

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, t_cond: torch.Tensor,
                backend: AttentionBackend) -> torch.Tensor:
        """inputs_embeds: [B, T, H]; positions: [B, T]; t_cond: [B, T, H] or broadcastable."""
        cos, sin = rope_cos_sin(positions, self.inv_freq, inputs_embeds.dtype)
        x = inputs_embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, t_cond, backend, i)
        return self.norm(x)


class VoxtralRealtime(nn.Module):
    """Encoder + adapter + LM. Methods are the steps the sessions and the engine compose."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.audio_tower = AudioEncoder(config.encoder, config.audio.num_mel_bins)
        self.multi_modal_projector = AudioAdapter(config.encoder.hidden_size, config.streaming.downsample_factor,
                                                  config.decoder.hidden_size)
        self.language_model = LanguageModel(config.decoder)
        if not config.decoder.tie_word_embeddings:
            self.lm_head = nn.Linear(config.decoder.hidden_size, config.decoder.vocab_size, bias=False)
        self.delay_inv_freq = delay_inv_freq(config.decoder.hidden_size)

    @property
    def device(self) -> torch.device:
        return self.language_model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.language_model.embed_tokens.weight.dtype

    def head_weight(self) -> torch.Tensor:
        if self.config.decoder.tie_word_embeddings:
            return self.language_model.embed_tokens.weight
        return self.lm_head.weight

    # -- steps ------------------------------------------------------------------------------
    def encode(self, mel: torch.Tensor, conv_state: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor,
               backend: AttentionBackend) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """mel [B, n_mels, 8k] -> audio embeddings [B, k, lm_hidden] and the new conv state."""
        frames, conv_state = self.audio_tower.embedder(mel.to(self.dtype), conv_state)
        hidden = self.audio_tower(frames, positions, backend)
        return self.multi_modal_projector(hidden), conv_state

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.embed_tokens(ids)

    def t_cond(self, delay_tokens: torch.Tensor) -> torch.Tensor:
        return delay_embedding(delay_tokens, self.delay_inv_freq, self.dtype)

    def decode(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, t_cond: torch.Tensor,
               backend: AttentionBackend) -> torch.Tensor:
        return self.language_model(inputs_embeds, positions, t_cond, backend)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.head_weight())

    # -- whole-sequence forward (training, teacher forcing, parity checks) ---------------------
    def forward(self, input_ids: torch.Tensor, mel: torch.Tensor, delay_tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits for whole sequences.

        input_ids: [B, T]; mel: [B, n_mels, 8T] (left/right padded audio); delay_tokens: [B] (may
        differ per row). Returns logits [B, T, vocab] (float32).
        """
        from .attention import DenseAttention

        b, t = input_ids.shape
        if mel.shape[-1] < t * self.config.streaming.mel_frames_per_token:
            raise ValueError(f"mel has {mel.shape[-1]} frames, {t} tokens need {t * self.config.streaming.mel_frames_per_token}")
        mel = mel[..., : t * self.config.streaming.mel_frames_per_token]
        dev = input_ids.device
        enc_pos = torch.arange(t * self.config.streaming.downsample_factor, device=dev).expand(b, -1)
        conv0 = self.audio_tower.embedder.initial_state(b, dev, self.dtype)
        audio, _ = self.encode(mel, conv0, enc_pos, DenseAttention(enc_pos, self.config.encoder.sliding_window))
        embeds = self.embed_tokens(input_ids) + audio
        pos = torch.arange(t, device=dev).expand(b, -1)
        t_cond = self.t_cond(delay_tokens.to(dev))[:, None, :]
        hidden = self.decode(embeds, pos, t_cond, DenseAttention(pos, self.config.decoder.sliding_window))
        return self.logits(hidden).float()
