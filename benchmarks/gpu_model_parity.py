"""Full-size Voxtral-Realtime config with random weights on a GPU: load cost and parity with transformers.

    python benchmarks/gpu_model_parity.py --work /tmp/full --out results.json [--seconds 20]

1. writes a random-weight checkpoint of the real configuration (4.4 B parameters, bf16,
   transformers layout, sharded) — weights drawn on the GPU;
2. in a fresh process: loads it with our loader (bf16, cuda), reporting wall time and peak host RSS;
3. fp32: our streaming session vs transformers' `generate` on the same audio: greedy tokens must
   be identical; teacher-forced logits max |diff|;
4. bf16: both in bf16, logits vs our fp32 logits (the tolerance we state) and token agreement.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def build_checkpoint(work: Path, seed: int) -> dict:
    import torch

    from realtime.config import ModelConfig
    from realtime.loader import save_model
    from realtime.model import VoxtralRealtime

    cfg = ModelConfig().validate()
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = VoxtralRealtime(cfg)
    model = model.to_empty(device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, device="cuda"))
            elif p.ndim == 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen, device="cuda"))
            else:
                fan_in = p.shape[1] * (p.shape[2] if p.ndim == 3 else 1)
                p.copy_(torch.randn(p.shape, generator=gen, device="cuda") * 0.3 * min(1.0, (128 / fan_in) ** 0.5))
    model = model.to(torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    t1 = time.perf_counter()
    save_model(model, work, max_shard_bytes=4 * 2**30)
    # a full-size (131,072 ids) tekken.json so the service can run on this checkpoint: 1,000 control
    # tokens at the real ids, then the first ranks of the Tekken vocabulary mistral-common ships
    from realtime.config import tekken_audio_section
    from realtime.tokenizer_build import NUM_CONTROL_TOKENS, shipped_tekken_ranks, write_tekken_json

    write_tekken_json(work / "tekken.json", shipped_tekken_ranks(cfg.decoder.vocab_size - NUM_CONTROL_TOKENS),
                      tekken_audio_section(cfg))

    return {"params": n_params, "init_s": t1 - t0, "save_s": time.perf_counter() - t1,
            "bytes": sum(f.stat().st_size for f in work.glob("*.safetensors"))}


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def child_load(work: Path) -> dict:
    import threading

    import torch

    from realtime.loader import load_model

    torch.cuda.synchronize()
    # RSS counts the memory-mapped checkpoint pages (page cache); anonymous memory is what a second
    # copy of the weights would show up as, so sample RssAnon while loading.
    peak_anon = [_status_kb("RssAnon")]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak_anon[0] = max(peak_anon[0], _status_kb("RssAnon"))
            time.sleep(0.01)

    th = threading.Thread(target=sample, daemon=True)
    base_anon = peak_anon[0]
    th.start()
    t0 = time.perf_counter()
    for dtype in (torch.bfloat16, torch.float32):
        model, rep = load_model(work, device="cuda", dtype=dtype)
        torch.cuda.synchronize()
        if dtype == torch.bfloat16:
            load_s, gpu_gb = time.perf_counter() - t0, torch.cuda.memory_allocated() / 2**30
            del model
            torch.cuda.empty_cache()
            t1 = time.perf_counter()
    load_fp32_s = time.perf_counter() - t1
    stop.set()
    th.join()
    return {"load_bf16_s": load_s, "load_fp32_s": load_fp32_s, "gpu_bf16_gb": gpu_gb,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "rss_anon_before_gb": base_anon / 2**20, "peak_rss_anon_gb": peak_anon[0] / 2**20,
            "checkpoint_gb": sum(f.stat().st_size for f in work.glob("*.safetensors")) / 2**30,
            "tensors": rep.num_tensors}


def child_parity(work: Path, seconds: float) -> dict:
    import numpy as np
    import torch
    import transformers

    from conftest import padded_for_offline, synthetic_audio
    from realtime.loader import load_model
    from realtime.session import StreamingSession

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    transformers.logging.set_verbosity_error()
    delay = 6
    audio = synthetic_audio(seconds, seed=1)
    padded = padded_for_offline(audio, delay)
    fe = transformers.VoxtralRealtimeFeatureExtractor()
    feats = fe(padded, sampling_rate=16000, return_tensors="pt").input_features.cuda()
    out: dict = {"audio_s": seconds, "transformers": transformers.__version__}

    class _NoText:  # tokens only: the random checkpoint has no tokenizer
        vocab_size = 131072
        num_control_tokens = 1000

        def token_bytes(self, i: int) -> bytes:
            return b""

    def ours_generate(model, same_features: torch.Tensor | None = None):
        s = StreamingSession(model, _NoText(), delay_ms=delay * 80)
        if same_features is not None:  # diagnostic: feed transformers' own float32 features
            real_compute = s._mel.compute

            def compute(n: int) -> torch.Tensor:
                start = s._mel.frames_done
                real_compute(n)
                return same_features[0, :, start: start + n].float().cpu()

            s._mel.compute = compute
        s.push_audio(audio)
        s.finish()
        return s.generated

    def margins(logits: torch.Tensor, positions: list[int]) -> list[float]:
        top2 = logits[0].topk(2, dim=-1).values
        return [(top2[p, 0] - top2[p, 1]).item() for p in positions]

    results = {}
    f32_logits = None
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).split(".")[-1]
        ours, _ = load_model(work, device="cuda", dtype=dtype)
        hf = transformers.VoxtralRealtimeForConditionalGeneration.from_pretrained(str(work), dtype=dtype,
                                                                                 device_map="cuda").eval()
        prompt = torch.tensor([ours.config.prompt_ids(delay)], device="cuda")
        if f32_logits is None:  # greedy decoding is compared in fp32; bf16 is compared on logits
            t0 = time.perf_counter()
            with torch.no_grad():
                gen = hf.generate(input_ids=prompt, input_features=feats.to(dtype),
                                  attention_mask=torch.ones_like(prompt), num_delay_tokens=delay, do_sample=False)
            torch.cuda.synchronize()
            hf_s = time.perf_counter() - t0
            hf_tokens = gen[0, prompt.shape[1]:].tolist()
            t0 = time.perf_counter()
            our_tokens = ours_generate(ours)
            torch.cuda.synchronize()
            our_s = time.perf_counter() - t0
        n = padded.size // 1280
        if f32_logits is None:  # teacher-force every dtype on the fp32 reference's tokens
            ids = torch.tensor([ours.config.prompt_ids(delay) + hf_tokens], device="cuda")[:, :n]
        with torch.no_grad():
            ref_logits = hf(input_ids=ids, input_features=feats.to(dtype), attention_mask=torch.ones_like(ids),
                            num_delay_tokens=delay).logits.float()
            our_logits = ours(ids, feats.to(dtype), torch.tensor([delay], device="cuda")).float()
        diff = (ref_logits - our_logits).abs()
        if f32_logits is not None:  # bf16: logits only
            ref32 = f32_logits.cuda()
            results[name] = {
                "logits_max_abs_diff_vs_transformers_bf16": diff.max().item(),
                "logits_rel_l2_vs_transformers_bf16": (diff.norm() / ref_logits.norm()).item(),
                "ours_vs_fp32_max_abs": (our_logits - ref32).abs().max().item(),
                "transformers_vs_fp32_max_abs": (ref_logits - ref32).abs().max().item(),
                "ours_vs_fp32_rel_l2": ((our_logits - ref32).norm() / ref32.norm()).item(),
                "transformers_vs_fp32_rel_l2": ((ref_logits - ref32).norm() / ref32.norm()).item(),
                "argmax_agreement_with_fp32": (our_logits.argmax(-1) == ref32.argmax(-1)).float().mean().item(),
                "transformers_argmax_agreement_with_fp32": (ref_logits.argmax(-1) == ref32.argmax(-1)).float().mean().item(),
            }
            break
        mism = [i for i, (a, b) in enumerate(zip(our_tokens, hf_tokens)) if a != b]
        same_feat_tokens = ours_generate(ours, feats.to(dtype))
        mism_same = [i for i, (a, b) in enumerate(zip(same_feat_tokens, hf_tokens)) if a != b]
        p0 = len(ours.config.prompt_ids(delay)) - 1  # logits row that decides generated token 0
        results[name] = {
            "tokens_identical": our_tokens == hf_tokens,
            "first_mismatches": mism[:5],
            "reference_top2_margin_at_first_mismatch": margins(ref_logits, [p0 + mism[0]]) if mism else [],
            "tokens_identical_with_transformers_features": same_feat_tokens == hf_tokens,
            "first_mismatches_with_transformers_features": mism_same[:5],
            "reference_min_top2_margin": (lambda t: (t[:, 0] - t[:, 1]).min().item())(
                ref_logits[0, p0:].topk(2, dim=-1).values),
            "n_tokens": len(hf_tokens),
            "distinct_tokens": len(set(hf_tokens)),
            "token_agreement": float(np.mean([a == b for a, b in zip(our_tokens, hf_tokens)])),
            "logits_max_abs_diff": diff.max().item(),
            "logits_rel_l2": (diff.norm() / ref_logits.norm()).item(),
            "logits_std": ref_logits.std().item(),
            "transformers_generate_s": hf_s,
            "ours_session_s": our_s,
        }
        f32_logits = our_logits.cpu()
        del ours, hf
        torch.cuda.empty_cache()
    out.update(results)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/voxtral-full-random")
    ap.add_argument("--out", default="gpu_model_parity.json")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--child", choices=["load", "parity"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    work = Path(args.work)
    if args.child:
        res = child_load(work) if args.child == "load" else child_parity(work, args.seconds)
        print("RESULT " + json.dumps(res))
        return 0
    report: dict = {}
    if not (work / "model.safetensors.index.json").exists():
        work.mkdir(parents=True, exist_ok=True)
        report["build"] = build_checkpoint(work, args.seed)
        print("build", report["build"], flush=True)
    for child in ("load", "parity"):
        proc = subprocess.run([sys.executable, __file__, "--work", str(work), "--child", child,
                               "--seconds", str(args.seconds)], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
        line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        if proc.returncode or not line:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            report[child] = {"error": proc.stderr[-1500:]}
        else:
            report[child] = json.loads(line[0][7:])
        print(child, report[child], flush=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
