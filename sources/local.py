"""Local checkpoints: an HF-layout directory, a directory of GGUF files, or one .gguf file.

A checkpoint directory is untrusted: a file it holds is opened only when it resolves to a regular file
inside the directory. Symlinks may point elsewhere inside it, and in a huggingface_hub cache snapshot
(`models--org--name/snapshots/<commit>/`) anywhere inside the repo folder, whose `blobs/` they point
into; a symlink that leaves, or a FIFO or device, is refused. A .gguf file named on the command line is
the user's own choice and is followed wherever it points.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from typing import TYPE_CHECKING

from specpair.checkpoint import Checkpoint, FileEntry
from specpair.errors import BadInput
from specpair.formats import TensorInfo, TensorTable, gguf, safetensors
from specpair.sources.reading import read_checkpoint

if TYPE_CHECKING:
    from torch import Tensor

    from specpair.formats.regions import PartCut

BLOB = re.compile(r"^[0-9a-f]{64}$")  # an LFS file's blob in the HF cache is named by its sha256


class LocalFiles:
    def __init__(self, root: str, only: str | None = None) -> None:
        self.root = root
        self.only = only  # a single file of `root`, when the user named one
        self.where = os.path.join(root, only) if only else (root.rstrip("/") or "/")
        self.boundary = None if only else _boundary(root)  # where files may resolve to

    def list(self) -> list[FileEntry]:
        if self.only:
            return [FileEntry(self.only, os.stat(os.path.join(self.root, self.only)).st_size)]
        entries = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                try:
                    size = os.stat(full).st_size  # follows the symlinks of an HF cache snapshot
                except OSError:
                    size = None
                entries.append(FileEntry(os.path.relpath(full, self.root), size))
        return entries

    def read(self, path: str, limit: int) -> bytes | None:
        full = self.inside(path)
        try:
            with open(full, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > limit:
                    raise BadInput(full, f"is {size} bytes, over the {limit}-byte limit for this file")
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise BadInput(full, f"cannot read ({e.strerror})") from None

    def safetensors_headers(self, shards: list[str]) -> list[TensorInfo]:
        return self.safetensors_table(shards).infos()

    def safetensors_table(self, shards: list[str]) -> TensorTable:
        table = TensorTable.empty()
        for shard in shards:
            table.extend(safetensors.read_local_table(self.inside(shard), shard)[0])
        return table

    def header_lengths(self, shards: list[str]) -> list[int] | None:
        try:
            lengths = [safetensors.header_length(self.inside(shard)) for shard in shards]
        except BadInput:  # a shard that is refused: the read names it, in shard order
            return None
        return None if None in lengths else lengths

    def gguf_header(self, path: str) -> gguf.GGUFHeader:
        return gguf.read_local(self.inside(path))

    def tensor(self, info: TensorInfo, cut: PartCut | None = None) -> Tensor:
        """A stored tensor's data (or `cut` of it) by positioned reads of its file (formats/weights.TensorReader)."""
        read = gguf.read_tensor if info.file.endswith(".gguf") else safetensors.read_tensor
        return read(self.inside(info.file), info, cut)

    def sha256(self, path: str) -> str:
        """The file's sha256: an HF cache blob's name where the file links to one, else hashed here."""
        full = self.inside(path)
        blob = os.path.basename(os.path.realpath(full))
        if os.path.islink(full) and BLOB.match(blob):
            return blob
        with open(full, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    def inside(self, path: str) -> str:
        """`root/path`, refused when it resolves outside `boundary` or is not a regular file (opening a
        FIFO blocks). A missing file passes: the caller reports it as before."""
        full = os.path.join(self.root, path)
        real = os.path.realpath(full)
        if self.boundary is not None and os.path.commonpath([real, self.boundary]) != self.boundary:
            raise BadInput(full, f"resolves to {real!r}, outside the checkpoint directory: refused")
        with contextlib.suppress(OSError):
            if not stat.S_ISREG(os.stat(real).st_mode):
                raise BadInput(full, "is not a regular file: refused")
        return full


def _boundary(root: str) -> str:
    """The checkpoint directory, resolved; for a huggingface_hub cache snapshot (or a folder inside one),
    its `models--*` repo folder."""
    real = path = os.path.realpath(root)
    while (parent := os.path.dirname(path)) != path:
        if os.path.basename(parent) == "snapshots" and os.path.basename(os.path.dirname(parent)).startswith("models--"):
            return os.path.dirname(parent)
        path = parent
    return real


def open_local(path: str, ref: str, gguf_file: str | None) -> Checkpoint:
    from specpair.sources.metadata_cache import cached

    if os.path.isdir(path):
        files = LocalFiles(path)
        listed = [e.path for e in files.list()]
        return cached(path, listed, gguf_file, ref, lambda: read_checkpoint(files, ref, "local", gguf_file))
    if path.endswith(".gguf"):
        directory, name = os.path.split(os.path.abspath(path))
        files = LocalFiles(directory, only=name)
        return cached(directory, [name], name, ref, lambda: read_checkpoint(files, ref, "local", name), named_file=True)
    raise BadInput(path, "is neither a checkpoint directory nor a .gguf file")
