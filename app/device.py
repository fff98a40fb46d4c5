"""Where the runtime runs: `--device` checked once for every command that runs a model."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from specpair.errors import BadInput

if TYPE_CHECKING:
    import torch

DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def choose_device(asked: str | None, option: str = "--device") -> torch.device:
    """`asked` (cpu, cuda, cuda:N) checked against what torch sees; None: cuda when present, else cpu."""
    import torch

    if asked is not None and not DEVICE.fullmatch(asked):
        raise BadInput(option, f"{asked!r} is not cuda, cuda:N or cpu")
    where = torch.device(asked or ("cuda" if torch.cuda.is_available() else "cpu"))
    if where.type == "cuda" and not torch.cuda.is_available():
        raise BadInput(option, "cuda asked, but torch sees no CUDA GPU here")
    return where


def on_cpu(asked: str | None) -> bool:
    """Whether `asked` (as `choose_device` reads it) runs on the CPU."""
    if asked is not None:
        return asked == "cpu"
    import torch

    return not torch.cuda.is_available()
