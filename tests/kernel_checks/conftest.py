"""What every kernel check runs under: Triton's interpreter (tests/test_kernels.py starts them with it), and
poisoned allocations."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def interpreted() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("the kernel checks run under TRITON_INTERPRET=1: run them through tests/test_kernels.py")


@pytest.fixture(autouse=True)
def poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.empty and torch.empty_like hand out NaN-filled floats, so an output element (or partial) that a
    kernel never writes shows up as NaN instead of as whatever the memory held."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        if t.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(empty_like(*a, **k)))
