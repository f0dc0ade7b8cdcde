"""`kernels.linear`: the few-row Triton projection equals `F.linear`; it falls back where it must; with
programmatic dependent launch (PDL) a CUDA-graph chain of dependent kernels computes what it does without.

The Triton kernel runs under the Triton interpreter in a subprocess (TRITON_INTERPRET must be set before
triton is imported); on a GPU it also runs natively, in bf16, with and without PDL.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import report_interpreter_checks

from kernels import linear as linear_mod
from kernels._dispatch import pdl_enabled, pdl_launch_args
from kernels.linear import linear, skinny_rows_limit


def _cases(dtype: torch.dtype, device: str = "cpu"):
    """(x, weight, bias): 1-16 rows, widths that are not block multiples, a row-strided x, 3-d inputs."""
    g = torch.Generator().manual_seed(0)
    for m, k, n, with_bias in ((1, 64, 48, False), (4, 300, 70, True), (16, 520, 33, True), (3, 257, 129, False)):
        x = torch.randn(m, k + 5, generator=g)[:, 3:k + 3].to(device, dtype)  # rows strided by k + 5
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
        b = torch.randn(n, generator=g).to(device, dtype) if with_bias else None
        yield x, w, b
        yield x.contiguous()[None], w, b  # [1, T, K], as the model calls it


@contextlib.contextmanager
def _counted_launches():
    """Counts the Triton kernel's launches while inside (yields the count holder)."""
    import kernels._linear_triton as lt

    calls = {"n": 0}
    launch = lt.launch_linear

    def counting(*a, **k):
        calls["n"] += 1
        return launch(*a, **k)

    lt.launch_linear = counting
    try:
        yield calls
    finally:
        lt.launch_linear = launch


def _check_against_f_linear(dtype: torch.dtype, atol: float, device: str = "cpu") -> int:
    """Runs every case through `linear(..., backend="triton")`; returns the number of kernel launches."""
    with _counted_launches() as calls:
        for x, w, b in _cases(dtype, device):
            got = linear(x, w, b, backend="triton")
            assert got.shape == (*x.shape[:-1], w.shape[0]) and got.dtype == dtype
            want = F.linear(x.float(), w.float(), None if b is None else b.float())
            torch.testing.assert_close(got.float(), want, atol=atol, rtol=1e-2)
    return calls["n"]


def _kernel_equals_f_linear() -> None:
    import kernels._linear_triton as lt

    assert _check_against_f_linear(torch.float16, atol=2e-2) == 8, "the Triton kernel did not run for every case"
    # fp32 goes to F.linear in the model (the kernel's tl.dot would round to tf32 on a GPU); the
    # interpreter computes in fp32, so the kernel's indexing is checked here exactly
    g = torch.Generator().manual_seed(1)
    for m, k, n in ((1, 300, 70), (16, 700, 40)):
        x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        y = torch.full((m, n), float("nan"))
        lt.launch_linear(x, w, b, y)
        torch.testing.assert_close(y, F.linear(x, w, b), atol=1e-4, rtol=1e-5)


def _split_k_equals_f_linear() -> None:
    """The K loop cut into ranges (whole K tiles, the last one short) summed by the second kernel: equal to
    F.linear (fp32 in the interpreter: exact indexing), with and without bias, on 1-16 rows; the same bits
    on a second call; a split count above the tile count is cut to one range per tile."""
    import kernels._linear_triton as lt

    g = torch.Generator().manual_seed(4)
    for m, k, n, splits in ((1, 1300, 40, 2), (4, 1300, 70, 3), (16, 700, 33, 8), (5, 2048, 20, 4), (3, 600, 9, 5)):
        x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
        for b in (None, torch.randn(n, generator=g)):
            y = torch.full((m, n), float("nan"))
            lt.launch_linear(x, w, b, y, splits=splits)
            torch.testing.assert_close(y, F.linear(x, w, b), atol=1e-4, rtol=1e-5)
            y2 = torch.full((m, n), float("nan"))
            lt.launch_linear(x, w, b, y2, splits=splits)
            assert torch.equal(y, y2)
    x16, w16 = torch.randn(4, 1300, generator=g).half(), (torch.randn(70, 1300, generator=g) / 36).half()
    y = torch.empty(4, 70, dtype=torch.float16)
    lt.launch_linear(x16, w16, None, y, splits=4)
    torch.testing.assert_close(y.float(), F.linear(x16.float(), w16.float()), atol=2e-2, rtol=1e-2)


def _row_tiles_are_rows_alone() -> None:
    """Above 16 rows (a caller's `max_rows`, the audio encoder's INVARIANT_ROWS) the kernel takes the rows in
    16-row tiles: close to F.linear, and on small-integer data (exact in fp32 in any summation order) equal to it
    with each row the bits it gets alone, also with the K loop cut; one launch per call; more rows than
    `max_rows` take F.linear."""
    import kernels._linear_triton as lt

    g = torch.Generator().manual_seed(6)
    for m, k, n, splits in ((40, 300, 70, 1), (64, 1300, 33, 3), (17, 257, 20, 1)):
        x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        y = torch.full((m, n), float("nan"))
        lt.launch_linear(x, w, b, y, splits=splits)
        torch.testing.assert_close(y, F.linear(x, w, b), atol=1e-4, rtol=1e-5)
        # The interpreter's tl.dot is numpy's matmul, whose summation order depends on the host's BLAS and
        # on a row's place in the tile (a CI machine's CPU gave row 39 of 40 other bits than alone), so
        # bit equality is checked on small integers, exact in fp32 in any order: a row read from or
        # written to the wrong place still differs. The summation order itself is a GPU test's job.
        xi, wi, bi = (torch.randint(-4, 5, s, generator=g).float() for s in ((m, k), (n, k), (n,)))
        yi = torch.full((m, n), float("nan"))
        lt.launch_linear(xi, wi, bi, yi, splits=splits)
        assert torch.equal(yi, F.linear(xi, wi, bi)), (m, k, n, splits)
        for r in (0, 16, m - 1):
            alone = torch.full((1, n), float("nan"))
            lt.launch_linear(xi[r:r + 1], wi, bi, alone, splits=splits)
            assert torch.equal(alone[0], yi[r]), (m, k, n, splits, r)
    with _counted_launches() as launched:
        x64, w16 = torch.randn(64, 96, generator=g).half(), torch.randn(24, 96, generator=g).half()
        torch.testing.assert_close(linear(x64, w16, backend="triton", max_rows=64).float(),
                                   F.linear(x64.float(), w16.float()), atol=2e-2, rtol=1e-2)
        assert launched["n"] == 1
        x65 = torch.randn(65, 96, generator=g).half()
        torch.testing.assert_close(linear(x65, w16, backend="triton", max_rows=64), F.linear(x65, w16))
        assert launched["n"] == 1, "65 rows over a 64-row limit must take F.linear"
        os.environ["STREAMSCRIBE_INVARIANT_ROWS"] = "16"  # the A/B switch: above 16 rows F.linear again
        try:
            torch.testing.assert_close(linear(x64[:17], w16, backend="triton", max_rows=64), F.linear(x64[:17], w16))
            assert launched["n"] == 1
            linear(x64[:16], w16, backend="triton", max_rows=64)
            assert launched["n"] == 2
        finally:
            del os.environ["STREAMSCRIBE_INVARIANT_ROWS"]


def _fallbacks_take_f_linear() -> None:
    with _counted_launches() as launched:
        x17 = torch.randn(17, 32).half()
        w = torch.randn(8, 32).half()
        torch.testing.assert_close(linear(x17, w, backend="triton"), F.linear(x17, w))  # 17 rows: F.linear
        torch.testing.assert_close(linear(x17.float(), w.float(), backend="triton"), F.linear(x17.float(), w.float()))
        os.environ["STREAMSCRIBE_SKINNY_ROWS"] = "0"
        torch.testing.assert_close(linear(x17[:1], w, backend="triton"), F.linear(x17[:1], w))
        assert launched["n"] == 0, "a case that must take F.linear launched the kernel"
        del os.environ["STREAMSCRIBE_SKINNY_ROWS"]
        linear(x17[:1], w, backend="triton")
        assert launched["n"] == 1


@pytest.mark.parametrize("name", ["float16", "fallbacks", "split_k", "row_tiles"])
def test_triton_interpreter(name, interpreter_results):
    pytest.importorskip("triton")
    assert interpreter_results.get(name) == "ok", interpreter_results.get(name)


def test_cpu_auto_backend_is_f_linear_and_trains():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 3, 40, generator=g, requires_grad=True)
    w = torch.randn(24, 40, generator=g, requires_grad=True)
    b = torch.randn(24, generator=g)
    y = linear(x, w, b)
    assert torch.equal(y, F.linear(x, w, b))
    y.sum().backward()
    assert x.grad is not None and w.grad is not None


def test_limits_and_pdl_switches(monkeypatch):
    monkeypatch.setenv("STREAMSCRIBE_SKINNY_ROWS", "64")
    assert skinny_rows_limit() == linear_mod.MAX_ROWS == 16
    monkeypatch.setenv("STREAMSCRIBE_SKINNY_ROWS", "4")
    assert skinny_rows_limit() == 4
    monkeypatch.setenv("STREAMSCRIBE_SKINNY_ROWS", "four")
    with pytest.raises(ValueError, match="STREAMSCRIBE_SKINNY_ROWS must be an integer"):
        skinny_rows_limit()
    monkeypatch.setenv("STREAMSCRIBE_SKINNY_ROWS", "4")
    cpu = torch.device("cpu")
    assert not pdl_enabled(cpu) and pdl_launch_args(cpu) == {"USE_GDC": False}
    if torch.cuda.is_available():
        monkeypatch.setenv("STREAMSCRIBE_PDL", "0")
        assert not pdl_enabled(torch.device("cuda"))


def test_rows_sent_to_the_kernel_by_caller_and_switches(monkeypatch):
    """A plain caller keeps STREAMSCRIBE_SKINNY_ROWS's limit (8 means 8, not 16); a batch-invariant caller gets its
    own up to STREAMSCRIBE_INVARIANT_ROWS; 0 sends every call to F.linear."""
    from kernels.linear import kernel_rows

    monkeypatch.delenv("STREAMSCRIBE_SKINNY_ROWS", raising=False)
    monkeypatch.delenv("STREAMSCRIBE_INVARIANT_ROWS", raising=False)
    assert (kernel_rows(16), kernel_rows(32), kernel_rows(64), kernel_rows(256)) == (16, 32, 64, 256)
    assert kernel_rows(512) == 256  # MAX_INVARIANT_ROWS: a 32-token look-ahead chunk's conv stem
    monkeypatch.setenv("STREAMSCRIBE_SKINNY_ROWS", "8")
    assert (kernel_rows(16), kernel_rows(64)) == (8, 64)
    monkeypatch.setenv("STREAMSCRIBE_INVARIANT_ROWS", "32")
    assert (kernel_rows(16), kernel_rows(64)) == (8, 32)
    monkeypatch.setenv("STREAMSCRIBE_SKINNY_ROWS", "0")
    assert (kernel_rows(16), kernel_rows(64)) == (0, 0)


def test_invariant_rows_switch_is_checked(monkeypatch):
    from kernels.linear import MAX_INVARIANT_ROWS, invariant_rows_limit

    monkeypatch.delenv("STREAMSCRIBE_INVARIANT_ROWS", raising=False)
    assert invariant_rows_limit() == MAX_INVARIANT_ROWS == 256
    monkeypatch.setenv("STREAMSCRIBE_INVARIANT_ROWS", "32")
    assert invariant_rows_limit() == 32
    for bad in ("8", "257", "many"):
        monkeypatch.setenv("STREAMSCRIBE_INVARIANT_ROWS", bad)
        with pytest.raises(ValueError, match="STREAMSCRIBE_INVARIANT_ROWS must be an integer in 16..256"):
            invariant_rows_limit()


def test_split_k_only_where_output_blocks_leave_sms_idle(monkeypatch):
    pytest.importorskip("triton")
    from kernels._linear_triton import split_k_for
    from kernels.linear import split_k

    # the full-size encoder's o (2,048 -> 1,280) and down (5,120 -> 1,280) on 132 SMs: 80 programs -> 4 ranges
    assert split_k_for(1280, 2048, 132) == 4 and split_k_for(1280, 5120, 132) == 4
    assert split_k_for(6144, 1280, 132) == 1 and split_k_for(10240, 1280, 132) == 1  # enough programs already
    assert split_k_for(384, 384, 132) == 2  # the default model: 24 programs, but only 2 K tiles
    assert split_k_for(384, 256, 132) == 1  # one K tile: nothing to cut
    assert split_k_for(16, 1 << 16, 132) == 8  # at most MAX_SPLITS
    assert split_k(1280, 5120, torch.device("cpu")) == 1  # the CPU never splits (the interpreter is told)
    if torch.cuda.is_available():
        assert split_k(1280, 5120, torch.device("cuda")) > 1
        monkeypatch.setenv("STREAMSCRIBE_SPLIT_K", "0")
        assert split_k(1280, 5120, torch.device("cuda")) == 1


def test_shape_mismatch_is_a_clear_error():
    pytest.importorskip("triton")  # backend="triton" checks shapes before any launch
    with pytest.raises(ValueError, match="linear: input width 8"):
        linear(torch.zeros(1, 8).half(), torch.zeros(4, 9).half(), backend="triton")


@pytest.mark.gpu
def test_gpu_split_k_rows_do_not_depend_on_the_batch():
    """A row's result is the same bits alone and in a batch of up to 16 rows, with and without a cut K loop (the
    split depends on the shape only), which is what lets a verify step's rows round as one-row steps of the same
    kernel do."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from kernels._linear_triton import split_k_for

    g = torch.Generator().manual_seed(5)
    for k, n in ((5120, 1280), (2048, 1280), (384, 384), (1280, 6144)):
        x = torch.randn(16, k, generator=g).cuda().bfloat16()
        w = (torch.randn(n, k, generator=g) / k ** 0.5).cuda().bfloat16()
        b = torch.randn(n, generator=g).cuda().bfloat16()
        full = linear(x, w, b)
        for rows in (1, 4, 7):
            assert torch.equal(linear(x[:rows], w, b), full[:rows]), (k, n, rows)
        assert (split_k_for(n, k, torch.cuda.get_device_properties(0).multi_processor_count) > 1) == (n < 2048)


@pytest.mark.gpu
def test_gpu_row_tiles_give_every_row_its_bits_alone():
    """Up to INVARIANT_ROWS rows (the audio encoder's calls), a row's result is the bits it gets alone, with and
    without a cut K loop: the conv stem's and the encoder layers' shapes of both models. cuBLAS promised no such
    thing: the look-ahead encoder's 32- and 64-row calls rounded otherwise than one-token steps (issue 5)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from kernels.linear import INVARIANT_ROWS

    g = torch.Generator().manual_seed(7)
    for k, n in ((384, 384), (1152, 384), (384, 2048), (1024, 384), (5120, 1280), (1280, 3840), (3840, 1280)):
        x = torch.randn(INVARIANT_ROWS, k, generator=g).cuda().bfloat16()
        w = (torch.randn(n, k, generator=g) / k ** 0.5).cuda().bfloat16()
        b = torch.randn(n, generator=g).cuda().bfloat16()
        full = linear(x, w, b, max_rows=INVARIANT_ROWS)
        torch.testing.assert_close(full.float(), F.linear(x.float(), w.float(), b.float()), atol=5e-2, rtol=2e-2)
        for rows in (1, 4, 8, 17, 32):
            assert torch.equal(linear(x[:rows], w, b, max_rows=INVARIANT_ROWS), full[:rows]), (k, n, rows)
        assert torch.equal(linear(x[40:41], w, b), full[40:41]), (k, n)


def _dependent_chain(x: torch.Tensor, ws: list[torch.Tensor]) -> torch.Tensor:
    """Each kernel reads what the one before wrote: a projection, a fused norm, RoPE-free SiLU·mul."""
    from kernels.fused_ops import add_rms_norm, silu_mul

    h, res = x, None
    norm_w = torch.ones(x.shape[-1], device=x.device, dtype=x.dtype)
    for w_up, w_down in ws:
        n, res = add_rms_norm(h, res, norm_w, 1e-5)
        h = linear(silu_mul(linear(n, w_up)), w_down)
    return h + res


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4])
def test_gpu_kernel_and_pdl_chain_in_a_graph(rows, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    assert _check_against_f_linear(torch.bfloat16, atol=3e-2, device="cuda") == 8
    g = torch.Generator().manual_seed(3)
    hid, inter = 1024, 2048
    x = torch.randn(rows, hid, generator=g).cuda().bfloat16()
    ws = [((torch.randn(2 * inter, hid, generator=g) / hid ** 0.5).cuda().bfloat16(),
           (torch.randn(hid, inter, generator=g) / inter ** 0.5).cuda().bfloat16()) for _ in range(24)]
    outs = {}
    for pdl in ("0", "1"):
        monkeypatch.setenv("STREAMSCRIBE_PDL", pdl)
        if pdl == "1" and not pdl_enabled(torch.device("cuda")):
            pytest.skip("PDL needs compute capability 9.0")
        static_x = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            _dependent_chain(static_x, ws)  # compile and warm up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _dependent_chain(static_x, ws)
        results = []
        for _ in range(20):  # the same replay many times: a race would show as a difference
            graph.replay()
            results.append(out.clone())
        torch.cuda.synchronize()
        assert all(torch.equal(r, results[0]) for r in results)
        outs[pdl] = (results[0], _dependent_chain(x, ws))
    assert torch.equal(outs["0"][0], outs["1"][0])  # same kernels: PDL changes when they start, not what they do
    assert torch.equal(outs["1"][0], outs["1"][1])  # the graph equals eager launches


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    report_interpreter_checks({"float16": _kernel_equals_f_linear, "fallbacks": _fallbacks_take_f_linear,
                               "split_k": _split_k_equals_f_linear, "row_tiles": _row_tiles_are_rows_alone})
