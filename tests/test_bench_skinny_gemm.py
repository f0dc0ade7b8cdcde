"""The skinny-GEMM experiment's kernel (`benchmarks/bench_skinny_gemm.py`) computes x @ w.T under the Triton
interpreter: rows 1-16, widths that are not block multiples, every configuration the benchmark tunes over, and
it refuses more rows than it pads to. (bf16 is checked on the GPU by the benchmark itself: the interpreter's
bf16 dot is not exact.)"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F


def _interpreter_main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_skinny_gemm import CONFIGS, skinny_linear_factory

    skinny_linear = skinny_linear_factory()
    g = torch.Generator().manual_seed(0)
    results = {}
    for dtype, atol in ((torch.float32, 1e-4), (torch.float16, 2e-2)):
        name = str(dtype).split(".")[-1]
        try:
            for m, k, n in ((1, 64, 48), (4, 300, 70), (16, 128, 33)):
                x = torch.randn(m, k, generator=g).to(dtype)
                w = torch.randn(n, k, generator=g).to(dtype)
                for config in CONFIGS[:: max(1, len(CONFIGS) // 4)]:
                    y = torch.full((m, n), float("nan"), dtype=dtype)
                    got = skinny_linear(x, w, y, config)
                    assert got is y
                    torch.testing.assert_close(got.float(), F.linear(x.float(), w.float()), atol=atol, rtol=1e-3)
            try:
                skinny_linear(torch.zeros(17, 8, dtype=dtype), torch.zeros(4, 8, dtype=dtype),
                              torch.zeros(17, 4, dtype=dtype))
                raise AssertionError("17 rows were accepted")
            except ValueError:
                pass
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - any failure goes back to the parent test as its traceback
            results[name] = traceback.format_exc()
    print("RESULTS " + json.dumps(results))


@pytest.mark.parametrize("name", ["float32", "float16"])
def test_skinny_kernel_under_the_interpreter(name, interpreter_results):
    pytest.importorskip("triton")
    assert interpreter_results.get(name) == "ok", interpreter_results.get(name)


if __name__ == "__main__":
    _interpreter_main()
