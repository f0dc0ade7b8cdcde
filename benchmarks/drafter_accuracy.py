"""Where a drafter is wrong: its teacher-forced next-token accuracy on clips, split by kind of position.

    python benchmarks/drafter_accuracy.py --target models/default --audio .bench_audio/* \
        --drafters models/default_drafter OTHER_DRAFTER ... [--out acc.json]

The target labels the clips (greedy at 480 ms, as `speculative.train` does) and records its hidden
states; each drafter then reads every position with the target's own inputs (depth 1: `x_q` and the
target's `h_{q-1}`, exactly the first draft of a round) and its argmax is compared with the target's
next token. Kinds of position, by the target token and the one before it:
`pad` ([STREAMING_PAD]), `word_start` (a non-pad after a pad: the word marker or first piece of a
word), `in_word` (a non-pad after a non-pad: the rest of a word's pieces); these three partition the
positions. `word_end` (a pad after a non-pad) is a subset of `pad`. Prompt positions are left out. CPU, fp32 (accuracy does not depend on the hardware).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from realtime.attention import DenseAttention
from realtime.audio import load_audio_file
from realtime.loader import load_model
from speculative.drafter import load_drafter
from speculative.train import label_audio

log = logging.getLogger("drafter_accuracy")


def position_kinds(target: torch.Tensor, previous: torch.Tensor, pad: int, keep: torch.Tensor
                   ) -> dict[str, torch.Tensor]:
    """Masks of the kept positions by the target token and the one before it: `all`; `pad`,
    `word_start` and `in_word`, which partition `all`; `word_end`, the pads that follow a non-pad."""
    kinds = {"pad": target == pad, "word_start": (target != pad) & (previous == pad),
             "in_word": (target != pad) & (previous != pad), "word_end": (target == pad) & (previous != pad)}
    return {"all": keep, **{k: m & keep for k, m in kinds.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--audio", nargs="+", required=True)
    ap.add_argument("--drafters", nargs="+", required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    model, _ = load_model(args.target, device="cpu", dtype=torch.float32)
    pad = model.config.tokens.streaming_pad
    seqs = label_audio(model, [load_audio_file(f) for f in args.audio], [480])
    report = {}
    for ddir in args.drafters:
        d = load_drafter(ddir, target_embedding=model.language_model.embed_tokens.weight)
        hits: dict[str, list[int]] = {}
        for s in seqs:
            n = len(s.hidden)
            q = torch.arange(n)
            x = d.embed_input_ids(s.tokens[:n][None], s.audio[None])
            h_prev = torch.cat([torch.zeros_like(s.hidden[:1]), s.hidden[:-1]])[None]
            with torch.no_grad():
                g = d(x, h_prev, q[None], d.t_cond(torch.tensor([s.delay_tokens]))[:, None, :],
                      DenseAttention(q[None], d.config.sliding_window))
                pred = d.logits(g)[0].argmax(-1)
            target = s.tokens[1:n + 1]
            for name, m in position_kinds(target, s.tokens[:n], pad, q >= s.prompt_len - 1).items():
                h = hits.setdefault(name, [0, 0])
                h[0] += int((pred[m] == target[m]).sum())
                h[1] += int(m.sum())
        report[ddir] = {k: {"accuracy": a / n if n else None, "positions": n} for k, (a, n) in hits.items()}
        log.info("%s: %s", ddir, ", ".join(f"{k} {v['accuracy']:.3f} (n={v['positions']})"
                                           for k, v in report[ddir].items()))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
