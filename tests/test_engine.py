"""Batched engine == single-stream session, for many streams joining and leaving at different steps."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import synthetic_audio
from realtime.engine import BatchedEngine, RunnerOptions
from realtime.engine.kv_cache import ring_width
from realtime.loader import load_model
from realtime.serving import AdmissionError, StreamDone, StreamError, StreamFailed, StreamToken
from realtime.session import transcribe
from realtime.tokenizer import load_tokenizer


class Recorder:
    def __init__(self) -> None:
        self.events: dict[int, list] = {}
        self.lock = threading.Lock()

    def __call__(self, ev) -> None:
        with self.lock:
            self.events.setdefault(ev.stream_id, []).append(ev)

    def tokens(self, sid: int) -> list[int]:
        return [e.token_id for e in self.events.get(sid, []) if isinstance(e, StreamToken) and e.token_id >= 0]

    def done(self, sid: int):
        evs = [e for e in self.events.get(sid, []) if isinstance(e, (StreamDone, StreamFailed))]
        return evs[-1] if evs else None


def drive(engine: BatchedEngine, max_steps: int = 100_000) -> None:
    """Run the engine loop body in this thread until nothing is left to do (deterministic)."""
    for _ in range(max_steps):
        live = engine._sync_with_clients()
        if not engine._run_step(live) and not engine._has_pending_work():
            return
    raise AssertionError("engine did not go idle")


def run_join_leave_scenario(model, tok, opts: RunnerOptions, n: int = 16, seed: int = 0) -> None:
    """n streams with random lengths/delays join at random steps, push random chunk sizes, finish
    and leave; every stream's tokens must equal the single-stream session's."""
    eng = BatchedEngine(model, tok, opts=opts)
    rng = np.random.default_rng(seed)
    clips = [synthetic_audio(float(rng.uniform(0.5, 4.0)), seed=100 + i) for i in range(n)]
    delays = [int(rng.choice([80, 160, 480, 1200, 2400])) for _ in range(n)]
    join_at = sorted(int(x) for x in rng.integers(0, 60, size=n))
    rec = Recorder()
    sids: dict[int, int] = {}
    pos = [0] * n
    finished = [False] * n
    refs = {i: transcribe(model, tok, clips[i], delay_ms=delays[i]).token_ids for i in range(n)}
    step = 0
    closed: set[int] = set()
    while len(closed) < n:
        for i in range(n):
            if i not in sids and join_at[i] <= step:
                try:
                    sids[i] = eng.open_stream(rec, delay_ms=delays[i])
                except AdmissionError:
                    pass  # full: try again on a later step
            if i in sids and not finished[i]:
                k = int(rng.choice([0, 1, 160, 1280, 3000, 20000]))
                if k:
                    eng.push_audio(sids[i], clips[i][pos[i]: pos[i] + k])
                    pos[i] += k
                if pos[i] >= clips[i].size:
                    eng.finish_stream(sids[i])
                    finished[i] = True
            if i in sids and i not in closed and rec.done(sids[i]) is not None:
                eng.close_stream(sids[i])  # leaving frees its slot for the streams still waiting
                closed.add(i)
        live = eng._sync_with_clients()
        eng._run_step(live)
        step += 1
        assert step < 20_000
    for i in range(n):
        done = rec.done(sids[i])
        assert isinstance(done, StreamDone)
        assert rec.tokens(sids[i]) == refs[i], f"stream {i} (delay {delays[i]} ms)"
        assert done.text == "".join(e.text for e in rec.events[sids[i]] if isinstance(e, StreamToken))
    drive(eng)
    assert len(eng._free_slots) == opts.max_streams
    assert eng.runner.lm_cache.pool.free == eng.runner.lm_cache.pool.num_blocks


@pytest.mark.parametrize(("small_windows", "in_flight"), [(False, None), (True, None), (True, True)])
def test_sixteen_streams_join_and_leave(tiny_ckpt, small_windows, in_flight):
    """(in_flight: CUDA's default, a step's tokens sent while the next step runs, on the CPU too)"""
    path = tiny_ckpt(seed=1, small_windows=small_windows)
    model, _ = load_model(path)
    run_join_leave_scenario(model, load_tokenizer(path), RunnerOptions(max_streams=12, max_batch=8, block_size=4,
                                                                        send_tokens_in_flight=in_flight))


@pytest.mark.parametrize("switch", ["1", "0"])
def test_rope_and_kv_write_in_one_call_keep_every_streams_tokens(tiny_ckpt, switch, monkeypatch):
    """By default the model's attention hands RoPE's keys and the values to the cache itself
    (`fused_ops.rope_write_kv` at the backend's `kv_destination`) and attends over the cache; with
    STREAMSCRIBE_ROPE_KV=0 it calls `rope` and `attend` as before. Either way, with small windows exceeded many
    times, every stream's tokens stay the session's (which attends without a cache)."""
    from kernels import fused_ops

    calls = {"n": 0}
    real = fused_ops.rope_write_kv

    def counted(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    if switch == "1":
        monkeypatch.delenv("STREAMSCRIBE_ROPE_KV", raising=False)
    else:
        monkeypatch.setenv("STREAMSCRIBE_ROPE_KV", switch)
    monkeypatch.setattr("realtime.model.rope_write_kv", counted)
    path = tiny_ckpt(seed=1, small_windows=True)
    model, _ = load_model(path)
    run_join_leave_scenario(model, load_tokenizer(path), RunnerOptions(max_streams=6, max_batch=4, block_size=4),
                            n=8, seed=5)
    assert calls["n"] > 100 if switch == "1" else calls["n"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("max_batch", [1, 4])
def test_rope_and_kv_write_in_one_kernel_on_gpu_equal_the_session(tiny_ckpt, max_batch, monkeypatch):
    """The same with the Triton kernel, in fp32, graphs on (the encoder's 4 rows take it at every batch, the LM's
    rows at batches 2-4; batch 1 takes the one-row path, which writes its keys in the q/k/v projection)."""
    import torch

    monkeypatch.delenv("STREAMSCRIBE_ROPE_KV", raising=False)
    torch.backends.cuda.matmul.allow_tf32 = False
    path = tiny_ckpt(seed=1, small_windows=True)
    model, _ = load_model(path, device="cuda")
    run_join_leave_scenario(model, load_tokenizer(path),
                            RunnerOptions(max_streams=3, max_batch=max_batch, block_size=16, cuda_graphs=True,
                                          one_row_decode=max_batch == 1), n=5, seed=3)


@pytest.mark.parametrize("small_windows", [False, True])
def test_plain_look_ahead_chunks_keep_every_streams_tokens(tiny_ckpt, small_windows):
    """A plain engine (no drafter) with `encoder_chunk=32` encodes a stream's buffered audio up to 32 tokens a call
    ahead of the LM (16 for two streams in a call, 8 for more): the sixteen-stream join/leave scenario keeps every
    stream's tokens; its audio ring holds a chunk beyond the position a step reads, and capacity planning counts
    it. A file pushed whole is encoded in 32-token calls."""
    from realtime.engine.engine import bytes_per_stream, plain_options_for

    path = tiny_ckpt(seed=1, small_windows=small_windows)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    opts = RunnerOptions(max_streams=12, max_batch=8, block_size=4, encoder_chunk=32)
    assert plain_options_for(opts).encoder_cache_tokens == 33
    assert plain_options_for(RunnerOptions()) == RunnerOptions()  # one-token steps: as before
    run_join_leave_scenario(model, tok, opts)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=1, max_batch=1, encoder_chunk=32))
    assert eng.runner.cache_len >= 33 and eng.bytes_per_stream == bytes_per_stream(model, eng.opts)
    assert bytes_per_stream(model, RunnerOptions(max_streams=1, max_batch=1, encoder_chunk=32)) == eng.bytes_per_stream
    calls: list[int] = []
    run = eng.runner.encoder.run
    eng.runner.encoder.run = lambda n, *a, **k: (calls.append(n), run(n, *a, **k))[1]
    rec = Recorder()
    clip = synthetic_audio(5.0, seed=77)
    sid = eng.open_stream(rec)
    eng.push_audio(sid, clip)
    eng.finish_stream(sid)
    drive(eng)
    assert rec.tokens(sid) == transcribe(model, tok, clip).token_ids
    assert calls.count(32) >= 1 and max(calls) == 32, calls


@pytest.mark.gpu
@pytest.mark.parametrize(("cuda_graphs", "encoder_stream", "encoder_chunk"),
                         [(True, True, 1), (False, True, 1), (True, False, 1), (True, 8, 1), (False, 8, 1),
                          (True, True, 32), (False, True, 32)])
@pytest.mark.parametrize("small_windows", [False, True])
def test_sixteen_streams_on_gpu(tiny_ckpt, small_windows, cuda_graphs, encoder_stream, encoder_chunk):
    """The CPU scenario on CUDA, with graphs and eager, the encoder on its own stream (the next token's
    encoder beside the LM step: a missing wait would show as other tokens), on one in a green context of 8
    SMs (`encoder_sms`) and on the main stream; and with the plain 32-token look-ahead, whose ahead calls write
    ring rows beside the LM step that reads another."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    path = tiny_ckpt(seed=1, small_windows=small_windows)
    model, _ = load_model(path, device="cuda")
    run_join_leave_scenario(model, load_tokenizer(path),
                            RunnerOptions(max_streams=12, max_batch=8, block_size=16, cuda_graphs=cuda_graphs,
                                          encoder_stream=bool(encoder_stream), encoder_chunk=encoder_chunk,
                                          encoder_sms=None if isinstance(encoder_stream, bool) else encoder_stream))


@pytest.mark.gpu
def test_encoder_sms_is_checked(tiny_ckpt, monkeypatch):
    """A green context for the encoder gets a stream of its own; impossible SM counts are refused with the
    option's name, from the option and from STREAMSCRIBE_ENCODER_SMS."""
    import torch

    from realtime.engine.model_runner import ModelRunner

    model, _ = load_model(tiny_ckpt(seed=1), device="cuda")
    runner = ModelRunner(model, RunnerOptions(max_streams=2, max_batch=2, encoder_sms=8))
    assert runner.enc_green is not None and isinstance(runner.enc_stream, torch.cuda.Stream)
    assert runner.enc_stream != torch.cuda.current_stream()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    with pytest.raises(ValueError, match="encoder_sms must be in"):
        ModelRunner(model, RunnerOptions(max_streams=2, max_batch=2, encoder_sms=sms + 1))
    monkeypatch.setenv("STREAMSCRIBE_ENCODER_SMS", "many")
    with pytest.raises(ValueError, match="STREAMSCRIBE_ENCODER_SMS"):
        ModelRunner(model, RunnerOptions(max_streams=2, max_batch=2))


def test_stream_priority_is_checked(monkeypatch):
    """`RunnerOptions.stream_priority` names the favoured chain; None reads STREAMSCRIBE_STREAM_PRIORITY (default
    none); anything else is refused with the option's or the variable's name."""
    from realtime.engine.model_runner import favoured_chain

    monkeypatch.delenv("STREAMSCRIBE_STREAM_PRIORITY", raising=False)
    assert favoured_chain(RunnerOptions()) == "none"
    assert favoured_chain(RunnerOptions(stream_priority="lm")) == "lm"
    monkeypatch.setenv("STREAMSCRIBE_STREAM_PRIORITY", "encoder")
    assert favoured_chain(RunnerOptions()) == "encoder"
    assert favoured_chain(RunnerOptions(stream_priority="none")) == "none"  # the option wins
    with pytest.raises(ValueError, match="stream_priority must be one of none, encoder, lm, got 'decoder'"):
        favoured_chain(RunnerOptions(stream_priority="decoder"))
    monkeypatch.setenv("STREAMSCRIBE_STREAM_PRIORITY", "high")
    with pytest.raises(ValueError, match="STREAMSCRIBE_STREAM_PRIORITY must be one of"):
        favoured_chain(RunnerOptions())


@pytest.mark.gpu
@pytest.mark.parametrize("favoured", ["encoder", "lm"])
def test_stream_priority_on_gpu(tiny_ckpt, favoured):
    """The CPU scenario with one chain's graphs captured on the highest stream priority: the same tokens (only
    the order of blocks on the SMs changes). The favoured graphs' capture stream has that priority, and a green
    context (whose stream has the default priority) cannot be combined with it."""
    import torch

    from realtime.engine.model_runner import ModelRunner

    torch.backends.cuda.matmul.allow_tf32 = False
    path = tiny_ckpt(seed=1)
    model, _ = load_model(path, device="cuda")
    opts = RunnerOptions(max_streams=12, max_batch=8, block_size=16, stream_priority=favoured)
    run_join_leave_scenario(model, load_tokenizer(path), opts)
    runner = ModelRunner(model, RunnerOptions(max_streams=2, max_batch=2, stream_priority=favoured))
    _, greatest = torch.cuda.Stream.priority_range()
    graphs = runner.graphs if favoured == "lm" else runner.encoder.graphs[1]
    assert graphs.capture_stream is not None and graphs.capture_stream.priority == greatest
    assert (runner.enc_stream.priority == greatest) == (favoured == "encoder")
    with pytest.raises(ValueError, match="cannot be combined"):
        ModelRunner(model, RunnerOptions(max_streams=2, max_batch=2, stream_priority=favoured, encoder_sms=8))


@pytest.mark.parametrize(("small_windows", "fused_gate_up"), [(False, "0"), (True, "0"), (True, "1")])
def test_one_row_decode_path_equals_the_session(tiny_ckpt, small_windows, fused_gate_up, monkeypatch):
    """Steps of one stream through the fused one-row LM path (`kernels.one_row`; on the CPU their
    references) give the single-stream session's tokens exactly, for streams joining and leaving, with
    windows exceeded many times, with the gate/up unfused (the default) and fused
    (STREAMSCRIBE_ONE_ROW_GATE_UP=1); the path and the chosen gate/up must really run (their calls are counted)."""
    from kernels import one_row
    from realtime.model import VoxtralRealtime

    monkeypatch.setenv("STREAMSCRIBE_ONE_ROW_GATE_UP", fused_gate_up)
    calls = {"rows": 0, "fused_gate_up": 0}

    def counting(name, fn):
        def counted(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return counted

    monkeypatch.setattr(VoxtralRealtime, "one_row_logits", counting("rows", VoxtralRealtime.one_row_logits))
    monkeypatch.setattr(one_row, "norm_gate_up_silu", counting("fused_gate_up", one_row.norm_gate_up_silu))
    path = tiny_ckpt(seed=1, small_windows=small_windows)
    model, _ = load_model(path)
    opts = RunnerOptions(max_streams=3, max_batch=1, block_size=4, one_row_decode=True)
    run_join_leave_scenario(model, load_tokenizer(path), opts, n=5, seed=3)
    assert calls["rows"] > 100
    layers = model.config.decoder.num_layers
    assert calls["fused_gate_up"] == (calls["rows"] * layers if fused_gate_up == "1" else 0)


def test_one_row_path_is_the_default_on_cuda_in_half_precision_only(monkeypatch):
    """`one_row_decode=None` takes the one-row path for CUDA fp16/bf16 only; STREAMSCRIBE_ONE_ROW=0 turns it off."""
    import torch

    from realtime.engine.model_runner import one_row_by_default

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.delenv("STREAMSCRIBE_ONE_ROW", raising=False)
    assert one_row_by_default(cuda, torch.bfloat16) and one_row_by_default(cuda, torch.float16)
    assert not one_row_by_default(cuda, torch.float32) and not one_row_by_default(cpu, torch.bfloat16)
    monkeypatch.setenv("STREAMSCRIBE_ONE_ROW", "0")
    assert not one_row_by_default(cuda, torch.bfloat16)


def test_one_row_decode_needs_a_backend_that_declares_fused_kv_writes(tiny_ckpt):
    """The one-row path writes keys/values inside its projection: a backend that does not declare
    `supports_fused_kv_write` (one with look-alike methods included) is refused with a clear error."""
    import torch

    from realtime.attention import DenseAttention
    from realtime.model import supports_fused_kv_write

    model, _ = load_model(tiny_ckpt(seed=1))
    c = model.config.decoder

    class LookAlike:
        def kv_destination(self, layer):
            raise AssertionError("a backend that does not declare the capability must not be used")

        attend_cached = kv_destination

    row = torch.zeros(c.hidden_size)
    ada = torch.ones(c.num_layers, c.hidden_size)
    for backend in (DenseAttention(torch.zeros(1, 1, dtype=torch.long), None), LookAlike()):
        assert not supports_fused_kv_write(backend)
        with pytest.raises(TypeError, match="does not declare supports_fused_kv_write"):
            model.one_row_logits(row, torch.zeros(1, dtype=torch.long), ada, backend)


@pytest.mark.gpu
@pytest.mark.parametrize(("cuda_graphs", "fused_gate_up"), [(True, "0"), (False, "0"), (True, "1")])
def test_one_row_decode_on_gpu_equals_the_session(tiny_ckpt, cuda_graphs, fused_gate_up, monkeypatch):
    """The one-row path's Triton kernels in fp32 (the engine picks them for bf16/fp16 by itself; fp32
    makes exact tokens a fair demand): the session's tokens, graphs on and off, small windows, the gate/up
    fused and not."""
    import torch

    monkeypatch.setenv("STREAMSCRIBE_ONE_ROW_GATE_UP", fused_gate_up)
    torch.backends.cuda.matmul.allow_tf32 = False
    path = tiny_ckpt(seed=1, small_windows=True)
    model, _ = load_model(path, device="cuda")
    run_join_leave_scenario(model, load_tokenizer(path),
                            RunnerOptions(max_streams=3, max_batch=1, block_size=16, cuda_graphs=cuda_graphs,
                                          one_row_decode=True), n=5, seed=3)


@pytest.mark.gpu
def test_one_row_decode_in_bf16_graphs_equal_eager(tiny_ckpt, monkeypatch):
    """bf16, where the engine takes the one-row path at batch 1 by default: replayed graphs give the eager
    path's tokens (the same kernels), and the path was the one-row one."""
    import torch

    monkeypatch.delenv("STREAMSCRIBE_ONE_ROW", raising=False)
    path = tiny_ckpt(seed=1)
    model, _ = load_model(path, device="cuda", dtype=torch.bfloat16)
    tok = load_tokenizer(path)
    clips = [synthetic_audio(3.0, seed=40 + i) for i in range(2)]
    tokens = {}
    for graphs in (True, False):
        eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=2, max_batch=1, cuda_graphs=graphs))
        assert eng.runner.one_row_decode
        rec = Recorder()
        sids = [eng.open_stream(rec) for _ in clips]
        for sid, clip in zip(sids, clips):
            eng.push_audio(sid, clip)
            eng.finish_stream(sid)
        drive(eng)
        tokens[graphs] = [rec.tokens(sid) for sid in sids]
    assert tokens[True] == tokens[False] and all(len(t) > 20 for t in tokens[True])


def test_admission_refusal_and_release(tiny_ckpt):
    path = tiny_ckpt(seed=0)
    model, _ = load_model(path)
    eng = BatchedEngine(model, load_tokenizer(path), opts=RunnerOptions(max_streams=2, max_batch=2))
    rec = Recorder()
    a = eng.open_stream(rec)
    eng.open_stream(rec)
    with pytest.raises(AdmissionError, match=r"engine is full: 2 streams admitted, each reserving [\d.]+ MiB"):
        eng.open_stream(rec)
    eng.close_stream(a)
    drive(eng)
    eng.open_stream(rec)  # the slot and its KV came back


def test_client_mistakes_reach_only_their_own_stream(tiny_ckpt):
    """Three client mistakes that once reached past their own stream:
    - a delay beyond the largest served (2400 ms) is refused at `open_stream` (ConfigError); it was accepted, and the
      join then failed on the delay-scale table for every stream joining in that step;
    - a buffer reused after `push_audio` returns does not change what was pushed (the engine copies it; it kept a
      reference, read at its next sync, so a later NaN also slipped past the check);
    - no event reaches a client after its `close_stream` returns, even when the close lands inside a step."""
    from realtime.config import ConfigError
    from realtime.session import StreamingSession

    path = tiny_ckpt(seed=0)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=3, max_batch=3))
    rec = Recorder()
    with pytest.raises(ConfigError, match="at most 2400 ms"):
        eng.open_stream(rec, delay_ms=2480)
    with pytest.raises(ConfigError, match="at most 2400 ms"):
        StreamingSession(model, tok, delay_ms=2480)
    longest = eng.open_stream(rec, delay_ms=2400)
    audio = synthetic_audio(1.5, seed=5)
    reused = eng.open_stream(rec)
    buf = np.empty(1600, np.float32)
    for k in range(0, audio.size, 1600):
        n = min(1600, audio.size - k)
        buf[:n] = audio[k:k + n]
        eng.push_audio(reused, buf[:n])
        eng.push_audio(longest, buf[:n])
        buf[:] = np.nan  # the client's buffer, refilled (or poisoned) before the engine's next sync
    eng.finish_stream(reused)
    eng.finish_stream(longest)
    closing = eng.open_stream(rec)
    eng.push_audio(closing, audio)
    eng.finish_stream(closing)
    live = eng._sync_with_clients()
    while not rec.tokens(closing):  # the engine thread's loop, run here, until the stream has its first tokens
        eng._run_step(live)
        live = eng._sync_with_clients()
    seen = len(rec.events[closing])
    eng.close_stream(closing)  # lands mid-step: `live` predates it
    eng._run_step(live)
    drive(eng)
    assert len(rec.events[closing]) == seen
    assert rec.tokens(reused) == transcribe(model, tok, audio).token_ids
    assert rec.tokens(longest) == transcribe(model, tok, audio, delay_ms=2400).token_ids
    assert isinstance(rec.done(reused), StreamDone) and isinstance(rec.done(longest), StreamDone)


def test_kv_memory_is_bounded_by_the_window(tiny_ckpt):
    path = tiny_ckpt(seed=0, small_windows=True)
    model, _ = load_model(path)
    eng = BatchedEngine(model, load_tokenizer(path), opts=RunnerOptions(max_streams=1, max_batch=1, block_size=4))
    c = model.config
    assert eng.runner.lm_cache.width == ring_width(c.decoder.sliding_window, 4, 8, None)
    rec = Recorder()
    sid = eng.open_stream(rec)
    eng.push_audio(sid, synthetic_audio(20.0, seed=3))  # 250 tokens: 40x the decoder window
    eng.finish_stream(sid)
    drive(eng)
    assert isinstance(rec.done(sid), StreamDone)
    assert rec.tokens(sid) == transcribe(model, load_tokenizer(path), synthetic_audio(20.0, seed=3)).token_ids
    # nothing beyond the ring reserved at admission was ever used
    assert eng.runner.lm_cache.pool.free == eng.runner.lm_cache.pool.num_blocks - eng.runner.lm_cache.width


def test_max_session_length_ends_gracefully(tiny_ckpt):
    path = tiny_ckpt(seed=0)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=2, max_batch=2, max_session_seconds=1.0))
    rec = Recorder()
    long_sid = eng.open_stream(rec)
    short_sid = eng.open_stream(rec)
    eng.push_audio(long_sid, synthetic_audio(30.0, seed=4))
    eng.push_audio(short_sid, synthetic_audio(0.5, seed=5))
    eng.finish_stream(short_sid)
    long_stream = eng._controls[long_sid].stream
    drive(eng)
    done = rec.done(long_sid)
    assert isinstance(done, StreamDone) and done.truncated
    # the encoder stopped at the last position the stream could run, though more audio had arrived
    assert long_stream.audio_done == long_stream.max_tokens - 1
    assert long_stream.audio_tokens_ready(model.config.streaming.mel_frames_per_token) > 0
    ref = transcribe(model, tok, synthetic_audio(30.0, seed=4)).token_ids
    assert rec.tokens(long_sid) == ref[: len(rec.tokens(long_sid))]
    assert rec.tokens(short_sid) == transcribe(model, tok, synthetic_audio(0.5, seed=5)).token_ids
    with pytest.raises(StreamError):
        eng.push_audio(short_sid, np.zeros(10, np.float32))


def test_bad_or_silent_streams_do_not_hurt_others(tiny_ckpt):
    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=3, max_batch=3))
    eng.start()
    try:
        rec = Recorder()
        good, nan, silent = (eng.open_stream(rec) for _ in range(3))
        audio = synthetic_audio(2.0, seed=6)
        with pytest.raises(ValueError, match="NaN"):
            eng.push_audio(nan, np.full(1000, np.nan, np.float32))
        eng.push_audio(silent, audio[:5000])  # then it stops sending, never finishes
        for k in range(0, audio.size, 999):
            eng.push_audio(good, audio[k: k + 999])
            if k % 4995 == 0:
                eng.push_audio(nan, audio[k: k + 10])
        eng.finish_stream(good)
        for _ in range(2400):  # generous: CI machines can be slow, the loop exits as soon as done
            if rec.done(good) is not None:
                break
            threading.Event().wait(0.05)
        assert rec.tokens(good) == transcribe(model, tok, audio).token_ids
        assert rec.done(silent) is None and rec.done(nan) is None  # still open, never stalled the good one
    finally:
        eng.stop()


def test_encoder_step_reads_keys_once_per_token(tiny_ckpt, monkeypatch):
    """The encoder step's queries come as runs of an audio token's 4 frames (one key read per run);
    the LM step's as single tokens. A run length of 1 would still be correct, only 4x the reads."""
    import realtime.engine.attention as engine_attention
    from realtime.engine.offline import run_engine_offline

    seen: list[tuple[int, int]] = []  # (cache id, tokens_per_run)
    init = engine_attention.PagedAttention.__init__

    def spy(self, cache, *args, tokens_per_run: int = 1, **kwargs):
        seen.append((id(cache), tokens_per_run))
        init(self, cache, *args, tokens_per_run=tokens_per_run, **kwargs)

    monkeypatch.setattr(engine_attention.PagedAttention, "__init__", spy)
    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    eng = BatchedEngine(model, load_tokenizer(path), opts=RunnerOptions(max_streams=2, max_batch=2))
    run_engine_offline(eng, [synthetic_audio(1.0, seed=1), synthetic_audio(1.3, seed=2)])
    enc, lm = id(eng.runner.enc_cache), id(eng.runner.lm_cache)
    assert {r for c, r in seen if c == enc} == {model.config.streaming.downsample_factor}
    assert {r for c, r in seen if c == lm} == {1}


def test_cpu_steps_read_rings_in_place(tiny_ckpt, monkeypatch):
    """On the CPU the engine's steps read each stream's encoder and LM rings in place (no gather), and the tokens
    are still the session's. A change that loses the layout (rings not slot-aligned, or the promise not passed)
    leaves the results right but fails here."""
    import importlib

    from realtime.engine.offline import run_engine_offline

    pa = importlib.import_module("kernels.paged_attention")
    read: list[int] = []
    in_place = pa._rings_in_place

    def spy(q, k_cache, *args, **kwargs):
        read.append(k_cache.data_ptr())
        return in_place(q, k_cache, *args, **kwargs)

    monkeypatch.setattr(pa, "_rings_in_place", spy)
    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=3, max_batch=3, block_size=4))
    clips = [synthetic_audio(1.0, seed=1), synthetic_audio(2.2, seed=2), synthetic_audio(1.6, seed=3)]
    got = run_engine_offline(eng, clips)
    assert [r.token_ids for r in got.results] == [transcribe(model, tok, c).token_ids for c in clips]
    enc = {t.data_ptr() for t in eng.runner.enc_cache.k}
    lm = {t.data_ptr() for t in eng.runner.lm_cache.k}
    assert enc <= set(read) and lm <= set(read), "every layer of both caches was read in place"


def test_recent_steps_is_the_median_of_the_last_window():
    from realtime.serving import RecentSteps

    r = RecentSteps(window_s=2.0, keep=4)
    assert r.median(0.0) == 0.0
    for t, s in [(0.0, 0.010), (0.5, 0.030), (1.0, 0.020)]:
        r.add(s, t)
    assert r.median(1.0) == 0.020
    assert r.median(2.2) == 0.025  # the step that ended at 0.0 left the window
    assert r.median(3.1) == 0.0  # nothing in the last 2 s: an idle engine
    for i in range(6):
        r.add(0.001 * i, 10.0)
    assert r.median(10.0) == 0.0035  # the newest 4 only
    r = RecentSteps(window_s=2.0)
    assert r.median_streams(0.0) == 0.0
    for t, n in [(0.0, 1), (0.5, 8), (1.0, 3), (1.5, 4)]:
        r.add(0.01, t, streams=n)
    assert r.median_streams(1.5) == 3.5 and r.median_streams(2.2) == 4.0  # the 1-stream step left the window
    assert r.median_streams(4.0) == 0.0



def test_recent_steps_fit_a_line_to_the_step_cost():
    """RecentSteps.cost_line: fixed + per stream x streams through the median step of each batch size; none from
    fewer than three batch sizes; neither a host pause nor one odd batch size tilts it; clamped at 0; refitted every
    REFIT steps."""
    from realtime.serving import RecentSteps

    r = RecentSteps()
    for n in (1, 4):
        for _ in range(5):
            r.add(0.004 + 0.0005 * n, 0.0, streams=n)
    assert r.cost_line() == (0.0, 0.0)  # two batch sizes only
    r = RecentSteps()
    for n in (1, 2, 4, 8, 16):
        for _ in range(5):
            r.add(0.004 + 0.0005 * n, 0.0, streams=n)
    r.add(0.9, 0.0, streams=16)  # a host pause
    r.add(0.5, 0.0, streams=3)
    r.add(0.5, 0.0, streams=3)  # an odd batch size
    fixed, per = r.cost_line()
    assert abs(fixed - 0.004) < 1e-9 and abs(per - 0.0005) < 1e-9
    for n in (1, 2, 4, 8, 16):  # every batch size turns out dearer per stream: 30 steps, not refitted yet
        for _ in range(6):
            r.add(0.004 + 0.002 * n, 0.0, streams=n)
    assert r.cost_line() == (fixed, per) and RecentSteps.REFIT == 32
    r.add(0.004 + 0.002 * 16, 0.0, streams=16)
    r.add(0.004 + 0.002 * 16, 0.0, streams=16)
    fixed, per = r.cost_line()
    assert abs(fixed - 0.004) < 1e-9 and abs(per - 0.002) < 1e-9
    many = RecentSteps()  # a GPU's many batch sizes: the fit reads at most max_points of them, evenly spread
    for n in range(1, 10):
        for _ in range(2):
            many.add(0.001 * n if n in (1, 5, 9) else 1.0, 0.0, streams=n)
    assert many.fit_cost_line(max_points=3) == (0.0, 0.001)  # sizes 1, 5 and 9 only: the line through them
    assert many.fit_cost_line() != (0.0, 0.001)  # all nine: the others move it
    falling = RecentSteps()
    for n in (1, 2, 3):
        for _ in range(2):
            falling.add(0.01 / n, 0.0, streams=n)
    assert falling.cost_line()[1] == 0.0 and falling.cost_line()[0] > 0  # never a negative cost


def test_engine_reports_its_recent_step_time(tiny_ckpt):
    """`EngineStats.recent_step_seconds`: the median of the steps just run (what admission compares with
    --max-step-ms), from an engine that just decoded."""
    from realtime.engine.offline import run_engine_offline

    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    eng = BatchedEngine(model, load_tokenizer(path), opts=RunnerOptions(max_streams=2, max_batch=2))
    assert eng.stats().recent_step_seconds == 0.0 and eng.stats().recent_step_streams == 0.0
    run_engine_offline(eng, [synthetic_audio(1.0, seed=1), synthetic_audio(1.0, seed=2)])
    st = eng.stats()
    recent = st.step_seconds[-min(len(st.step_seconds), 512):]
    assert 0 < st.recent_step_seconds <= max(recent) and st.recent_step_seconds >= min(recent)
    assert st.recent_step_streams == 2.0  # both streams decoded in (nearly) every step


def test_collected_then_no_gc_guard():
    """The guard graph capture runs under (CPU part of the check below): garbage in reference cycles
    is collected on entry, the automatic GC stays off inside, and its previous state comes back."""
    import gc
    import weakref

    from realtime.engine.cuda_graph import collected_then_no_gc

    class Cycle:
        pass

    c = Cycle()
    c.self_reference = c
    ref = weakref.ref(c)
    del c
    assert gc.isenabled()
    with collected_then_no_gc():
        assert ref() is None  # collected before the block
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collected_then_no_gc():
        raise RuntimeError("a failed capture")
    assert gc.isenabled()  # restored on errors too
    gc.disable()
    try:
        with collected_then_no_gc():
            pass
        assert not gc.isenabled()  # left off when it was off
    finally:
        gc.enable()


@pytest.mark.gpu
def test_no_garbage_collection_while_graphs_are_captured():
    """Engines sit in reference cycles, so only the GC frees them, and freeing one destroys its CUDA
    graphs. CUDA forbids that while a stream captures (the capture is invalidated): it happened in
    the speculative benchmark, which builds engines in turn. So capture collects first and keeps the
    automatic GC off until it is done."""
    import gc

    import torch

    from realtime.engine.cuda_graph import DecodeGraphRunner

    x = torch.zeros(4, device="cuda")
    seen: list[tuple[bool, bool]] = []  # (capturing, gc enabled)

    def forward(b: int) -> None:
        seen.append((torch.cuda.is_current_stream_capturing(), gc.isenabled()))
        x[:b] += 1

    class Cycle:
        pass

    c = Cycle()
    c.self_reference = c
    collected = []
    ref = __import__("weakref").ref(c, lambda _: collected.append(gc.isenabled()))
    del c
    assert gc.isenabled()
    runner = DecodeGraphRunner(forward, 4, torch.device("cuda"))
    runner.capture()
    assert ref() is None and collected == [True]  # older garbage went before capture, not during
    assert [enabled for capturing, enabled in seen if capturing] == [False] * len(runner.buckets)
    assert any(not capturing for capturing, _ in seen)  # the warm-up ran outside capture
    assert gc.isenabled()
    before = x.clone()
    runner.replay(4)  # the captured graph works
    torch.cuda.synchronize()
    assert (x - before).tolist() == [1.0] * 4


def assert_whole_clips_transcribed(eng: BatchedEngine, model, tok, clips: list[np.ndarray], delay_ms: int = 480) -> None:
    """Every clip pushed at once and finished (offline), the engine driven until idle: each stream's
    tokens are the single-stream session's, and its encoder went exactly as far as its last position
    needs (the last position run is total_tokens - 2)."""
    rec = Recorder()
    sids = [eng.open_stream(rec, delay_ms=delay_ms) for _ in clips]
    streams = [eng._controls[sid].stream for sid in sids]
    for sid, clip in zip(sids, clips):
        eng.push_audio(sid, clip)
        eng.finish_stream(sid)
    drive(eng)
    for sid, clip in zip(sids, clips):
        assert rec.tokens(sid) == transcribe(model, tok, clip, delay_ms=delay_ms).token_ids
    for s in streams:
        assert s.audio_done == s.total_tokens - 1


@pytest.mark.parametrize("encode_ahead", [True, False])
def test_next_audio_is_encoded_behind_the_lm_step(tiny_ckpt, encode_ahead):
    """With `encode_ahead` a stream whose next audio token has arrived gets it encoded right after the
    step's LM launch (its host work then overlaps the device), so the next step starts with its LM
    launch; without it every step encodes first. Tokens equal the single-stream session's either way,
    and nothing past a stream's last position is encoded."""
    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=2, max_batch=2, encode_ahead=encode_ahead))
    calls: list[tuple[str, list[tuple[int, int]]]] = []  # per call: kind, (audio_done, lm_pos) of its streams
    ahead_flags: list[bool] = []  # per encoder call: queued as the next step's (may run beside the LM)
    for name in ("encode_step", "decode_step"):
        real = getattr(eng.runner, name)

        def spy(streams, real=real, name=name, **kw):
            calls.append((name, [(s.audio_done, s.lm_pos) for s in streams]))
            if name == "encode_step":
                ahead_flags.append(kw.get("ahead", False))
            return real(streams, **kw)

        setattr(eng.runner, name, spy)
    steps: list[list[str]] = []
    run_step = eng._run_step

    def step(live):
        n = len(calls)
        ran = run_step(live)
        steps.append([kind for kind, _ in calls[n:]])
        return ran

    eng._run_step = step
    assert_whole_clips_transcribed(eng, model, tok, [synthetic_audio(1.0, seed=1), synthetic_audio(1.6, seed=2)])
    ran = [kinds for kinds in steps if "decode_step" in kinds]
    if encode_ahead:
        assert ran[0] == ["encode_step", "decode_step", "encode_step"]
        # the calls after a launch are the next step's: on CUDA they run beside the LM step
        encodes = [kind for kind, _ in calls if kind != "decode_step"]
        assert len(encodes) == len(ahead_flags) and ahead_flags[0] is False and ahead_flags[1] is True
        assert sum(ahead_flags) >= len(ahead_flags) - 3
        assert all(kinds[0] == "decode_step" for kinds in ran[1:])  # the audio was already encoded
        assert sum(kinds == ["decode_step", "encode_step"] for kinds in ran) >= len(ran) - 3
        for kind, rows in calls:  # every encoder call after a launch encodes the next position
            if kind == "encode_step" and rows and rows[0][0] > rows[0][1]:
                assert all(done == pos + 1 for done, pos in rows)
    else:
        assert all(kinds == ["encode_step", "decode_step"] for kinds in ran)
        assert not any(ahead_flags)


@pytest.mark.parametrize("in_flight", [True, False])
def test_a_steps_tokens_are_sent_while_the_next_step_runs(tiny_ckpt, in_flight):
    """`send_tokens_in_flight` (the default on CUDA): a step's token events go out after the next step's launch and
    before the engine waits for that step's tokens (the host's detokenising and callbacks overlap the device).
    Without it (the CPU's default: nothing to overlap) they go at the end of their own step. Either way every
    token reaches its client, in order, with the session's tokens."""
    path = tiny_ckpt(seed=1)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    assert BatchedEngine(model, tok, opts=RunnerOptions(max_streams=1, max_batch=1))._send_in_flight is False
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=3, max_batch=3, send_tokens_in_flight=in_flight))
    log: list[str] = []
    real_decode, real_wait = eng.runner.decode_step, eng._token_copy.wait
    eng.runner.decode_step = lambda streams: log.append("launch") or real_decode(streams)
    eng._token_copy.wait = lambda: log.append("wait") or real_wait()
    rec = Recorder()

    def on_event(ev):
        if isinstance(ev, StreamToken):
            log.append("token")
        rec(ev)

    clips = [synthetic_audio(1.2 + 0.4 * i, seed=30 + i) for i in range(3)]
    sids = [eng.open_stream(on_event) for _ in clips]
    # one detokeniser cache for every stream (bounded by the vocabulary, not by the streams)
    assert len({id(eng._controls[sid].stream.detok.text_cache) for sid in sids}) == 1
    for sid, clip in zip(sids, clips):
        eng.push_audio(sid, clip)
        eng.finish_stream(sid)
    drive(eng)
    for sid, clip in zip(sids, clips):
        assert rec.tokens(sid) == transcribe(model, tok, clip).token_ids
        assert isinstance(rec.done(sid), StreamDone)
    steps = "".join({"launch": "L", "wait": "W", "token": "t"}[e] for e in log).split("L")[1:]
    assert len(steps) > 20
    sent_in_flight = sum(step.split("W")[0].count("t") for step in steps)
    late = [step.split("W", 1)[1].count("t") for step in steps if "W" in step]
    if in_flight:
        # a step sends the previous step's tokens between its launch and its wait, and none between its wait and
        # the next launch except the end-of-stream flushes
        assert sent_in_flight >= 0.8 * sum(step.count("t") for step in steps)
        assert sum(1 for n in late if n) <= len(clips)
    else:
        assert sent_in_flight == 0 and sum(late) == sum(len(rec.tokens(sid)) for sid in sids)
        assert sum(1 for n in late if n) >= 10  # step by step, not held to the streams' ends


def test_tokens_of_a_lone_step_reach_an_idle_engines_client(tiny_ckpt):
    """A live stream whose audio runs out: the engine goes idle, and the tokens of its last step are sent then,
    not held until the next step; so are those of an engine stopped between steps."""
    path = tiny_ckpt(seed=1)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=2, max_batch=2, send_tokens_in_flight=True))
    rec = Recorder()
    sid = eng.open_stream(rec)
    eng.push_audio(sid, synthetic_audio(1.5, seed=3))
    drive(eng)  # until nothing is decodable: the stream is neither finished nor closed
    s = eng._controls[sid].stream
    assert len(s.tokens) > s.prompt_len + 3
    assert rec.tokens(sid) == s.tokens[s.prompt_len:]
    assert rec.done(sid) is None
    # a step's tokens wait for the next step's launch; an engine stopped before it still delivers them
    eng.push_audio(sid, synthetic_audio(0.5, seed=4))
    eng._run_step(eng._sync_with_clients())
    assert eng._unsent and len(rec.tokens(sid)) < len(s.tokens) - s.prompt_len
    eng._stop = True
    eng._loop()
    assert rec.tokens(sid) == s.tokens[s.prompt_len:] and not eng._unsent


def test_a_closed_stream_gets_no_events_and_a_raising_callback_hurts_no_other(tiny_ckpt, caplog):
    """Tokens decided for a stream whose client then closed it are not sent to it; a client callback that
    raises is logged, and the engine and the other streams go on with the session's tokens."""
    path = tiny_ckpt(seed=1)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=3, max_batch=3, send_tokens_in_flight=True))
    rec = Recorder()
    raised = []

    def bad(ev):
        raised.append(ev)
        raise RuntimeError("client bug")

    clips = [synthetic_audio(1.5, seed=40 + i) for i in range(3)]
    good, closing, broken = eng.open_stream(rec), eng.open_stream(rec), eng.open_stream(bad)
    for sid, clip in zip((good, closing, broken), clips):
        eng.push_audio(sid, clip)
        eng.finish_stream(sid)
    while len(eng._controls[closing].stream.tokens) <= eng._controls[closing].stream.prompt_len + 2:
        eng._run_step(eng._sync_with_clients())
    recorded = len(eng._controls[closing].stream.tokens) - eng._controls[closing].stream.prompt_len
    eng.close_stream(closing)
    drive(eng)
    assert len(rec.tokens(closing)) < recorded  # the last step's tokens were not sent after the close
    assert rec.done(closing) is None
    assert rec.tokens(good) == transcribe(model, tok, clips[0]).token_ids
    assert isinstance(rec.done(good), StreamDone)
    assert len(raised) > 3 and isinstance(raised[-1], StreamDone)  # it was still sent every event, its end too
    assert "event callback of stream" in caplog.text


def test_a_step_visits_only_the_streams_with_work(tiny_ckpt):
    """Between steps the engine looks only at streams a client touched or that still have work: 20
    admitted streams without new audio cost a step nothing (a load test showed per-step scans of every
    stream making the engine thread the bottleneck at 512 paced streams). A stream that gets audio again
    is served again, with the tokens of a single-stream session."""
    path = tiny_ckpt(seed=1)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    eng = BatchedEngine(model, tok, opts=RunnerOptions(max_streams=24, max_batch=24, block_size=4))
    rec = Recorder()
    idle = [eng.open_stream(rec) for _ in range(20)]
    busy = eng.open_stream(rec)
    drive(eng)  # joins; the prompt rows the left padding allows run now
    eng._sync_with_clients()  # streams left without work are set aside here
    visits: dict[int, int] = {}

    def counting(fn, sid: int):
        def counted(*a, **k):
            visits[sid] = visits.get(sid, 0) + 1
            return fn(*a, **k)
        return counted

    for sid in [*idle, busy]:
        s = eng._controls[sid].stream
        for name in ("audio_tokens_ready", "is_finished"):
            setattr(s, name, counting(getattr(s, name), sid))
    clip = synthetic_audio(2.0, seed=5)
    for start in range(0, 16000, 1280):  # 1 s in 80 ms chunks, a step after each
        eng.push_audio(busy, clip[start: start + 1280])
        eng._run_step(eng._sync_with_clients())
    assert eng._step >= 10
    assert visits.get(busy, 0) > 0
    assert [visits.get(sid, 0) for sid in idle] == [0] * len(idle)
    # an idle stream that gets audio again is served, exactly
    late = idle[3]
    eng.push_audio(late, clip[:12000])
    eng.finish_stream(late)
    drive(eng)
    assert isinstance(rec.done(late), StreamDone)
    assert rec.tokens(late) == transcribe(model, tok, clip[:12000]).token_ids


def test_offline_command_transcribes_files_as_the_session_does(tiny_ckpt, tmp_path, capsys, monkeypatch):
    """`python -m realtime.transcribe` (here its `main`) on several files: each file's line is the single-stream
    session's text, with the engine options of its flags (`--no-encoder-stream`, `--no-cuda-graphs`);
    an unreadable file is a clear error (exit 2), not a traceback."""
    import wave

    from realtime import transcribe as offline
    from realtime.audio import load_audio_file

    used: list[RunnerOptions] = []
    real = offline.transcribe_batch

    def spy(*args, opts, **kw):
        used.append(opts)
        return real(*args, opts=opts, **kw)

    monkeypatch.setattr(offline, "transcribe_batch", spy)

    path = tiny_ckpt(seed=2)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    files = []
    for i, seconds in enumerate((1.0, 1.7)):
        f = tmp_path / f"clip{i}.wav"
        with wave.open(str(f), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes((np.clip(synthetic_audio(seconds, seed=40 + i), -1, 1) * 32767).astype(np.int16).tobytes())
        files.append(f)
    want = [f"{f}\t{offline.one_line(transcribe(model, tok, load_audio_file(f)).text)}" for f in files]
    for flags in ([], ["--no-encoder-stream", "--no-cuda-graphs", "--batch", "1"]):
        assert offline.main(["--model", str(path), "--device", "cpu", *flags, *map(str, files)]) == 0
        assert capsys.readouterr().out.splitlines() == want
    assert [(o.encoder_stream, o.cuda_graphs, o.max_batch) for o in used] == [(True, True, 2), (False, False, 1)]
    (tmp_path / "bad.wav").write_bytes(b"not audio")
    assert offline.main(["--model", str(path), "--device", "cpu", str(tmp_path / "bad.wav")]) == 2
    assert "error:" in capsys.readouterr().err
    # an output file whose folder does not exist is refused before the decoding (it failed after it, a traceback)
    assert offline.main(["--model", str(path), "--device", "cpu", "--srt", str(tmp_path / "no" / "x.srt"),
                         str(files[0])]) == 2
    assert "--srt" in capsys.readouterr().err
    # the engine module's former command line points there instead of doing nothing
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "realtime.engine.offline", str(files[0])], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and "python -m realtime.transcribe" in proc.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [True, False])
@pytest.mark.parametrize("chunk", [8, 32])
def test_gpu_encoder_chunks_give_the_bits_of_one_token_calls(cuda_graphs, chunk):
    """The embedded model in bf16: a stream's audio embeddings are the same bits whether the look-ahead encoder
    takes its audio 8, 4, 2 or 1 token per call (speculation's catch-up; 32 and 16 too with a 32-token chunk, a
    chain's) or one token per step (plain decoding). The conv stem and the layers' projections take `linear`'s
    batch-invariant kernel up to the runner's encoder rows (64; 256 at 32 tokens), the attention splits by streams:
    what makes speculation lossless in bf16 (issue 5). Before, cuBLAS at 32 and 64 rows rounded otherwise, and
    most embeddings after the first differing frame differed."""
    import torch

    from realtime.audio import IncrementalLogMel, load_audio_file
    from realtime.engine.model_runner import ModelRunner
    from realtime.model_store import DEFAULT_MODEL_DIR

    model, _ = load_model(DEFAULT_MODEL_DIR, device="cuda", dtype=torch.bfloat16)
    audio = load_audio_file(str(DEFAULT_MODEL_DIR.parent.parent / "demo" / "samples" / "sample_en.wav"), 16000)
    audio = np.concatenate([audio, np.zeros(3 * 16000, np.float32)])  # 96 tokens need 7.7 s after the left pad
    chunks = [8] * 9 + [4, 2, 1, 1] + [8] * 2 if chunk == 8 else [32, 16, 8, 4, 2, 1, 1, 32]
    plans = {"one token per call": [1] * 96, "chunks": chunks}
    got = {}
    for name, plan in plans.items():
        runner = ModelRunner(model, RunnerOptions(max_streams=2, max_batch=2, max_step_tokens=8, encoder_chunk=chunk,
                                                  encoder_cache_tokens=chunk, cuda_graphs=cuda_graphs))
        enc, cl = runner.encoder, runner.cache_len
        runner.admit(1)
        mel = IncrementalLogMel.for_stream(model.config)
        mel.push(audio)
        done, rows = 0, []
        for n in plan:
            frames = enc.mpt * n
            enc.run(n, [mel.window(frames)], [1], [done])
            mel.advance(frames)
            torch.cuda.synchronize()
            rows += [runner.audio_cache[1 * cl + (done + i) % cl].clone() for i in range(n)]
            done += n
        got[name] = torch.stack(rows)
    a, b = got["one token per call"], got["chunks"]
    assert a.shape == b.shape == (96, model.config.decoder.hidden_size)
    differing = [i for i in range(96) if not torch.equal(a[i], b[i])]
    assert not differing, f"tokens {differing[:8]} differ ({len(differing)} of 96)"



def encoder_rows_of_many_streams_vs_alone(device: str, dtype, *, cuda_graphs: bool, streams: int = 16,
                                           tokens: int = 56):
    """(batched, alone): each of `streams` streams' audio embeddings [tokens, H] when one plain runner with
    `encoder_rows=64` encodes all of them in every call (one token each: streams x 4 rows a call), and when a runner
    encodes that stream by itself. The streams hear the demo sample from different offsets (after the 32 tokens of
    left-pad silence every stream starts with)."""
    import torch

    from kernels.linear import INVARIANT_ROWS
    from realtime.audio import IncrementalLogMel, load_audio_file
    from realtime.engine.model_runner import ModelRunner
    from realtime.model_store import DEFAULT_MODEL_DIR

    model, _ = load_model(DEFAULT_MODEL_DIR, device=device, dtype=dtype)
    audio = load_audio_file(str(DEFAULT_MODEL_DIR.parent.parent / "demo" / "samples" / "sample_en.wav"), 16000)
    clips = [np.concatenate([np.roll(audio, 997 * k), np.zeros(3 * 16000, np.float32)]) for k in range(streams)]

    def encode(which: list[int]) -> list[torch.Tensor]:
        runner = ModelRunner(model, RunnerOptions(max_streams=streams + 1, max_batch=streams, cuda_graphs=cuda_graphs,
                                                  encoder_rows=INVARIANT_ROWS))
        enc, cl = runner.encoder, runner.cache_len
        slots = list(range(1, len(which) + 1))
        for slot in slots:
            runner.admit(slot)
        mels = []
        for k in which:
            mel = IncrementalLogMel.for_stream(model.config)
            mel.push(clips[k])
            mels.append(mel)
        for done in range(tokens):
            enc.run(1, [m.window(enc.mpt) for m in mels], slots, [done] * len(slots))
            for m in mels:
                m.advance(enc.mpt)
        if device == "cuda":
            torch.cuda.synchronize()
        return [torch.stack([runner.audio_cache[slot * cl + t % cl].clone() for t in range(tokens)]) for slot in slots]

    batched = encode(list(range(streams)))
    alone = [encode([k])[0] for k in range(streams)]
    return batched, alone


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_gpu_eight_streams_per_encoder_call_give_each_stream_its_bits_alone(cuda_graphs):
    """The embedded model in bf16: 8 streams encoded together on `linear`'s batch-invariant kernel (`encoder_rows=64`)
    give every stream the bits it gets encoded alone. 8 streams is the envelope: the conv stem's first layer takes 8
    mel frames a token, so 8 streams fill its 64 rows; at 16 streams its 128 rows go to cuBLAS and 9 of 16 streams
    differed on an H100 (forty-third session), which is why bf16 speculation at batch 16 and 64 is not bit-identical to
    plain decoding (its look-ahead calls take up to 8 tokens a stream, far more rows again) while fp32 is (16/16,
    64/64 on the same H100: docs/benchmarks.md, issue 5)."""
    import torch

    from kernels.linear import INVARIANT_ROWS

    streams = INVARIANT_ROWS // 8
    batched, alone = encoder_rows_of_many_streams_vs_alone("cuda", torch.bfloat16, cuda_graphs=cuda_graphs,
                                                           streams=streams)
    differing = [k for k, (a, b) in enumerate(zip(batched, alone)) if not torch.equal(a, b)]
    assert not differing, f"streams {differing} differ from their encoding alone ({len(differing)} of {streams})"


def test_many_streams_per_encoder_call_give_each_stream_its_embeddings_alone_on_the_cpu():
    """The GPU test's scenario on the CPU (fp32, the torch references; 4 streams): the same embeddings up to float
    rounding, so the scenario itself (slots, offsets, windows) is right wherever the bits are not checked."""
    import torch

    batched, alone = encoder_rows_of_many_streams_vs_alone("cpu", torch.float32, cuda_graphs=False, streams=4,
                                                           tokens=40)
    assert all(a.shape == (40, b.shape[1]) and a.abs().max() > 0 for a, b in zip(batched, alone))
    for a, b in zip(batched, alone):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(batched[0][-6:], batched[1][-6:])  # past the silence the offsets differ

@pytest.mark.parametrize("encoder_chunk", [1, 8])
def test_encoder_projections_ask_for_batch_invariant_rows_and_the_lm_does_not(tiny_ckpt, monkeypatch, encoder_chunk):
    """The routing behind lossless bf16 speculation, checked on the CPU (the GPU test above checks the bits): with
    look-ahead chunks (encoder_chunk 8, as speculation sets) every projection of the audio encoder (conv stem,
    layers, adapter; prompt prefix included) asks `linear` for INVARIANT_ROWS rows; a plain runner's ask for 16
    (cuBLAS beyond: faster at 5-16 streams, and rows of up to 16 get the same bits either way); a plain LM step's
    always 16 (more would move batches of 17-64 streams off cuBLAS)."""
    import torch

    import realtime.model as model_module
    from kernels.linear import INVARIANT_ROWS, MAX_ROWS
    from realtime.engine.offline import run_engine_offline

    path = tiny_ckpt(seed=1)
    model, _ = load_model(path)
    encoder_weights = {p.data_ptr() for m in (model.audio_tower, model.multi_modal_projector) for p in m.parameters()}
    lm_weights = {p.data_ptr() for p in model.language_model.parameters()} | {model.head_weight().data_ptr()}
    asked: dict[str, set[int]] = {"encoder": set(), "lm": set()}
    real = model_module.linear

    def recording(x, weight, bias=None, *, max_rows=MAX_ROWS, **kw):
        part = "encoder" if weight.data_ptr() in encoder_weights else "lm" if weight.data_ptr() in lm_weights else "?"
        asked.setdefault(part, set()).add(max_rows)
        return real(x, weight, bias, max_rows=max_rows, **kw)

    monkeypatch.setattr(model_module, "linear", recording)
    eng = BatchedEngine(model, load_tokenizer(path), opts=RunnerOptions(max_streams=2, max_batch=2, cuda_graphs=False,
                                                                        encoder_chunk=encoder_chunk))
    with torch.no_grad():
        run_engine_offline(eng, [synthetic_audio(1.5, seed=3), synthetic_audio(1.0, seed=4)])
    assert asked == {"encoder": {INVARIANT_ROWS if encoder_chunk > 1 else MAX_ROWS}, "lm": {MAX_ROWS}}, asked
    assert model.audio_tower.embedder.linear_rows == INVARIANT_ROWS  # the model's own default, restored


def test_encoder_rows_option_is_checked_and_restored(tiny_ckpt, monkeypatch):
    """`RunnerOptions.encoder_rows`: None gives STREAMSCRIBE_ENCODER_ROWS if set, else 64 with look-ahead chunks
    and 16 without; 16..256 are taken as given (a look-ahead call of several tokens takes at least the conv stem's
    rows at the largest chunk: 256 at 32 tokens); anything else is refused with the option's or the variable's name. `VoxtralRealtime.encoder_rows` sets every encoder
    projection's rows and restores them on exit, also after an exception."""
    from kernels.linear import INVARIANT_ROWS, MAX_ROWS
    from realtime.engine.model_runner import encoder_rows_for

    monkeypatch.delenv("STREAMSCRIBE_ENCODER_ROWS", raising=False)
    assert encoder_rows_for(RunnerOptions()) == MAX_ROWS
    assert encoder_rows_for(RunnerOptions(encoder_chunk=8)) == encoder_rows_for(RunnerOptions(encoder_chunk=32)) \
        == INVARIANT_ROWS
    assert encoder_rows_for(RunnerOptions(encoder_rows=256)) == 256
    assert encoder_rows_for(RunnerOptions(encoder_rows=32)) == 32
    assert encoder_rows_for(RunnerOptions(encoder_chunk=8, encoder_rows=16)) == 16
    for bad in (8, 257, 32.0, True):
        with pytest.raises(ValueError, match="encoder_rows must be an integer in 16..256, got"):
            encoder_rows_for(RunnerOptions(encoder_rows=bad))
    monkeypatch.setenv("STREAMSCRIBE_ENCODER_ROWS", "64")
    assert encoder_rows_for(RunnerOptions()) == INVARIANT_ROWS
    assert encoder_rows_for(RunnerOptions(encoder_rows=16)) == MAX_ROWS  # the option wins
    for bad in ("8", "many"):
        monkeypatch.setenv("STREAMSCRIBE_ENCODER_ROWS", bad)
        with pytest.raises(ValueError, match="STREAMSCRIBE_ENCODER_ROWS must be an integer in 16..256"):
            encoder_rows_for(RunnerOptions())
    monkeypatch.delenv("STREAMSCRIBE_ENCODER_ROWS")
    model, _ = load_model(tiny_ckpt(seed=1))
    tower = model.audio_tower
    mods = [tower.embedder, model.multi_modal_projector, *(m for l in tower.layers for m in (l.self_attn, l.mlp))]
    lm = [m for l in model.language_model.layers for m in (l.self_attn, l.mlp)]
    assert {m.linear_rows for m in mods} == {INVARIANT_ROWS} and {m.linear_rows for m in lm} == {MAX_ROWS}
    with pytest.raises(RuntimeError, match="inside"):
        with model.encoder_rows(24):
            assert {m.linear_rows for m in mods} == {24} and {m.linear_rows for m in lm} == {MAX_ROWS}
            raise RuntimeError("inside")
    assert {m.linear_rows for m in mods} == {INVARIANT_ROWS}


def test_lookahead_encoder_splits_its_attention_by_streams(tiny_ckpt, monkeypatch):
    """The look-ahead encoder asks for its attention's key splits by the number of streams in the call, whatever
    the tokens per stream (8 tokens of one stream are 8 runs of 4 frames, which the kernel's own choice would split
    less: other sums than a one-token call's); and `splits_for_streams` is the kernel's choice for one run per
    stream (the full-size encoder's shape on an H200's 132 SMs: 12 splits, where 8 runs would get 3)."""
    from types import SimpleNamespace

    import torch

    import realtime.engine.lookahead as lookahead
    from kernels._paged_attention_triton import choose_num_splits
    from kernels.paged_attention import splits_for_streams
    from realtime.audio import IncrementalLogMel
    from realtime.engine.model_runner import ModelRunner

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: SimpleNamespace(multi_processor_count=132))
    cuda = torch.device("cuda")
    assert splits_for_streams(1, 32, 750, 4, cuda) == choose_num_splits(1, 32, 753, cuda) == 12
    assert choose_num_splits(8, 32, 753, cuda) == 3
    assert splits_for_streams(1, 32, 750, 4, torch.device("cpu")) is None
    monkeypatch.undo()

    calls = []
    monkeypatch.setattr(lookahead, "splits_for_streams", lambda *a: calls.append(a))
    path = tiny_ckpt(seed=1)
    model, _ = load_model(path)
    runner = ModelRunner(model, RunnerOptions(max_streams=2, max_batch=2, max_step_tokens=8, encoder_chunk=8,
                                              cuda_graphs=False))
    runner.admit(0)
    mel = IncrementalLogMel.for_stream(model.config)
    mel.push(synthetic_audio(2.0, seed=5))
    enc = runner.encoder
    with torch.no_grad():
        enc.run(8, [mel.window(enc.mpt * 8)], [0], [0])
    spec = runner.enc_cache.spec
    assert calls == [(1, spec.kv_heads, spec.window, enc.fpt, runner.device)]
