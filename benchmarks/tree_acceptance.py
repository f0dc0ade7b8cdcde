"""How many tokens a round would accept if the target verified a tree of drafts instead of one chain.

    python benchmarks/tree_acceptance.py --target models/default --audio .bench_audio/* \
        --drafters models/default_drafter [--depths 6] [--budgets 6 8 16 32 64] [--out tree.json]

A parallel (mask-row) drafter gives, in one pass, a distribution over the token at each draft depth
1..U from anchor p (rows p .. p+U-1). A chain verifies the argmax at every depth. A tree verifies the
M draft nodes either with the highest path score per round (the product of the depth distributions
along the path, EAGLE-2's dynamic tree) or from a fixed tree of rank paths (`realtime.engine.tree.
default_tree_paths`, what the engine's `tree_nodes` verifies): a round then accepts the longest prefix
of the target's own tokens that is a path of the tree. This script measures that, teacher-forced on the
target's greedy transcripts of the clips (the drafter reads exactly what the engine feeds it: the
target's tokens and hidden states up to p, its own audio at every row), for several node budgets M,
with rounds following each other as in decoding. It also reports how often the target's token is the
drafter's r-th choice at each depth (the static tree's rank model is fitted to that). CPU, fp32: a
question about acceptance, not speed.
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
from realtime.engine.tree import default_tree_paths
from realtime.loader import load_model
from speculative.capability import supports_parallel_drafting
from speculative.drafter import load_drafter
from speculative.train import TeacherSequence, label_audio, parallel_row_layout

log = logging.getLogger("tree_acceptance")


@torch.no_grad()
def depth_log_probs(d, s: TeacherSequence, depths: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities [A, U, V] of the drafts at depths 1..U of every anchor that starts a round at a
    generated position, and the target's tokens there [A, U] (-1 past the sequence's end)."""
    n = len(s.hidden)
    src, depth, allowed = parallel_row_layout(n, depths, d.config.sliding_window)
    idx = src.clamp(max=n - 1)
    masked = depth > 0
    tok_in = torch.where(masked, d.mask_token_id, s.tokens[:n][idx])
    x = d.embed_input_ids(tok_in[None], s.audio[idx][None])
    h_prev = torch.cat([torch.zeros_like(s.hidden[:1]), s.hidden[:-1]])
    hid = torch.where(masked[:, None], 0.0, h_prev[idx])
    g = d(x, hid[None], idx[None], d.t_cond(torch.tensor([s.delay_tokens]))[:, None, :],
          DenseAttention.with_mask(allowed))
    lp = torch.log_softmax(d.logits(g)[0].float(), -1).view(depths, n, -1).transpose(0, 1)  # [n, U, V]
    tgt = s.tokens[1:n + 1]
    want = torch.full((n, depths), -1, dtype=torch.long)
    for j in range(depths):
        want[: n - j, j] = tgt[j:]
    anchors = torch.arange(s.prompt_len - 1, n)
    return lp[anchors], want[anchors]


def tree_accepted(lp: torch.Tensor, want: torch.Tensor, budget: int) -> torch.Tensor:
    """Accepted drafts per anchor [A] when the tree holds the `budget` best nodes by path score."""
    _, u, _ = lp.shape
    top_lp, top_id = lp.topk(budget, -1)  # [A, U, M]
    scores, true, all_scores, all_true = None, None, [], []
    for j in range(u):
        if j == 0:
            scores = top_lp[:, 0]  # [A, M]
            true = top_id[:, 0] == want[:, :1]
        else:
            cand = (scores[:, :, None] + top_lp[:, j, None, :]).flatten(1)  # [A, M*M]
            cand_true = (true[:, :, None] & (top_id[:, j, None, :] == want[:, j, None, None])).flatten(1)
            scores, pick = cand.topk(budget, -1)
            true = cand_true.gather(1, pick)
        all_scores.append(scores)
        all_true.append(true)
    s, t = torch.stack(all_scores, 1).flatten(1), torch.stack(all_true, 1).flatten(1)  # [A, U*M]
    kth = s.topk(budget, -1).values[:, -1:]
    chosen = (s >= kth) & t  # the true path's nodes that made the tree
    depth_of = torch.arange(u).repeat_interleave(budget)[None].expand_as(chosen)
    # accepted = the deepest chosen true node + 1 (ancestors of a chosen node score higher: chosen too)
    return torch.where(chosen, depth_of + 1, 0).amax(-1)


def true_ranks(lp: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """[A, U] the rank of the target's token among the drafter's choices at each depth (huge past the end)."""
    r = (lp > lp.gather(-1, want.clamp(min=0)[..., None])).sum(-1)
    return torch.where(want >= 0, r, 1 << 30)


def static_tree_accepted(ranks: torch.Tensor, paths: list[tuple[int, ...]]) -> torch.Tensor:
    """Accepted drafts per anchor when the round verifies the fixed tree `paths` (rank paths)."""
    inside = set(paths)
    out = []
    for row in ranks.tolist():
        n = 0
        while n < len(row) and tuple(row[: n + 1]) in inside:
            n += 1
        out.append(n)
    return torch.tensor(out)


def chain_accepted(lp: torch.Tensor, want: torch.Tensor, k: int) -> torch.Tensor:
    hit = lp[:, :k].argmax(-1) == want[:, :k]
    return hit.long().cumprod(-1).sum(-1)


def rounds_walk(accepted: torch.Tensor) -> float:
    """Tokens per round when rounds follow each other as in decoding: a round at anchor i accepts
    accepted[i] drafts and emits accepted[i] + 1 tokens, and the next round starts after them. (The
    mean over all anchors would overstate it: long accepted runs skip the easy positions, so rounds
    start at hard ones more often than positions are hard.)"""
    acc = accepted.tolist()
    i = rounds = tokens = 0
    while i < len(acc):
        n = min(acc[i] + 1, len(acc) - i)
        tokens, rounds, i = tokens + n, rounds + 1, i + n
    return tokens / rounds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--audio", nargs="+", required=True)
    ap.add_argument("--drafters", nargs="+", required=True)
    ap.add_argument("--depths", type=int, default=6)
    ap.add_argument("--budgets", type=int, nargs="+", default=[6, 8, 12, 16, 24, 32, 48, 64])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    torch.set_grad_enabled(False)
    model, _ = load_model(args.target, device="cpu", dtype=torch.float32)
    seqs = label_audio(model, [load_audio_file(f) for f in args.audio], [480])
    report = {}
    for ddir in args.drafters:
        d = load_drafter(ddir, target_embedding=model.language_model.embed_tokens.weight)
        if not supports_parallel_drafting(d):
            raise SystemExit(f"{ddir}: {type(d).__name__} is not a parallel drafter")
        parts = [depth_log_probs(d, s, args.depths) for s in seqs]
        r = {"anchors": sum(len(p[0]) for p in parts), "chain": {}, "tree": {}, "static_tree": {}}

        def summary(accepted: list[torch.Tensor]) -> dict:
            # per sequence: the walk of consecutive rounds (what decoding sees), tokens over rounds
            walks = [rounds_walk(a) for a in accepted]
            tokens = [len(a) for a in accepted]
            return {"mean_acceptance_length": sum(tokens)
                    / sum(t / w for w, t in zip(walks, tokens)),
                    "over_all_anchors": 1 + torch.cat(accepted).float().mean().item()}

        for k in range(1, args.depths + 1):
            r["chain"][k] = summary([chain_accepted(lp, want, k) for lp, want in parts])
        ranks = [true_ranks(lp, want) for lp, want in parts]
        for m in args.budgets:
            r["tree"][m] = summary([tree_accepted(lp, want, m) for lp, want in parts])
            paths = default_tree_paths(args.depths, m)
            r["static_tree"][m] = summary([static_tree_accepted(rk, paths) for rk in ranks])
        every = torch.cat(ranks)
        r["rank_share"] = [[float((every[:, j] == k).float().mean()) for k in range(4)] for j in range(args.depths)]
        report[ddir] = r
        log.info("%s: chain %s; dynamic tree %s; static tree %s; rank shares by depth %s", ddir,
                 *({k: round(v["mean_acceptance_length"], 3) for k, v in r[name].items()}
                   for name in ("chain", "tree", "static_tree")),
                 [[round(x, 3) for x in row] for row in r["rank_share"]])
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
