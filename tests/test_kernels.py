"""The kernels of runtime/kernels/, each Triton kernel against its torch reference under Triton's interpreter,
and every reference against transformers' code and for batch invariance (tests/kernel_checks/check_*.py).

Triton decides whether it interprets when it is first imported, and this suite imports it earlier without
TRITON_INTERPRET (formats/exl3.py does): so the checks run in a pytest of their own per kernel file, with
TRITON_INTERPRET=1 set before anything imports Triton, and this module reports each run.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKS = sorted(Path(__file__).with_name("kernel_checks").glob("check_*.py"))
KERNELS = Path(__file__).parents[1] / "runtime" / "kernels"


def jit_kernels() -> list[tuple[str, ast.FunctionDef]]:
    """(file name, definition) of every @triton.jit function of runtime/kernels: the kernels (the functions kernels
    call are @device_function)."""
    return [
        (path.name, node)
        for path in sorted(KERNELS.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)
    ]


def test_every_kernel_file_has_checks() -> None:
    public = {p.stem for p in KERNELS.glob("*.py")} - {"__init__", "cpu_rows", "triton_common"}
    assert {p.stem.removeprefix("check_") for p in CHECKS} == public


def test_every_kernel_waits_for_the_previous_one_and_every_launch_says_how() -> None:
    """Under programmatic dependent launch (triton_common.py) a kernel may start before the previous one ends: one
    that read its inputs before `after_previous_kernel(PDL)` would race. So every Triton kernel's first statement is
    that call, with PDL its last parameter, or before it only a weight prefetch under `if PDL == 2` (a weight is
    no kernel's output); and every launch passes `**launch_options()` (which sets PDL and the launch together), last
    of its keyword splats (a launch may splat its operands' constexprs before it)."""
    kernels = []
    for name, node in jit_kernels():
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        while isinstance(body[0], ast.If) and ast.unparse(body[0].test).startswith("PDL == 2"):
            calls = {ast.unparse(c.func) for c in ast.walk(body[0]) if isinstance(c, ast.Call)}
            assert all(c.startswith("_prefetch") for c in calls) and not body[0].orelse, calls
            body = body[1:]
        kernels.append((name, node.name, ast.unparse(body[0]), node.args.args[-1].arg))
    launches = [
        (path.name, ast.unparse(node.func.value), [ast.unparse(k.value) for k in node.keywords if k.arg is None])
        for path in sorted(KERNELS.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)  # kernel[grid](...)
    ]
    assert len(kernels) >= 13 and len(launches) >= 13
    assert [k for k in kernels if k[2:] != ("after_previous_kernel(PDL)", "PDL")] == []
    assert [k for k in launches if k[2][-1:] != ["launch_options()"]] == []  # last: nothing overrides its keys
    assert {k[1] for k in kernels} == {k[1] for k in launches}


@pytest.mark.parametrize("checks", CHECKS, ids=lambda p: p.stem)
def test_kernels_in_triton_interpreter(checks: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(checks), "-q", "-p", "no:cacheprovider"],
        cwd=Path(__file__).parents[1],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]


@pytest.mark.parametrize(
    "asked, said",
    [
        ("yes", "SPECPAIR_PDL: is 'yes': give 0 (plain launches), 1 (PDL) or 2 (PDL and weight prefetch)"),
        ("2", "SPECPAIR_PDL: programmatic dependent launch needs a Hopper or later GPU"),
        ("0", "{'PDL': 0}"),
        ("", "{'PDL': 0}"),  # unset: PDL where it compiles, plain launches here (no GPU)
    ],
)
def test_what_specpair_pdl_asks_is_checked_before_a_kernel_launches(asked: str, said: str) -> None:
    """A value that is no mode is refused when the kernels are imported; a mode this machine (no CUDA, or before
    Hopper) cannot compile is refused at the first launch, by name, not by a compiler's traceback."""
    script = (
        "from specpair.errors import BadInput\n"
        "try:\n"
        "    from specpair.runtime.kernels import triton_common\n"
        "    print(triton_common.launch_options())\n"
        "except BadInput as e:\n"
        "    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES")}
    env |= {"SPECPAIR_PDL": asked, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, whatever this machine has
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == said, result.stdout + result.stderr


def test_every_kernel_compiles_for_hopper_in_every_launch_mode() -> None:
    """What the GPU machine compiles first, compiled here for sm_90 by the Triton installed here (PTX, then ptxas
    from Triton's wheel): one launch the kernel checks make of each kernel and layout, with plain launches and with
    PDL and the weight prefetch (mode 1 compiles a subset of mode 2's code), once with the bf16 dots the GPU runs
    (the interpreter's stand-ins replaced), and once with every integer argument the constant 1, as the JIT
    specialises a 1. The interpreter runs none of it: a global that is not a constexpr,
    an intrinsic this Triton lacks, inline PTX that ptxas refuses, `.to` on an argument that may be 1 fail only
    here and on a GPU. `tools/compile_kernels.py` without --sample runs the checks and compiles every launch."""
    tool = Path(__file__).parents[1] / "tools" / "compile_kernels.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, str(tool), "--sample", "--modes", "0,2"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    compiled = {line.split(":")[0] for line in result.stdout.splitlines() if "compiled for sm_90" in line}
    assert compiled == {node.name for _, node in jit_kernels()} and ", 0 failed" in result.stdout
