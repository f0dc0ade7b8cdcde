"""Fused element-wise ops: references equal the unfused eager formulas; Triton kernels equal the references.

The Triton kernels run under the Triton interpreter in a subprocess (TRITON_INTERPRET must be set
before triton is imported); on a GPU they also run natively.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels.fused_ops import add_rms_norm, add_rms_norm_reference, rope, rope_reference, silu_mul, silu_mul_reference

REPO_ROOT = Path(__file__).resolve().parent.parent


def _eager_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_references_equal_unfused_formulas(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=g).to(dtype)
    r = torch.randn(3, 5, 64, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(64, generator=g)).to(dtype)
    sc = (1 + 0.1 * torch.randn(3, 5, 64, generator=g)).to(dtype)
    y, h = add_rms_norm_reference(x, r, w, 1e-5, sc)
    assert torch.equal(h, x + r)
    assert torch.equal(y, _eager_rms(x + r, w, 1e-5) * sc)
    y0, h0 = add_rms_norm_reference(x, None, w, 1e-5)
    assert h0 is x and torch.equal(y0, _eager_rms(x, w, 1e-5))
    q = torch.randn(2, 5, 4, 16, generator=g).to(dtype)
    cos, sin = torch.randn(2, 5, 16, generator=g).to(dtype), torch.randn(2, 5, 16, generator=g).to(dtype)
    rot = torch.cat([-q[..., 8:], q[..., :8]], dim=-1)
    assert torch.equal(rope_reference(q, cos, sin), q * cos[:, :, None] + rot * sin[:, :, None])
    gu = torch.randn(7, 2 * 48, generator=g).to(dtype)
    assert torch.equal(silu_mul_reference(gu), F.silu(gu[:, :48]) * gu[:, 48:])
    # the CPU dispatchers are the references
    assert torch.equal(add_rms_norm(x, r, w, 1e-5, sc)[0], y)
    assert torch.equal(silu_mul(gu), silu_mul_reference(gu))
    qq, kk = rope(q, q[:, :, :2], cos, sin)
    assert torch.equal(qq, rope_reference(q, cos, sin)) and torch.equal(kk, rope_reference(q[:, :, :2], cos, sin))


def _cases(device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    for rows, hidden in ((1, 64), (5, 200), (3, 3072)):
        x = torch.randn(rows, hidden, generator=g).to(device, dtype)
        r = torch.randn(rows, hidden, generator=g).to(device, dtype)
        w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
        sc = (1 + 0.1 * torch.randn(rows, hidden, generator=g)).to(device, dtype)
        yield x, r, w, sc


def _check_backend(device: str, dtype: torch.dtype, backend: str, atol: float) -> None:
    fo = importlib.import_module("kernels.fused_ops")
    for x, r, w, sc in _cases(device, dtype):
        xt = x.t().contiguous().t()  # same values, hidden-major layout (like the conv stem's output)
        for res, scale, xin in ((r, sc, x), (None, None, x), (r, None, x), (None, None, xt), (r, sc[:1], xt)):
            x = xin
            y, h = fo.add_rms_norm(x, res, w, 1e-5, scale, backend=backend)
            y_ref, h_ref = fo.add_rms_norm_reference(x, res, w, 1e-5, scale)
            assert torch.equal(h, h_ref)
            torch.testing.assert_close(y, y_ref, atol=atol, rtol=0)
    g = torch.Generator().manual_seed(2)
    for t, hq, hk, d in ((1, 4, 2, 16), (9, 32, 8, 128), (4, 32, 32, 64), (3, 20, 6, 32)):
        # q and k as views of one fused projection (as the model makes them): strided along tokens
        qkv = torch.randn(1, t, (hq + 2 * hk) * d, generator=g).to(device, dtype)
        q = qkv[..., : hq * d].view(1, t, hq, d)
        k = qkv[..., hq * d: (hq + hk) * d].view(1, t, hk, d)
        ang = torch.randn(1, t, d // 2, generator=g)
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(device, dtype)
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(device, dtype)
        qq, kk = fo.rope(q, k, cos, sin, backend=backend)
        torch.testing.assert_close(qq, fo.rope_reference(q, cos, sin), atol=atol, rtol=0)
        torch.testing.assert_close(kk, fo.rope_reference(k, cos, sin), atol=atol, rtol=0)
        _check_rope_write_kv(fo, qkv, q, k, cos, sin, qq, kk, backend, atol, g)
    for rows, n in ((1, 48), (6, 1500), (2, 9216)):
        gu = torch.randn(rows, 2 * n, generator=g).to(device, dtype)
        torch.testing.assert_close(fo.silu_mul(gu, backend=backend), fo.silu_mul_reference(gu), atol=atol, rtol=0)


def _check_rope_write_kv(fo, qkv, q, k, cos, sin, qq, kk, backend: str, atol: float, g: torch.Generator) -> None:
    """`rope_write_kv`: the rotated q of `rope` (bitwise), and the cache `rope` + `write_kv` leave (bitwise:
    the rotated keys and the values in their slots, slot -1 skipped, every other slot untouched NaN)."""
    from kernels.paged_attention import write_kv, write_kv_reference

    _, t, hk, d = k.shape
    hq = q.shape[2]
    v = qkv[..., (hq + hk) * d:].view(1, t, hk, d)
    slots = torch.randperm(5 * 4, generator=g)[:t].to(q.device)
    if t > 1:
        slots[t // 2] = -1  # a padding row: writes nothing
    caches = [torch.full((5, 4, hk, d), float("nan"), dtype=q.dtype, device=q.device) for _ in range(4)]
    q_rot = fo.rope_write_kv(q, k, v, cos, sin, caches[0], caches[1], slots, backend=backend)
    assert torch.equal(q_rot, qq)
    write_kv(caches[2], caches[3], kk[0], v[0], slots, backend=backend)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)
    ref_k, ref_v = torch.full_like(caches[0], float("nan")), torch.full_like(caches[1], float("nan"))
    write_kv_reference(ref_k, ref_v, fo.rope_reference(k, cos, sin)[0], v[0], slots)
    torch.testing.assert_close(caches[0], ref_k, atol=atol, rtol=0, equal_nan=True)
    torch.testing.assert_close(caches[1], ref_v, atol=0, rtol=0, equal_nan=True)
    assert caches[0].isfinite().any() and caches[0].isnan().any()
    with pytest.raises(ValueError, match="do not agree"):
        fo.rope_write_kv(q, k, v[:, :, :1], cos, sin, caches[0], caches[1], slots, backend=backend)


def _interpreter_main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    fo = importlib.import_module("kernels.fused_ops")
    import traceback

    refs = (fo.add_rms_norm_reference, fo.rope_reference, fo.silu_mul_reference)
    results = {}
    for dtype in (torch.float32, torch.float16):
        name = str(dtype).split(".")[-1]
        try:
            calls = {"n": 0}

            def counting(fn):
                def wrapped(*a, **k):
                    calls["n"] += 1
                    return fn(*a, **k)
                return wrapped

            import kernels._fused_triton as ft

            for attr in ("launch_add_rms_norm", "launch_rope", "launch_silu_mul", "launch_rope_write_kv"):
                setattr(ft, attr, counting(getattr(ft, attr)))
            _check_backend("cpu", dtype, "triton", atol={torch.float32: 2e-6, torch.float16: 2e-3}[dtype])
            assert calls["n"] > 10, "the Triton launchers did not run"
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    assert refs  # references stay importable for the comparisons above
    print("RESULTS " + json.dumps(results))


@pytest.mark.parametrize("name", ["float32", "float16"])
def test_triton_interpreter(name, interpreter_results):
    pytest.importorskip("triton")
    assert interpreter_results.get(name) == "ok", interpreter_results.get(name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_triton_matches_reference(dtype):
    _check_backend("cuda", dtype, "triton", atol={torch.float32: 2e-6, torch.bfloat16: 1.6e-2}[dtype])


if __name__ == "__main__":
    _interpreter_main()


def test_training_takes_the_differentiable_path_even_when_triton_is_forced():
    """The Triton kernels have no backward; with autograd on, the dispatchers must use the
    references (otherwise gradients stop at every norm: a model would not train on a GPU)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 32, generator=g, requires_grad=True)
    w = torch.ones(32, requires_grad=True)
    y, _ = add_rms_norm(x, None, w, 1e-5, backend="triton")  # no triton launch happens: autograd needs the reference
    gu = torch.randn(4, 64, generator=g, requires_grad=True)
    q = torch.randn(1, 4, 2, 8, generator=g, requires_grad=True)
    cos, sin = torch.randn(1, 4, 8, generator=g), torch.randn(1, 4, 8, generator=g)
    qq, _ = rope(q, q.detach(), cos, sin, backend="triton")
    (y.sum() + silu_mul(gu, backend="triton").sum() + qq.sum()).backward()
    assert x.grad is not None and w.grad is not None and gu.grad is not None and q.grad is not None
