"""No tensor data is ever read: only headers and the small JSON files.

(a) Real-size checkpoints whose data sections are sparse holes of hundreds of GB inspect in
seconds. (b) Every read the readers make is recorded (builtins.open and io.open wrapped, mmap
refused): safetensors reads stop exactly at the data section; GGUF, which has no header length,
is parsed from read-ahead chunks and never reads more than one chunk past the data start.
"""

from __future__ import annotations

import builtins
import io
import json
import mmap
import os
import shutil
import struct
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures import build_dflash, build_gguf_dflash, build_gguf_target, build_target

from specpair.checkpoint import Checkpoint
from specpair.sources import open_checkpoint

GGUF_READ_AHEAD = 1 << 20  # formats/gguf.py refills its buffer in chunks of this size
REAL_SIZE = {
    "layers": 60,
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 2,
    "head_dim": 256,
    "experts": 512,
    "moe_intermediate": 1024,
    "vocab_size": 248320,
}  # Qwen3.5-397B-A17B's shape


def safetensors_data_start(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def gguf_data_start(path: Path) -> int:
    """Where a GGUF's data section starts, found by walking its header from the format spec (an
    oracle independent of specpair's reader; gguf-py's GGUFReader takes seconds on 248k tokens)."""
    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        raw = f.read(64 << 20)  # fixture headers are a few MB at most
    tensor_count, kv_count = struct.unpack_from("<QQ", raw, 8)
    pos, alignment = 24, 32

    def string() -> bytes:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", raw, pos)
        pos += 8 + n
        return raw[pos - n : pos]

    def skip(vtype: int) -> None:
        nonlocal pos
        if vtype == 8:
            string()
        elif vtype == 9:
            element, n = struct.unpack_from("<IQ", raw, pos)
            pos += 12
            if element in scalar:
                pos += n * scalar[element]
            else:
                for _ in range(n):
                    skip(element)
        else:
            pos += scalar[vtype]

    for _ in range(kv_count):
        key = string()
        (vtype,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if key == b"general.alignment":
            (alignment,) = struct.unpack_from("<I", raw, pos)
        skip(vtype)
    for _ in range(tensor_count):
        string()
        (dims,) = struct.unpack_from("<I", raw, pos)
        pos += 4 + 8 * dims + 4 + 8  # dims, ggml type, offset
    return -(-pos // alignment) * alignment


def inspect_json(path: Path) -> tuple[dict[str, Any], float]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "specpair", "inspect", str(path), "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["checkpoint"], time.perf_counter() - start


# ---------------------------------------------------------------------------------------------------
# (a) sparse real-size files


def test_sparse_real_size_safetensors(tmp_path: Path) -> None:
    root = build_target(tmp_path / "big", "qwen3_5_moe", shards=8, sparse=True, **REAL_SIZE)
    shards = sorted(root.glob("*.safetensors"))
    data = sum(f.stat().st_size - safetensors_data_start(f) for f in shards)
    assert data > 700e9 and sum(f.stat().st_blocks * 512 for f in shards) < 64e6  # holes, not bytes on disk
    checkpoint, seconds = inspect_json(root)
    assert sum(g["bytes"] for g in checkpoint["groups"]) == data
    assert (checkpoint["shapes"]["num_layers"], checkpoint["shapes"]["num_experts"]) == (60, 512)
    assert seconds < 20  # reading the data, even as holes, would take minutes
    shutil.rmtree(root)  # sparse, but 800 GB to anything that copies it


def test_sparse_real_size_gguf(tmp_path: Path) -> None:
    path = build_gguf_target(tmp_path / "big.gguf", "qwen35moe", qtype="Q8_0", sparse=True, **REAL_SIZE)
    data = path.stat().st_size - gguf_data_start(path)
    assert data > 400e9 and path.stat().st_blocks * 512 < 64e6
    checkpoint, seconds = inspect_json(path)
    assert (checkpoint["shapes"]["num_layers"], checkpoint["mtp"]["layers"]) == (60, 1)
    tensors = sum(g["tensors"] for g in checkpoint["groups"])
    assert data - 32 * tensors < sum(g["bytes"] for g in checkpoint["groups"]) <= data  # each tensor padded to 32
    assert seconds < 20
    path.unlink()


# ---------------------------------------------------------------------------------------------------
# (b) every read recorded


class RecordingFile:
    """A file object that logs the byte range of every read; anything else passes through."""

    def __init__(self, handle: Any, reads: list[tuple[int, int]]) -> None:
        self._handle, self._reads = handle, reads

    def read(self, size: int = -1) -> bytes:
        start = self._handle.tell()
        data = self._handle.read(size)
        self._reads.append((start, start + len(data)))
        return data

    def readinto(self, buffer: Any) -> int:
        start = self._handle.tell()
        n = self._handle.readinto(buffer)
        self._reads.append((start, start + (n or 0)))
        return n

    def __getattr__(self, name: str) -> Any:
        if name.startswith("read"):  # readline, readlines, read1, ...: not expected, and not recorded
            raise AssertionError(f"unexpected read method {name}")
        return getattr(self._handle, name)

    def __enter__(self) -> RecordingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


class Recorder:
    """Opens checkpoints with open() wrapped for every file under `root` (recording modes and read
    ranges per file) and mmap refused."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = str(root.resolve())
        self.opened: dict[str, list[str]] = defaultdict(list)
        self.reads: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self._open = builtins.open
        self._monkeypatch = monkeypatch

    def read_checkpoint(self, path: Path) -> Checkpoint:
        with self._monkeypatch.context() as patch:
            patch.setattr(builtins, "open", self.open)
            patch.setattr(io, "open", self.open)
            patch.setattr(mmap, "mmap", refuse_mmap)
            return open_checkpoint(str(path))

    def open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = self._open(file, mode, *args, **kwargs)
        if isinstance(file, int):
            return handle
        path = os.path.realpath(os.fsdecode(os.fspath(file)))
        if not path.startswith(self.root + os.sep):
            return handle
        self.opened[path].append(mode)
        return RecordingFile(handle, self.reads[path])

    def last_byte_read(self, path: Path) -> int:
        return max(end for _, end in self.reads[str(path.resolve())])


def refuse_mmap(*args: object, **kwargs: object) -> None:
    raise AssertionError("a reader memory-mapped a checkpoint file")


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    return Recorder(tmp_path, monkeypatch)


def assert_headers_only(rec: Recorder, root: Path) -> None:
    """Every .safetensors file's reads end exactly at its data start; no pickle or code file is opened."""
    shards = sorted(root.glob("*.safetensors"))
    assert shards
    for shard in shards:
        assert rec.last_byte_read(shard) == safetensors_data_start(shard)  # the whole header, not a byte more
    for path, modes in rec.opened.items():
        assert set(modes) == {"rb"}, (path, modes)
        assert not path.endswith((".pt", ".py", ".bin")), path


def test_safetensors_single_file_reads_headers_only(tmp_path: Path, recorder: Recorder) -> None:
    root = build_target(tmp_path / "target", "qwen3_5_moe", quant="nvfp4-modelopt")
    checkpoint = recorder.read_checkpoint(root)
    assert checkpoint.role == "both" and checkpoint.total_bytes > 0
    assert_headers_only(recorder, root)
    assert str(root / "config.json") in recorder.opened  # the small files are read in full


def test_safetensors_shards_read_headers_only(tmp_path: Path, recorder: Recorder) -> None:
    root = build_target(tmp_path / "target", "qwen3_next", shards=4)
    recorder.read_checkpoint(root)
    assert_headers_only(recorder, root)
    assert len(list(root.glob("*.safetensors"))) == 4


def test_drafter_pickles_and_code_are_never_opened(tmp_path: Path, recorder: Recorder) -> None:
    root = build_dflash(tmp_path / "drafter", auto_map=True, mask_embedding=True)
    checkpoint = recorder.read_checkpoint(root)
    assert checkpoint.drafter.mask_embedding_file == "mask_embedding.pt"
    assert_headers_only(recorder, root)


@pytest.mark.parametrize(
    "build",
    [
        lambda p: build_gguf_target(p, "llama", hidden=1024, layers=8, intermediate=4096, sparse=True),
        # 248320 token strings make a header of several read-ahead chunks
        lambda p: build_gguf_dflash(p, hidden=2048, intermediate=6144, vocab_size=248320, sparse=True),
    ],
    ids=["small-header", "multi-chunk-header"],
)
def test_gguf_reads_no_byte_past_the_header(tmp_path: Path, recorder: Recorder, build: Callable[[Path], Path]) -> None:
    path = build(tmp_path / "model.gguf")
    data_start = gguf_data_start(path)
    assert path.stat().st_size > data_start + 16 * GGUF_READ_AHEAD  # a data section far bigger than one chunk
    checkpoint = recorder.read_checkpoint(path)
    assert checkpoint.format == "gguf"
    assert set(recorder.opened) == {str(path.resolve())}
    assert recorder.last_byte_read(path) < data_start  # the reader stops inside the header
    assert sum(end - start for start, end in recorder.reads[str(path.resolve())]) <= data_start
