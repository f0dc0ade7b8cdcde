"""The rule that makes programmatic dependent launch safe, checked on the kernels' source (CPU, no GPU).

With PDL (`kernels/_dispatch.pdl_enabled`) a kernel may run while the kernel before it on the stream is
still running. So every Triton kernel launched with `pdl_launch_args` must call `pdl_prologue(USE_GDC)`
(which waits for the previous kernel's writes) before it stores anything or loads anything but its
weights. A kernel that broke this would race only on a GPU, and only sometimes; this test fails at once.
"""

from __future__ import annotations

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
# what a kernel may read before the wait: weights (projections' rows, norm weights), never written by a step
WEIGHT_POINTERS = {"w_ptr", "w_rows", "w1_rows", "w2_rows", "nw_ptr"}


def _triton_kernels(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)
            and any("jit" in ast.unparse(d) for d in f.decorator_list)}


def _launched_with_pdl(tree: ast.Module) -> set[str]:
    """Names of kernels launched as `kernel[grid](..., **pdl_launch_args(...))`."""
    names = set()
    for call in ast.walk(tree):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Subscript)
                and any(k.arg is None and "pdl_launch_args" in ast.unparse(k.value) for k in call.keywords)):
            names.add(ast.unparse(call.func.value))
    return names


def _violations(source: str, where: str) -> tuple[list[str], int]:
    """(broken rules, number of PDL-launched kernels checked) of one kernel module's source."""
    tree = ast.parse(source)
    kernels = _triton_kernels(tree)
    found, checked = [], 0
    for name in sorted(_launched_with_pdl(tree)):
        fn = kernels[name]
        checked += 1
        if "USE_GDC" not in [a.arg for a in fn.args.args]:
            found.append(f"{where}:{name} has no USE_GDC parameter")
            continue
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        at = [i for i, s in enumerate(body) if "pdl_prologue(USE_GDC)" in ast.unparse(s)]
        if len(at) != 1:
            found.append(f"{where}:{name} must call pdl_prologue(USE_GDC) once, at top level")
            continue
        for stmt in body[: at[0]]:
            for call in (c for c in ast.walk(stmt) if isinstance(c, ast.Call)):
                func = ast.unparse(call.func)
                if func.endswith(("store", "atomic_add")):
                    found.append(f"{where}:{name} writes before the PDL wait: {ast.unparse(stmt)}")
                elif func.endswith("load") and not (
                        {n.id for n in ast.walk(call.args[0]) if isinstance(n, ast.Name)} & WEIGHT_POINTERS):
                    found.append(f"{where}:{name} loads a non-weight before the PDL wait: {ast.unparse(call)}")
    return found, checked


def test_every_pdl_kernel_waits_before_it_reads_activations_or_writes():
    total = 0
    for path in sorted(KERNELS.glob("_*_triton.py")):
        found, checked = _violations(path.read_text(), path.name)
        assert not found, found
        total += checked
    assert total >= 8  # norm, RoPE, SiLU·mul, gather-add, KV write, attention, combine, projection


def test_the_rule_catches_kernels_that_read_or_write_before_waiting():
    head = "import triton\nimport triton.language as tl\n\n@triton.jit\n"
    launch = "\ndef launch(x, w, y):\n    k[(1,)](x, w, y, **pdl_launch_args(x.device))\n"
    cases = {
        "reads its input": "    x = tl.load(x_ptr)\n    pdl_prologue(USE_GDC)\n    tl.store(y_ptr, x)\n",
        "writes": "    tl.store(y_ptr, 0.0)\n    pdl_prologue(USE_GDC)\n",
        "never waits": "    tl.store(y_ptr, tl.load(x_ptr))\n",
    }
    for what, body in cases.items():
        src = head + "def k(x_ptr, w_ptr, y_ptr, USE_GDC: tl.constexpr):\n" + body + launch
        found, checked = _violations(src, what)
        assert checked == 1 and len(found) == 1, (what, found)
    fine = "    w = tl.load(w_ptr)\n    pdl_prologue(USE_GDC)\n    tl.store(y_ptr, w + tl.load(x_ptr))\n"
    src = head + "def k(x_ptr, w_ptr, y_ptr, USE_GDC: tl.constexpr):\n" + fine + launch
    assert _violations(src, "fine") == ([], 1)
    no_param = head + "def k(x_ptr, w_ptr, y_ptr):\n" + fine + launch
    assert len(_violations(no_param, "no parameter")[0]) == 1
