"""Tree verification for parallel drafters: the target checks a tree of drafts per round, not one chain.

A parallel drafter gives, in one pass, a distribution over the token at each depth 1..k after the
anchor p. A chain verifies the drafter's first choice at every depth, so a round whose first draft is
wrong accepts nothing however likely the runner-up was. Here a round verifies a fixed tree of rank
paths (a path (r1, r2, ...) drafts the drafter's r1-th choice at depth 1, its r2-th at depth 2, ...;
Medusa's static trees): the root (position p) and every node (position p + its depth) run as rows of
one target step, each node attending to the stream's cache up to p and to its own ancestors. The
round accepts the longest path whose every token is the target's greedy choice after its parent,
then the target's token there. With only first choices (every rank 0) this is exactly the chain.

Where the keys go. Every node of one depth has the same position, so only one of them may write its
keys into the ring there: the node whose ranks are all 0 (the chain's node) does; the others write
into scratch slots of the stream (cache blocks outside every ring), and the attention kernel reads a
node's ancestors from the slots listed for it (`paged_attention`'s tree_root/tree_slots). After
acceptance the host knows which nodes were right; the next step's verify first copies the accepted
scratch nodes' keys and values into the ring at their positions (the commit), before anything reads
them. Until then nothing reads positions > p of that stream.

Lossless as the chain is: each emitted token is the target's argmax at a row whose inputs and
attended keys are exactly those of plain decoding.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np


def default_tree_paths(depths: int, nodes: int, first: float = 0.6, ratio: float = 0.3) -> list[tuple[int, ...]]:
    """`nodes` rank paths of depth <= `depths`, the most likely under a model in which the target's
    token is the drafter's r-th choice with probability first * ratio**r at every depth. Ordered by
    that likelihood, so every prefix of the list is a tree (a path's parent is likelier than the path).
    (0.6 / 0.3 fit the shipped drafter's ranks on the held-out clips; `benchmarks/tree_acceptance.py`.)"""
    step = [-math.log(first * ratio ** r) for r in range(nodes)]
    heap = [(step[r], (r,)) for r in range(nodes)]
    heapq.heapify(heap)
    out: list[tuple[int, ...]] = []
    while heap and len(out) < nodes:
        cost, path = heapq.heappop(heap)
        out.append(path)
        if len(path) < depths:
            for r in range(nodes):
                heapq.heappush(heap, (cost + step[r], path + (r,)))
    return out


@dataclass(frozen=True)
class TreeLayout:
    """The nodes a stream verifies when it may draft `k_s` tokens: the tree's paths of depth <= k_s,
    in the tree's order (parents first). Block row 0 is the root; node j is row j + 1."""

    # Everything is precomputed per draft length: at batch 1 the host's work is part of every round.
    depth: np.ndarray  # [n] 1..k_s
    row_depth: np.ndarray  # [n + 1] each block row's depth (0: the root)
    per_depth: list[int]  # nodes at depths 1..k
    children: list[list[int]]  # per block row: its children's rows (host lists: the walk runs every step)
    row_off_chain: list[bool]  # per block row: its keys sit in a scratch slot (any rank > 0 on its path)
    off_rows: np.ndarray  # the rows off the chain ...
    off_scratch: np.ndarray  # ... and the index of each one's scratch slot
    choice_offset: np.ndarray  # [n] (depth - 1) * ranks + rank: where its token is among the drafter's choices
    ancestor_take: np.ndarray  # [n, k] rows of its ancestors at depths 1..depth (itself last), 0 after ...
    ancestor_mask: np.ndarray  # [n, k] ... 1 where such an ancestor exists


class DraftTree:
    """A static tree of rank paths, validated, with the layout of every draft length 0..k."""

    def __init__(self, paths: list[tuple[int, ...]], k: int, ranks: int | None = None) -> None:
        seen: set[tuple[int, ...]] = set()
        for path in paths:
            if not path or len(path) > k or min(path) < 0:
                raise ValueError(f"tree path {path!r}: needs 1..{k} ranks >= 0")
            if path in seen:
                raise ValueError(f"tree path {path!r} appears twice")
            if len(path) > 1 and path[:-1] not in seen:
                raise ValueError(f"tree path {path!r} comes before its parent {path[:-1]!r}")
            seen.add(path)
        self.paths, self.k = list(paths), k
        need = 1 + max((max(p) for p in paths), default=0)  # choices per depth the drafter must give
        if ranks is not None and ranks < need:
            raise ValueError(f"tree paths use {need} choices per depth, more than ranks={ranks}")
        # the stride of the drafter's choices per depth (a chain inside a wider tree's buffers: that tree's)
        self.ranks = need if ranks is None else ranks
        self.off_chain = sum(1 for p in paths if any(p))  # scratch slots per stream
        self.layouts = [self._layout(ks) for ks in range(k + 1)]

    def scratch_blocks(self, block_size: int) -> int:
        """Cache blocks per stream for the keys of the nodes off the chain."""
        return math.ceil(self.off_chain / block_size)

    def _layout(self, k_s: int) -> TreeLayout:
        paths = [p for p in self.paths if len(p) <= k_s]
        row = {p: j + 1 for j, p in enumerate(paths)}
        scratch_of = {p: i for i, p in enumerate(q for q in self.paths if any(q))}
        anc = np.full((len(paths), self.k), -1, dtype=np.int64)
        for j, p in enumerate(paths):
            anc[j, : len(p)] = [row[p[:i]] for i in range(1, len(p) + 1)]
        depth = np.array([len(p) for p in paths], dtype=np.int64)
        return TreeLayout(
            depth=depth,
            row_depth=np.concatenate([[0], depth]),
            per_depth=[sum(1 for p in paths if len(p) == d) for d in range(1, self.k + 1)],
            children=[[j + 1 for j, p in enumerate(paths) if row.get(p[:-1], 0) == r] for r in range(len(paths) + 1)],
            row_off_chain=[False] + [any(p) for p in paths],
            off_rows=np.array([j + 1 for j, p in enumerate(paths) if any(p)], dtype=np.int64),
            off_scratch=np.array([scratch_of[p] for p in paths if any(p)], dtype=np.int64),
            choice_offset=(depth - 1) * self.ranks + np.array([p[-1] for p in paths], dtype=np.int64),
            ancestor_take=anc.clip(min=0), ancestor_mask=(anc >= 0).astype(np.int64))


def chain_paths(k: int) -> list[tuple[int, ...]]:
    """The chain as a tree: the first choice at every depth 1..k."""
    return [(0,) * d for d in range(1, k + 1)]


def walk_tree(next_tokens: list[int], tokens: list[int], base: int, layout: TreeLayout) -> list[int]:
    """Greedy acceptance in one stream's verify block (host lists of the step's rows): the rows of the
    accepted path, root first. From the root, follow the child whose token is the target's choice at the
    current row. The tokens to emit are `next_tokens` at these rows."""
    path, cur = [0], 0
    while True:
        want = next_tokens[base + cur]
        for child in layout.children[cur]:
            if tokens[base + child] == want:
                break
        else:
            return path
        path.append(child)
        cur = child
