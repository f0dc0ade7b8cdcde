"""The rule that makes programmatic dependent launch safe, checked on the kernels' source (CPU, no GPU).

With PDL (`kernels/_dispatch.pdl_enabled`) a kernel may run while the kernel before it on the stream is
still running. So every Triton kernel launched with `pdl_launch_args` must call `pdl_prologue(USE_GDC)`
(which waits for the previous kernel's writes) before it stores anything or loads anything but its
weights or the step's host-staged metadata. A kernel that broke this would race only on a GPU, and only
sometimes; this test fails at once.

A kernel may place the call differently per compile-time mode (`if EARLY: ... pdl_prologue(...)` and
`if not EARLY: pdl_prologue(...)` at its top level): the rule is then checked on each mode's body.
"""

from __future__ import annotations

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
# what a kernel may read before the wait: weights (projections' rows, norm weights), never written by a step
WEIGHT_POINTERS = {"w_ptr", "w_rows", "w1_rows", "w2_rows", "nw_ptr"}
# the step's metadata (positions, sequence ids, ring tables, tree slots): copied from the host before a step's
# graphs start and written by no kernel. When a PDL kernel starts, only the kernel right before it may still run
# (that one has passed its own wait, so everything before it is complete), and no kernel writes these.
METADATA_POINTERS = {"pos_ptr", "seq_ptr", "bt_ptr", "bt_row", "root_ptr", "tslot_ptr", "tslot_row"}


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
        for mode, mode_body in _modes(body):
            found += _mode_violations(mode_body, f"{where}:{name}{mode}", set(kernels) - {name})
    return found, checked


def _mode_flag(test: ast.expr) -> tuple[str, bool] | None:
    """`X` -> (X, True), `not X` -> (X, False) for a bare name X (a constexpr switch), else None."""
    if isinstance(test, ast.Name):
        return test.id, True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Name):
        return test.operand.id, False
    return None


def _modes(body: list[ast.stmt]) -> list[tuple[str, list[ast.stmt]]]:
    """The body once per value of each switch whose top-level `if` holds the wait, with that switch's top-level
    branches inlined (the taken one) or dropped; a body without such a switch is its own one mode."""
    flags = sorted({f[0] for s in body if isinstance(s, ast.If) and "pdl_prologue(" in ast.unparse(s)
                    and (f := _mode_flag(s.test)) is not None})
    if not flags:
        return [("", body)]
    flag, out = flags[0], []  # one switch here; the others are expanded by the recursion
    for value in (True, False):
        taken: list[ast.stmt] = []
        for s in body:
            f = _mode_flag(s.test) if isinstance(s, ast.If) else None
            if f is not None and f[0] == flag:
                taken += s.body if f[1] == value else s.orelse
            else:
                taken.append(s)
        out += [(f" [{flag}={value}]{mode}", b) for mode, b in _modes(taken)]
    return out


def _mode_violations(body: list[ast.stmt], where: str, helpers: set[str]) -> list[str]:
    """Before the one wait: no store, and loads (direct, or through the module's jit helpers, judged by the
    pointers passed to them) only from weights and metadata."""
    allowed = WEIGHT_POINTERS | METADATA_POINTERS
    at = [i for i, s in enumerate(body) if "pdl_prologue(USE_GDC)" in ast.unparse(s)]
    if len(at) != 1 or ast.unparse(body[at[0]]).strip() != "pdl_prologue(USE_GDC)":
        return [f"{where} must call pdl_prologue(USE_GDC) once, at top level"]
    found = []
    for stmt in body[: at[0]]:
        for call in (c for c in ast.walk(stmt) if isinstance(c, ast.Call)):
            func = ast.unparse(call.func)
            if func.endswith(("store", "atomic_add")):
                found.append(f"{where} writes before the PDL wait: {ast.unparse(stmt)}")
            elif func.endswith("load") and not (
                    {n.id for n in ast.walk(call.args[0]) if isinstance(n, ast.Name)} & allowed):
                found.append(f"{where} loads a non-weight before the PDL wait: {ast.unparse(call)}")
            elif func in helpers:
                pointers = {n.id for a in call.args for n in ast.walk(a) if isinstance(n, ast.Name)
                            and n.id.endswith(("_ptr", "_row", "_rows"))}
                if pointers - allowed:
                    found.append(f"{where} passes {sorted(pointers - allowed)} to {func} before the PDL wait")
    return found


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


def test_the_rule_checks_each_mode_of_a_kernel_that_waits_in_mode_branches():
    """A kernel that moves its wait per constexpr mode (the attention's EARLY) is checked once per mode: metadata
    and helpers over metadata may come first, activations may not, and every mode must wait exactly once."""
    head = ("import triton\nimport triton.language as tl\n\n@triton.jit\ndef helper(p):\n    return tl.load(p)\n\n"
            "@triton.jit\n")
    launch = "\ndef launch(x, w, y):\n    k[(1,)](x, w, y, **pdl_launch_args(x.device))\n"
    sig = "def k(x_ptr, pos_ptr, y_ptr, EARLY: tl.constexpr, USE_GDC: tl.constexpr):\n"
    fine = ("    if not EARLY:\n        pdl_prologue(USE_GDC)\n    p = tl.load(pos_ptr)\n"
            "    if EARLY:\n        m = helper(pos_ptr)\n        pdl_prologue(USE_GDC)\n    tl.store(y_ptr, tl.load(x_ptr) + p)\n")
    assert _violations(head + sig + fine + launch, "fine") == ([], 1)
    broken = {
        "reads an activation early": fine.replace("p = tl.load(pos_ptr)", "p = tl.load(x_ptr)"),
        "a helper reads an activation early": fine.replace("helper(pos_ptr)", "helper(x_ptr)"),
        "one mode never waits": fine.replace("    if not EARLY:\n        pdl_prologue(USE_GDC)\n", ""),
        "one mode writes early": fine.replace("        m = helper(pos_ptr)\n", "        tl.store(y_ptr, 0.0)\n"),
    }
    for what, body in broken.items():
        found, checked = _violations(head + sig + body + launch, what)
        assert checked == 1 and len(found) >= 1, (what, found)
        assert all("EARLY=" in f for f in found), (what, found)  # each finding names its mode
