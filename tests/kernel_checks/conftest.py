"""What every kernel check runs under: Triton's interpreter (tests/test_kernels.py starts them with it), or, in the
GPU tier (tests/gpu/test_kernels_compiled.py), the compiled kernels on CUDA; and poisoned allocations.

On CUDA the checks stay as written (CPU tensors, the CPU references, the same bounds and bitwise row checks): each
kernel module's `*_triton` entry is wrapped to move its tensor arguments to the GPU, run the compiled kernel, and
bring the results back, along with any argument the kernel wrote in place (caches, states); a strided view goes as
the same view of its base; a split product's partials (linear.SplitSums) go and come back as tensors do, tile tables
(linear.TileTables) go with their expert_ids, and a MoE's terms (experts.ExpertTerms) field by field."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from specpair.formats.packed import Packed
from specpair.runtime import kernels
from specpair.runtime.kernels import experts, linear

ON_CUDA = os.environ.get("SPECPAIR_KERNEL_CHECKS") == "cuda"
# every module of runtime/kernels, so that a new kernel's checks run it on the GPU too, not on CPU pointers
KERNEL_MODULES = tuple(
    importlib.import_module(f"{kernels.__name__}.{path.stem}")
    for path in sorted(Path(kernels.__file__).parent.glob("*.py"))
    if path.stem != "__init__"
)


@pytest.fixture(autouse=True)
def interpreted() -> None:
    if ON_CUDA:
        if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
            pytest.fail("SPECPAIR_KERNEL_CHECKS=cuda runs the compiled kernels: a CUDA device, no TRITON_INTERPRET")
    elif os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("the kernel checks run under TRITON_INTERPRET=1: run them through tests/test_kernels.py")


def _strided_on_cuda(t: torch.Tensor) -> torch.Tensor:
    """t on CUDA with its strides: a strided view into a larger tensor (a slice of a fused product's output) as the
    same view of its whole base, moved (Tensor.to would hand the kernel a contiguous copy)."""
    if t._base is None or t.is_contiguous() or not t._base.is_contiguous():
        return t.to("cuda")
    return t._base.to("cuda").as_strided(t.shape, t.stride(), t.storage_offset() - t._base.storage_offset())


def _to_cuda(value: Any, moved: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    if isinstance(value, torch.Tensor) and not value.is_cuda:
        for original, on_gpu in moved:  # a tensor given twice (expert_ids, and in their TileTables) goes once
            if original is value:
                return on_gpu
        on_gpu = _strided_on_cuda(value)
        moved.append((value, on_gpu))
        return on_gpu
    if isinstance(value, Packed):
        return value.to("cuda")
    if isinstance(value, linear.SplitSums):
        return dataclasses.replace(value, partial=_to_cuda(value.partial, moved))
    if isinstance(value, linear.TileTables):
        return linear.TileTables(_to_cuda(value.expert_ids, moved))
    if isinstance(value, experts.ExpertTerms):
        fields = dataclasses.fields(value)
        return dataclasses.replace(value, **{f.name: _to_cuda(getattr(value, f.name), moved) for f in fields})
    if isinstance(value, tuple | list):
        return type(value)(_to_cuda(v, moved) for v in value)
    return value


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, linear.SplitSums):
        return dataclasses.replace(value, partial=value.partial.cpu())
    if isinstance(value, tuple | list):
        return type(value)(_to_cpu(v) for v in value)
    return value


def on_cuda(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """`kernel` compiled on CUDA for CPU arguments; a call already on CUDA (one kernel calling another) goes as is."""

    @functools.wraps(kernel)
    def run(*args: Any, **kwargs: Any) -> Any:
        moved: list[tuple[torch.Tensor, torch.Tensor]] = []
        args, kwargs = _to_cuda(args, moved), {k: _to_cuda(v, moved) for k, v in kwargs.items()}
        if not moved:
            return kernel(*args, **kwargs)
        result = _to_cpu(kernel(*args, **kwargs))
        for original, on_gpu in moved:  # what the kernel wrote in place (a cache, a recurrent state) comes back
            back = on_gpu.cpu()
            if not torch.equal(back, original):
                original.copy_(back)
        return result

    return run


if ON_CUDA:  # before the check modules import, so that what they bind at import time is the wrapped kernel
    for module in KERNEL_MODULES:
        for name, kernel in vars(module).copy().items():
            if name.endswith("_triton") and callable(kernel) and kernel.__module__ == module.__name__:
                setattr(module, name, on_cuda(kernel))


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
