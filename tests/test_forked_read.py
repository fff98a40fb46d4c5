"""A big tokenizer.json is parsed in a forked child while the parent reads the tensor headers
(sources/child.py): the Checkpoint, the token list, the cache entry and every error are those of a serial read,
and whatever goes wrong in the child only makes the parent do the work itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures import build_target

import specpair.sources.reading
from specpair.checkpoint import Checkpoint
from specpair.checkpoint.tokenizer import Tokenizer
from specpair.errors import BadInput
from specpair.formats import TensorTable
from specpair.sources import child, open_checkpoint


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fork for any tokenizer, give the child every shard but the first, even on one CPU; records what came back
    from a child."""
    monkeypatch.setattr(specpair.sources.reading, "FORK_TOKENIZER_BYTES", 0)
    monkeypatch.setattr(specpair.sources.reading, "_child_share", lambda shards, *_: (shards[:1], shards[1:]))
    monkeypatch.setattr(child, "available", lambda: True)
    received: list[str] = []
    for cls in (Tokenizer, TensorTable):
        real = cls.from_bytes.__func__

        def spying(cls: type, data: bytes, real=real) -> object:
            received.append(cls.__name__)
            return real(cls, data)

        monkeypatch.setattr(cls, "from_bytes", classmethod(spying))
    return received


def serial(root: Path, monkeypatch: pytest.MonkeyPatch) -> Checkpoint:
    with monkeypatch.context() as m:
        m.setattr(child, "available", lambda: False)
        m.setenv("HF_HUB_CACHE", str(root.parent / "serial-hub"))
        return open_checkpoint(str(root))


def error_of(root: Path) -> str:
    with pytest.raises(BadInput) as raised:
        open_checkpoint(str(root))
    return str(raised.value)


@pytest.mark.parametrize(("family", "shards"), [("qwen3", 3), ("qwen3_5", 4), ("qwen3_5", 1)])
def test_a_forked_read_gives_what_a_serial_read_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forking: list[str], family: str, shards: int
) -> None:
    root = build_target(tmp_path / "t", family, shards=shards)
    expected = serial(root, monkeypatch)
    forked = open_checkpoint(str(root))
    assert forking == (["TensorTable"] if shards > 1 else []) + ["Tokenizer"]  # what the child parsed
    assert forked.tokenizer.tokens is None  # its tokens stay JSON until a comparison asks
    assert forked.to_json() == expected.to_json() and forked.tokenizer == expected.tokenizer
    assert forked.tokenizer.token_list() == expected.tokenizer.token_list()


def test_the_child_takes_the_later_shards_that_make_both_processes_finish_together() -> None:
    shards = [f"s{k}" for k in range(10)]
    share = specpair.sources.reading._child_share
    headers = [1_330_000] * 10  # the 94k-tensor NVFP4 export's 13.3 MB
    assert share(shards, headers, 0) == (shards[:5], shards[5:])  # half: then the summary waits for neither
    # a tokenizer.json the child parses after its headers: it takes fewer (4.8 MB wanted for 12 MB)
    assert share(shards, headers, 12_000_000) == (shards[:6], shards[6:])
    assert share(shards, headers, 50_000_000) == (shards, [])  # the tokenizer alone outweighs all the rest
    assert share(shards, [100_000] * 10, 0) == (shards, [])  # 1 MB of headers: not worth a process
    assert share(shards, None, 0) == (shards, [])  # not local files
    assert share(shards[:1], [9_000_000], 0) == (shards[:1], [])


def test_the_cache_entry_written_after_a_forked_read_gives_the_same_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forking: list[str]
) -> None:
    root = build_target(tmp_path / "t", "qwen3_5", shards=2)
    expected = serial(root, monkeypatch)
    open_checkpoint(str(root))
    cached = open_checkpoint(str(root))
    assert forking == ["TensorTable", "Tokenizer"]  # the second read came from the cache
    assert cached.to_json() == expected.to_json()
    assert cached.tokenizer.token_list() == expected.tokenizer.token_list()


def break_tokenizer(root: Path) -> None:
    (root / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')


def break_shard(k: int) -> Callable[[Path], None]:
    def breaking(root: Path) -> None:
        shard = root / f"model-{k:05d}-of-00003.safetensors"
        shard.write_bytes(shard.read_bytes()[:20])

    return breaking


@pytest.mark.parametrize(
    "damage",
    [[break_tokenizer], [break_shard(3)], [break_shard(1), break_shard(3)], [break_tokenizer, break_shard(3)]],
    ids=["tokenizer", "child's shard", "both processes' shards", "tokenizer and shard"],
)
def test_bad_input_is_named_as_a_serial_read_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forking: list[str], damage: list
) -> None:
    root = build_target(tmp_path / "t", "qwen3", shards=3)
    for broken in damage:
        broken(root)
    with monkeypatch.context() as m:
        m.setattr(child, "available", lambda: False)
        expected = error_of(root)
    assert error_of(root) == expected
    assert ("tokenizer.json" in expected) == (break_tokenizer in damage)
    assert ("00001-of" in expected) == (len(damage) == 2 and break_tokenizer not in damage)


def test_the_child_returns_each_works_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child, "available", lambda: True)
    big = b"x" * 1_000_000  # over a pipe's buffer: the child writes it while the parent waits
    with child.forked(lambda: big, None, lambda: b"") as (first, nothing, last):
        assert (last(), first(), nothing()) == (b"", big, None)  # taken in any order
        assert first() == big  # collected once, kept


def fail() -> bytes:
    raise RuntimeError("no")


def die() -> bytes:
    os.kill(os.getpid(), signal.SIGKILL)
    return b"never"


@pytest.mark.parametrize("work", [fail, die, lambda: "not bytes"], ids=["raises", "killed", "wrong type"])
def test_a_work_that_fails_returns_nothing_nor_do_the_ones_after_it(monkeypatch: pytest.MonkeyPatch, work) -> None:
    monkeypatch.setattr(child, "available", lambda: True)
    with child.forked(lambda: b"done", work, lambda: b"after") as (before, failed, after):
        assert (before(), failed(), after()) == (b"done", None, None)


def test_nothing_is_forked_where_it_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child, "available", lambda: False)
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked"))
    with child.forked(lambda: b"x", None) as (work, nothing):
        assert (work(), nothing()) == (None, None)


def test_a_fork_the_system_refuses_leaves_the_work_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forking: list[str]
) -> None:
    root = build_target(tmp_path / "t", "qwen3", shards=3)
    expected = serial(root, monkeypatch)

    def refused() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refused)
    opened = len(os.listdir("/proc/self/fd"))
    assert open_checkpoint(str(root)).to_json() == expected.to_json() and forking == []
    assert len(os.listdir("/proc/self/fd")) == opened  # the pipe was closed


def test_a_child_left_uncollected_is_killed_and_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child, "available", lambda: True)
    started: list[int] = []
    real_fork = os.fork

    def recording() -> int:
        pid = real_fork()
        if pid:
            started.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", recording)
    with child.forked(lambda: (time.sleep(600), b"")[1]):
        pass  # its result is never asked for
    (pid,) = started
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_the_child_neither_repeats_buffered_output_nor_runs_the_parents_handlers(tmp_path: Path) -> None:
    handled = tmp_path / "handled"
    script = f"""
import os, signal, sys
from specpair.sources import child
child.available = lambda: True
signal.signal(signal.SIGTERM, lambda *_: open({str(handled)!r}, "w").close())
print("before", end="")  # buffered: stdout is a pipe
def work():
    os.kill(os.getpid(), signal.SIGTERM)
    return b"never"
with child.forked(work) as (result,):
    print(repr(result()), end="")
with child.forked(lambda: b"ok") as (result,):
    print(" " + result().decode(), end="")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "beforeNone ok", "")
    assert not handled.exists()


def test_small_files_or_a_single_cpu_fork_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = build_target(tmp_path / "t", "qwen3", shards=3)
    assert (root / "tokenizer.json").stat().st_size < specpair.sources.reading.FORK_TOKENIZER_BYTES
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked"))
    open_checkpoint(str(root))
    monkeypatch.setattr(specpair.sources.reading, "FORK_TOKENIZER_BYTES", 0)
    monkeypatch.setattr(specpair.sources.reading, "FORK_HEADER_BYTES", 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0})
    other = build_target(tmp_path / "u", "qwen3", shards=3)
    assert open_checkpoint(str(other)).tokenizer.tokens is not None  # parsed here, not sent as JSON
