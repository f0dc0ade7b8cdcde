"""kernels.spec_round: a speculative round's layout and acceptance from device state (issue 5's chained rounds).

The torch references are checked against a row-by-row Python statement of the same rules, on random states; the
Triton kernels against the references under the Triton interpreter (CPU) and natively on the GPU, element for
element, into outputs poisoned beforehand.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import kernels
from kernels.spec_round import (
    RoundConstants,
    RoundLayout,
    round_accept,
    round_accept_reference,
    round_layout,
    round_layout_reference,
)

SLOTS = 5
INT32 = ("c_pos", "c_dly", "v_pos", "v_dly", "dr_pos")


def make_case(seed: int, k: int, parallel: bool, audio: bool, device: str = "cpu") -> dict:
    """A random stream state, caches' tables, token ring and poisoned outputs (every field of a RoundLayout)."""
    rng = np.random.default_rng(seed)
    chain = 0 if parallel else k - 1
    c = RoundConstants(k=k, ring=2 * (k + 1), catchup_rows=2 * k if parallel else k + 1, parallel=parallel,
                       chain_steps=chain, stash_stride=k + 3, audio_rows=int(rng.integers(3 * k + 4, 90)),
                       pad_stash=SLOTS * (k + 3), zero_stash=(SLOTS + 1) * (k + 3), pad_audio=SLOTS * 97,
                       mask_token=4096, min_buffered=int(rng.choice([2, 2, 3, 5])),
                       d_block=int(rng.choice([4, 16])), d_width=int(rng.integers(3, 9)),
                       lm_block=int(rng.choice([4, 16])), lm_width=int(rng.integers(3, 9)))
    n_acc = int(rng.integers(1, k + 2))
    p = int(rng.integers(k + 2, 3000))
    last = p + int(rng.integers(-1, k + 3))  # from no drafts allowed (last <= p) to more than k
    state = torch.tensor([p, p - n_acc, last, int(rng.integers(SLOTS)), int(rng.integers(0, 30)),
                          int(rng.integers(0, 4))], dtype=torch.int64)
    tokens = torch.from_numpy(rng.integers(0, 4096, size=c.ring)).long()
    d_tables = torch.from_numpy(rng.permutation(SLOTS * c.d_width).reshape(SLOTS, c.d_width)).int()
    lm_tables = torch.from_numpy(rng.permutation(SLOTS * c.lm_width).reshape(SLOTS, c.lm_width)).int()

    def out(n: int, name: str) -> torch.Tensor:
        return torch.full((n,), -777, dtype=torch.int32 if name in INT32 else torch.int64)

    rows, v = c.catchup_rows, k + 1
    fields = {n: out(rows, n) for n in ("c_tok", "c_hid", "c_slot_mapping", "c_pos", "c_dly")}
    fields["c_last"] = out(1, "c_last")
    fields |= {n: out(v, n) for n in ("v_tok", "v_src", "v_aud", "v_slot_mapping", "v_stash", "v_pos", "v_dly")}
    fields["c_aud"] = out(rows, "c_aud") if audio else None
    # the chain steps' buffers are [steps, batch]: the stream's column is a strided view
    grid = {n: out(3 * max(chain, 1), n).view(max(chain, 1), 3) for n in ("dr_pos", "dr_slot_mapping", "dr_aud")}
    fields["dr_pos"] = grid["dr_pos"][:chain, 0] if chain else None
    fields["dr_slot_mapping"] = grid["dr_slot_mapping"][:chain, 0] if chain else None
    fields["dr_aud"] = grid["dr_aud"][:chain, 0] if chain and audio else None
    case = {"c": c, "state": state, "tokens": tokens, "d_tables": d_tables, "lm_tables": lm_tables,
            "grid": grid, "fields": fields,
            "v_next": torch.from_numpy(rng.integers(0, 50, size=v + 3)).long(),
            "v_tokens": torch.from_numpy(rng.integers(0, 50, size=v + 3)).long(),
            "log": torch.full((6, k + 3), -777, dtype=torch.int64)}
    n_agree = int(rng.integers(0, k + 1))  # the first drafts equal the argmax before them, then (maybe) not
    case["v_tokens"][1: 1 + n_agree] = case["v_next"][:n_agree]
    if device != "cpu":
        case = to_device(case, device)
    return case


def to_device(case: dict, device: str) -> dict:
    """A copy of the case on `device` (every tensor copied, even to its own device)."""
    out = dict(case)
    for name in ("state", "tokens", "d_tables", "lm_tables", "v_next", "v_tokens", "log"):
        out[name] = case[name].to(device, copy=True)
    grid = {n: t.to(device, copy=True) for n, t in case["grid"].items()}
    chain = case["c"].chain_steps
    fields = {n: (None if t is None else t.to(device, copy=True)) for n, t in case["fields"].items()}
    for n in ("dr_pos", "dr_slot_mapping", "dr_aud"):
        if fields[n] is not None:
            fields[n] = grid[n][:chain, 0]
    out["grid"], out["fields"] = grid, fields
    return out


def clone(case: dict) -> dict:
    return to_device(case, str(case["state"].device))


def layout_of(case: dict) -> RoundLayout:
    return RoundLayout(**case["fields"])


def run_layout(case: dict, fn) -> dict[str, list[int] | None]:
    fn(case["c"], case["state"], case["tokens"], case["d_tables"], case["lm_tables"], layout_of(case))
    return {n: (None if t is None else t.cpu().tolist()) for n, t in case["fields"].items()}


def layout_rows(case: dict) -> dict[str, list[int] | None]:
    """The layout rules row by row in plain Python (the module docstring's statement)."""
    c = case["c"]
    p, prev, last, slot, dly, _ = case["state"].tolist()
    tokens = case["tokens"].tolist()
    ks = min(max(last - p, 0), c.k) if last - p + 1 >= c.min_buffered else 0

    def kv(tables: torch.Tensor, q: int, block: int, width: int) -> int:
        return int(tables[slot, (q // block) % width]) * block + q % block

    n_acc = p - prev
    n_mask = max(ks - 1, 0) if c.parallel else 0
    out: dict[str, list[int] | None] = {n: [] for n in ("c_tok", "c_hid", "c_slot_mapping", "c_pos", "c_dly", "c_aud")}
    for j in range(c.catchup_rows):
        q = prev + 1 + j
        if j < n_acc + n_mask:
            row = (tokens[q % c.ring] if j < n_acc else c.mask_token,
                   slot * c.stash_stride + j if j < n_acc else c.zero_stash,
                   kv(case["d_tables"], q, c.d_block, c.d_width), q, dly, slot * c.audio_rows + q % c.audio_rows)
        else:
            row = (-1, c.pad_stash, -1, -1, 0, c.pad_audio)
        for n, x in zip(("c_tok", "c_hid", "c_slot_mapping", "c_pos", "c_dly", "c_aud"), row):
            out[n].append(x)
    out["c_last"] = [n_acc - 1]
    for n in ("dr_pos", "dr_slot_mapping", "dr_aud"):
        out[n] = [] if c.chain_steps else None
    for i in range(c.chain_steps):
        q = p + 1 + i
        ok = i < ks - 1
        out["dr_pos"].append(q if ok else -1)
        out["dr_slot_mapping"].append(kv(case["d_tables"], q, c.d_block, c.d_width) if ok else -1)
        out["dr_aud"].append(slot * c.audio_rows + q % c.audio_rows if ok else c.pad_audio)
    names = ("v_tok", "v_src", "v_aud", "v_slot_mapping", "v_stash", "v_pos", "v_dly")
    for n in names:
        out[n] = []
    for j in range(c.k + 1):
        q = p + j
        if j <= ks:
            row = (tokens[p % c.ring] if j == 0 else -1, j - 1 if j else -1, slot * c.audio_rows + q % c.audio_rows,
                   kv(case["lm_tables"], q, c.lm_block, c.lm_width), slot * c.stash_stride + j, q, dly)
        else:
            row = (-1, -1, -1, -1, c.pad_stash, -1, 0)
        for n, x in zip(names, row):
            out[n].append(x)
    for n in ("c_aud", "dr_aud"):
        if case["fields"][n] is None:
            out[n] = None
    return out


def accept_rows(case: dict) -> tuple[list[int], list[int], list[int]]:
    """Acceptance row by row: (state after, token ring after, the logged row)."""
    c = case["c"]
    state = case["state"].tolist()
    tokens = case["tokens"].tolist()
    p, last, r = state[0], state[2], state[5]
    ks = min(max(last - p, 0), c.k) if last - p + 1 >= c.min_buffered else 0
    nxt, inp = case["v_next"].tolist(), case["v_tokens"].tolist()
    n_acc = 0
    while n_acc < ks and inp[1 + n_acc] == nxt[n_acc]:
        n_acc += 1
    for j in range(c.k + 1):
        tokens[(p + 1 + j) % c.ring] = nxt[j]
    state[0], state[1], state[5] = p + n_acc + 1, p, r + 1
    return state, tokens, [ks, n_acc, *nxt[: c.k + 1]]


CASES = [(seed, k, parallel, audio) for seed, (k, parallel, audio) in
         enumerate(itertools.product((1, 4, 6), (False, True), (False, True)))]


@pytest.mark.parametrize(("seed", "k", "parallel", "audio"), CASES)
def test_layout_reference_is_the_rules_row_by_row(seed: int, k: int, parallel: bool, audio: bool) -> None:
    for rep in range(25):
        case = make_case(1000 * seed + rep, k, parallel, audio)
        assert run_layout(case, round_layout_reference) == layout_rows(case)
        # the strided chain views wrote their column only
        for n, grid in case["grid"].items():
            if case["fields"][n] is not None:
                assert (grid[:, 1:] == -777).all()


@pytest.mark.parametrize(("seed", "k", "parallel", "audio"), CASES)
def test_accept_reference_is_the_rules_row_by_row(seed: int, k: int, parallel: bool, audio: bool) -> None:
    for rep in range(25):
        case = make_case(1000 * seed + rep, k, parallel, audio)
        want_state, want_tokens, want_row = accept_rows(case)
        r = int(case["state"][5])
        round_accept_reference(case["c"], case["state"], case["tokens"], case["v_next"], case["v_tokens"], case["log"])
        assert case["state"].tolist() == want_state and case["tokens"].tolist() == want_tokens
        assert case["log"][r].tolist() == want_row
        assert (torch.cat([case["log"][:r], case["log"][r + 1:]]) == -777).all()


def test_bad_arguments_are_refused() -> None:
    case = make_case(0, 4, False, True)
    c = case["c"]
    with pytest.raises(ValueError, match="state"):
        round_layout(c, case["state"][:5], case["tokens"], case["d_tables"], case["lm_tables"], layout_of(case))
    bad = dict(case["fields"], v_pos=case["fields"]["v_pos"][:3])
    with pytest.raises(ValueError, match="v_pos"):
        round_layout(c, case["state"], case["tokens"], case["d_tables"], case["lm_tables"], RoundLayout(**bad))
    with pytest.raises(ValueError, match="log"):
        round_accept(c, case["state"], case["tokens"], case["v_next"], case["v_tokens"], case["log"][:, :3])


# ---------------------------------------------------------------------------------------------
# Triton: under the interpreter (CPU) and natively (GPU)
# ---------------------------------------------------------------------------------------------
def _triton_equals_reference(device: str, reps: int) -> None:
    for seed, k, parallel, audio in CASES:
        for rep in range(reps):
            case = make_case(1000 * seed + rep, k, parallel, audio, device=device)
            ref = clone(case)
            assert run_layout(case, lambda *a: round_layout(*a, backend="triton")) == \
                run_layout(ref, round_layout_reference), (seed, k, parallel, audio, rep)
            for n, grid in case["grid"].items():
                assert torch.equal(grid, ref["grid"][n]), n
            round_accept(case["c"], case["state"], case["tokens"], case["v_next"], case["v_tokens"], case["log"],
                         backend="triton")
            round_accept_reference(ref["c"], ref["state"], ref["tokens"], ref["v_next"], ref["v_tokens"], ref["log"])
            for n in ("state", "tokens", "log"):
                assert torch.equal(case[n], ref[n]), (n, seed, k, parallel, audio, rep)


INTERPRETER_CHECKS = {"layout_and_accept": lambda: _triton_equals_reference("cpu", 2)}


def _interpreter_main() -> None:
    from conftest import report_interpreter_checks

    torch.set_num_threads(1)
    report_interpreter_checks(INTERPRETER_CHECKS)


@pytest.mark.skipif(not kernels.HAVE_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("name", list(INTERPRETER_CHECKS))
def test_triton_interpreter(name: str, interpreter_results: dict[str, str]) -> None:
    assert interpreter_results.get(name) == "ok", interpreter_results.get(name, "check did not run")


@pytest.mark.gpu
def test_gpu_round_kernels_equal_the_references() -> None:
    _triton_equals_reference("cuda", 10)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _interpreter_main()
