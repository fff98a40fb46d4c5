"""Every kernel check of tests/kernel_checks/ (each Triton kernel against its torch reference: error bounds, and a
row's bits alone equal to its bits among other rows) with the kernels compiled for the CUDA device instead of
interpreted (kernel_checks/conftest.py moves each kernel's arguments to the GPU and its results back). The checks of
the CPU references against transformers' code are the CPU tier's: they hold for the transformers the tests pin, and
a GPU machine's own transformers may differ (2026-12-04's H200 image: its Gated DeltaNet reference no longer repeats
key heads for value heads), so they are left out here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKS = sorted((Path(__file__).resolve().parents[1] / "kernel_checks").glob("check_*.py"))


@pytest.mark.parametrize("pdl", [0, 1, 2], ids=["plain", "pdl", "pdl-prefetch"])
@pytest.mark.parametrize("checks", CHECKS, ids=lambda p: p.stem)
def test_compiled_kernels_on_cuda(checks: Path, pdl: int) -> None:
    """With every kernel launched plainly, with programmatic dependent launch, and with it and the matmuls' weight
    prefetch (runtime/kernels/triton_common.py PDL_MODES)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"SPECPAIR_KERNEL_CHECKS": "cuda"}
    env["SPECPAIR_PDL"] = str(pdl)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(checks), "-q", "-p", "no:cacheprovider", "-o", "addopts="]
        + ["-k", "not is_transformers"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
