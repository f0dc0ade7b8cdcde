"""Batched-engine benchmarks on a GPU (issue 3: B1-B4 and memory), full-size config, random bf16 weights.

    python benchmarks/bench_engine.py --model DIR --out bench_engine.json [--quick]

B1  batch-1 step time (encoder token + LM token, graphs on) vs the floor: weight bytes / measured
    device copy bandwidth (same run); each step's encoder before its LM, and (`engine_order`) as the
    engine runs a backlog: the next token's encoder after the LM launch, on the encoder's CUDA stream.
B2  step time for 1..N streams at 2-minute session ages, and the largest stream count whose p99
    step time (= time to process one 80 ms tick for every stream) stays <= 40 ms; then a paced run
    through the real engine thread at that count (audio fed at real time).
B3  step time at session age 1 min vs 60 min (caches filled to those positions).
B4  transformers (eager generate with caches) on the same GPU: per-stream step time, ratio ours/theirs.
Memory: KV bytes reserved per stream (encoder + LM) and the admission limit they imply.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from host_phases import _IN_FLIGHT  # --tokens-in-flight -> RunnerOptions.send_tokens_in_flight
from profile_tools import kernel_profile

from realtime.engine.model_runner import ModelRunner, RunnerOptions, kv_bytes_per_stream
from realtime.engine.staging import TokenCopy
from realtime.loader import load_model

log = logging.getLogger("bench_engine")


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (median of 20)."""
    n = 2 * 2**30 // 2
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    times = []
    for _ in range(25):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * a.numel() * 2 / statistics.median(times[5:])


def matmul_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * 10 / (time.perf_counter() - t0) / 1e12


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class SyntheticStreams:
    """Drives ModelRunner.encode/decode directly for `n` streams at given session ages."""

    def __init__(self, runner: ModelRunner, n: int, ages_tokens: list[int], delay: int = 6,
                 ahead: bool = False, parts: str = "both") -> None:
        if parts not in ("both", "lm", "encoder"):
            raise ValueError(f"parts must be 'both', 'lm' or 'encoder', got {parts!r}")
        self.runner, self.n = runner, n
        # parts: "lm" times the LM step alone and "encoder" the encoder step alone (each on the same positions
        # as a whole step), to tell where a step's time goes; "both": the step itself
        self.parts = parts
        # ahead: in the engine's order (`BatchedEngine._run_step` with encode_ahead): the LM step, its token
        # copy, then the next token's encoder (on the encoder's stream when the runner has one); else
        # each step encodes its own token first
        self.ahead = ahead
        self._encoded = False  # ahead: the next step's token is encoded
        self._copy = TokenCopy(n, runner.device)
        c = runner.cfg
        self.fpt = c.streaming.downsample_factor
        self.prompt = c.prompt_length(delay)
        self.slots = list(range(n))
        for s in self.slots:
            runner.admit(s)
        self.lm_pos = [self.prompt + a for a in ages_tokens]
        self.delays = [delay] * n
        self.tokens = [33] * n
        # each stream's next sample window (the samples of one token's mel frames), as the engine sends it (a numpy
        # view of the stream's buffer, `IncrementalLogMel.window_samples`)
        self.host_mel = [torch.randn(runner.mel.samples_needed(c.streaming.mel_frames_per_token)).numpy()
                         for _ in range(n)]

    def release(self) -> None:
        for s in self.slots:
            self.runner.release(s)

    def step(self, trace: StepTrace | None = None) -> None:
        r = self.runner
        mark = trace.mark if trace is not None else _no_mark
        mark("start")
        # front-end work of a real step: each stream's sample window to the device (log-mel, conv stem,
        # encoder layers and adapter run in the encoder graph)
        mark("mel")
        if self.parts == "encoder":
            r.encoder.run(1, self.host_mel, self.slots, self.lm_pos)
            r.fence.wait()
            self.lm_pos = [p + 1 for p in self.lm_pos]
            return
        if not self._encoded and self.parts == "both":
            r.encoder.run(1, self.host_mel, self.slots, self.lm_pos)
        mark("encoder")
        ids = r.decode(self.slots, self.lm_pos, self.tokens, self.delays)
        mark("decode")
        queued = r.fence.mark()
        self._copy.start(ids)  # the device -> host copy of a real step
        if self.ahead and self.parts == "both":
            r.encoder.run(1, self.host_mel, self.slots, [p + 1 for p in self.lm_pos], ahead=True)
        self._encoded = self.ahead
        self.tokens = self._copy.wait()
        r.fence.passed(queued)  # as the engine does: the staging copies queued before the tokens have run
        self.lm_pos = [p + 1 for p in self.lm_pos]
        mark("sync")


def _no_mark(name: str) -> None:
    pass


class StepTrace:
    """Where a step's time goes, to explain slow steps: host wall clock between phases (front-end;
    encoder launch, which since the eighth session includes the sample upload and the log-mel, run in
    the encoder graph, so the "mel" phase is empty; LM launch; wait for the token ids) and, from CUDA
    events recorded at the same points, the device time of the encoder and LM parts. Events never
    synchronise, so the trace leaves the step as it is. Python GC runs in a step are counted."""

    PHASES = ("mel", "encoder", "decode", "sync")

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self._wall: dict[str, float] = {}
        self._events: dict[str, torch.cuda.Event] = {}
        self._gc_runs = 0
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_runs += 1

    def mark(self, name: str) -> None:
        self._wall[name] = time.perf_counter()
        if name in ("mel", "encoder", "decode"):
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._events[name] = ev
        if name == "start":
            self._gc_runs = 0
        if name == "sync":  # the step is over: the events have completed
            w, e = self._wall, self._events
            row = {"total_ms": 1e3 * (w["sync"] - w["start"]), "step": len(self.steps)}
            prev = "start"
            for ph in self.PHASES:
                row[f"host_{ph}_ms"] = 1e3 * (w[ph] - w[prev])
                prev = ph
            row["dev_encoder_ms"] = e["mel"].elapsed_time(e["encoder"])
            row["dev_decode_ms"] = e["encoder"].elapsed_time(e["decode"])
            row["gc_runs"] = self._gc_runs
            self.steps.append(row)

    def summary(self, slowest: int = 5) -> dict:
        rows = sorted(self.steps, key=lambda r: r["total_ms"])
        keys = [k for k in rows[0] if k not in ("total_ms", "step")] if rows else []
        med = {k: statistics.median(r[k] for r in rows) for k in keys}
        return {"median_phases": med, "slowest_steps": rows[-slowest:][::-1],
                "steps_with_gc": sum(1 for r in rows if r["gc_runs"])}


def time_steps(sim: SyntheticStreams, steps: int, warmup: int = 5, trace: bool = False) -> dict:
    gc.collect()
    gc.freeze()  # as the engine does: full GC passes over the model's objects would show up as outliers
    try:
        return _time_steps(sim, steps, warmup, StepTrace() if trace else None)
    finally:
        gc.unfreeze()


def _time_steps(sim: SyntheticStreams, steps: int, warmup: int, trace: StepTrace | None) -> dict:
    for _ in range(warmup):
        sim.step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        sim.step(trace)
        times.append(time.perf_counter() - t0)
    times.sort()
    out = {"median_ms": 1e3 * statistics.median(times),
           "p99_ms": 1e3 * times[min(len(times) - 1, int(0.99 * len(times)))], "mean_ms": 1e3 * statistics.fmean(times),
           "max_ms": 1e3 * times[-1]}
    if trace is not None:
        trace.close()
        out["trace"] = trace.summary()
    return out


def bench_b1(model, bw: float, steps: int, profile: bool = False) -> dict:
    runner = ModelRunner(model, RunnerOptions(max_streams=1, max_batch=1, max_session_seconds=600))
    sim = SyntheticStreams(runner, 1, [750])
    t = time_steps(sim, steps)
    # device time alone (no host front-end): events around encoder + LM graphs
    s_ev, e_ev = torch.cuda.Event(True), torch.cuda.Event(True)
    dev = []
    for _ in range(50):
        s_ev.record()
        runner.encoder.run(1, sim.host_mel, sim.slots, sim.lm_pos)
        runner.decode(sim.slots, sim.lm_pos, sim.tokens, sim.delays)
        e_ev.record()
        e_ev.synchronize()
        runner.fence.passed()
        dev.append(s_ev.elapsed_time(e_ev))
    prof = kernel_profile(lambda: (runner.encoder.run(1, sim.host_mel, sim.slots, sim.lm_pos),
                                   runner.decode(sim.slots, sim.lm_pos, sim.tokens, sim.delays))) if profile else None
    sim.release()
    # the engine's order: the next token's encoder queued after the LM launch, on the encoder's stream
    ahead = SyntheticStreams(runner, 1, [750], ahead=True)
    t_ahead = time_steps(ahead, steps)
    ahead.release()
    floor_ms = weight_bytes(model) / bw * 1e3
    out = {**t, "device_median_ms": statistics.median(dev), "floor_ms": floor_ms,
           "ratio_to_floor": t["median_ms"] / floor_ms, "device_ratio_to_floor": statistics.median(dev) / floor_ms,
           "engine_order": {**t_ahead, "ratio_to_floor": t_ahead["median_ms"] / floor_ms}}
    if prof is not None:
        prof["gemm_GBps"] = weight_bytes(model) / 1e9 / (prof["by_kind_us"].get("gemm", 0.0) / 1e6 or float("nan"))
        out["kernel_profile"] = prof
    return out


def bench_b2(model, counts: list[int], steps: int, session_s: float, trace: bool = False) -> tuple[list[dict], int]:
    max_n = max(counts)
    runner = ModelRunner(model, RunnerOptions(max_streams=max_n, max_batch=max_n, max_session_seconds=session_s))
    rows, best = [], 0
    session_tokens = int(session_s * 1000 / 80)
    for n in counts:
        ages = [int(session_tokens * (i + 0.5) / n) for i in range(n)]  # ages spread over the session
        sim = SyntheticStreams(runner, n, ages)
        t = time_steps(sim, steps, trace=trace)
        sim.release()
        del sim
        rows.append({"streams": n, **t})
        log.info("B2 %d streams: %s", n, t)
        if t["p99_ms"] <= 40.0:
            best = n
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    return rows, best


def paced_run(model, tokenizer, n: int, seconds: float, session_s: float, stagger_s: float = 2.0,
              warmup_s: float = 3.0, tokens_in_flight: bool | None = None) -> dict:
    """n streams fed at real time through the engine thread (80 ms chunks), joining over `stagger_s`.

    Emission lag of a token = wall clock when it is emitted - wall clock when the audio it covers
    (its `audio_end_ms`) had been pushed; tokens of the first `warmup_s` seconds of each stream are
    left out (joins and prefills). The floor is one chunk (80 ms): a token also needs 2.5 ms of audio
    beyond its frame, which arrives with the next chunk.
    """
    from conftest import synthetic_audio

    from realtime.engine import BatchedEngine
    from realtime.serving import StreamToken

    gc.collect()  # earlier runners hold CUDA-graph pools through reference cycles
    torch.cuda.empty_cache()
    eng = BatchedEngine(model, tokenizer, opts=RunnerOptions(max_streams=n, max_batch=n, max_session_seconds=session_s,
                                                             send_tokens_in_flight=tokens_in_flight))
    lags: list[float] = []
    lock = threading.Lock()
    t_start: dict[int, float] = {}

    def on_event(ev):
        if isinstance(ev, StreamToken) and ev.token_id >= 0 and ev.audio_end_ms >= warmup_s * 1000:
            now = time.perf_counter()
            with lock:
                lags.append(now - (t_start[ev.stream_id] + ev.audio_end_ms / 1e3))

    eng.start()
    audio = synthetic_audio(seconds, seed=0)
    tick = 1280
    t0 = time.perf_counter()
    streams: list[tuple[int, float]] = []  # (stream id, its start time)
    joins = [t0 + stagger_s * i / max(1, n) for i in range(n)]
    sent = {}
    end = t0 + stagger_s + seconds
    while time.perf_counter() < end:
        now = time.perf_counter()
        while len(streams) < n and joins[len(streams)] <= now:
            sid = eng.open_stream(on_event, delay_ms=480)
            t_start[sid] = now
            streams.append((sid, now))
            sent[sid] = 0
        for sid, ts in streams:
            due = min(audio.size, int((now - ts) * 16000) // tick * tick)
            if due > sent[sid]:
                eng.push_audio(sid, audio[sent[sid]: due])
                sent[sid] = due
        time.sleep(0.002)
    time.sleep(1.0)
    st = eng.stats()
    eng.stop()
    del eng
    lags.sort()
    steps = sorted(st.step_seconds[-2000:])
    q = lambda xs, f: 1e3 * xs[min(len(xs) - 1, int(f * (len(xs) - 1)))] if xs else None
    return {"streams": n, "seconds": seconds, "stagger_s": stagger_s, "tokens_measured": len(lags),
            "lag_p50_ms": q(lags, 0.5), "lag_p99_ms": q(lags, 0.99), "lag_max_ms": q(lags, 1.0),
            "step_p50_ms": q(steps, 0.5), "step_p99_ms": q(steps, 0.99)}


def bench_b3(model, n_list: list[int], steps: int) -> list[dict]:
    gc.collect()
    torch.cuda.empty_cache()
    out = []
    for n in n_list:
        runner = ModelRunner(model, RunnerOptions(max_streams=n, max_batch=n))  # full LM window reserved
        res = {"streams": n}
        for label, age_s in (("1min", 60), ("60min", 3600)):
            sim = SyntheticStreams(runner, n, [int(age_s * 12.5)] * n)
            res[label] = time_steps(sim, steps)
            sim.release()
        res["growth"] = res["60min"]["median_ms"] / res["1min"]["median_ms"] - 1
        out.append(res)
        log.info("B3 %s", res)
        del runner
        gc.collect()
        torch.cuda.empty_cache()
    return out


def bench_b4(model_dir: Path, seconds: float, batches: list[int], ours: dict) -> list[dict]:
    import transformers
    from conftest import padded_for_offline, synthetic_audio

    transformers.logging.set_verbosity_error()
    hf = transformers.VoxtralRealtimeForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.bfloat16,
                                                                             device_map="cuda").eval()
    fe = transformers.VoxtralRealtimeFeatureExtractor()
    padded = padded_for_offline(synthetic_audio(seconds, seed=2), 6)
    rows = []
    for b in batches:
        feats = fe([padded] * b, sampling_rate=16000, return_tensors="pt").input_features.cuda().to(torch.bfloat16)
        prompt = torch.tensor([[1] + [32] * 38] * b, device="cuda")
        kw = dict(input_ids=prompt, input_features=feats, attention_mask=torch.ones_like(prompt), num_delay_tokens=6,
                  do_sample=False)
        with torch.no_grad():
            hf.generate(**kw, max_new_tokens=8)  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = hf.generate(**kw)
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        steps = out.shape[1] - prompt.shape[1]
        per_step = dt / steps * 1e3
        ours_ms = ours.get(b)
        rows.append({"batch": b, "transformers_step_ms": per_step, "transformers_per_stream_ms": per_step / b,
                     "ours_step_ms": ours_ms, "ratio_ours_over_theirs": (ours_ms / per_step) if ours_ms else None})
        log.info("B4 %s", rows[-1])
    del hf
    torch.cuda.empty_cache()
    return rows


def random_checkpoint(path: Path) -> dict | None:
    """A fresh machine: the full-size random checkpoint into `path` when it holds none (its build
    figures; None when it was there)."""
    if any(path.glob("*.safetensors")):
        return None
    from gpu_model_parity import build_checkpoint

    path.mkdir(parents=True, exist_ok=True)
    build = build_checkpoint(path, 0)
    torch.cuda.empty_cache()
    return build


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default="bench_engine.json")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--session-s", type=float, default=120.0)
    ap.add_argument("--counts", default="1,8,32,64,128,192,256,320")
    ap.add_argument("--paced-seconds", type=float, default=12.0)
    ap.add_argument("--paced-streams", default="", help="comma list: paced runs at these counts (default: B2's best)")
    ap.add_argument("--trace", action="store_true", help="B2: per-step phase times and the slowest steps")
    ap.add_argument("--profile", action="store_true", help="B1: kernel inventory of a step (torch.profiler)")
    ap.add_argument("--tokens-in-flight", choices=sorted(_IN_FLIGHT), default="auto",
                    help="paced runs: send a step's token events while the device runs the next step (on), at the end "
                         "of their own step (off), or the engine's default for the device (auto)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: b1,b2,paced,b3,b4")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    skip = set(filter(None, args.skip.split(",")))
    torch.backends.cuda.matmul.allow_tf32 = True
    report: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    bw = copy_bandwidth()
    report["copy_bandwidth_GBps"] = bw / 1e9
    report["matmul_bf16_TFLOPs"] = matmul_tflops()
    build = random_checkpoint(Path(args.model))
    if build is not None:
        report["build"] = build
    model, _ = load_model(args.model, device="cuda", dtype=torch.bfloat16)
    report["weight_GB"] = weight_bytes(model) / 1e9
    enc_b, lm_b = kv_bytes_per_stream(model, RunnerOptions(max_session_seconds=args.session_s))
    enc_full, lm_full = kv_bytes_per_stream(model, RunnerOptions())
    free = torch.cuda.mem_get_info()[0]
    report["memory"] = {
        "encoder_kv_MB_per_stream": enc_b / 1e6, "lm_kv_MB_per_stream_session": lm_b / 1e6,
        "session_s": args.session_s, "lm_kv_MB_per_stream_full_window": lm_full / 1e6,
        "free_GB_after_weights": free / 1e9,
        "admission_limit_session": int(0.92 * free // (enc_b + lm_b)),
        "admission_limit_unbounded": int(0.92 * free // (enc_full + lm_full)),
    }
    log.info("memory %s", report["memory"])

    def save() -> None:  # after every part, so that a part that fails or runs out of time keeps the ones before
        Path(args.out).write_text(json.dumps(report, indent=2))

    save()
    if "b1" not in skip:
        report["B1"] = bench_b1(model, bw, args.steps, args.profile)
        log.info("B1 %s", report["B1"])
        save()
    counts = [int(x) for x in args.counts.split(",")]
    counts = [n for n in counts if n <= report["memory"]["admission_limit_session"]]
    best = 0
    if "b2" not in skip:
        report["B2"], best = bench_b2(model, counts, args.steps, args.session_s, args.trace)
        report["B2_max_streams_p99_le_40ms"] = best
        save()
    paced = [int(x) for x in args.paced_streams.split(",") if x] or ([best, max(1, best // 2)] if best else [])
    limit = report["memory"]["admission_limit_session"]
    if any(n > limit for n in paced):  # as B2's counts: more would not be admitted (an H100 fits 174, an H200 329)
        log.info("paced counts above the admission limit %d are left out: %s", limit, [n for n in paced if n > limit])
        paced = [n for n in paced if n <= limit]
    if True:
        if "paced" not in skip and paced:

            class _NoText:
                vocab_size, num_control_tokens = 131072, 1000

                def token_bytes(self, i):
                    return b""

            report["B2_paced"] = []
            for n in sorted(set(paced)):
                report["B2_paced"].append(paced_run(model, _NoText(), n, args.paced_seconds, args.session_s,
                                                     tokens_in_flight=_IN_FLIGHT[args.tokens_in_flight]))
                log.info("paced %s", report["B2_paced"][-1])
                save()
                gc.collect()
                torch.cuda.empty_cache()
    if "b3" not in skip:
        report["B3"] = bench_b3(model, [1, 32], max(30, args.steps // 2))
        save()
    if "b4" not in skip:
        ours = {1: report.get("B1", {}).get("median_ms")}
        for row in report.get("B2", []):
            ours.setdefault(row["streams"], row["median_ms"])
        del model
        torch.cuda.empty_cache()
        report["B4"] = bench_b4(Path(args.model), 10.0, [1, 8], ours)
    save()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
