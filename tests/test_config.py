"""Config reading from config.json / params.json + tekken.json, validation naming the bad field."""

from __future__ import annotations

import json
import shutil

import pytest

from realtime.config import ConfigError, ModelConfig, load_config, to_params_json, to_transformers_json
from realtime.testing.tiny_checkpoint import tiny_config


def test_real_model_defaults():
    cfg = ModelConfig().validate()
    assert cfg.prompt_length(cfg.delay_tokens()) == 39
    assert cfg.delay_tokens(480) == 6 and cfg.delay_tokens(2400) == 30
    assert cfg.samples_per_token == 1280 and cfg.token_duration_ms == 80
    assert cfg.right_pad_tokens(6) == 17
    assert cfg.prompt_ids(6) == [1] + [32] * 38


def test_transformers_and_mistral_configs_agree(tiny_ckpt):
    hf = load_config(tiny_ckpt(seed=0, fmt="hf"))
    mi = load_config(tiny_ckpt(seed=0, fmt="mistral"))
    assert hf == mi == tiny_config()


def test_roundtrip_writers(tmp_path):
    cfg = ModelConfig()
    (tmp_path / "config.json").write_text(json.dumps(to_transformers_json(cfg)))
    assert load_config(tmp_path) == cfg
    p = tmp_path / "m"
    p.mkdir()
    (p / "params.json").write_text(json.dumps(to_params_json(cfg)))
    assert load_config(p) == cfg


def _write_cfg(tmp_path, mutate):
    data = to_transformers_json(tiny_config())
    mutate(data)
    (tmp_path / "config.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d["text_config"].update(hidden_size="big"), "text_config.hidden_size"),
    (lambda d: d["text_config"].update(num_key_value_heads=3), "num_kv_heads"),
    (lambda d: d["audio_config"].update(num_key_value_heads=2), "audio_config.num_key_value_heads"),
    (lambda d: d["audio_config"].update(sliding_window=0), "encoder.sliding_window"),
    (lambda d: d["text_config"].update(hidden_act="gelu"), "text_config.hidden_act"),
    (lambda d: d.pop("audio_config"), "audio_config"),
    (lambda d: d.update(model_type="whisper"), "model_type"),
    (lambda d: d["text_config"].update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6}), "rope_type"),
    (lambda d: d["text_config"].update(rms_norm_eps=-1.0), "decoder.rms_norm_eps"),
    (lambda d: d.update(audio_length_per_tok=6), "mel_frames_per_token"),
    (lambda d: d["text_config"].update(vocab_size=20), "tokens.streaming_pad"),
])
def test_bad_config_names_the_field(tmp_path, mutate, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(_write_cfg(tmp_path, mutate))


def test_bad_params_json_names_the_field(tiny_ckpt, tmp_path):
    src = tiny_ckpt(seed=0, fmt="mistral")
    shutil.copy(src / "tekken.json", tmp_path / "tekken.json")
    data = json.loads((src / "params.json").read_text())
    del data["multimodal"]["whisper_model_args"]["encoder_args"]["n_layers"]
    (tmp_path / "params.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"multimodal\.whisper_model_args\.encoder_args\.n_layers"):
        load_config(tmp_path)


def test_tekken_delay_and_left_pad_are_read(tiny_ckpt, tmp_path):
    src = tiny_ckpt(seed=0, fmt="hf")
    for f in ("config.json", "tekken.json"):
        shutil.copy(src / f, tmp_path / f)
    tk = json.loads((tmp_path / "tekken.json").read_text())
    tk["audio"]["transcription_delay_ms"] = 160
    tk["audio"]["streaming_n_left_pad_tokens"] = 16
    (tmp_path / "tekken.json").write_text(json.dumps(tk))
    cfg = load_config(tmp_path)
    assert cfg.streaming.default_delay_ms == 160 and cfg.streaming.n_left_pad_tokens == 16
    tk["audio"]["audio_encoding_config"]["num_mel_bins"] = 80
    (tmp_path / "tekken.json").write_text(json.dumps(tk))
    with pytest.raises(ConfigError, match="num_mel_bins"):
        load_config(tmp_path)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="neither config.json nor params.json"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope")


def test_delay_validation():
    cfg = ModelConfig()
    for bad in (0, -80, 100, "480"):
        with pytest.raises(ConfigError, match="transcription_delay_ms"):
            cfg.delay_tokens(bad)
