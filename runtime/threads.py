"""How many CPU threads the runtime's torch ops use: the cores this process may run on that are idle now.

torch's CPU ops split work across an OpenMP pool and wait at a barrier after each op, so one thread on a core that
another process holds makes every op wait a scheduler time slice. On a 2-core machine with one core busy, the
SmolLM2 GGUF decoded at 3.4 tok/s with 2 threads against 9.9 with 1 (10.1 with 2 on an idle machine). So the count
is the number of usable cores that were idle over a short sample of /proc/stat, at least 1; `--threads N` or
OMP_NUM_THREADS, when given, win.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

SAMPLE_S = 0.05
IDLE_SHARE = 0.5  # a core idle for at least this share of the sample counts as free


def cpu_times(stat: str) -> dict[int, tuple[int, int]]:
    """/proc/stat's per-CPU lines as {cpu: (idle jiffies incl. iowait, total jiffies)} (steal counts as busy)."""
    times = {}
    for line in stat.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        values = [int(f) for f in fields[:8]]
        times[int(name[3:])] = (values[3] + values[4], sum(values))
    return times


def idle_cores(before: str, after: str, usable: set[int]) -> int:
    """How many of the `usable` CPUs were idle for at least IDLE_SHARE of the time between two /proc/stat reads."""
    start, end = cpu_times(before), cpu_times(after)
    free = 0
    for cpu in usable & start.keys() & end.keys():
        idle, total = end[cpu][0] - start[cpu][0], end[cpu][1] - start[cpu][1]
        free += total > 0 and idle / total >= IDLE_SHARE
    return free


def pick_threads(
    requested: int | None = None,
    *,
    read_stat: Callable[[], str] = lambda: Path("/proc/stat").read_text(),
    sample_s: float = SAMPLE_S,
) -> int:
    """The thread count for CPU work: `requested`, else OMP_NUM_THREADS, else the usable cores idle now (>= 1).
    Where /proc/stat cannot be read (not Linux), every usable core."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--threads must be at least 1, not {requested}")
        return requested
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    try:
        before = read_stat()
        time.sleep(sample_s)
        after = read_stat()
    except OSError:
        return len(usable)
    return max(1, min(len(usable), idle_cores(before, after, set(usable))))
