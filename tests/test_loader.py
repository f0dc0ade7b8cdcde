"""Checkpoint loading: layouts, shards, Mistral-native RoPE permutation, strictness, corrupt files."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import padded_for_offline, synthetic_audio
from realtime.audio import log_mel_spectrogram
from realtime.loader import CheckpointError, load_model, save_model
from realtime.testing.tiny_checkpoint import random_model, tiny_config


def _logits(model, seconds=2.0, seed=0, delay=6):
    padded = padded_for_offline(synthetic_audio(seconds, seed=seed), delay)
    mel = log_mel_spectrogram(padded, model.config.audio)[None]
    n = padded.size // 1280
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.decoder.vocab_size, (1, n), generator=g)
    with torch.no_grad():
        return model(ids, mel, torch.tensor([delay]))


def test_mistral_native_equals_transformers_copy(tiny_ckpt):
    hf, rep_hf = load_model(tiny_ckpt(seed=7, fmt="hf"))
    mi, rep_mi = load_model(tiny_ckpt(seed=7, fmt="mistral"))
    assert rep_hf.layout == "transformers" and rep_mi.layout == "mistral"
    assert (_logits(hf) - _logits(mi)).abs().max().item() <= 1e-5
    # and the permutation really happened: the raw Mistral q weight differs from the HF one
    raw = load_file(str(tiny_ckpt(seed=7, fmt="mistral") / "consolidated.safetensors"))
    wq = raw["layers.0.attention.wq.weight"]
    assert not torch.equal(wq, hf.language_model.layers[0].self_attn.q_proj.weight)


def _copy_with_renamed_keys(src, dst, rename):
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    sd = load_file(str(src / "model.safetensors"))
    save_file({rename(k): v for k, v in sd.items()}, str(dst / "model.safetensors"))


@pytest.mark.parametrize("layout", ["hub", "model_prefixed", "base"])
def test_three_transformers_layouts(tiny_ckpt, tmp_path, layout):
    src = tiny_ckpt(seed=8)
    ref, _ = load_model(src)

    def rename(k: str) -> str:  # saved keys are in the hub layout: language_model.model.*
        if layout == "hub":
            return k
        if layout == "model_prefixed":
            return "model." + k.replace("language_model.model.", "language_model.")
        return k.replace("language_model.model.", "language_model.")

    dst = tmp_path / layout
    _copy_with_renamed_keys(src, dst, rename)
    if layout == "hub":  # an explicit (tied) lm_head copy is accepted
        sd = load_file(str(dst / "model.safetensors"))
        sd["language_model.lm_head.weight"] = sd["language_model.model.embed_tokens.weight"].clone()
        save_file(sd, str(dst / "model.safetensors"))
    m, _ = load_model(dst)
    assert torch.equal(_logits(m), _logits(ref))


def test_sharded_checkpoint(tmp_path):
    model = random_model(tiny_config(), seed=9)
    files = save_model(model, tmp_path, max_shard_bytes=200_000)
    assert len(files) > 2 and (tmp_path / "model.safetensors.index.json").exists()
    m, rep = load_model(tmp_path)
    assert len(rep.files) == len(files)
    assert torch.equal(_logits(m), _logits(model))


def test_transformers_loads_our_checkpoint_and_we_load_transformers_save(tmp_path, tiny_ckpt):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    src = tiny_ckpt(seed=10)
    hf = transformers.VoxtralRealtimeForConditionalGeneration.from_pretrained(str(src), dtype=torch.float32)
    out = tmp_path / "resaved"
    hf.save_pretrained(str(out))
    shutil.copy(src / "tekken.json", out / "tekken.json")
    a, _ = load_model(src)
    b, _ = load_model(out)
    assert torch.equal(_logits(a), _logits(b))


def test_published_layout_folder(tiny_ckpt, tmp_path):
    """transformers files, params.json/consolidated and tekken.json side by side load as one model."""
    hf, mi = tiny_ckpt(seed=11, fmt="hf"), tiny_ckpt(seed=11, fmt="mistral")
    for f in list(hf.iterdir()) + [mi / "params.json", mi / "consolidated.safetensors"]:
        shutil.copy(f, tmp_path / f.name)
    m, rep = load_model(tmp_path)
    assert rep.layout == "transformers" and rep.files == ["model.safetensors"]
    ref, _ = load_model(hf)
    assert torch.equal(_logits(m), _logits(ref))


def test_dtype_and_device_selection(tiny_ckpt):
    m, _ = load_model(tiny_ckpt(seed=0), dtype=torch.bfloat16, device="cpu")
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    assert m.device.type == "cpu"
    logits = _logits(m)
    assert torch.isfinite(logits).all()


def test_strict_missing_unexpected_mismatched(tiny_ckpt, tmp_path):
    src = tiny_ckpt(seed=0)
    sd = load_file(str(src / "model.safetensors"))
    del sd["language_model.model.layers.1.mlp.up_proj.weight"]
    sd["language_model.model.layers.0.extra.weight"] = torch.zeros(3)
    sd["audio_tower.norm.weight"] = torch.zeros(5)
    dst = tmp_path / "bad"
    dst.mkdir()
    for f in ("config.json", "tekken.json"):
        shutil.copy(src / f, dst / f)
    save_file(sd, str(dst / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_model(dst)
    msg = str(err.value)
    assert "missing tensors (1): language_model.layers.1.mlp.up_proj.weight" in msg
    assert "unexpected tensors (1): language_model.model.layers.0.extra.weight" in msg
    assert "audio_tower.norm.weight: checkpoint [5] vs model [64]" in msg


def test_config_weights_mismatch(tiny_ckpt, tmp_path):
    src = tiny_ckpt(seed=0)
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["text_config"]["num_hidden_layers"] = 3
    cfg["text_config"]["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"missing tensors .*language_model\.layers\.2\..*shape mismatches"):
        load_model(tmp_path)


def test_corrupt_and_truncated_files(tiny_ckpt, tmp_path):
    src = tiny_ckpt(seed=0)
    data = (src / "model.safetensors").read_bytes()
    cases = {
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "garbage_header": b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"\xff" * 64,
        "huge_header_len": b"\xff" * 8 + data[8:],
    }
    for name, blob in cases.items():
        d = tmp_path / name
        d.mkdir()
        for f in ("config.json", "tekken.json"):
            shutil.copy(src / f, d / f)
        (d / "model.safetensors").write_bytes(blob)
        with pytest.raises(CheckpointError, match="model.safetensors"):
            load_model(d)
    (tmp_path / "noweights").mkdir()
    shutil.copy(src / "config.json", tmp_path / "noweights" / "config.json")
    with pytest.raises(CheckpointError, match="no safetensors weights"):
        load_model(tmp_path / "noweights")


def test_nan_weights_rejected(tiny_ckpt, tmp_path):
    src = tiny_ckpt(seed=0)
    sd = load_file(str(src / "model.safetensors"))
    sd["multi_modal_projector.linear_1.weight"][0, 0] = float("nan")
    for f in ("config.json", "tekken.json"):
        shutil.copy(src / f, tmp_path / f)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="NaN"):
        load_model(tmp_path)
