"""The GPU tier: the compiled Triton kernels, CUDA-graph replay and the speculative loop on a CUDA device.

    PYTHONPATH=<a directory holding the repository as specpair> python3 -m pytest -q -p no:cacheprovider \
        -o addopts="" tests/gpu

On a machine without CUDA (CI) every test here is skipped with that reason: the CPU tier tests the same logic
(the kernels under Triton's interpreter, StepGraph's eager path through static buffers, the loop in float32).
`benchmarks/results/gpu_tier.md` holds the last run on a GPU (its raw output: gpu_tier_run.txt).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gpu_tier import DEVICE

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: the tiny models and drafters the CPU tier builds (fixtures, drafting)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available() or DEVICE != "cuda":
        return
    skip = pytest.mark.skip(reason="no CUDA device: the GPU tier runs on a GPU machine (tests/gpu/conftest.py)")
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)
