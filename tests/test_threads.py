"""The CPU thread count: idle usable cores from two /proc/stat reads, --threads and OMP_NUM_THREADS first."""

from __future__ import annotations

import os

import pytest

from specpair.runtime.threads import cpu_times, idle_cores, pick_threads


def stat(*cpus: tuple[int, int, int]) -> str:
    """A /proc/stat with per-CPU (user, idle, steal) jiffies."""
    total = [sum(c[0] for c in cpus), sum(c[1] for c in cpus), sum(c[2] for c in cpus)]
    lines = [f"cpu  {total[0]} 0 0 {total[1]} 0 0 0 {total[2]} 0 0"]
    lines += [f"cpu{i} {u} 0 0 {idle} 0 0 0 {steal} 0 0" for i, (u, idle, steal) in enumerate(cpus)]
    return "\n".join([*lines, "intr 1 2 3", "ctxt 5"]) + "\n"


def test_cpu_times_reads_each_cpu_and_counts_steal_as_busy() -> None:
    assert cpu_times(stat((10, 90, 0), (5, 80, 15))) == {0: (90, 100), 1: (80, 100)}


def test_a_core_another_process_holds_is_not_counted() -> None:
    before = stat((0, 0, 0), (0, 0, 0))
    after = stat((5, 95, 0), (98, 2, 0))  # cpu1 busy
    assert idle_cores(before, after, {0, 1}) == 1
    assert idle_cores(before, stat((5, 95, 0), (10, 90, 0)), {0, 1}) == 2
    assert idle_cores(before, stat((5, 95, 0), (0, 10, 90)), {0, 1}) == 1  # stolen by the host
    assert idle_cores(before, after, {1}) == 0  # only the busy one is ours


def test_pick_threads_uses_idle_usable_cores_at_least_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    usable = len(os.sched_getaffinity(0))
    reads = iter([stat(*[(0, 0, 0)] * usable), stat(*[(100, 0, 0)] * usable)])
    assert pick_threads(read_stat=lambda: next(reads), sample_s=0) == 1  # every core busy: still one thread
    reads = iter([stat(*[(0, 0, 0)] * usable), stat(*[(1, 99, 0)] * usable)])
    assert pick_threads(read_stat=lambda: next(reads), sample_s=0) == usable


def test_requested_and_environment_win(monkeypatch: pytest.MonkeyPatch) -> None:
    def unread() -> str:
        raise AssertionError("/proc/stat read although the count was given")

    assert pick_threads(3, read_stat=unread) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert pick_threads(read_stat=unread) == 2
    with pytest.raises(ValueError, match="at least 1"):
        pick_threads(0)


def test_unreadable_stat_gives_every_usable_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def refused() -> str:
        raise PermissionError("/proc/stat")

    assert pick_threads(read_stat=refused, sample_s=0) == len(os.sched_getaffinity(0))
