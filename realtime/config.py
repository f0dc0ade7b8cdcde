"""Typed, validated model configuration for Voxtral-Realtime-style checkpoints.

One `ModelConfig` is built from either a transformers `config.json` (optionally with a
`preprocessor_config.json` and a `tekken.json` beside it) or a Mistral-native `params.json`
plus `tekken.json`. Every problem raises `ConfigError` naming the offending field.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Delays the real model accepts: every multiple of 80 ms from 80 to 1200 ms, and 2400 ms.
ALLOWED_DELAYS_MS: tuple[int, ...] = tuple(range(80, 1201, 80)) + (2400,)

# transformers' `VoxtralRealtimeEncoderConfig` has no rope theta default of its own: it falls
# back to the generic 1e4. We follow the file (and the reference) when it is silent.
_TRANSFORMERS_DEFAULT_ROPE_THETA = 10000.0


class ConfigError(ValueError):
    """A configuration file is missing a field or holds an invalid value."""


@dataclass(frozen=True)
class AudioFrontendConfig:
    sampling_rate: int = 16000
    n_fft: int = 400
    hop_length: int = 160
    num_mel_bins: int = 128
    global_log_mel_max: float = 1.5
    mel_fmax: float = 8000.0


@dataclass(frozen=True)
class EncoderConfig:
    hidden_size: int = 1280
    num_layers: int = 32
    num_heads: int = 32
    head_dim: int = 64
    intermediate_size: int = 5120
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    sliding_window: int = 750


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int = 131072
    hidden_size: int = 3072
    num_layers: int = 26
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 9216
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    sliding_window: int | None = 8192
    tie_word_embeddings: bool = True
    ada_cond_dim: int = 32


@dataclass(frozen=True)
class TokenIds:
    bos: int = 1
    eos: int = 2
    pad: int = 11
    streaming_pad: int = 32
    streaming_word: int = 33
    # Ids below this are control tokens and never part of the text.
    num_control_tokens: int = 1000


@dataclass(frozen=True)
class StreamingConfig:
    default_delay_ms: int = 480
    n_left_pad_tokens: int = 32
    # mistral-common's OFFLINE_STREAMING_BUFFER_TOKENS: right padding covers delay + 1 + this.
    right_pad_buffer_tokens: int = 10
    mel_frames_per_token: int = 8
    downsample_factor: int = 4
    # the largest transcription delay served (the real model's published range ends at 2400 ms): the models' tables
    # of delay scales (`VoxtralRealtime.prepare_for_inference`) hold the delays up to it, and a longer one is refused
    max_delay_ms: int = 2400


@dataclass(frozen=True)
class ModelConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    audio: AudioFrontendConfig = field(default_factory=AudioFrontendConfig)
    tokens: TokenIds = field(default_factory=TokenIds)
    streaming: StreamingConfig = field(default_factory=StreamingConfig)

    # ---- derived quantities -------------------------------------------------------------
    @property
    def samples_per_token(self) -> int:
        return self.streaming.mel_frames_per_token * self.audio.hop_length

    @property
    def token_duration_ms(self) -> int:
        return self.samples_per_token * 1000 // self.audio.sampling_rate

    @property
    def encoder_frames_per_token(self) -> int:
        return self.streaming.downsample_factor

    def delay_tokens(self, delay_ms: int | None = None) -> int:
        """Number of delay tokens for a delay in milliseconds (validated)."""
        ms = self.streaming.default_delay_ms if delay_ms is None else delay_ms
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms <= 0:
            raise ConfigError(f"transcription_delay_ms must be a positive number, got {ms!r}")
        step = self.token_duration_ms
        if ms % step != 0:
            raise ConfigError(f"transcription_delay_ms must be a multiple of {step} ms, got {ms}")
        if ms > self.streaming.max_delay_ms:
            raise ConfigError(f"transcription_delay_ms must be at most {self.streaming.max_delay_ms} ms, got {ms}")
        return int(ms // step)

    @property
    def max_delay_tokens(self) -> int:
        """The largest delay served, in tokens (`delay_tokens` refuses longer ones)."""
        return self.streaming.max_delay_ms // self.token_duration_ms

    def prompt_length(self, delay_tokens: int) -> int:
        return 1 + self.streaming.n_left_pad_tokens + delay_tokens

    def prompt_ids(self, delay_tokens: int) -> list[int]:
        return [self.tokens.bos] + [self.tokens.streaming_pad] * (
            self.streaming.n_left_pad_tokens + delay_tokens
        )

    def right_pad_tokens(self, delay_tokens: int) -> int:
        return delay_tokens + 1 + self.streaming.right_pad_buffer_tokens

    @property
    def left_pad_samples(self) -> int:
        """Silence every stream starts with (n_left_pad_tokens audio tokens)."""
        return self.streaming.n_left_pad_tokens * self.samples_per_token

    def finish_padding(self, user_samples: int, delay_tokens: int) -> tuple[int, int]:
        """End of audio: (zero samples to append, total LM positions of the stream).

        Zeros to a whole token, then delay + 1 + buffer tokens so the delayed text is flushed; the
        stream then has `total` audio tokens and decoding stops when `total` tokens are known.
        """
        spt = self.samples_per_token
        pad = (-user_samples) % spt + self.right_pad_tokens(delay_tokens) * spt
        return pad, self.streaming.n_left_pad_tokens + (user_samples + pad) // spt

    def audio_end_ms(self, position: int) -> int:
        """Stream audio (ms from its first sample) the model had seen when deciding the token of
        LM position `position` (the step ran position - 1, which reads audio token position - 1)."""
        return max(0, (position - self.streaming.n_left_pad_tokens) * self.token_duration_ms)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> "ModelConfig":
        _validate(self)
        return self


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------
def _require_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _require_positive_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive finite number, got {value!r}")


def _validate(cfg: ModelConfig) -> None:
    e, d, a, s, t = cfg.encoder, cfg.decoder, cfg.audio, cfg.streaming, cfg.tokens
    for name in ("hidden_size", "num_layers", "num_heads", "head_dim", "intermediate_size", "sliding_window"):
        _require_positive_int(f"encoder.{name}", getattr(e, name))
    for name in ("rms_norm_eps", "rope_theta"):
        _require_positive_float(f"encoder.{name}", getattr(e, name))
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "intermediate_size", "ada_cond_dim"):
        _require_positive_int(f"decoder.{name}", getattr(d, name))
    for name in ("rms_norm_eps", "rope_theta"):
        _require_positive_float(f"decoder.{name}", getattr(d, name))
    if d.sliding_window is not None:
        _require_positive_int("decoder.sliding_window", d.sliding_window)
    if d.num_heads % d.num_kv_heads != 0:
        raise ConfigError(
            f"decoder.num_heads ({d.num_heads}) must be a multiple of decoder.num_kv_heads ({d.num_kv_heads})"
        )
    if e.head_dim % 2 or d.head_dim % 2:
        raise ConfigError("encoder.head_dim and decoder.head_dim must be even (RoPE rotates pairs)")
    if d.hidden_size % 2:
        raise ConfigError(f"decoder.hidden_size must be even (delay embedding is cos|sin), got {d.hidden_size}")
    for name in ("sampling_rate", "n_fft", "hop_length", "num_mel_bins"):
        _require_positive_int(f"audio.{name}", getattr(a, name))
    _require_positive_float("audio.mel_fmax", a.mel_fmax)
    if a.n_fft < 2 * a.hop_length:
        raise ConfigError(f"audio.n_fft ({a.n_fft}) must be at least twice audio.hop_length ({a.hop_length})")
    for name in ("default_delay_ms", "mel_frames_per_token", "downsample_factor", "max_delay_ms"):
        _require_positive_int(f"streaming.{name}", getattr(s, name))
    if isinstance(s.n_left_pad_tokens, bool) or not isinstance(s.n_left_pad_tokens, int) or s.n_left_pad_tokens < 0:
        raise ConfigError(f"streaming.n_left_pad_tokens must be >= 0, got {s.n_left_pad_tokens!r}")
    if s.mel_frames_per_token != 2 * s.downsample_factor:
        # The conv stem halves the frame rate; the adapter stacks `downsample_factor` frames.
        raise ConfigError(
            f"streaming.mel_frames_per_token ({s.mel_frames_per_token}) must be 2 x streaming.downsample_factor "
            f"({s.downsample_factor})"
        )
    cfg.delay_tokens(s.default_delay_ms)
    for name in ("bos", "eos", "pad", "streaming_pad", "streaming_word"):
        v = getattr(t, name)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < d.vocab_size:
            raise ConfigError(f"tokens.{name} must be a token id in [0, {d.vocab_size}), got {v!r}")


# ---------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path.name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path.name} must hold a JSON object")
    return data


class _Fields:
    """Reads typed fields from a JSON object, naming the full field path in errors."""

    def __init__(self, data: dict[str, Any], prefix: str) -> None:
        self.data = data
        self.prefix = prefix

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, allow_none: bool = False) -> Any:
        if key not in self.data or (self.data[key] is None and not allow_none and default is not ...):
            if default is ...:
                raise ConfigError(f"missing field {self.prefix}{key}")
            return default
        value = self.data[key]
        if value is None and allow_none:
            return None
        # JSON ints are valid floats; bools are never numbers here.
        ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in _as_tuple(kind))
        if not ok and float in _as_tuple(kind) and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok and int in _as_tuple(kind) and isinstance(value, str) and value.strip().isdigit():
            value, ok = int(value), True  # params.json sometimes stores sliding_window as a string
        if not ok:
            raise ConfigError(f"field {self.prefix}{key} has the wrong type: {value!r}")
        return value

    def sub(self, key: str) -> "_Fields":
        value = self.data.get(key)
        if not isinstance(value, dict):
            raise ConfigError(f"missing field {self.prefix}{key} (an object)")
        return _Fields(value, f"{self.prefix}{key}.")


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _rope_theta(f: _Fields, what: str) -> float:
    rp = f.data.get("rope_parameters")
    if isinstance(rp, dict) and rp.get("rope_theta") is not None:
        rope_type = rp.get("rope_type", "default")
        if rope_type != "default":
            raise ConfigError(f"field {f.prefix}rope_parameters.rope_type: only 'default' RoPE is supported, got {rope_type!r}")
        return _Fields(rp, f"{f.prefix}rope_parameters.").get("rope_theta", float)
    if f.data.get("rope_theta") is not None:
        return f.get("rope_theta", float)
    logger.warning("%s has no rope theta; using the transformers default %g", what, _TRANSFORMERS_DEFAULT_ROPE_THETA)
    return _TRANSFORMERS_DEFAULT_ROPE_THETA


def _config_from_transformers(data: dict[str, Any]) -> tuple[EncoderConfig, DecoderConfig, dict[str, Any]]:
    root = _Fields(data, "")
    model_type = data.get("model_type")
    if model_type is not None and model_type != "voxtral_realtime":
        raise ConfigError(f"field model_type must be 'voxtral_realtime', got {model_type!r}")
    a = root.sub("audio_config")
    t = root.sub("text_config")

    num_heads = a.get("num_attention_heads", int, 32)
    # transformers maps the encoder's num_key_value_heads onto num_attention_heads (attribute_map):
    # a file holding both with different values is ambiguous, so refuse it.
    kv = a.data.get("num_key_value_heads")
    if kv is not None and kv != num_heads:
        raise ConfigError(
            f"field audio_config.num_key_value_heads ({kv}) differs from audio_config.num_attention_heads "
            f"({num_heads}); transformers would silently use one for the other"
        )
    hidden = a.get("hidden_size", int, 1280)
    enc = EncoderConfig(
        hidden_size=hidden,
        num_layers=a.get("num_hidden_layers", int, 32),
        num_heads=num_heads,
        head_dim=a.get("head_dim", int, hidden // num_heads if num_heads else 64),
        intermediate_size=a.get("intermediate_size", int, 5120),
        rms_norm_eps=a.get("rms_norm_eps", float, 1e-5),
        rope_theta=_rope_theta(a, "audio_config"),
        sliding_window=a.get("sliding_window", int, 750),
    )
    if a.data.get("num_mel_bins") is not None:
        a.get("num_mel_bins", int)
    for act_field, expected in (("hidden_act", "silu"), ("activation_function", "gelu")):
        v = a.data.get(act_field)
        if v is not None and v != expected:
            raise ConfigError(f"field audio_config.{act_field} must be {expected!r}, got {v!r}")
    v = t.data.get("hidden_act")
    if v is not None and v != "silu":
        raise ConfigError(f"field text_config.hidden_act must be 'silu', got {v!r}")
    v = data.get("projector_hidden_act")
    if v is not None and v != "gelu":
        raise ConfigError(f"field projector_hidden_act must be 'gelu', got {v!r}")

    t_hidden = t.get("hidden_size", int, 3072)
    t_heads = t.get("num_attention_heads", int, 32)
    tie = data.get("tie_word_embeddings", t.data.get("tie_word_embeddings", True))
    if not isinstance(tie, bool):
        raise ConfigError(f"field tie_word_embeddings must be a boolean, got {tie!r}")
    dec = DecoderConfig(
        vocab_size=t.get("vocab_size", int, 131072),
        hidden_size=t_hidden,
        num_layers=t.get("num_hidden_layers", int, 26),
        num_heads=t_heads,
        num_kv_heads=t.get("num_key_value_heads", int, 8),
        head_dim=t.get("head_dim", int, t_hidden // t_heads if t_heads else 128, allow_none=False),
        intermediate_size=t.get("intermediate_size", int, 9216),
        rms_norm_eps=t.get("rms_norm_eps", float, 1e-5),
        rope_theta=_rope_theta(t, "text_config") if ("rope_parameters" in t.data or "rope_theta" in t.data) else 1e6,
        sliding_window=t.get("sliding_window", int, 8192, allow_none=True),
        tie_word_embeddings=tie,
    )
    extra = {
        "mel_frames_per_token": root.get("audio_length_per_tok", int, 8),
        "downsample_factor": root.get("downsample_factor", int, 4),
        "default_delay_tokens": root.get("default_num_delay_tokens", int, 6),
        "num_mel_bins": a.get("num_mel_bins", int, 128),
        "bos": t.get("bos_token_id", int, 1, allow_none=False),
        "eos": t.get("eos_token_id", (int, list), 2),
    }
    return enc, dec, extra


def _config_from_params(data: dict[str, Any]) -> tuple[EncoderConfig, DecoderConfig, dict[str, Any]]:
    root = _Fields(data, "")
    mm = root.sub("multimodal").sub("whisper_model_args")
    ea = mm.sub("encoder_args")
    heads = ea.get("n_heads", int)
    kv = ea.data.get("n_kv_heads")
    if kv is not None and kv != heads:
        raise ConfigError(f"field multimodal.whisper_model_args.encoder_args.n_kv_heads ({kv}) must equal n_heads ({heads})")
    for key, expected in (("ffn_type", "swiglu"), ("norm_type", "rms_norm"), ("pos_embed", "rope")):
        v = ea.data.get(key)
        if v is not None and v != expected:
            raise ConfigError(f"field {ea.prefix}{key} must be {expected!r}, got {v!r}")
    if ea.data.get("causal") is False:
        raise ConfigError(f"field {ea.prefix}causal must be true for a streaming encoder")
    dim = ea.get("dim", int)
    enc = EncoderConfig(
        hidden_size=dim,
        num_layers=ea.get("n_layers", int),
        num_heads=heads,
        head_dim=ea.get("head_dim", int, dim // heads),
        intermediate_size=ea.get("hidden_dim", int),
        rms_norm_eps=ea.get("norm_eps", float, 1e-5),
        rope_theta=ea.get("rope_theta", float, 1e6),
        sliding_window=ea.get("sliding_window", int, 750),
    )
    t_dim = root.get("dim", int)
    t_heads = root.get("n_heads", int)
    dec = DecoderConfig(
        vocab_size=root.get("vocab_size", int),
        hidden_size=t_dim,
        num_layers=root.get("n_layers", int),
        num_heads=t_heads,
        num_kv_heads=root.get("n_kv_heads", int, t_heads),
        head_dim=root.get("head_dim", int, t_dim // t_heads),
        intermediate_size=root.get("hidden_dim", int),
        rms_norm_eps=root.get("norm_eps", float, 1e-5),
        rope_theta=root.get("rope_theta", float, 1e6),
        sliding_window=root.get("sliding_window", int, None, allow_none=True),
        tie_word_embeddings=root.get("tied_embeddings", bool, True),
        ada_cond_dim=root.get("ada_rms_norm_t_cond_dim", int, 32),
    )
    enc_args = ea.data.get("audio_encoding_args") or {}
    ds = mm.data.get("downsample_args") or {}
    extra: dict[str, Any] = {
        "downsample_factor": _Fields(ds, f"{mm.prefix}downsample_args.").get("downsample_factor", int, 4),
    }
    if enc_args:
        ef = _Fields(enc_args, f"{ea.prefix}audio_encoding_args.")
        extra.update(
            num_mel_bins=ef.get("num_mel_bins", int, 128),
            sampling_rate=ef.get("sampling_rate", int, 16000),
            hop_length=ef.get("hop_length", int, 160),
            n_fft=ef.get("window_size", int, 400),
            global_log_mel_max=ef.get("global_log_mel_max", float, 1.5),
        )
        if ef.data.get("frame_rate") is not None:
            extra["frame_rate"] = ef.get("frame_rate", float)
    return enc, dec, extra


def _tekken_audio(path: Path) -> dict[str, Any]:
    """The streaming/audio section of a tekken.json, read as plain JSON (vocab not parsed twice)."""
    data = _read_json(path)
    audio = data.get("audio")
    if audio is None:
        return {}
    if not isinstance(audio, dict):
        raise ConfigError("field tekken.json:audio must be an object")
    f = _Fields(audio, "tekken.json:audio.")
    out: dict[str, Any] = {}
    if audio.get("transcription_format", "streaming") != "streaming":
        raise ConfigError(
            f"field tekken.json:audio.transcription_format must be 'streaming', got {audio.get('transcription_format')!r}"
        )
    if audio.get("transcription_delay_ms") is not None:
        out["default_delay_ms"] = f.get("transcription_delay_ms", (int, float))
    if audio.get("streaming_n_left_pad_tokens") is not None:
        out["n_left_pad_tokens"] = f.get("streaming_n_left_pad_tokens", int)
    if audio.get("sampling_rate") is not None:
        out["sampling_rate"] = f.get("sampling_rate", int)
    if audio.get("frame_rate") is not None:
        out["frame_rate"] = f.get("frame_rate", (int, float))
    enc = audio.get("audio_encoding_config") or audio.get("encoding_config")
    if isinstance(enc, dict):
        ef = _Fields(enc, "tekken.json:audio.audio_encoding_config.")
        out["num_mel_bins"] = ef.get("num_mel_bins", int, 128)
        out["hop_length"] = ef.get("hop_length", int, 160)
        out["n_fft"] = ef.get("window_size", int, 400)
        if enc.get("global_log_mel_max") is not None:
            out["global_log_mel_max"] = ef.get("global_log_mel_max", float)
    return out


def _preprocessor(path: Path) -> dict[str, Any]:
    data = _read_json(path)
    f = _Fields(data, "preprocessor_config.json:")
    out: dict[str, Any] = {}
    for key, name, kind in (
        ("sampling_rate", "sampling_rate", int),
        ("hop_length", "hop_length", int),
        ("n_fft", "n_fft", int),
        ("feature_size", "num_mel_bins", int),
        ("global_log_mel_max", "global_log_mel_max", float),
    ):
        if data.get(key) is not None:
            out[name] = f.get(key, kind)
    win = data.get("win_length")
    if win is not None and win != data.get("n_fft", win):
        raise ConfigError(f"field preprocessor_config.json:win_length ({win}) must equal n_fft")
    return out


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read the configuration of a checkpoint folder (transformers or Mistral-native layout)."""
    d = Path(model_dir)
    if not d.is_dir():
        raise ConfigError(f"model folder {d} does not exist")
    cfg_json, params_json, tekken = d / "config.json", d / "params.json", d / "tekken.json"
    if cfg_json.exists():
        enc, dec, extra = _config_from_transformers(_read_json(cfg_json))
        source = "config.json"
    elif params_json.exists():
        enc, dec, extra = _config_from_params(_read_json(params_json))
        source = "params.json"
    else:
        raise ConfigError(f"{d} holds neither config.json nor params.json")

    merged: dict[str, Any] = dict(extra)
    if tekken.exists():
        for k, v in _tekken_audio(tekken).items():
            if k in merged and merged[k] != v and k != "default_delay_ms":
                raise ConfigError(f"tekken.json:audio {k}={v!r} disagrees with {source} ({merged[k]!r})")
            merged[k] = v
    pre = d / "preprocessor_config.json"
    if pre.exists():
        for k, v in _preprocessor(pre).items():
            if k in merged and merged[k] != v:
                raise ConfigError(f"preprocessor_config.json {k}={v!r} disagrees with {source} ({merged[k]!r})")
            merged[k] = v

    audio = AudioFrontendConfig(
        sampling_rate=merged.get("sampling_rate", 16000),
        n_fft=merged.get("n_fft", 400),
        hop_length=merged.get("hop_length", 160),
        num_mel_bins=merged.get("num_mel_bins", 128),
        global_log_mel_max=merged.get("global_log_mel_max", 1.5),
    )
    mel_per_tok = merged.get("mel_frames_per_token")
    if mel_per_tok is None:
        frame_rate = merged.get("frame_rate", 12.5)
        mel_per_tok = int(round(audio.sampling_rate / frame_rate / audio.hop_length))
    tok_ms = mel_per_tok * audio.hop_length * 1000 // audio.sampling_rate
    delay_ms = merged.get("default_delay_ms")
    if delay_ms is None:
        delay_ms = merged.get("default_delay_tokens", 6) * tok_ms
    if isinstance(delay_ms, float):
        if not delay_ms.is_integer():
            raise ConfigError(f"transcription_delay_ms must be a whole number of ms, got {delay_ms}")
        delay_ms = int(delay_ms)
    eos = merged.get("eos", 2)
    if isinstance(eos, list):
        if not eos or not all(isinstance(x, int) for x in eos):
            raise ConfigError(f"field text_config.eos_token_id must be an id or a list of ids, got {eos!r}")
        eos = eos[0]
    cfg = ModelConfig(
        encoder=enc,
        decoder=dec,
        audio=audio,
        tokens=TokenIds(bos=merged.get("bos", 1), eos=eos),
        streaming=StreamingConfig(
            default_delay_ms=delay_ms,
            n_left_pad_tokens=merged.get("n_left_pad_tokens", 32),
            mel_frames_per_token=mel_per_tok,
            downsample_factor=merged.get("downsample_factor", 4),
        ),
    )
    return cfg.validate()


def with_overrides(cfg: ModelConfig, **kwargs: Any) -> ModelConfig:
    """A copy of `cfg` with top-level sections replaced (used by tests and tools)."""
    return replace(cfg, **kwargs).validate()


# ---------------------------------------------------------------------------------------
# Writers (the inverse of the readers; used to save trained and test checkpoints)
# ---------------------------------------------------------------------------------------
def to_transformers_json(cfg: ModelConfig) -> dict[str, Any]:
    e, d = cfg.encoder, cfg.decoder
    return {
        "architectures": ["VoxtralRealtimeForConditionalGeneration"],
        "model_type": "voxtral_realtime",
        "audio_config": {
            "model_type": "voxtral_realtime_encoder",
            "hidden_size": e.hidden_size,
            "num_hidden_layers": e.num_layers,
            "num_attention_heads": e.num_heads,
            "head_dim": e.head_dim,
            "intermediate_size": e.intermediate_size,
            "num_mel_bins": cfg.audio.num_mel_bins,
            "rms_norm_eps": e.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": e.rope_theta},
            "sliding_window": e.sliding_window,
            "hidden_act": "silu",
            "activation_function": "gelu",
        },
        "text_config": {
            "model_type": "voxtral_realtime_text",
            "vocab_size": d.vocab_size,
            "hidden_size": d.hidden_size,
            "num_hidden_layers": d.num_layers,
            "num_attention_heads": d.num_heads,
            "num_key_value_heads": d.num_kv_heads,
            "head_dim": d.head_dim,
            "intermediate_size": d.intermediate_size,
            "rms_norm_eps": d.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": d.rope_theta},
            "sliding_window": d.sliding_window,
            "hidden_act": "silu",
            "bos_token_id": cfg.tokens.bos,
            "eos_token_id": cfg.tokens.eos,
            "pad_token_id": cfg.tokens.pad,
            "tie_word_embeddings": d.tie_word_embeddings,
        },
        "audio_length_per_tok": cfg.streaming.mel_frames_per_token,
        "default_num_delay_tokens": cfg.delay_tokens(),
        "downsample_factor": cfg.streaming.downsample_factor,
        "projector_hidden_act": "gelu",
        "tie_word_embeddings": d.tie_word_embeddings,
    }


def to_params_json(cfg: ModelConfig) -> dict[str, Any]:
    e, d, a = cfg.encoder, cfg.decoder, cfg.audio
    return {
        "dim": d.hidden_size,
        "n_layers": d.num_layers,
        "head_dim": d.head_dim,
        "hidden_dim": d.intermediate_size,
        "n_heads": d.num_heads,
        "n_kv_heads": d.num_kv_heads,
        "use_biases": False,
        "causal": True,
        "rope_theta": d.rope_theta,
        "norm_eps": d.rms_norm_eps,
        "vocab_size": d.vocab_size,
        "tied_embeddings": d.tie_word_embeddings,
        "sliding_window": d.sliding_window,
        "ada_rms_norm_t_cond_dim": d.ada_cond_dim,
        "multimodal": {
            "whisper_model_args": {
                "encoder_args": {
                    "audio_encoding_args": {
                        "sampling_rate": a.sampling_rate,
                        "frame_rate": a.sampling_rate / (cfg.samples_per_token),
                        "num_mel_bins": a.num_mel_bins,
                        "hop_length": a.hop_length,
                        "window_size": a.n_fft,
                        "chunk_length_s": None,
                        "global_log_mel_max": a.global_log_mel_max,
                        "transcription_format": "streaming",
                    },
                    "dim": e.hidden_size,
                    "n_layers": e.num_layers,
                    "head_dim": e.head_dim,
                    "hidden_dim": e.intermediate_size,
                    "n_heads": e.num_heads,
                    "n_kv_heads": e.num_heads,
                    "use_biases": True,
                    "rope_theta": e.rope_theta,
                    "causal": True,
                    "norm_eps": e.rms_norm_eps,
                    "pos_embed": "rope",
                    "ffn_type": "swiglu",
                    "norm_type": "rms_norm",
                    "sliding_window": e.sliding_window,
                },
                "downsample_args": {"downsample_factor": cfg.streaming.downsample_factor},
            }
        },
    }


def tekken_audio_section(cfg: ModelConfig) -> dict[str, Any]:
    a = cfg.audio
    return {
        "sampling_rate": a.sampling_rate,
        "frame_rate": a.sampling_rate / cfg.samples_per_token,
        "audio_encoding_config": {
            "num_mel_bins": a.num_mel_bins,
            "hop_length": a.hop_length,
            "window_size": a.n_fft,
        },
        "chunk_length_s": None,
        "transcription_format": "streaming",
        "transcription_delay_ms": cfg.streaming.default_delay_ms,
        "streaming_look_ahead_ms": 2.5,
        "streaming_look_back_ms": 52.5,
        "streaming_n_left_pad_tokens": cfg.streaming.n_left_pad_tokens,
    }
