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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from typing_extensions import TypeIs

from kernels import one_row
from kernels.fused_ops import add_rms_norm, rope, rope_write_kv, rope_write_kv_enabled, silu_mul
from kernels.linear import INVARIANT_ROWS, MAX_ROWS, linear

from .config import DecoderConfig, EncoderConfig, ModelConfig


class AttentionBackend(Protocol):
    """Stores the new keys/values of layer `layer` and returns attention outputs for `q`.

    q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] (RoPE already applied). Returns [B, T, Hq, D].
    """

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class SupportsFusedKVWrite(AttentionBackend, Protocol):
    """A backend whose keys/values the model may write itself (the one-row q/k/v projection,
    `one_row.norm_qkv_rope_kv`, or RoPE, `fused_ops.rope_write_kv`): it names the cache and the slots of the
    step's rows, then attends over what is in the cache."""

    supports_fused_kv_write: ClassVar[Literal[True]] = True

    def kv_destination(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(k_cache, v_cache, slot_mapping [T]) where the rows' keys and values of `layer` go (T = 1: one row)."""
        ...

    def attend_cached(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """`attend` for q [1, T, Hq, D] whose keys/values are already in the cache."""
        ...


def supports_fused_kv_write(backend: object) -> TypeIs[SupportsFusedKVWrite]:
    """True only if the backend's class declares the capability (the flag is exactly True)."""
    return getattr(type(backend), "supports_fused_kv_write", False) is True


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, scale: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight * rms_norm(x + residual) [* scale], x + residual).

        Normalises in fp32, casts back, then scales: the reference's order of operations. Taking the
        residual add and the delay scale here lets CUDA run the whole chain as one kernel.
        """
        return add_rms_norm(x, residual, self.weight, self.eps, scale)


class FrequencyTable:
    """Inverse frequencies of a sinusoidal table, built once per device.

    Kept out of the module's buffers on purpose: models are built on the meta device and then
    materialised with `to_empty`, which would leave buffers uninitialised; and a step replayed
    from a CUDA graph must not copy anything from the host.
    """

    def __init__(self, make: Callable[[], torch.Tensor]) -> None:
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


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, *, q_bias: bool, v_bias: bool,
                 o_bias: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=q_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=v_bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=o_bias)
        self._qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.linear_rows = MAX_ROWS  # rows per call that take `linear`'s batch-invariant kernel (encoder: more)

    def fuse(self) -> None:
        """One [q;k;v] matrix for inference; q/k/v weights become views of it (no extra memory)."""
        w = torch.cat([self.q_proj.weight.data, self.k_proj.weight.data, self.v_proj.weight.data])
        nq, nk = self.q_proj.out_features, self.k_proj.out_features
        self.q_proj.weight.data, self.k_proj.weight.data, self.v_proj.weight.data = w[:nq], w[nq:nq + nk], w[nq + nk:]
        b = None
        if self.q_proj.bias is not None or self.v_proj.bias is not None:
            zeros = lambda n: torch.zeros(n, device=w.device, dtype=w.dtype)
            b = torch.cat([self.q_proj.bias.data if self.q_proj.bias is not None else zeros(nq), zeros(nk),
                           self.v_proj.bias.data if self.v_proj.bias is not None else zeros(nk)])
            if self.q_proj.bias is not None:
                self.q_proj.bias.data = b[:nq]
            if self.v_proj.bias is not None:
                self.v_proj.bias.data = b[nq + nk:]
        self._qkv = (w, b)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend,
                layer: int) -> torch.Tensor:
        b, t, _ = x.shape
        if self._qkv is not None and not torch.is_grad_enabled():  # training keeps separate leaves
            nq, nk = self.heads * self.head_dim, self.kv_heads * self.head_dim
            q, k, v = linear(x, *self._qkv, max_rows=self.linear_rows).split([nq, nk, nk], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.reshape(b, t, self.heads, self.head_dim)
        k = k.reshape(b, t, self.kv_heads, self.head_dim)
        v = v.reshape(b, t, self.kv_heads, self.head_dim)
        if rope_write_kv_enabled() and supports_fused_kv_write(backend):  # one launch for RoPE and the KV write
            k_cache, v_cache, slots = backend.kv_destination(layer)
            out = backend.attend_cached(layer, rope_write_kv(q, k, v, cos, sin, k_cache, v_cache, slots))
        else:
            q, k = rope(q, k, cos, sin)
            out = backend.attend(layer, q, k, v)
        return linear(out.reshape(b, t, self.heads * self.head_dim), self.o_proj.weight, self.o_proj.bias,
                      max_rows=self.linear_rows)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int, *, down_bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=down_bias)
        self._gate_up: torch.Tensor | None = None
        self.linear_rows = MAX_ROWS  # as Attention.linear_rows

    def fuse(self) -> None:
        w = torch.cat([self.gate_proj.weight.data, self.up_proj.weight.data])
        n = self.gate_proj.out_features
        self.gate_proj.weight.data, self.up_proj.weight.data = w[:n], w[n:]
        self._gate_up = w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._gate_up is not None and not torch.is_grad_enabled():
            rows = self.linear_rows
            return linear(silu_mul(linear(x, self._gate_up, max_rows=rows)), self.down_proj.weight,
                          self.down_proj.bias, max_rows=rows)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@contextmanager
def _rows_set(attrs: list[tuple[object, str]], new: Callable[[int], int]) -> Iterator[None]:
    """Within: each (object, attribute) of `attrs` (a `linear` max_rows) holds new(its value); restored on exit, also
    after an exception."""
    saved = [getattr(o, a) for o, a in attrs]
    for o, a in attrs:
        setattr(o, a, new(getattr(o, a)))
    try:
        yield
    finally:
        for (o, a), v in zip(attrs, saved):
            setattr(o, a, v)


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
        self.linear_rows = INVARIANT_ROWS  # CUDA inference: `linear`'s max_rows (`VoxtralRealtime.encoder_rows`)

    def initial_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros(batch, self.conv1.in_channels, 2, device=device, dtype=dtype),
                torch.zeros(batch, self.conv2.in_channels, 1, device=device, dtype=dtype))

    def forward(self, mel: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """mel: [B, n_mels, F] with F even -> frames [B, F/2, hidden] and the new state."""
        if mel.shape[-1] % 2:
            raise ValueError(f"conv stem needs an even number of mel frames, got {mel.shape[-1]}")
        x1 = torch.cat([state[0], mel], dim=-1)
        if torch.is_grad_enabled() or not x1.is_cuda:  # training, and the CPU: the convolutions themselves
            y1 = F.gelu(self.conv1(x1))
            x2 = torch.cat([state[1], y1], dim=-1)
            y2 = F.gelu(self.conv2(x2))
            return y2.transpose(1, 2), (x1[..., -2:], x2[..., -1:])
        # CUDA inference: each convolution as one matrix product over its input windows, time-major. A
        # streaming step convolves a handful of frames, where cuDNN spent more time converting the
        # weights' layout (NCHW -> NHWC, every call) than convolving (H200 kernel profile, B1).
        return self.forward_as_matmuls(x1, state[1])

    def forward_as_matmuls(self, x1: torch.Tensor, state2: torch.Tensor
                           ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """`forward` after its first concatenation (x1 = [conv1 state; mel]), the convolutions as
        matrix products (any device; tested against the convolutions on the CPU)."""
        y1 = F.gelu(_conv_as_linear(x1.transpose(1, 2), self.conv1, self.linear_rows))  # [B, F, hidden]
        x2 = torch.cat([state2.transpose(1, 2), y1], dim=1)
        y2 = F.gelu(_conv_as_linear(x2, self.conv2, self.linear_rows))
        return y2, (x1[..., -2:], x2[:, -1:].transpose(1, 2))


def _conv_as_linear(x: torch.Tensor, conv: nn.Conv1d, max_rows: int) -> torch.Tensor:
    """`conv` (no padding or dilation) of time-major x [B, L, C_in] -> [B, L_out, C_out]: the windows
    [B, L_out, C_in, k] flattened channel-major match the weight [C_out, C_in, k] viewed as a matrix."""
    (k,), (stride,) = conv.kernel_size, conv.stride
    windows = x.unfold(1, k, stride)  # [B, L_out, C_in, k]
    b, n = windows.shape[:2]
    return linear(windows.reshape(b, n, -1), conv.weight.reshape(conv.out_channels, -1), conv.bias,
                  max_rows=max_rows)


class EncoderLayer(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.num_heads, c.num_heads, c.head_dim, q_bias=True, v_bias=True,
                                   o_bias=True)
        self.self_attn_layer_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.final_layer_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size, down_bias=True)
        # an encoder call's rows are its streams' new frames: row by row the same result whatever the chunk
        # (a look-ahead of 8 audio tokens gives the bits of 8 one-token steps: lossless speculation)
        self.self_attn.linear_rows = self.mlp.linear_rows = INVARIANT_ROWS

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                backend: AttentionBackend, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(mlp output, residual stream): the caller adds them (fused into the next norm)."""
        h, residual = self.self_attn_layer_norm(x, residual)
        h, residual = self.final_layer_norm(self.self_attn(h, cos, sin, backend, layer), residual)
        return self.mlp(h), residual


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
        x, residual = frames, None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, cos, sin, backend, i)
        return self.norm(x, residual)[0]


class AudioAdapter(nn.Module):
    """Stacks `factor` consecutive encoder frames and projects them to one LM embedding."""

    def __init__(self, enc_hidden: int, factor: int, lm_hidden: int) -> None:
        super().__init__()
        self.factor = factor
        self.linear_1 = nn.Linear(enc_hidden * factor, lm_hidden, bias=False)
        self.linear_2 = nn.Linear(lm_hidden, lm_hidden, bias=False)
        self.linear_rows = INVARIANT_ROWS  # `linear`'s max_rows (`VoxtralRealtime.encoder_rows`)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        b, t, h = frames.shape
        if t % self.factor:
            raise ValueError(f"adapter needs a multiple of {self.factor} encoder frames, got {t}")
        stacked = frames.reshape(b, t // self.factor, h * self.factor)
        h = linear(stacked, self.linear_1.weight, max_rows=self.linear_rows)
        return linear(F.gelu(h), self.linear_2.weight, max_rows=self.linear_rows)


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

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                ada_scale: torch.Tensor, backend: AttentionBackend, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ada_scale = 1 + ada_rms_norm(t_cond): the delay scale of this layer's MLP input."""
        h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(h, cos, sin, backend, layer), residual, ada_scale)
        return self.mlp(h), residual


class LanguageModel(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta)

    def ada_scales(self, t_cond: torch.Tensor) -> list[torch.Tensor]:
        """Per-layer `1 + ada(t_cond)`: depends only on the delay, so engines tabulate it."""
        return [1 + layer.ada_rms_norm(t_cond) for layer in self.layers]

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, t_cond: torch.Tensor | None,
                backend: AttentionBackend, ada_scales: list[torch.Tensor] | torch.Tensor | None = None
                ) -> torch.Tensor:
        """inputs_embeds: [B, T, H]; positions: [B, T]; t_cond: [B, T, H] or broadcastable (or pass
        precomputed `ada_scales`, one [B, T, H]-broadcastable tensor per layer)."""
        cos, sin = rope_cos_sin(positions, self.inv_freq, inputs_embeds.dtype)
        scales = ada_scales if ada_scales is not None else self.ada_scales(t_cond)
        x, residual = inputs_embeds, None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, cos, sin, scales[i], backend, i)
        return self.norm(x, residual)[0]

    def forward_one_row(self, inputs_embeds: torch.Tensor, position: torch.Tensor, ada_scales: torch.Tensor,
                        backend: SupportsFusedKVWrite) -> torch.Tensor:
        """`forward` for ONE row through the fused one-row kernels (`kernels.one_row`, 8 kernels a layer; 6 with
        the gate/up fused too, `one_row.fused_gate_up`):
        inputs_embeds [H], position [1], ada_scales [L, H] -> the residual stream after the last layer [H]
        (the final norm is left to the head, `VoxtralRealtime.one_row_logits`). Needs the fused
        projections of `VoxtralRealtime.fuse_projections`."""
        if not supports_fused_kv_write(backend):
            raise TypeError(f"forward_one_row writes keys/values in the q/k/v projection: the attention backend "
                            f"{type(backend).__name__} does not declare supports_fused_kv_write")
        c = self.config
        cos, sin = rope_cos_sin(position, self.inv_freq, inputs_embeds.dtype)
        cos, sin = cos.reshape(-1), sin.reshape(-1)
        res = inputs_embeds  # the residual stream; the first layer's norm reads the input itself
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            if attn._qkv is None or mlp._gate_up is None:
                raise RuntimeError("forward_one_row needs the fused projections (fuse_projections)")
            k_cache, v_cache, slot = backend.kv_destination(i)
            q = one_row.norm_qkv_rope_kv(res, layer.input_layernorm.weight, c.rms_norm_eps, attn._qkv[0], cos, sin,
                                         k_cache, v_cache, slot, c.num_heads, c.num_kv_heads)
            out = backend.attend_cached(i, q[None, None])
            res = one_row.linear_residual(out.reshape(-1), attn.o_proj.weight, res)
            if one_row.fused_gate_up():
                act = one_row.norm_gate_up_silu(res, layer.post_attention_layernorm.weight, c.rms_norm_eps,
                                                ada_scales[i], mlp._gate_up)
            else:  # the unfused layer's three kernels (norm, projection, SiLU·mul): same rounding
                act = silu_mul(linear(layer.post_attention_layernorm(res, None, ada_scales[i])[0], mlp._gate_up))
            res = one_row.linear_residual(act, mlp.down_proj.weight, res)
        return res


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
        self.head_rows = MAX_ROWS  # rows per `logits` call that take `linear`'s batch-invariant kernel

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

    def decode(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, t_cond: torch.Tensor | None,
               backend: AttentionBackend, ada_scales: list[torch.Tensor] | torch.Tensor | None = None
               ) -> torch.Tensor:
        return self.language_model(inputs_embeds, positions, t_cond, backend, ada_scales)

    def fuse_projections(self) -> None:
        """Fuse q/k/v and gate/up matrices for inference (call once, after weights are in place)."""
        for m in self.modules():
            if isinstance(m, (Attention, SwiGLU)):
                m.fuse()

    @torch.no_grad()
    def prepare_for_inference(self, max_delay_tokens: int | None = None) -> None:
        """Fused projections, and the delay scales of every layer for every delay as one table.

        `ada_table[l, d]` = 1 + ada_l(t_cond(d)): sessions and engines index it instead of running
        two small matmuls per layer per step. It covers delays 0..max_delay_tokens (default: the config's largest
        served delay, which `ModelConfig.delay_tokens` enforces).
        """
        if max_delay_tokens is None:
            max_delay_tokens = self.config.max_delay_tokens
        self.fuse_projections()
        delays = torch.arange(max_delay_tokens + 1, device=self.device)
        self.ada_table = torch.stack(self.language_model.ada_scales(self.t_cond(delays)))  # [L, D+1, H]

    def ada_scales_for(self, delay_tokens: torch.Tensor) -> torch.Tensor | None:
        """[L, 1, B, H] scales for per-row delays [B] (None when no table was prepared)."""
        table = getattr(self, "ada_table", None)
        if table is None:
            return None
        return table.index_select(1, delay_tokens.reshape(-1))[:, None]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(hidden, self.head_weight(), max_rows=self.head_rows)

    @contextmanager
    def encoder_rows(self, rows: int) -> Iterator[None]:
        """Within: the audio encoder's projections (conv stem, layers, adapter) send calls of up to `rows` rows to
        `linear`'s batch-invariant kernel, and larger ones to cuBLAS (outside: INVARIANT_ROWS). A row's bits do not
        depend on `rows` as long as its call takes the kernel. A runner encodes in it (`RunnerOptions.encoder_rows`):
        look-ahead chunks need INVARIANT_ROWS (8 tokens in one call give the bits of 8 one-token calls), plain
        steps of 5-16 streams are faster on cuBLAS. Module attributes, restored on exit; a CUDA graph captured
        inside keeps the kernels it captured."""
        tower, adapter = self.audio_tower, self.multi_modal_projector
        mods = [tower.embedder, adapter, *(m for layer in tower.layers for m in (layer.self_attn, layer.mlp))]
        with _rows_set([(m, "linear_rows") for m in mods], lambda _: rows):
            yield

    @contextmanager
    def lm_rows_invariant_to(self, rows: int) -> Iterator[None]:
        """Within: the LM's projections and head send calls of up to `rows` rows to `linear`'s batch-invariant
        kernel (each row the bits it gets alone), not to cuBLAS. A speculative verify step runs in it, so that its
        rows (a draft tree of 24 is 25 rows at batch 1; a chain at batch 8 is up to 64) round as plain steps of up to
        16 rows do, and speculation stays lossless in fp16/bf16. Module attributes, restored on exit; a CUDA graph
        captured inside keeps the kernels it captured."""
        mods = [(m, "linear_rows") for layer in self.language_model.layers for m in (layer.self_attn, layer.mlp)]
        with _rows_set([*mods, (self, "head_rows")], lambda r: max(r, rows)):
            yield

    def supports_one_row_decode(self) -> bool:
        """Whether `one_row_logits` applies: the LM has no biases (true of this architecture) and its
        projections are fused (`prepare_for_inference`)."""
        layer = self.language_model.layers[0]
        return layer.self_attn._qkv is not None and layer.self_attn._qkv[1] is None and layer.mlp._gate_up is not None

    def one_row_logits(self, inputs_embeds: torch.Tensor, position: torch.Tensor, ada_scales: torch.Tensor,
                       backend: SupportsFusedKVWrite) -> torch.Tensor:
        """`logits(decode(...))` of ONE row [H] at `position` [1] through the fused one-row kernels:
        logits [V]. ada_scales: [L, H], the row's delay scales (`ada_table[:, delay]`). On the CPU
        (references) equal to the unfused path bit for bit; on the GPU to the dtype's rounding."""
        lm = self.language_model
        res = lm.forward_one_row(inputs_embeds, position, ada_scales, backend)
        return one_row.norm_linear(res, lm.norm.weight, lm.norm.eps, self.head_weight())

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
        # every row has the same positions: one [1, T, T] mask broadcast over the batch
        audio, _ = self.encode(mel, conv0, enc_pos, DenseAttention(enc_pos[:1], self.config.encoder.sliding_window))
        embeds = self.embed_tokens(input_ids) + audio
        pos = torch.arange(t, device=dev).expand(b, -1)
        t_cond = self.t_cond(delay_tokens.to(dev))[:, None, :]
        hidden = self.decode(embeds, pos, t_cond, DenseAttention(pos[:1], self.config.decoder.sliding_window))
        return self.logits(hidden).float()
