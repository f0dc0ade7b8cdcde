"""Probe: do the target's intermediate layers say more about the token after next than its last hidden state?

    python benchmarks/drafter_feature_probe.py --target models/default --train-audio CLIPS... \
        --eval-audio .bench_audio/*

The question behind an EAGLE-3-style drafter (features from several target layers instead of the last
hidden state alone). The target labels the clips (greedy, 480 ms); at each position t a small MLP
(one hidden layer of 768, dropout 0.1, 12 epochs, AdamW) reads the fused input of position t+1
(`embed(token) + audio`) and a feature set of position t, and predicts the target's token at t+2, the
first draft of a round. Feature sets: `last` (the final hidden state, what the drafter reads now) and
`last+mid` (plus the residual streams after LM layers 2 and 3 of 4). Trained on --train-audio, scored on
--eval-audio by kind of position (see `drafter_accuracy.py`). A probe has no attention over earlier
positions, so its accuracies sit below a drafter's; the comparison between the feature sets is the point.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from drafter_accuracy import position_kinds

from realtime.audio import load_audio_file
from realtime.loader import load_model
from speculative.train import label_audio, teacher_forced


def collect(model, files: list[str]) -> dict:
    """Per position t: fused input of t+1, last hidden and residual streams of t, tokens t+1 and t+2."""
    layers = model.language_model.layers
    captured: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda m, i, o: captured.append((o[0] + o[1]).detach())) for layer in layers]
    audios = [load_audio_file(f) for f in files]
    rows = []
    for audio, s in zip(audios, label_audio(model, audios, [480])):
        captured.clear()
        aud, hid = teacher_forced(model, audio, s.tokens.tolist(), s.delay_tokens)
        streams = [torch.cat([c[0] for c in captured[i::len(layers)]])
                   for i in range(len(layers))]  # chunks interleave the layers
        n = len(hid) - 1
        rows.append({"x_next": model.embed_tokens(s.tokens[1:n + 1]) + aud[1:n + 1], "last": hid[:n],
                     "mid": torch.cat([streams[1][:n], streams[2][:n]], -1), "target": s.tokens[2:n + 2],
                     "previous": s.tokens[1:n + 1], "keep": torch.arange(n) >= s.prompt_len - 2})
    for h in hooks:
        h.remove()
    return {k: torch.cat([r[k] for r in rows]).detach() for k in rows[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--train-audio", nargs="+", required=True)
    ap.add_argument("--eval-audio", nargs="+", required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    model, _ = load_model(args.target, device="cpu", dtype=torch.float32)
    pad = model.config.tokens.streaming_pad
    with torch.no_grad():
        tr, te = collect(model, args.train_audio), collect(model, args.eval_audio)
    report = {}
    for name, keys in (("last", ["x_next", "last"]), ("last+mid", ["x_next", "last", "mid"])):
        torch.manual_seed(0)
        x_tr, x_te = (torch.cat([d[k] for k in keys], -1) for d in (tr, te))
        mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-4
        x_tr, x_te = (x_tr - mu) / sd, (x_te - mu) / sd
        net = torch.nn.Sequential(torch.nn.Linear(x_tr.shape[1], 768), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                  torch.nn.Linear(768, model.config.decoder.vocab_size))
        opt = torch.optim.AdamW(net.parameters(), 1e-3, weight_decay=0.01)
        idx = torch.nonzero(tr["keep"]).flatten()
        for _ in range(12):
            for b in idx[torch.randperm(len(idx))].split(512):
                loss = F.cross_entropy(net(x_tr[b]), tr["target"][b])
                opt.zero_grad()
                loss.backward()
                opt.step()
        net.eval()
        with torch.no_grad():
            pred = net(x_te).argmax(-1)
            train_acc = float((net(x_tr[idx]).argmax(-1) == tr["target"][idx]).float().mean())
        kinds = position_kinds(te["target"], te["previous"], pad, te["keep"])
        report[name] = {"train_accuracy": train_acc,
                        **{k: float((pred[m] == te["target"][m]).float().mean()) for k, m in kinds.items()}}
        print(name, json.dumps({k: round(v, 3) for k, v in report[name].items()}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
