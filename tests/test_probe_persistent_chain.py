"""The persistent-kernel probe's chain (`benchmarks/probe_persistent_chain.py`, issue 3) computes what torch does,
under the Triton interpreter: small shapes that are not block multiples, several layers, K split into ranges, one
program (the interpreter runs programs one after another, so a barrier across several would never open; the GPU
run checks every grid against the same reference), with and without each product's first weight tile requested
before its barrier. A wrong product is caught (by hand and by the drivers' check, `checked_persistent`), and a
reference that vanishes is refused rather than passed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch


def _interpreter_main() -> None:
    from conftest import report_interpreter_checks

    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import probe_persistent_chain as p

    dims = p.Dims(hidden=72, qkv=100, attn=60, inter=90, layers=3)
    w = p.make_weights(dims, "cpu")
    a0 = torch.randn(dims.hidden, generator=torch.Generator().manual_seed(3))
    ref = p.reference(w, a0, dims)

    def chain_matches_torch() -> None:
        for block_n, block_k, prefetch in ((8, 32, False), (16, 64, False), (32, 16, False), (8, 32, True),
                                           (32, 16, True)):
            run, st = p.persistent_chain(w, a0, dims, 1, block_n, block_k, 4, 1, prefetch=prefetch)
            run()
            run()  # again: the buffers it clears for itself must leave a second run the same
            assert int(st["flag"]) == 0 and int(st["counter"]) == 4 * dims.layers
            assert p.rel_error(st["a"], ref) < 1e-5, (block_n, block_k, prefetch)

    def k_ranges_add_up() -> None:
        st = {"a": a0.clone(), "q": torch.zeros(dims.qkv), "o": torch.zeros(dims.hidden),
              "h": torch.zeros(2 * dims.inter), "counter": torch.zeros(1, dtype=torch.int32),
              "flag": torch.zeros(1, dtype=torch.int32)}
        p.persistent_chain_kernel[(1,)](
            st["a"], st["q"], st["o"], st["h"], w["qkv"], w["o"], w["gu"], w["d"], st["counter"], st["flag"],
            dims.layers, HID=dims.hidden, NQKV=dims.qkv, NATTN=dims.attn, NINTER=dims.inter, KS_QKV=3, KS_O=2,
            KS_GU=4, KS_D=3, BLOCK_N=16, BLOCK_K=16, PREFETCH=True)
        assert p.rel_error(st["a"], ref) < 1e-5

    def a_wrong_product_is_caught() -> None:
        bad = dict(w, d=w["d"].clone())
        bad["d"][dims.layers - 1, :8] = 0  # 8 output rows of the last down projection
        run, st = p.persistent_chain(bad, a0, dims, 1, 16, 32, 4, 1)
        run()
        assert p.rel_error(st["a"], ref) > 1e-3
        # the GPU drivers' check (`checked_persistent`, against torch on the same weights) passes a right chain and
        # names a chain that misses its reference a failure
        _, st, err, failure = p.checked_persistent(w, a0, dims, 1, (16, 32, 4, 1), True)
        assert err < 1e-5 and failure is None and p.still_ok(st)
        right = p.reference
        p.reference = lambda *args: right(bad, a0, dims)  # the kernel's output against another chain's
        try:
            _, st, err, failure = p.checked_persistent(w, a0, dims, 1, (16, 32, 4, 1), True)
        finally:
            p.reference = right
        assert err > 1e-3 and failure is not None and failure.startswith("failed")

    def a_vanishing_reference_is_refused() -> None:
        try:
            p.rel_error(torch.zeros(4), torch.zeros(4))
        except ValueError:
            return
        raise AssertionError("a zero reference was accepted")

    report_interpreter_checks({"chain": chain_matches_torch, "k_ranges": k_ranges_add_up,
                               "wrong_product": a_wrong_product_is_caught,
                               "vanishing_reference": a_vanishing_reference_is_refused})


@pytest.mark.parametrize("name", ["chain", "k_ranges", "wrong_product", "vanishing_reference"])
def test_probe_chain_under_the_interpreter(name, interpreter_results):
    pytest.importorskip("triton")
    assert interpreter_results.get(name) == "ok", interpreter_results.get(name)


if __name__ == "__main__":
    _interpreter_main()
