"""The fused one-row projection experiment (`benchmarks/bench_fused_gemv.py`) under the Triton interpreter:
`fused_gemv` with each prologue equals the unfused kernels' references followed by `F.linear`, the residual
stream it writes is exactly x + residual, and a few whole layers computed both ways agree. (bf16 and the
timing run on the GPU, in the benchmark itself.)"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from conftest import report_interpreter_checks


def _check(dtype: torch.dtype, atol: float) -> None:
    from bench_fused_gemv import CONFIGS, RMS_NORM, SILU_MUL, LayerWeights, fused_gemv, fused_layer, unfused_layer

    from kernels.fused_ops import add_rms_norm_reference, silu_mul_reference

    g = torch.Generator().manual_seed(0)
    for k, n in ((64, 48), (300, 70)):
        x, r = torch.randn(k, generator=g).to(dtype), torch.randn(k, generator=g).to(dtype)
        nw = (1 + 0.1 * torch.randn(k, generator=g)).to(dtype)
        sc = (1 + 0.1 * torch.randn(k, generator=g)).to(dtype)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
        for config in CONFIGS[:: max(1, len(CONFIGS) // 4)]:
            for res, scale in ((r, sc), (None, None), (r, None)):
                y = torch.full((n,), float("nan"), dtype=dtype)
                ro = torch.full((k,), float("nan"), dtype=dtype)
                fused_gemv(x, w, y, RMS_NORM, config, residual=res, norm_weight=nw, scale=scale,
                           residual_out=ro if res is not None else None)
                h_ref, res_ref = add_rms_norm_reference(x, res, nw, 1e-5, scale)
                torch.testing.assert_close(y.float(), F.linear(h_ref.float(), w.float()), atol=atol, rtol=1e-2)
                if res is not None:
                    assert torch.equal(ro, res_ref), "the residual stream must be exactly x + residual"
            gu = torch.randn(2 * k, generator=g).to(dtype)
            y = fused_gemv(gu, w, torch.full((n,), float("nan"), dtype=dtype), SILU_MUL, config)
            torch.testing.assert_close(y.float(), F.linear(silu_mul_reference(gu).float(), w.float()),
                                       atol=atol, rtol=1e-2)
    shapes = {"hidden": 64, "q_out": 32, "qkv": 96, "inter": 80}
    lw = LayerWeights(torch.device("cpu"), shapes, g, dtype)
    x, res = torch.randn(1, 64, generator=g).to(dtype), torch.randn(1, 64, generator=g).to(dtype)
    attn = torch.randn(1, 32, generator=g).to(dtype)
    for u, v in zip(fused_layer(CONFIGS[0], x, res, attn, lw), unfused_layer(x, res, attn, lw)):
        torch.testing.assert_close(u.float(), v.float(), atol=10 * atol, rtol=2e-2)
    with pytest.raises(ValueError, match="one row"):
        fused_gemv(x, lw.o, torch.zeros(64, dtype=dtype), SILU_MUL)


@pytest.mark.parametrize("name", ["float32", "float16"])
def test_fused_gemv_under_the_interpreter(name, interpreter_results):
    pytest.importorskip("triton")
    assert interpreter_results.get(name) == "ok", interpreter_results.get(name)


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    report_interpreter_checks({"float32": lambda: _check(torch.float32, 1e-4),
                               "float16": lambda: _check(torch.float16, 2e-2)})
