"""Where the runtime runs: `--device` checked once for every command that runs a model, the CPU threads it
uses there (`--threads`), the dtype it serves in (`--dtype`), and its ranks under tensor parallelism (`--tp`)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specpair.errors import BadInput, RankFailed

if TYPE_CHECKING:
    import torch

    from specpair.runtime.parallel import Parallel

DEVICE = re.compile(r"cpu|cuda(:\d+)?")
DTYPES = ("bfloat16", "float32")


@dataclass(frozen=True)
class Placement:
    device: torch.device
    parallel: Parallel  # this process's rank under tensor parallelism (one of one outside a group)
    dtype: torch.dtype  # what the model is held and run in


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


def place_runtime(asked: str | None, threads: int | None = None, dtype: str | None = None) -> Placement:
    """The device (`choose_device`), this process's rank under tensor parallelism, and the dtype: `dtype`, else
    bfloat16 on CUDA and on a CPU that multiplies bf16 natively (runtime/kernels/cpu_rows.py: there a bf16 product
    of 16 rows costs what float32's of 4 does, and streams half the bytes), float32 on other CPUs. On the CPU,
    torch's thread count: `threads`, else OMP_NUM_THREADS, else the usable cores idle now, shared among the ranks
    (runtime/threads.py: a thread on a core another process holds stalls every op)."""
    import torch

    from specpair.runtime.kernels.cpu_rows import native_bf16
    from specpair.runtime.parallel import Parallel
    from specpair.runtime.threads import pick_threads

    if dtype is not None and dtype not in DTYPES:
        raise BadInput("--dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}")
    where = choose_device(asked)
    parallel = Parallel.from_environment(where)
    if where.type == "cpu":
        count = pick_threads(threads)
        torch.set_num_threads(count if threads is not None else max(1, count // parallel.size))
    served = dtype or ("bfloat16" if where.type == "cuda" or native_bf16() else "float32")
    return Placement(where, parallel, getattr(torch, served))


def start_ranks(size: int) -> int | None:
    """Under `--tp N` (N > 1) in a plain process: run N ranks of this same command (runtime.parallel.launch: rank 0
    prints, the others are silent) and return the exit code to end with; inside a group, started so or by torchrun:
    None, this process is a rank and does the work. RankFailed when a rank but rank 0 (which reports its own
    errors) fails."""
    from specpair.runtime.parallel import launch

    started = os.environ.get("WORLD_SIZE")
    if started is not None:
        if size > 1 and int(started) != size:
            raise BadInput("--tp", f"{size} asked inside a group of {started} processes (torchrun --nproc-per-node)")
        return None
    if size == 1:
        return None
    code, rank, failure = launch([sys.executable, "-m", "specpair", *sys.argv[1:]], size)
    if rank:
        raise RankFailed("--tp", failure, code)
    return code
