"""A process that imports specpair (and torch, huggingface_hub) once, then forks one child per command, so a
test can SIGKILL `specpair download` or `specpair convert` at any moment of its work without paying the
2 s of Python and torch start-up for every kill.

    python tests/forkserver.py      # then one JSON request per line on stdin, one JSON answer per line on stdout

request: {"argv": ["convert", ...], "cwd": DIR, "env": {...}, "output": PREFIX,
          "kill_after_s": seconds or null, "file_size_limit": bytes or null,
          "kill_when": {"glob": PATTERN under cwd, "min_bytes": N} or null, "signal": "SIGKILL" (default) | "SIGTERM" | ...}
answer:  {"status": exit code, or -9 when the SIGKILL ended it, "seconds": wall time from fork to exit,
          "killed_by": "timer" | "file" | null}

`kill_when` signals the child once a file matching PATTERN holds at least N bytes (looked at every 2 ms): a kill
placed by what the command has written, not by when (with `kill_after_s` as the limit on waiting for it).

The child runs `specpair.cli.main()` on argv in `cwd` with exactly `env`, stdin from /dev/null and its stdout
and stderr in PREFIX.out / PREFIX.err; an exception that escapes main() is printed as Python prints it
(a traceback) and exits 1, as an uncaught one would. `file_size_limit` sets RLIMIT_FSIZE in the child:
past it the kernel fails write() with EFBIG (Python ignores SIGXFSZ). The server itself never runs a torch
op and holds one thread (start it with OPENBLAS_NUM_THREADS=1: NumPy's OpenBLAS starts a thread at
import; it refuses to serve otherwise), so a fork copies no lock or thread pool mid-flight. The kill is
os.kill(SIGKILL) on a pidfd timer: nothing in the child sees it coming. Linux only (pidfd_open).
"""

from __future__ import annotations

import glob
import json
import os
import resource
import select
import signal
import sys
import time
import traceback
from typing import Any


def serve() -> None:
    # everything the commands import lazily, so that a child does real work from its first millisecond
    import httpx2  # noqa: F401
    import huggingface_hub  # noqa: F401
    import rich.console  # noqa: F401
    import rich.table  # noqa: F401
    import torch  # noqa: F401

    import specpair.checkpoint.gguf_arch  # noqa: F401
    import specpair.checkpoint.gguf_tokenizer  # noqa: F401
    import specpair.cli  # noqa: F401  (registers every command)
    import specpair.convert.converter  # noqa: F401
    import specpair.sources.download  # noqa: F401

    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        sys.exit(f"forkserver: {threads} threads after the imports; forking would copy them mid-flight")
    for line in sys.stdin:
        sys.stdout.write(json.dumps(run(json.loads(line))) + "\n")
        sys.stdout.flush()


def run(request: dict[str, Any]) -> dict[str, Any]:
    # opened here, so that they exist even when the kill comes before the child's first instruction
    streams = [os.open(os.devnull, os.O_RDONLY)] + [
        os.open(request["output"] + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for suffix in (".out", ".err")
    ]
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(request, streams)
    for fd in streams:
        os.close(fd)
    exited = os.pidfd_open(pid)
    killed_by = None
    try:
        watch, limit = request.get("kill_when"), request.get("kill_after_s")
        while True:
            wait = limit if watch is None else WATCH_INTERVAL_S
            if limit is not None:
                wait = max(0.0, min(wait, start + limit - time.monotonic()))
            ready, _, _ = select.select([exited], [], [], wait)
            if ready:
                break
            if watch is not None and _holds(request["cwd"], watch["glob"], watch["min_bytes"]):
                killed_by = "file"
            elif limit is not None and time.monotonic() >= start + limit:
                killed_by = "timer"
            if killed_by:
                os.kill(pid, signal.Signals[request.get("signal") or "SIGKILL"])
                break
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(exited)
    return {"status": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - start, "killed_by": killed_by}


WATCH_INTERVAL_S = 0.002


def _holds(cwd: str, pattern: str, min_bytes: int) -> bool:
    for path in glob.glob(os.path.join(cwd, pattern), recursive=True):
        try:
            if os.path.getsize(path) >= min_bytes:
                return True
        except OSError:  # renamed or removed between the listing and the look
            pass
    return False


def _child(request: dict[str, Any], streams: list[int]) -> None:
    code = 1
    try:
        for fd, stream in enumerate(streams):  # stdin, stdout, stderr
            os.dup2(stream, fd)
            os.close(stream)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        limit = request.get("file_size_limit")
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        sys.argv = ["specpair", *request["argv"]]
        from specpair.cli import main

        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    serve()
