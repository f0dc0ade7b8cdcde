"""Checkpoint loading: safetensors (single file or sharded), transformers and Mistral-native layouts.

The model is built on the `meta` device and materialised on the target device; tensors are then
read one at a time from memory-mapped files and copied in place, so the host never holds a second
full copy of the weights. Loading is strict: every missing, unexpected or mis-shaped tensor is
listed in one error.
"""

from __future__ import annotations

import json
import logging
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ModelConfig, load_config
from .model import VoxtralRealtime

logger = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """Weights that cannot be loaded: missing files, corrupt data, or tensors that do not fit."""


# ---------------------------------------------------------------------------------------
# Key layouts
# ---------------------------------------------------------------------------------------
_ENC = r"mm_streams_embeddings\.embedding_module\.whisper_encoder\."
_MISTRAL_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^mm_streams_embeddings\.embedding_module\.tok_embeddings\.weight$"), "language_model.embed_tokens.weight"),
    (re.compile(r"^tok_embeddings\.weight$"), "language_model.embed_tokens.weight"),
    (re.compile(r"^output\.weight$"), "lm_head.weight"),
    (re.compile(r"^norm\.weight$"), "language_model.norm.weight"),
    (re.compile(r"^layers\.(\d+)\.attention_norm\.weight$"), r"language_model.layers.\1.input_layernorm.weight"),
    (re.compile(r"^layers\.(\d+)\.ffn_norm\.weight$"), r"language_model.layers.\1.post_attention_layernorm.weight"),
    (re.compile(r"^layers\.(\d+)\.attention\.w([qkvo])\.weight$"), r"language_model.layers.\1.self_attn.\2_proj.weight"),
    (re.compile(r"^layers\.(\d+)\.feed_forward\.w1\.weight$"), r"language_model.layers.\1.mlp.gate_proj.weight"),
    (re.compile(r"^layers\.(\d+)\.feed_forward\.w2\.weight$"), r"language_model.layers.\1.mlp.down_proj.weight"),
    (re.compile(r"^layers\.(\d+)\.feed_forward\.w3\.weight$"), r"language_model.layers.\1.mlp.up_proj.weight"),
    (re.compile(r"^layers\.(\d+)\.ada_rms_norm_t_cond\.0\.weight$"), r"language_model.layers.\1.ada_rms_norm.linear1.weight"),
    (re.compile(r"^layers\.(\d+)\.ada_rms_norm_t_cond\.2\.weight$"), r"language_model.layers.\1.ada_rms_norm.linear2.weight"),
    (re.compile(rf"^{_ENC}conv_layers\.0\.conv\.(weight|bias)$"), r"audio_tower.embedder.conv1.\1"),
    (re.compile(rf"^{_ENC}conv_layers\.1\.conv\.(weight|bias)$"), r"audio_tower.embedder.conv2.\1"),
    (re.compile(rf"^{_ENC}transformer\.norm\.weight$"), "audio_tower.norm.weight"),
    (re.compile(rf"^{_ENC}transformer\.layers\.(\d+)\.attention\.w([qkvo])\.(weight|bias)$"), r"audio_tower.layers.\1.self_attn.\2_proj.\3"),
    (re.compile(rf"^{_ENC}transformer\.layers\.(\d+)\.attention_norm\.weight$"), r"audio_tower.layers.\1.self_attn_layer_norm.weight"),
    (re.compile(rf"^{_ENC}transformer\.layers\.(\d+)\.ffn_norm\.weight$"), r"audio_tower.layers.\1.final_layer_norm.weight"),
    (re.compile(rf"^{_ENC}transformer\.layers\.(\d+)\.feed_forward\.w1\.(weight|bias)$"), r"audio_tower.layers.\1.mlp.gate_proj.\2"),
    (re.compile(rf"^{_ENC}transformer\.layers\.(\d+)\.feed_forward\.w2\.(weight|bias)$"), r"audio_tower.layers.\1.mlp.down_proj.\2"),
    (re.compile(rf"^{_ENC}transformer\.layers\.(\d+)\.feed_forward\.w3\.(weight|bias)$"), r"audio_tower.layers.\1.mlp.up_proj.\2"),
    (re.compile(r"^mm_streams_embeddings\.embedding_module\.audio_language_projection\.0\.weight$"), "multi_modal_projector.linear_1.weight"),
    (re.compile(r"^mm_streams_embeddings\.embedding_module\.audio_language_projection\.2\.weight$"), "multi_modal_projector.linear_2.weight"),
]


def is_mistral_layout(keys: list[str]) -> bool:
    return any(k.startswith("mm_streams_embeddings.") or k.startswith("layers.") for k in keys)


def canonical_key_transformers(key: str) -> str:
    """Any of transformers' three layouts -> our parameter names."""
    if key.startswith("model."):
        key = key[len("model."):]
    if key.startswith("language_model.model."):
        return "language_model." + key[len("language_model.model."):]
    if key.startswith("language_model.lm_head."):
        return "lm_head." + key[len("language_model.lm_head."):]
    return key


def canonical_key_mistral(key: str) -> str | None:
    for pattern, repl in _MISTRAL_RULES:
        new, n = pattern.subn(repl, key)
        if n:
            return new
    return None


def interleaved_to_half_rotary(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder the output rows of a q/k projection from interleaved-pair RoPE to rotate_half RoPE."""
    out_dim = t.shape[0]
    rest = t.shape[1:]
    return t.reshape(heads, out_dim // heads // 2, 2, *rest).transpose(1, 2).reshape(out_dim, *rest)


def half_rotary_to_interleaved(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of `interleaved_to_half_rotary` (used to write Mistral-native checkpoints)."""
    out_dim = t.shape[0]
    rest = t.shape[1:]
    return t.reshape(heads, 2, out_dim // heads // 2, *rest).transpose(1, 2).reshape(out_dim, *rest)


def _mistral_rope_heads(cfg: ModelConfig, canonical: str) -> int | None:
    m = re.match(r"^(audio_tower|language_model)\.layers\.\d+\.self_attn\.([qk])_proj\.(weight|bias)$", canonical)
    if not m:
        return None
    tower, proj = m.group(1), m.group(2)
    if tower == "audio_tower":
        return cfg.encoder.num_heads
    return cfg.decoder.num_heads if proj == "q" else cfg.decoder.num_kv_heads


# ---------------------------------------------------------------------------------------
# safetensors files
# ---------------------------------------------------------------------------------------
@dataclass
class TensorSource:
    file: Path
    key: str
    shape: tuple[int, ...]
    dtype: str


_ST_DTYPES = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"}


def _read_header(path: Path) -> dict[str, TensorSource]:
    """Parse and check a safetensors header (size, offsets) without reading tensor data."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path.name}: truncated safetensors file ({size} bytes, no header)")
            (hlen,) = struct.unpack("<Q", raw)
            if hlen <= 0 or hlen > min(size - 8, 100 * 1024 * 1024):
                raise CheckpointError(f"{path.name}: corrupt safetensors header length {hlen} (file is {size} bytes)")
            header = json.loads(f.read(hlen).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path.name}: corrupt safetensors header: {exc}") from exc
    except OSError as exc:
        raise CheckpointError(f"{path.name}: cannot read: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name}: corrupt safetensors header (not an object)")
    data_size = size - 8 - hlen
    out: dict[str, TensorSource] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{path.name}: corrupt header entry for {key!r}") from exc
        if dtype not in _ST_DTYPES:
            raise CheckpointError(f"{path.name}: tensor {key!r} has unsupported dtype {dtype}")
        if not (0 <= start <= end):
            raise CheckpointError(f"{path.name}: tensor {key!r} has invalid data offsets {start}..{end}")
        if end > data_size:
            raise CheckpointError(
                f"{path.name}: truncated safetensors file: tensor {key!r} ends at byte {end} but the data "
                f"section holds {data_size} bytes"
            )
        out[key] = TensorSource(path, key, shape, dtype)
    return out


def find_weight_files(model_dir: Path, prefer_mistral: bool) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    hf_single = model_dir / "model.safetensors"
    consolidated = model_dir / "consolidated.safetensors"
    if prefer_mistral and consolidated.exists():
        return [consolidated]
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index.name}: corrupt index: {exc!r}") from exc
        files = sorted({model_dir / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"{index.name} names shard(s) that do not exist: {', '.join(missing)}")
        return files
    if hf_single.exists():
        return [hf_single]
    if consolidated.exists():
        return [consolidated]
    shards = sorted(model_dir.glob("model-*-of-*.safetensors"))
    if shards:
        return shards
    raise CheckpointError(f"{model_dir} holds no safetensors weights (model.safetensors, shards, or consolidated.safetensors)")


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------
@dataclass
class LoadReport:
    seconds: float
    num_tensors: int
    layout: str
    files: list[str]


def describe_misfit(problems: dict[str, list[str]]) -> str:
    """One line naming what keeps a checkpoint from its model ({"missing tensors": [...], ...}), at
    most 20 entries per kind; '' when every list is empty. The strict loaders raise with it."""
    parts = []
    for kind, items in problems.items():
        if items:
            more = " ..." if len(items) > 20 else ""
            parts.append(f"{kind} ({len(items)}): {'; '.join(items[:20])}{more}")
    return " | ".join(parts)


def load_model(model_dir: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               config: ModelConfig | None = None) -> tuple[VoxtralRealtime, LoadReport]:
    d = Path(model_dir)
    t0 = time.perf_counter()
    cfg = config or load_config(d)
    prefer_mistral = not (d / "config.json").exists()
    files = find_weight_files(d, prefer_mistral)

    sources: dict[str, TensorSource] = {}
    raw_keys: list[str] = []
    for f in files:
        for key, src in _read_header(f).items():
            raw_keys.append(key)
            sources[key] = src
    mistral = is_mistral_layout(raw_keys)

    with torch.device("meta"):
        model = VoxtralRealtime(cfg)
    expected = {k: tuple(p.shape) for k, p in model.named_parameters()}

    mapping: dict[str, str] = {}  # canonical -> raw
    unexpected: list[str] = []
    for key in raw_keys:
        canon = canonical_key_mistral(key) if mistral else canonical_key_transformers(key)
        if canon is None:
            unexpected.append(key)
            continue
        if canon == "lm_head.weight" and cfg.decoder.tie_word_embeddings:
            # an explicit copy of the tied embedding is allowed (transformers accepts it); the tie wins
            if sources[key].shape != expected["language_model.embed_tokens.weight"]:
                unexpected.append(f"{key} (shape {list(sources[key].shape)})")
            continue
        if canon in mapping:
            unexpected.append(f"{key} (duplicate of {mapping[canon]})")
            continue
        if canon not in expected:
            unexpected.append(key)
            continue
        mapping[canon] = key
    missing = sorted(set(expected) - set(mapping))
    mismatched = [
        f"{mapping[c]}: checkpoint {list(sources[mapping[c]].shape)} vs model {list(expected[c])}"
        for c in sorted(mapping) if sources[mapping[c]].shape != expected[c]
    ]
    problems = describe_misfit({"missing tensors": missing, "unexpected tensors": unexpected,
                                "shape mismatches": mismatched})
    if problems:
        raise CheckpointError(f"checkpoint in {d} does not fit its config: {problems}")

    # dtype first (free on meta), then one allocation on the target device
    model = model.to(dtype).to_empty(device=device)
    params = dict(model.named_parameters())
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for canon, raw in mapping.items():
        by_file.setdefault(sources[raw].file, []).append(canon)
    with torch.no_grad():
        for f, canons in by_file.items():
            try:
                with safe_open(str(f), framework="pt", device="cpu") as st:
                    for canon in canons:
                        t = st.get_tensor(mapping[canon])
                        if mistral:
                            heads = _mistral_rope_heads(cfg, canon)
                            if heads is not None:
                                t = interleaved_to_half_rotary(t, heads)
                        if not torch.isfinite(t.float() if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t).all():
                            raise CheckpointError(f"{f.name}: tensor {mapping[canon]!r} holds NaN or infinite values")
                        params[canon].copy_(t)
                        del t
            except CheckpointError:
                raise
            except Exception as exc:  # safetensors raises SafetensorError / OSError on bad data
                raise CheckpointError(f"{f.name}: cannot read tensor data (corrupt or truncated file?): {exc}") from exc
    model.eval()
    model.prepare_for_inference()
    report = LoadReport(time.perf_counter() - t0, len(mapping), "mistral" if mistral else "transformers",
                        [f.name for f in files])
    logger.info("loaded %d tensors (%s layout) from %s in %.2fs", report.num_tensors, report.layout, d, report.seconds)
    return model, report


# ---------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------
def _to_transformers_key(canon: str) -> str:
    """Our names -> the layout transformers' save_pretrained writes (hub layout)."""
    if canon.startswith("language_model."):
        return "language_model.model." + canon[len("language_model."):]
    if canon.startswith("lm_head."):
        return "language_model." + canon
    return canon


_MISTRAL_INVERSE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^language_model\.embed_tokens\.weight$"), "mm_streams_embeddings.embedding_module.tok_embeddings.weight"),
    (re.compile(r"^lm_head\.weight$"), "output.weight"),
    (re.compile(r"^language_model\.norm\.weight$"), "norm.weight"),
    (re.compile(r"^language_model\.layers\.(\d+)\.input_layernorm\.weight$"), r"layers.\1.attention_norm.weight"),
    (re.compile(r"^language_model\.layers\.(\d+)\.post_attention_layernorm\.weight$"), r"layers.\1.ffn_norm.weight"),
    (re.compile(r"^language_model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight$"), r"layers.\1.attention.w\2.weight"),
    (re.compile(r"^language_model\.layers\.(\d+)\.mlp\.gate_proj\.weight$"), r"layers.\1.feed_forward.w1.weight"),
    (re.compile(r"^language_model\.layers\.(\d+)\.mlp\.down_proj\.weight$"), r"layers.\1.feed_forward.w2.weight"),
    (re.compile(r"^language_model\.layers\.(\d+)\.mlp\.up_proj\.weight$"), r"layers.\1.feed_forward.w3.weight"),
    (re.compile(r"^language_model\.layers\.(\d+)\.ada_rms_norm\.linear1\.weight$"), r"layers.\1.ada_rms_norm_t_cond.0.weight"),
    (re.compile(r"^language_model\.layers\.(\d+)\.ada_rms_norm\.linear2\.weight$"), r"layers.\1.ada_rms_norm_t_cond.2.weight"),
    (re.compile(r"^audio_tower\.embedder\.conv1\.(weight|bias)$"), r"mm_streams_embeddings.embedding_module.whisper_encoder.conv_layers.0.conv.\1"),
    (re.compile(r"^audio_tower\.embedder\.conv2\.(weight|bias)$"), r"mm_streams_embeddings.embedding_module.whisper_encoder.conv_layers.1.conv.\1"),
    (re.compile(r"^audio_tower\.norm\.weight$"), "mm_streams_embeddings.embedding_module.whisper_encoder.transformer.norm.weight"),
    (re.compile(r"^audio_tower\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)$"), r"mm_streams_embeddings.embedding_module.whisper_encoder.transformer.layers.\1.attention.w\2.\3"),
    (re.compile(r"^audio_tower\.layers\.(\d+)\.self_attn_layer_norm\.weight$"), r"mm_streams_embeddings.embedding_module.whisper_encoder.transformer.layers.\1.attention_norm.weight"),
    (re.compile(r"^audio_tower\.layers\.(\d+)\.final_layer_norm\.weight$"), r"mm_streams_embeddings.embedding_module.whisper_encoder.transformer.layers.\1.ffn_norm.weight"),
    (re.compile(r"^audio_tower\.layers\.(\d+)\.mlp\.gate_proj\.(weight|bias)$"), r"mm_streams_embeddings.embedding_module.whisper_encoder.transformer.layers.\1.feed_forward.w1.\2"),
    (re.compile(r"^audio_tower\.layers\.(\d+)\.mlp\.down_proj\.(weight|bias)$"), r"mm_streams_embeddings.embedding_module.whisper_encoder.transformer.layers.\1.feed_forward.w2.\2"),
    (re.compile(r"^audio_tower\.layers\.(\d+)\.mlp\.up_proj\.(weight|bias)$"), r"mm_streams_embeddings.embedding_module.whisper_encoder.transformer.layers.\1.feed_forward.w3.\2"),
    (re.compile(r"^multi_modal_projector\.linear_1\.weight$"), "mm_streams_embeddings.embedding_module.audio_language_projection.0.weight"),
    (re.compile(r"^multi_modal_projector\.linear_2\.weight$"), "mm_streams_embeddings.embedding_module.audio_language_projection.2.weight"),
]


def _to_mistral_key(canon: str) -> str:
    for pattern, repl in _MISTRAL_INVERSE:
        new, n = pattern.subn(repl, canon)
        if n:
            return new
    raise CheckpointError(f"no Mistral-native name for parameter {canon}")


def save_model(model: VoxtralRealtime, out_dir: str | Path, *, layout: str = "transformers",
               max_shard_bytes: int | None = None) -> list[Path]:
    """Write weights + config in the transformers (config.json) or Mistral (params.json) layout.

    With `max_shard_bytes`, transformers-layout weights are split into shards with an index file.
    """
    from safetensors.torch import save_file

    from .config import to_params_json, to_transformers_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    tensors: dict[str, torch.Tensor] = {}
    for canon, p in model.named_parameters():
        t = p.detach().to("cpu").contiguous()
        if layout == "mistral":
            heads = _mistral_rope_heads(cfg, canon)
            if heads is not None:
                t = half_rotary_to_interleaved(t, heads).contiguous()
            tensors[_to_mistral_key(canon)] = t
        elif layout == "transformers":
            tensors[_to_transformers_key(canon)] = t
        else:
            raise ValueError(f"layout must be 'transformers' or 'mistral', got {layout!r}")
    written: list[Path] = []
    if layout == "mistral":
        save_file(tensors, str(out / "consolidated.safetensors"))
        (out / "params.json").write_text(json.dumps(to_params_json(cfg), indent=2))
        written.append(out / "consolidated.safetensors")
    else:
        (out / "config.json").write_text(json.dumps(to_transformers_json(cfg), indent=2))
        (out / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": cfg.tokens.bos, "eos_token_id": cfg.tokens.eos, "pad_token_id": cfg.tokens.pad}, indent=2))
        if max_shard_bytes is None:
            save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
            written.append(out / "model.safetensors")
        else:
            shards: list[dict[str, torch.Tensor]] = [{}]
            size = 0
            for k, t in tensors.items():
                nbytes = t.numel() * t.element_size()
                if shards[-1] and size + nbytes > max_shard_bytes:
                    shards.append({})
                    size = 0
                shards[-1][k] = t
                size += nbytes
            weight_map: dict[str, str] = {}
            for i, shard in enumerate(shards):
                name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(out / name), metadata={"format": "pt"})
                written.append(out / name)
                weight_map.update({k: name for k in shard})
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            (out / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return written
