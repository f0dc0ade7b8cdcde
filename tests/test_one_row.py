"""`kernels.one_row`: the fused one-row decode projections.

- references: each equals the unfused chain it replaces (fused_ops references, F.linear, write_kv),
  exactly, including the cache writes (only the row's slot changes; a negative slot writes nothing);
- the Triton kernel (under the Triton interpreter in a subprocess, fp32 and fp16; natively on a GPU in
  bf16, in a CUDA graph with and without programmatic dependent launch) equals the references to
  rounding, on shapes that are not block multiples, with poisoned outputs and caches;
- in its tensor-core mode (configs with dot = 1) every result equals, bit for bit, what the unfused chain
  gives with `kernels.linear`'s multi-row kernel for the projection (interpreter in fp16; GPU in bf16),
  so that a batch-1 step rounds as a row of a larger batch does; fp32 and tiles it cannot fill fall back.
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from conftest import report_interpreter_checks

from kernels import one_row
from kernels.fused_ops import add_rms_norm_reference, rope_reference, silu_mul_reference


def _unfused_qkv(h, nw, eps, w, cos, sin, hq, hkv, d):
    """What the unfused layer computes: norm kernel, projection, q/k split, RoPE (q, k and v [1, H, D])."""
    y = add_rms_norm_reference(h[None, None], None, nw, eps)[0]
    qkv = F.linear(y, w)[0, 0]
    q = qkv[: hq * d].view(1, hq, d)
    k = qkv[hq * d: (hq + hkv) * d].view(1, hkv, d)
    v = qkv[(hq + hkv) * d:].view(1, hkv, d)
    return rope_reference(q, cos[None], sin[None])[0], rope_reference(k, cos[None], sin[None])[0], v[0]


def _case(g: torch.Generator, dtype: torch.dtype, device: str, hidden: int, hq: int, hkv: int, d: int):
    h = torch.randn(hidden, generator=g).to(device, dtype)
    nw = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
    w = (torch.randn((hq + 2 * hkv) * d, hidden, generator=g) / hidden ** 0.5).to(device, dtype)
    ang = torch.randn(d // 2, generator=g)
    cos = torch.cat([ang.cos(), ang.cos()]).to(device, dtype)
    sin = torch.cat([ang.sin(), ang.sin()]).to(device, dtype)
    return h, nw, w, cos, sin


SHAPES = ((40, 4, 2, 16), (300, 6, 3, 32), (128, 2, 2, 64))  # (hidden, q heads, kv heads, head_dim)


def _check_qkv(dtype: torch.dtype, backend: str, atol: float, device: str = "cpu") -> None:
    g = torch.Generator().manual_seed(0)
    for hidden, hq, hkv, d in SHAPES:
        h, nw, w, cos, sin = _case(g, dtype, device, hidden, hq, hkv, d)
        q_ref, k_ref, v_ref = _unfused_qkv(h, nw, 1e-5, w, cos, sin, hq, hkv, d)
        for slot_value in (13, -1):
            kc = torch.full((5, 4, hkv, d), float("nan"), dtype=dtype, device=device)
            vc = torch.full_like(kc, float("nan"))
            slot = torch.tensor([slot_value], device=device)
            q = one_row.norm_qkv_rope_kv(h, nw, 1e-5, w, cos, sin, kc, vc, slot, hq, hkv, backend=backend)
            assert q.shape == (hq, d) and q.dtype == dtype
            torch.testing.assert_close(q.float(), q_ref.float(), atol=atol, rtol=1e-2)
            written = torch.zeros(5, 4, dtype=torch.bool)
            if slot_value >= 0:
                written[slot_value // 4, slot_value % 4] = True
                torch.testing.assert_close(kc[3, 1].float(), k_ref.float(), atol=atol, rtol=1e-2)
                torch.testing.assert_close(vc[3, 1].float(), v_ref.float(), atol=atol, rtol=1e-2)
            assert kc[~written.to(device)].isnan().all() and vc[~written.to(device)].isnan().all(), "wrote another slot"


def _check_projections(dtype: torch.dtype, backend: str, atol: float, device: str = "cpu") -> None:
    g = torch.Generator().manual_seed(1)
    for k, n in ((64, 48), (300, 70), (520, 129)):
        x = torch.randn(k, generator=g).to(device, dtype)
        nw = (1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype)
        sc = (1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
        res = torch.randn(n, generator=g).to(device, dtype)
        got = one_row.linear_residual(x, w, res, backend=backend)
        want = (F.linear(x[None], w) + res[None])[0]  # the projection, then the residual add
        torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=1e-2)
        got = one_row.norm_linear(x, nw, 1e-5, w, backend=backend)
        want = F.linear(add_rms_norm_reference(x[None], None, nw, 1e-5)[0], w)[0]
        torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=1e-2)
        w2 = (torch.randn(2 * n, k, generator=g) / k ** 0.5).to(device, dtype)
        for scale in (sc, None):
            got = one_row.norm_gate_up_silu(x, nw, 1e-5, scale, w2, backend=backend)
            want = silu_mul_reference(F.linear(add_rms_norm_reference(x[None], None, nw, 1e-5, scale)[0], w2))[0]
            assert got.shape == (n,)
            torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=1e-2)


def test_references_equal_the_unfused_chain():
    """On the CPU ("auto" = the references) every operation is the unfused chain, bit for bit."""
    for dtype in (torch.float32, torch.bfloat16):
        _check_qkv(dtype, "auto", atol=0.0)
        _check_projections(dtype, "auto", atol=0.0)


def test_shape_errors_are_clear():
    h = torch.zeros(8)
    with pytest.raises(ValueError, match="one input row"):
        one_row.norm_linear(h[None], torch.ones(8), 1e-5, torch.zeros(3, 8))
    with pytest.raises(ValueError, match=r"weight must be \[N, 8\]"):
        one_row.linear_residual(h, torch.zeros(3, 9), torch.zeros(3))
    with pytest.raises(ValueError, match="residual must be"):
        one_row.linear_residual(h, torch.zeros(3, 8), torch.zeros(4))
    with pytest.raises(ValueError, match="must have 32 rows"):
        one_row.norm_qkv_rope_kv(h, torch.ones(8), 1e-5, torch.zeros(31, 8), torch.zeros(4), torch.zeros(4),
                                 torch.zeros(2, 4, 2, 4), torch.zeros(2, 4, 2, 4), torch.zeros(1, dtype=torch.long),
                                 4, 2)


def test_default_configs_compile_for_sm90_without_spills():
    """Each operation's default launch configuration, compiled for the H200 offline (Triton's bundled ptxas):
    no spill stack, 16-byte weight loads, and the K loop pipelined with cp.async where it has stages."""
    pytest.importorskip("triton")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_one_row import CONFIG_KEY, resources

    for op, key in CONFIG_KEY.items():
        r = resources(op, one_row.CONFIGS[key])
        assert r["stack_bytes"] == 0 and r["local_loads_stores"] == 0, (op, r)
        assert r["ldg_128"] > 0 and (r["cp_async"] > 0) == (one_row.CONFIGS[key][3] > 1), (op, r)


def test_profiled_unfused_gate_up_is_the_fused_operation():
    """`bench_one_row.py --profile gate_up_unfused` profiles the same arithmetic as the fused gate/up (on the CPU
    their references agree bit for bit), so the two profiles compare like with like."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_one_row import unfused_gate_up_calls

    g = torch.Generator().manual_seed(5)
    k, inter = 48, 40
    layers = [SimpleNamespace(nw2=1 + 0.1 * torch.randn(k, generator=g), scale=1 + 0.1 * torch.randn(k, generator=g),
                              gate_up=torch.randn(2 * inter, k, generator=g) / k ** 0.5) for _ in range(2)]
    x = SimpleNamespace(res=torch.randn(k, generator=g))
    for L, call in zip(layers, unfused_gate_up_calls(layers, x)):
        want = one_row.norm_gate_up_silu(x.res, L.nw2, 1e-5, L.scale, L.gate_up, backend="torch")
        assert torch.equal(call(), want)


def test_launch_configs_from_the_environment(monkeypatch):
    """STREAMSCRIBE_ONE_ROW_CONFIGS overrides some operations' configurations; anything malformed is refused
    with the variable's name."""
    monkeypatch.setenv("STREAMSCRIBE_ONE_ROW_CONFIGS", '{"qkv": [4, 512, 2, 2, 0], "head": [32, 0, 8, 4, 1]}')
    got = one_row.launch_configs()
    assert got["qkv"] == (4, 512, 2, 2, 0) and got["head"] == (32, 0, 8, 4, 1)
    assert got["residual"] == one_row.CONFIGS["residual"]
    for bad in ('{"qkv": [4, 512, 2, 2]}', '{"qkv": [4, 512, 2, 0, 0]}', '{"nope": [4, 512, 2, 2, 0]}', '[1, 2]',
                '{"qkv": [4, 0, 2, 2, 0]}', '{"qkv": [8, 256, 2, 2, 1]}', '{"qkv": [16, 256, 2, 2, 2]}'):
        monkeypatch.setenv("STREAMSCRIBE_ONE_ROW_CONFIGS", bad)
        with pytest.raises(ValueError, match="STREAMSCRIBE_ONE_ROW_CONFIGS"):
            one_row.launch_configs()


# BLOCK_K 0: `linear`'s K tile for each weight; the norms' programs have the norm kernel's 4 warps
DOT_CONFIGS = {"qkv": [16, 0, 4, 2, 1], "residual": [16, 0, 2, 3, 1], "gate_up": [16, 0, 4, 3, 1],
               "head": [32, 0, 4, 2, 1]}


def _dot_configs(configs: dict | None = None):
    """A context in which the one-row operations launch tensor-core configurations (DOT_CONFIGS)."""
    import contextlib
    import json

    @contextlib.contextmanager
    def ctx():
        old = os.environ.get("STREAMSCRIBE_ONE_ROW_CONFIGS")
        os.environ["STREAMSCRIBE_ONE_ROW_CONFIGS"] = json.dumps(configs or DOT_CONFIGS)
        try:
            yield
        finally:
            if old is None:
                del os.environ["STREAMSCRIBE_ONE_ROW_CONFIGS"]
            else:
                os.environ["STREAMSCRIBE_ONE_ROW_CONFIGS"] = old
    return ctx()


def _check_dot_equals_linear(dtype: torch.dtype, backend: str, device: str = "cpu", exact: bool = True) -> None:
    """Tensor-core mode: every operation equals the multi-row path for the same row (the norm, RoPE and
    SiLU·mul kernels of `fused_ops`, `kernels.linear` for the projection), bit for bit on a GPU; K and N are not
    tile multiples, and the wide gate/up (>= 16384 rows) takes the other K tile. The interpreter's tl.dot is
    numpy's matmul, whose sums depend on the operands' memory layout, so there (exact=False) the results must
    agree to one rounding."""
    from kernels.fused_ops import add_rms_norm, rope, silu_mul
    from kernels.linear import linear

    def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
        if exact:
            return torch.equal(a, b)
        torch.testing.assert_close(a.float(), b.float(), atol=1e-3, rtol=2e-3)
        return True

    def normed(x: torch.Tensor, nw: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        return add_rms_norm(x[None], None, nw, 1e-5, scale, backend=backend)[0]

    g = torch.Generator().manual_seed(3)
    # `linear` cuts the K loop of projections too narrow to fill the GPU (split_k_for), which sums in another
    # order; the LM head, the one operation the one-row path runs on the tensor cores by default, is never cut at
    # the full-size or the default model's shape (8,192 and 256 programs), so the comparison is with the uncut kernel
    with _dot_configs(), mock.patch.dict(os.environ, {"STREAMSCRIBE_SPLIT_K": "0"}):
        for hidden, hq, hkv, d in ((300, 6, 3, 32), (520, 4, 2, 64)):
            h, nw, w, cos, sin = _case(g, dtype, device, hidden, hq, hkv, d)
            kc = torch.full((5, 4, hkv, d), float("nan"), dtype=dtype, device=device)
            vc = torch.full_like(kc, float("nan"))
            slot = torch.tensor([13], device=device)
            q = one_row.norm_qkv_rope_kv(h, nw, 1e-5, w, cos, sin, kc, vc, slot, hq, hkv, backend=backend)
            qkv = linear(normed(h, nw), w, backend=backend)[0]
            q_ref, k_ref = rope(qkv[: hq * d].view(1, 1, hq, d), qkv[hq * d: (hq + hkv) * d].view(1, 1, hkv, d),
                                cos[None, None], sin[None, None], backend=backend)
            assert equal(q, q_ref[0, 0]), "q"
            assert equal(kc[3, 1], k_ref[0, 0]), "k"
            assert equal(vc[3, 1], qkv[(hq + hkv) * d:].view(hkv, d)), "v"
        for k, n in ((300, 70), (520, 8200)):
            x = torch.randn(k, generator=g).to(device, dtype)
            nw = (1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype)
            sc = (1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype)
            w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
            res = torch.randn(n, generator=g).to(device, dtype)
            want = linear(x[None], w, backend=backend)[0] + res
            assert equal(one_row.linear_residual(x, w, res, backend=backend), want), "residual"
            assert equal(one_row.norm_linear(x, nw, 1e-5, w, backend=backend),
                         linear(normed(x, nw), w, backend=backend)[0]), "norm + linear"
            w2 = (torch.randn(2 * n, k, generator=g) / k ** 0.5).to(device, dtype)
            got = one_row.norm_gate_up_silu(x, nw, 1e-5, sc, w2, backend=backend)
            want = silu_mul(linear(normed(x, nw, sc), w2, backend=backend), backend=backend)[0]
            if exact:
                # the SiLU epilogue is compiled inside the projection, the silu_mul kernel on its own: on an H200
                # a few outputs round one step apart (twenty-sixth session), the projection's sums do not
                # (full-size shapes: `bench_one_row.py`'s count of differing outputs is 0)
                ulps = ((got.float() - want.float()).abs() / want.float().abs().clamp_min(1e-30) * 2 ** 7)
                differ = got != want
                assert differ.float().mean() <= 0.01 and (ulps[differ] <= 1.01).all(), (
                    f"gate/up: {int(differ.sum())} of {got.numel()} differ, up to {ulps.max().item():.2f} ulps")
            else:
                assert equal(got, want), "gate/up"


def _check_dot_falls_back() -> None:
    """fp32 (TF32 on tensor cores) and paired groups of fewer than 16 outputs take the FMA configurations."""
    w16 = torch.zeros(64, 32, dtype=torch.float16)
    with _dot_configs():
        assert one_row._config("residual", w16) == (16, 256, 2, 3, 1)
        assert one_row._config("residual", w16.float()) == one_row.FMA_FALLBACK["residual"]
        assert one_row._config("qkv", w16, half=8) == one_row._config("qkv", w16.float(), half=8)
        assert one_row._config("qkv", w16, half=8)[4] == 0
        assert one_row._config("gate_up", torch.zeros(2 * 9216, 8, dtype=torch.float16), 9216)[1] == 128
        assert one_row._config("gate_up", w16, 32)[1] == 256


def _interpreter_dot() -> None:
    with _dot_configs():
        _check_qkv(torch.float16, "triton", atol=2e-2)
        _check_projections(torch.float16, "triton", atol=2e-2)
        _check_qkv(torch.float32, "triton", atol=1e-4)  # falls back to FMA
    _check_dot_equals_linear(torch.float16, "triton", exact=False)
    _check_dot_falls_back()


def _interpreter_fp32() -> None:
    _check_qkv(torch.float32, "triton", atol=1e-4)
    _check_projections(torch.float32, "triton", atol=1e-4)


def _interpreter_fp16() -> None:
    _check_qkv(torch.float16, "triton", atol=2e-2)
    _check_projections(torch.float16, "triton", atol=2e-2)


@pytest.mark.parametrize("name", ["float32", "float16", "dot"])
def test_triton_interpreter(name, interpreter_results):
    pytest.importorskip("triton")
    assert interpreter_results.get(name) == "ok", interpreter_results.get(name)


def _layer_chain(x: torch.Tensor, layers: list, kc: torch.Tensor, vc: torch.Tensor, slot: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int) -> torch.Tensor:
    """The one-row layer's kernels back to back (attention replaced by a fixed mix of q), each reading
    what the one before wrote."""
    res = x
    for nw, w_qkv, w_o, nw2, sc, w_gu, w_down in layers:
        q = one_row.norm_qkv_rope_kv(res, nw, 1e-5, w_qkv, cos, sin, kc, vc, slot, hq, hkv)
        res = one_row.linear_residual(q.reshape(-1), w_o, res)
        res = one_row.linear_residual(one_row.norm_gate_up_silu(res, nw2, 1e-5, sc, w_gu), w_down, res)
    return one_row.norm_linear(res, layers[0][0], 1e-5, layers[0][2].t().contiguous())


@pytest.mark.gpu
def test_gpu_tensor_core_mode_is_the_multi_row_kernel():
    """On the GPU the tensor-core mode gives `kernels.linear`'s sums bit for bit (bf16), so a batch-1 step rounds
    as a row of a batch of 2-16 does; it also meets the references' tolerance."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    with _dot_configs():
        _check_qkv(torch.bfloat16, "auto", atol=3e-2, device="cuda")
        _check_projections(torch.bfloat16, "auto", atol=3e-2, device="cuda")
    _check_dot_equals_linear(torch.bfloat16, "auto", device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "dot"])
def test_gpu_kernels_and_a_pdl_chain_in_a_graph(monkeypatch, mode):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    if mode == "dot":
        import json

        monkeypatch.setenv("STREAMSCRIBE_ONE_ROW_CONFIGS", json.dumps(DOT_CONFIGS))
    _check_qkv(torch.bfloat16, "auto", atol=3e-2, device="cuda")
    _check_projections(torch.bfloat16, "auto", atol=3e-2, device="cuda")
    from kernels._dispatch import pdl_enabled

    g = torch.Generator().manual_seed(2)
    hid, hq, hkv, d, inter = 1024, 8, 2, 128, 2816
    dev, dt = "cuda", torch.bfloat16

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(dev, dt)

    layers = [(1 + rnd(hid, s=0.1), rnd((hq + 2 * hkv) * d, hid, s=hid ** -0.5), rnd(hid, hq * d, s=(hq * d) ** -0.5),
               1 + rnd(hid, s=0.1), 1 + rnd(hid, s=0.1), rnd(2 * inter, hid, s=hid ** -0.5),
               rnd(hid, inter, s=inter ** -0.5)) for _ in range(12)]
    x = rnd(hid)
    ang = torch.randn(d // 2, generator=g)
    cos, sin = torch.cat([ang.cos(), ang.cos()]).to(dev, dt), torch.cat([ang.sin(), ang.sin()]).to(dev, dt)
    slot = torch.tensor([5], device=dev)
    outs = {}
    for pdl in ("0", "1"):
        monkeypatch.setenv("STREAMSCRIBE_PDL", pdl)
        if pdl == "1" and not pdl_enabled(torch.device(dev)):
            pytest.skip("PDL needs compute capability 9.0")
        kc = torch.full((4, 16, hkv, d), float("nan"), device=dev, dtype=dt)
        vc = torch.full_like(kc, float("nan"))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            eager = _layer_chain(x, layers, kc, vc, slot, cos, sin, hq, hkv)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _layer_chain(x, layers, kc, vc, slot, cos, sin, hq, hkv)
        results = []
        for _ in range(20):  # a missing wait would show as a moving result
            graph.replay()
            results.append(out.clone())
        torch.cuda.synchronize()
        assert all(torch.equal(r, results[0]) for r in results)
        assert torch.equal(results[0], eager)
        assert not kc[0, 5].isnan().any() and kc[1:].isnan().all()
        outs[pdl] = results[0]
    assert torch.equal(outs["0"], outs["1"])


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    report_interpreter_checks({"float32": _interpreter_fp32, "float16": _interpreter_fp16, "dot": _interpreter_dot})
