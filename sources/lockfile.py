"""`specpair.lock`: what `specpair download` fetched, pinned: per repo the commit and the sha256 of every file.

Schema "specpair.lock/1", one JSON object:

    {"schema": "specpair.lock/1",
     "repos": [{"repo": "org/name", "role": "target" | "draft", "revision": "<as asked, or null>",
                "commit": "<40 hex>", "endpoint": "https://huggingface.co",
                "layout": "hf-cache" | "local-dir", "path": "<where the files are>",
                "selection": {"include": [...], "exclude": [...], "metadata_only": false},
                "files": [{"path": "config.json", "size": 1234, "sha256": "<64 hex>"}, ...]}, ...]}

The first repo is the target, the second (if any) its drafter. `path` is the HF cache snapshot directory or
the --local-dir directory, relative to the lock's own directory when it lies below it (so a folder holding
both moves as one), else absolute. A lock is read as untrusted input: every field is checked, and file names
must stay inside their directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from specpair.checkpoint import Checkpoint
from specpair.errors import BadInput
from specpair.formats import MAX_JSON_DEPTH, brief, nests_deeper_than
from specpair.sources.hub import COMMIT, safe_relative
from specpair.sources.settings import write_atomic

LOCK_SCHEMA = "specpair.lock/1"
LOCK_NAME = "specpair.lock"
LAYOUTS = ("hf-cache", "local-dir")
ROLES = ("target", "draft")
MAX_LOCK_BYTES = 64 << 20
HASH_BUFFER = 8 << 20  # large reads keep sha256 at its ~2 GB/s per core; hashlib drops the GIL on them
SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class LockedFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class LockedRepo:
    repo: str
    role: str
    revision: str | None
    commit: str
    endpoint: str
    layout: str
    directory: str  # absolute
    include: list[str]
    exclude: list[str]
    metadata_only: bool
    files: list[LockedFile]


@dataclass(frozen=True)
class FileCheck:
    """One file of a lock against the disk: ok, missing, size_differs or hash_differs."""

    path: str
    size: int
    status: str
    found_size: int | None = None
    found_sha256: str | None = None


def lock_path_of(argument: str) -> str:
    """`verify DIR|LOCK`: a directory means the specpair.lock inside it."""
    path = os.path.expanduser(argument)
    if os.path.isdir(path):
        path = os.path.join(path, LOCK_NAME)
        if not os.path.isfile(path):
            raise BadInput(argument, f"no {LOCK_NAME} in this directory")
    elif not os.path.isfile(path):
        raise BadInput(argument, "no such file or directory")
    return path


def write_lock(path: str, repos: list[LockedRepo]) -> None:
    """Write atomically: a reader sees the old lock or the new one, never half of one."""
    base = os.path.dirname(os.path.abspath(path))
    document = {"schema": LOCK_SCHEMA, "repos": [_repo_to_json(r, base) for r in repos]}
    data = (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    try:
        write_atomic(path, data)
    except OSError as e:
        raise BadInput(path, f"cannot write the lockfile ({e.strerror or e})") from None


def read_lock(path: str) -> list[LockedRepo]:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LOCK_BYTES + 1)
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror or e})") from None
    if len(raw) > MAX_LOCK_BYTES:
        raise BadInput(path, f"over {MAX_LOCK_BYTES} bytes: not a {LOCK_SCHEMA} file")
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise BadInput(path, f"not valid JSON ({e})") from None
    except RecursionError:  # the decoder recurses once per level
        raise BadInput(path, f"not a {LOCK_SCHEMA} file (JSON nested too deeply)") from None
    if nests_deeper_than(document, MAX_JSON_DEPTH):  # repr and the checks below would recurse as deep
        raise BadInput(path, f"not a {LOCK_SCHEMA} file (JSON nested deeper than {MAX_JSON_DEPTH} levels)")
    if not isinstance(document, dict) or document.get("schema") != LOCK_SCHEMA:
        raise BadInput(path, f"not a {LOCK_SCHEMA} file")
    repos = document.get("repos")
    if not isinstance(repos, list) or not 1 <= len(repos) <= 2:
        raise BadInput(path, "'repos' must list one or two repos (target, then drafter)")
    base = os.path.dirname(os.path.abspath(path))
    return [_repo_from_json(item, f"{path}: repos[{i}]", base) for i, item in enumerate(repos)]


def verify(repos: list[LockedRepo]) -> list[list[FileCheck]]:
    """Re-hash every locked file, the largest first, on all cores; per repo, in lock order."""
    jobs = [(r, f) for r in repos for f in r.files]
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i][1].size)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        found = dict(zip(order, pool.map(lambda i: _check(*jobs[i]), order)))
    checks = [found[i] for i in range(len(jobs))]
    per_repo, start = [], 0
    for r in repos:
        per_repo.append(checks[start : start + len(r.files)])
        start += len(r.files)
    return per_repo


def hash_file(path: str, hashers: Iterable[Any]) -> int:
    """Feed a file to the hashers; returns its size."""
    buffer = bytearray(HASH_BUFFER)
    view = memoryview(buffer)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            for h in hashers:
                h.update(view[:n])
            total += n
    return total


def open_locked_pair(
    path: str, gguf_file: str | None, draft_gguf_file: str | None
) -> tuple[Checkpoint, Checkpoint | None]:
    """`specpair check specpair.lock`: the lock's target and drafter, read where they were downloaded."""
    repos = read_lock(path)
    checkpoints = [_open_locked(repo, g) for repo, g in zip(repos, (gguf_file, draft_gguf_file))]
    return checkpoints[0], (checkpoints[1] if len(checkpoints) > 1 else None)


def fetch_again(repo: LockedRepo) -> str:
    """The `specpair download` that puts `repo`'s files back where the lock says they are, as they were selected;
    with no lockfile of its own, which would replace the pair's."""
    command = ["specpair", "download", f"{repo.repo}@{repo.commit}"]
    command += [arg for pattern in repo.include for arg in ("--include", pattern)]
    command += [arg for pattern in repo.exclude for arg in ("--exclude", pattern)]
    command += ["--metadata-only"] if repo.metadata_only else []
    command += ["--local-dir", repo.directory] if repo.layout == "local-dir" else []
    return shlex.join(command + ["--no-lock"])


def _open_locked(repo: LockedRepo, gguf_file: str | None) -> Checkpoint:
    from specpair.sources.hub import CachedFiles
    from specpair.sources.reading import read_checkpoint

    if not os.path.isdir(repo.directory):
        raise BadInput(
            repo.directory,
            f"{repo.repo}@{repo.commit} is not there any more (the lock says it was downloaded here): fetch it "
            f"again with `{fetch_again(repo)}`",
        )
    # The cache reader lists the shards an index names even when only metadata was downloaded, and reads
    # such a checkpoint as config-only instead of refusing it. It looks at the files the lock lists only: the
    # directory is the lock's word, and a lock naming "/" must not make it walk the whole file system.
    files = CachedFiles(
        repo.repo, repo.commit, repo.commit, repo.directory, None, repo.directory, locked=[f.path for f in repo.files]
    )
    return read_checkpoint(files, repo.directory, "local", gguf_file, revision=repo.commit)


def _check(repo: LockedRepo, locked: LockedFile) -> FileCheck:
    full = os.path.join(repo.directory, locked.path)
    found = FileCheck(locked.path, locked.size, "missing")
    try:
        info = os.stat(full)
    except OSError:
        return found
    if not stat.S_ISREG(info.st_mode):  # /dev/zero would hash forever, a FIFO block on open
        raise BadInput(full, "is not a regular file: refused")
    size = info.st_size
    if size != locked.size:
        return FileCheck(locked.path, locked.size, "size_differs", found_size=size)
    digest = hashlib.sha256()
    try:
        hash_file(full, [digest])
    except OSError as e:
        raise BadInput(full, f"cannot read ({e.strerror or e})") from None
    status = "ok" if digest.hexdigest() == locked.sha256 else "hash_differs"
    return FileCheck(locked.path, locked.size, status, size, digest.hexdigest())


def _repo_to_json(repo: LockedRepo, base: str) -> dict[str, Any]:
    inside = os.path.relpath(repo.directory, base)
    path = repo.directory if inside == ".." or inside.startswith("../") else inside
    return {
        "repo": repo.repo,
        "role": repo.role,
        "revision": repo.revision,
        "commit": repo.commit,
        "endpoint": repo.endpoint,
        "layout": repo.layout,
        "path": path,
        "selection": {"include": repo.include, "exclude": repo.exclude, "metadata_only": repo.metadata_only},
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in repo.files],
    }


def _repo_from_json(item: object, where: str, base: str) -> LockedRepo:
    from specpair.sources.reading import REPO_ID

    if not isinstance(item, dict):
        raise BadInput(where, "not an object")
    repo, commit, path = item.get("repo"), item.get("commit"), item.get("path")
    if not isinstance(repo, str) or not REPO_ID.match(repo):
        raise BadInput(where, f"'repo' is not a Hub repo id: {brief(repo)}")
    if not isinstance(commit, str) or not COMMIT.match(commit):
        raise BadInput(where, f"'commit' is not a 40-hex commit id: {brief(commit)}")
    if not _file_name(path) or not path:
        raise BadInput(where, "'path' must name the directory the files were downloaded to")
    revision, endpoint = item.get("revision"), item.get("endpoint")
    if revision is not None and not isinstance(revision, str):
        raise BadInput(where, "'revision' must be a string or null")
    if item.get("layout") not in LAYOUTS or item.get("role") not in ROLES:
        raise BadInput(where, f"'layout' must be one of {', '.join(LAYOUTS)} and 'role' one of {', '.join(ROLES)}")
    selection = item.get("selection")
    if not (
        isinstance(selection, dict)
        and _strings(selection.get("include"))
        and _strings(selection.get("exclude"))
        and isinstance(selection.get("metadata_only"), bool)
    ):
        raise BadInput(where, "'selection' must hold 'include' and 'exclude' lists of globs and 'metadata_only'")
    raw_files = item.get("files")
    if not isinstance(raw_files, list):
        raise BadInput(where, "'files' must be a list")
    files = []
    for i, f in enumerate(raw_files):
        ok = (
            isinstance(f, dict)
            and safe_relative(f.get("path"))
            and _file_name(f["path"])
            and type(f.get("size")) is int
            and f["size"] >= 0
            and isinstance(f.get("sha256"), str)
            and SHA256.match(f["sha256"])
        )
        if not ok:
            raise BadInput(
                f"{where}: files[{i}]",
                "needs a relative 'path' inside the repo, an integer 'size' and a 64-hex 'sha256'",
            )
        files.append(LockedFile(f["path"], f["size"], f["sha256"]))
    return LockedRepo(
        repo=repo,
        role=item["role"],
        revision=revision,
        commit=commit,
        endpoint=endpoint if isinstance(endpoint, str) else "",
        layout=item["layout"],
        directory=os.path.normpath(os.path.join(base, os.path.expanduser(path))),
        include=selection["include"],
        exclude=selection["exclude"],
        metadata_only=selection["metadata_only"],
        files=files,
    )


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _file_name(value: object) -> bool:
    """A string the file system can take: no NUL, no lone surrogate (JSON allows both)."""
    if not isinstance(value, str) or "\0" in value:
        return False
    try:
        os.fsencode(value)
    except UnicodeError:
        return False
    return True
