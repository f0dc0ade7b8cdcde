"""`kernels.l2_prefetch`: the weights fetched into L2 while each layer's attention runs, and where they are asked for.

On the CPU the plumbing is checked with a recording prefetcher (which weights, in which order, joined once per
step, on the LM's multi-row and one-row paths and the encoder's); on a GPU the bulk prefetch kernel itself and the
engine's tokens with prefetching on, graphs on and off.
"""

from __future__ import annotations

import pytest
import torch

from conftest import synthetic_audio
from kernels.l2_prefetch import (
    ALIGN,
    L2Prefetcher,
    PrefetchConfig,
    fetch_plan,
    l2_prefetch_supported,
    prefetch_config_from_env,
    prefetch_switched_on,
)
from realtime.engine import BatchedEngine, RunnerOptions
from realtime.loader import load_model
from realtime.session import transcribe
from realtime.tokenizer import load_tokenizer
from test_engine import run_join_leave_scenario, transcribe_clips


class RecordingPrefetcher:
    """Stands in for `L2Prefetcher` on the CPU: records what is asked for."""

    def __init__(self, mlp_bytes: int = 0, ahead_bytes: int = 0) -> None:
        self.mlp_bytes, self.ahead_bytes = mlp_bytes, ahead_bytes
        self.calls: list[tuple[int, int | None]] = []  # (data_ptr, max_bytes)
        self.joins = 0

    def fetch(self, t: torch.Tensor, max_bytes: int | None = None) -> None:
        self.calls.append((t.data_ptr(), max_bytes))

    def join(self) -> None:
        self.joins += 1


def test_fetch_plan_rounds_down_and_refuses_what_is_not_one_aligned_range():
    w = torch.zeros(64, 33, dtype=torch.bfloat16)  # 4,224 bytes
    assert fetch_plan(w) == 4224
    assert fetch_plan(w, 1000) == 992  # rounded down to the 16-byte unit
    assert fetch_plan(w, 8) == 0
    assert fetch_plan(torch.zeros(7, dtype=torch.bfloat16)) == 0  # 14 bytes: less than one unit
    assert fetch_plan(w.t()) == 0  # not contiguous
    assert fetch_plan(w.reshape(-1)[1:]) == 0  # contiguous, but 2 bytes past an aligned start
    assert ALIGN == 16


def test_prefetch_is_off_by_default_checked_and_absent_on_the_cpu(monkeypatch, tiny_model):
    from realtime.engine.model_runner import ModelRunner, prefetch_config_for

    model, _ = tiny_model
    for name in ("STREAMSCRIBE_L2_PREFETCH", "STREAMSCRIBE_L2_PREFETCH_MLP_MB", "STREAMSCRIBE_L2_PREFETCH_CHUNK_KB",
                 "STREAMSCRIBE_L2_PREFETCH_AHEAD_MB", "STREAMSCRIBE_L2_PREFETCH_AHEAD_CHAINS",
                 "STREAMSCRIBE_L2_PREFETCH_PER_PROGRAM", "STREAMSCRIBE_L2_PREFETCH_CHAINS",
                 "STREAMSCRIBE_L2_PREFETCH_SIDE"):
        monkeypatch.delenv(name, raising=False)
    assert not prefetch_switched_on()
    assert prefetch_config_from_env() == PrefetchConfig() == PrefetchConfig(64 << 10, 0, 0, 32, False)
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH", "1")
    assert prefetch_switched_on()
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_MLP_MB", "2.5")
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_CHUNK_KB", "256")
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_AHEAD_MB", "32")
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_PER_PROGRAM", "4")
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_SIDE", "1")
    config = PrefetchConfig(256 << 10, int(2.5 * (1 << 20)), 32 << 20, 4, True)
    assert prefetch_config_from_env() == config
    assert not l2_prefetch_supported(torch.device("cpu"))
    for choice in (None, True, False):  # switched on, but no GPU to fetch on
        runner = ModelRunner(model, RunnerOptions(max_streams=1, max_batch=1, l2_prefetch=choice))
        assert runner.lm_prefetcher is None and runner.enc_prefetcher is None
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_MLP_MB", "lots")
    with pytest.raises(ValueError, match="STREAMSCRIBE_L2_PREFETCH_MLP_MB must be a number of MB"):
        prefetch_config_from_env()
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_MLP_MB", "0")
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_AHEAD_MB", "-1")
    with pytest.raises(ValueError, match="STREAMSCRIBE_L2_PREFETCH_AHEAD_MB must be a number of MB"):
        prefetch_config_from_env()
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_AHEAD_MB", "32")
    config = PrefetchConfig(256 << 10, 0, 32 << 20, 4, True)
    assert prefetch_config_for("lm") == prefetch_config_for("encoder") == config
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_AHEAD_CHAINS", "encoder")
    assert prefetch_config_for("lm") == PrefetchConfig(256 << 10, 0, 0, 4, True)
    assert prefetch_config_for("encoder") == config
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_CHAINS", "lm")
    assert prefetch_config_for("encoder") is None  # (and the LM, outside the ahead chains, fetches at attention)
    assert prefetch_config_for("lm") == PrefetchConfig(256 << 10, 0, 0, 4, True)
    for name in ("STREAMSCRIBE_L2_PREFETCH_CHAINS", "STREAMSCRIBE_L2_PREFETCH_AHEAD_CHAINS"):
        monkeypatch.setenv(name, "audio")
        with pytest.raises(ValueError, match=f"{name} must be lm, encoder or both"):
            ModelRunner(model, RunnerOptions(max_streams=1, max_batch=1))
        monkeypatch.delenv(name)
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_AHEAD_MB", "0")
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_CHUNK_KB", "0")
    with pytest.raises(ValueError, match="STREAMSCRIBE_L2_PREFETCH_CHUNK_KB must be"):
        ModelRunner(model, RunnerOptions(max_streams=1, max_batch=1))  # refused even where nothing is fetched
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_CHUNK_KB", "64")
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_PER_PROGRAM", "33")
    with pytest.raises(ValueError, match="STREAMSCRIBE_L2_PREFETCH_PER_PROGRAM must be a number of chunks in 1..32"):
        prefetch_config_from_env()
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_PER_PROGRAM", "32")
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_SIDE", "yes")
    with pytest.raises(ValueError, match="STREAMSCRIBE_L2_PREFETCH_SIDE must be 0 or 1"):
        prefetch_config_from_env()
    with pytest.raises(ValueError, match="per_program must be in 1..32"):
        PrefetchConfig(per_program=0)
    with pytest.raises(ValueError, match="chunk_bytes must be a positive multiple of 16"):
        PrefetchConfig(chunk_bytes=1000)
    monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH", "0")
    ModelRunner(model, RunnerOptions(max_streams=1, max_batch=1))  # switched off: the other switches are not read


@pytest.fixture(scope="module")
def tiny_model(tiny_ckpt):
    """(model, tokenizer) of the tiny seed-1 checkpoint on the CPU, loaded once for this module."""
    path = tiny_ckpt(seed=1)
    return load_model(path)[0], load_tokenizer(path)


@pytest.mark.parametrize(("streams", "one_row", "mlp_bytes", "ahead_bytes"),
                         [(1, True, 0, 0), (1, True, 4096, 0), (2, False, 4096, 0), (1, True, 0, 8192),
                          (2, False, 4096, 8192)])
def test_each_layer_asks_for_the_weights_it_reads_next_and_the_step_joins(tiny_model, streams, one_row, mlp_bytes,
                                                                         ahead_bytes):
    """Every LM step asks, layer by layer, for the o projection's weights at the attention (and with `mlp_bytes`,
    the head of the MLP's fused gate/up matrix), and joins once at its end; every encoder step likewise with its own
    prefetcher. In the "ahead" mode (`ahead_bytes`) each projection asks for the next one's weights instead: o,
    gate/up, down, the next layer's q/k/v (after the LM's last layer on the one-row path, the head). The tokens
    stay the single-stream session's (a recording prefetcher changes nothing, but the hooks must not either)."""
    model, tok = tiny_model
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=2, max_batch=2, block_size=4,
                                                        one_row_decode=one_row))
    lm, enc = RecordingPrefetcher(mlp_bytes, ahead_bytes), RecordingPrefetcher(mlp_bytes, ahead_bytes)
    eng.runner.lm_prefetcher, eng.runner.enc_prefetcher = lm, enc
    clips = [synthetic_audio(1.5, seed=40 + i) for i in range(streams)]
    assert transcribe_clips(eng, clips) == [transcribe(model, tok, clip).token_ids for clip in clips]

    def expected(layers, after: torch.Tensor | None) -> list[tuple[int, int | None]]:
        out = []
        for i, layer in enumerate(layers):
            if ahead_bytes:
                out.append((layer.self_attn.o_proj.weight.data_ptr(), ahead_bytes))
            else:
                out.append((layer.self_attn.o_proj.weight.data_ptr(), None))
            if mlp_bytes:
                out.append((layer.mlp._gate_up.data_ptr(), mlp_bytes))
            if ahead_bytes:
                out.append((layer.mlp._gate_up.data_ptr(), ahead_bytes))
                out.append((layer.mlp.down_proj.weight.data_ptr(), ahead_bytes))
                following = layers[i + 1].self_attn._qkv[0] if i + 1 < len(layers) else after
                if following is not None:
                    out.append((following.data_ptr(), ahead_bytes))
        return out

    per_lm_step = expected(model.language_model.layers, model.head_weight() if streams == 1 else None)
    per_enc_step = expected(model.audio_tower.layers, None)
    assert lm.joins > 0 and enc.joins > 0
    assert lm.calls == per_lm_step * lm.joins
    assert enc.calls == per_enc_step * enc.joins


@pytest.mark.gpu
@pytest.mark.parametrize("side_stream", [False, True])
def test_gpu_bulk_prefetch_runs_and_leaves_the_bytes_alone(side_stream):
    """The kernel compiles and runs on sizes that are and are not multiples of its chunk, in the chain (PDL) and
    from a side stream joined back, eagerly and inside a CUDA graph; the fetched tensors keep their bytes, and a
    product that reads them right after gives the bits it gives without the prefetch."""
    dev = torch.device("cuda")
    if not l2_prefetch_supported(dev):
        pytest.skip("the bulk prefetch needs sm_90+")
    torch.manual_seed(0)
    p = L2Prefetcher(dev, PrefetchConfig(chunk_bytes=4096, per_program=3, side_stream=side_stream))
    tensors = [torch.randn(n, device=dev, dtype=torch.bfloat16) for n in (8, 1000, 4096 * 5 + 24, 3 << 20)]
    before = [t.clone() for t in tensors]
    for t in tensors:
        p.fetch(t)
    p.fetch(tensors[-1], 1 << 20)
    p.join()
    torch.cuda.synchronize()
    assert p.fetched_bytes == sum(fetch_plan(t) for t in tensors) + (1 << 20)
    assert all(torch.equal(a, b) for a, b in zip(tensors, before))
    w = torch.randn(1024, 2048, device=dev, dtype=torch.bfloat16)
    x = torch.randn(4, 2048, device=dev, dtype=torch.bfloat16)
    want = x @ w.t()
    out = torch.empty_like(want)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        torch.matmul(x, w.t(), out=out)  # warm-up outside the capture
        with torch.cuda.graph(g, stream=s):
            p.fetch(w)
            torch.matmul(x, w.t(), out=out)
            p.join()
    torch.cuda.current_stream(dev).wait_stream(s)
    for _ in range(5):
        out.zero_()
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_gpu_engine_with_l2_prefetch_keeps_every_streams_tokens(tiny_ckpt, monkeypatch, cuda_graphs):
    """The sixteen-stream join/leave scenario with the prefetchers on, at the attention and ahead, in the chain
    and from side streams (fp32: the single-stream session's tokens), and the embedded model in bf16 at batch 1
    (the one-row path) giving the same tokens with them off, at the attention, and ahead (32 MB, with 4 MB of the
    MLP at the attention; in the chain and from side streams)."""
    dev = torch.device("cuda")
    if not l2_prefetch_supported(dev):
        pytest.skip("the bulk prefetch needs sm_90+")
    from realtime.audio import load_audio_file
    from realtime.model_store import DEFAULT_MODEL_DIR

    torch.backends.cuda.matmul.allow_tf32 = False
    path = tiny_ckpt(seed=1)
    model, _ = load_model(path, device="cuda")
    for ahead, side in (("0", "0"), ("32", "0"), ("32", "1")):
        monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_AHEAD_MB", ahead)
        monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_SIDE", side)
        opts = RunnerOptions(max_streams=12, max_batch=8, block_size=16, cuda_graphs=cuda_graphs, l2_prefetch=True)
        run_join_leave_scenario(model, load_tokenizer(path), opts)

    model, _ = load_model(DEFAULT_MODEL_DIR, device="cuda", dtype=torch.bfloat16)
    tok = load_tokenizer(DEFAULT_MODEL_DIR)
    audio = load_audio_file(str(DEFAULT_MODEL_DIR.parent.parent / "demo" / "samples" / "sample_en.wav"), 16000)
    got = {}
    modes = (("off", "0", "0", "0"), ("attention", "0", "0", "0"), ("ahead", "32", "4", "0"), ("side", "32", "4", "1"))
    for mode, ahead, mlp, side in modes:
        monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_AHEAD_MB", ahead)
        monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_MLP_MB", mlp)
        monkeypatch.setenv("STREAMSCRIBE_L2_PREFETCH_SIDE", side)
        eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=1, max_batch=1, cuda_graphs=cuda_graphs,
                                                            l2_prefetch=mode != "off"))
        on = mode != "off"
        assert (eng.runner.lm_prefetcher is not None) == on and (eng.runner.enc_prefetcher is not None) == on
        got[mode] = transcribe_clips(eng, [audio[: 8 * 16000]])[0]
        if on:
            assert eng.runner.lm_prefetcher.fetched_bytes > 0 and eng.runner.enc_prefetcher.fetched_bytes > 0
            assert eng.runner.enc_prefetcher.ahead_bytes == int(ahead) << 20
    assert len(got["off"]) > 50 and got["attention"] == got["ahead"] == got["side"] == got["off"]
