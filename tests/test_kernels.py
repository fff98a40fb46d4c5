"""The kernels of runtime/kernels/, each Triton kernel against its torch reference under Triton's interpreter,
and every reference against transformers' code and for batch invariance (tests/kernel_checks/check_*.py).

Triton decides whether it interprets when it is first imported, and this suite imports it earlier without
TRITON_INTERPRET (formats/exl3.py does): so the checks run in a pytest of their own per kernel file, with
TRITON_INTERPRET=1 set before anything imports Triton, and this module reports each run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKS = sorted(Path(__file__).with_name("kernel_checks").glob("check_*.py"))


def test_every_kernel_file_has_checks() -> None:
    kernels = Path(__file__).parents[1] / "runtime" / "kernels"
    public = {p.stem for p in kernels.glob("*.py")} - {"__init__", "cpu_rows", "triton_common"}
    assert {p.stem.removeprefix("check_") for p in CHECKS} == public


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
