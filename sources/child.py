"""Parsing done in a forked child while this process parses on.

A cold `check` of a MoE export that stores every expert apart parses ~13 MB of tensor headers and a ~9 MB
tokenizer.json, all independent of each other: on two cores the child takes the later shards' headers, then the
tokenizer, and this process the first shards and the summary, which needs all headers but not the tokenizer. The
child reads local files and computes; it is started only when this process has one thread (so it inherits no
lock another thread holds), sends each result down a pipe as soon as it has it, and leaves without running this
process's exit handlers or flushing its buffers. Whatever goes wrong in it (an exception, a signal, a short
write) makes that result and the ones after it None, and the caller does that work itself, raising what a serial
read raises. Where fork is not the platform's way (macOS, Windows) or one CPU is all there is, nothing is forked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

LENGTH_BYTES = 8

Work = Callable[[], bytes]
Result = Callable[[], bytes | None]


def available() -> bool:
    return sys.platform == "linux" and threading.active_count() == 1 and len(os.sched_getaffinity(0)) > 1


@contextlib.contextmanager
def forked(*works: Work | None) -> Iterator[list[Result]]:
    """Run the works, one after another, in a child; yields, per work, a call that waits for its bytes (None:
    the work was None, failed, or nothing was forked: do it here). On leaving, the child is killed and reaped."""
    started = _start() if any(works) and available() else None
    if started is None:
        yield [lambda: None for _ in works]
        return
    pid, read_end, write_end = started
    if pid == 0:  # the child: compute, write, leave without this process's exit handlers or buffers
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # not the parent's handlers (convert's cleanup)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.close(read_end)
            with open(write_end, "wb") as pipe:
                for work in filter(None, works):
                    data = work()
                    pipe.write(len(data).to_bytes(LENGTH_BYTES, "little"))
                    pipe.write(data)
                    pipe.flush()  # the parent may take it while the next work runs
        finally:
            os._exit(0)
    os.close(write_end)
    pipe = open(read_end, "rb")  # closed on leaving, below
    received: list[bytes | None] = []  # the results in the child's order; None from the first one that failed

    def message() -> bytes | None:
        if received and received[-1] is None:
            return None
        prefix = pipe.read(LENGTH_BYTES)
        length = int.from_bytes(prefix, "little")
        data = pipe.read(length) if len(prefix) == LENGTH_BYTES else b""
        return data if len(prefix) == LENGTH_BYTES and len(data) == length else None

    def result_of(position: int) -> Result:
        def result() -> bytes | None:
            while len(received) <= position:
                received.append(message())
            return received[position]

        return result

    positions = iter(range(len(works)))
    try:
        yield [result_of(next(positions)) if work is not None else (lambda: None) for work in works]
    finally:
        pipe.close()
        with contextlib.suppress(ProcessLookupError):  # a child that has finished is a zombie until reaped
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _start() -> tuple[int, int, int] | None:
    """fork() with a pipe: (pid, read end, write end); None when the system has no process or pipe to give."""
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        return os.fork(), read_end, write_end
    except OSError:  # EAGAIN at the process limit, ENOMEM
        os.close(read_end)
        os.close(write_end)
        return None
