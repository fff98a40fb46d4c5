"""`specpair download`: pinned, verified, resumable downloads of one repo or of a target and its drafter.

huggingface_hub resolves each revision to a commit (one `model_info` call per repo, through
`hub.HubFiles`) and supplies the HTTP session, auth headers and error types. The transfer is done here,
because `hf_hub_download` does not resume in 2.x (each try writes a fresh uuid-named .incomplete):
every file streams into a stable partial name, is hashed while its bytes arrive (a partial left by an
earlier run is re-hashed, then resumed with an HTTP Range request), and is renamed to its final name only
once it matches the Hub: the LFS sha256 for large files, the git blob id for the others. A mismatch
removes the bad copy. In the HF cache the files get huggingface_hub's own layout (blobs named by etag,
snapshot symlinks, refs/<branch>), so `hf_hub_download(local_files_only=True)`, `scan_cache_dir()` and
`specpair check --offline` find them; with --local-dir they are plain files, plus huggingface_hub's
download metadata so that `hf download --local-dir` sees them as current.

Partial files: `<cache>/models--org--name/blobs/<etag>.incomplete`, or
`<local-dir>/.cache/specpair/download/<path>.<etag[:16]>.incomplete`.

Errors: BadInput (exit 2) for what is refused before the transfer (arguments, access, a moving ref under
--require-sha, too little disk space); DownloadFailed (exit 1) for a transfer that did not end verified,
after which a re-run resumes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from specpair.checkpoint import FileEntry
from specpair.errors import BadInput, Incomplete
from specpair.sources.hub import (
    REQUEST_TIMEOUT_S,
    HubFiles,
    Unreachable,
    hub_errors,
    repo_folder,
    write_ref,
)
from specpair.sources.lockfile import ROLES, LockedFile, LockedRepo, hash_file
from specpair.sources.reading import REPO_ID
from specpair.sources.settings import HubSettings, settings_from_env

WORKERS = 8  # files in flight at once, as huggingface_hub's snapshot_download
RETRIES = 5  # failed tries in a row without a new byte before a file is given up
BACKOFF_S = 1.0  # wait before the n-th retry in a row: BACKOFF_S * 2**(n-1), at most MAX_BACKOFF_S
MAX_BACKOFF_S = 16.0
DEFAULT_READ_TIMEOUT_S = 10.0  # huggingface_hub's default for HF_HUB_DOWNLOAD_TIMEOUT
METADATA_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken", ".md")  # what --metadata-only keeps
PARTIAL_SUFFIX = ".incomplete"
LOCAL_PARTIALS = os.path.join(".cache", "specpair", "download")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
GIT_BLOB_ID = re.compile(r"^[0-9a-f]{40}$")


class DownloadFailed(Incomplete):
    """A transfer that did not end with a verified file: exit 1. What arrived intact stays for a resume."""


class _Retry(Exception):
    """A try that failed in a way worth repeating (5xx, cut connection, stall)."""


class _Restart(Exception):
    """The server will not continue from the partial's end: discard the partial and fetch from byte 0."""


class _Cancelled(Exception):
    """The user interrupted the run: stop this file, keeping its partial."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of a commit as the Hub lists it: what the downloaded bytes must match."""

    path: str
    size: int
    sha256: str | None  # LFS files
    blob_id: str | None  # plain git files (an LFS file's blob id is its pointer's, so it is not kept)

    @property
    def etag(self) -> str:
        """huggingface_hub's name for the cached blob: the sha256 of an LFS file, else the git blob id."""
        return self.sha256 or self.blob_id or ""


@dataclass(frozen=True)
class Destination:
    layout: str  # "hf-cache" | "local-dir"
    directory: str  # where the files appear: the cache snapshot directory, or the local directory
    storage: str  # the cache's models--org--name folder (blobs/, refs/); the local directory itself

    def final_path(self, f: RemoteFile) -> str:
        if self.layout == "hf-cache":
            return os.path.join(self.storage, "blobs", f.etag)
        return os.path.join(self.directory, f.path)

    def partial_path(self, f: RemoteFile) -> str:
        if self.layout == "hf-cache":
            return self.final_path(f) + PARTIAL_SUFFIX
        return os.path.join(self.directory, LOCAL_PARTIALS, f"{f.path}.{f.etag[:16]}{PARTIAL_SUFFIX}")

    def lock_path(self, f: RemoteFile) -> str:
        if self.layout == "hf-cache":  # huggingface_hub's own lock: an hf_hub_download of the same blob waits too
            cache, folder = os.path.split(self.storage)
            return os.path.join(cache, ".locks", folder, f"{f.etag}.lock")
        return self.partial_path(f)[: -len(PARTIAL_SUFFIX)] + ".lock"


@dataclass
class RepoPlan:
    repo: str
    revision: str | None  # as asked; None means main
    commit: str
    role: str
    settings: HubSettings
    files: list[RemoteFile]
    destination: Destination
    include: list[str]
    exclude: list[str]
    metadata_only: bool

    @property
    def where(self) -> str:
        return f"{self.repo}@{self.revision}" if self.revision else self.repo

    @property
    def moving(self) -> bool:
        """Asked by branch or tag (or not at all): the commit was looked up now, not given."""
        return self.revision != self.commit


@dataclass(frozen=True)
class FileState:
    """What an earlier run left on disk, seen before any transfer."""

    file: RemoteFile
    present: bool  # under its final name with the listed size (it is re-hashed before it counts)
    partial: int  # bytes of an interrupted download that a resume keeps


@dataclass(frozen=True)
class DiskNeed:
    directory: str
    needed: int
    free: int


@dataclass(frozen=True)
class FileResult:
    path: str
    size: int
    sha256: str
    status: str  # "present" | "downloaded" | "resumed" | "replaced" (a wrong copy stood under the final name)
    transferred: int
    resumed: int


@dataclass
class RepoResult:
    plan: RepoPlan
    files: list[FileResult]

    def locked(self) -> LockedRepo:
        p = self.plan
        return LockedRepo(
            repo=p.repo,
            role=p.role,
            revision=p.revision,
            commit=p.commit,
            endpoint=p.settings.endpoint,
            layout=p.destination.layout,
            directory=p.destination.directory,
            include=p.include,
            exclude=p.exclude,
            metadata_only=p.metadata_only,
            files=[LockedFile(f.path, f.size, f.sha256) for f in self.files],
        )


@dataclass
class _Run:
    read_timeout: float
    on_bytes: Callable[[int], None]
    stop: threading.Event = field(default_factory=threading.Event)


def plan(
    refs: list[str],
    revision: str | None,
    include: list[str],
    exclude: list[str],
    local_dir: str | None,
    metadata_only: bool,
    require_sha: bool,
    on_resolved: Callable[[RepoPlan], None],
) -> list[RepoPlan]:
    """Resolve each repo at its own revision and list the files to fetch; nothing is downloaded."""
    if not 1 <= len(refs) <= 2:
        raise BadInput("specpair download", "give one repo, or two: the target, then its drafter")
    if revision is not None and len(refs) == 2:
        raise BadInput(
            "--revision", "applies to a single repo; a pair is never fetched at one revision: pin each repo as REPO@REV"
        )
    asked = [_parse_ref(ref, revision) for ref in refs]
    settings = settings_from_env(None)
    if settings.offline:
        raise BadInput(
            "HF_HUB_OFFLINE", "is set, and downloading needs the Hub (`specpair verify` checks files downloaded before)"
        )
    local_dirs = _local_dirs([repo for repo, _ in asked], local_dir)
    plans = []
    for role, (repo, rev), directory in zip(ROLES, asked, local_dirs):
        found = _resolve(repo, rev, role, directory, settings, include, exclude, metadata_only)
        if require_sha and found.moving:
            raise BadInput(
                found.where,
                f"{rev or 'main'!r} is a branch or tag, now at commit {found.commit}: "
                f"pin it as {repo}@{found.commit}, or pass --no-require-sha to lock "
                "the commit it points to now",
            )
        on_resolved(found)
        plans.append(found)
    return plans


def survey(repo_plan: RepoPlan) -> list[FileState]:
    dest = repo_plan.destination
    states = []
    for f in repo_plan.files:
        final = dest.final_path(f)
        present = os.path.isfile(final) and os.path.getsize(final) == f.size
        try:
            partial = os.path.getsize(dest.partial_path(f))
        except OSError:
            partial = 0
        states.append(FileState(f, present, 0 if present or partial > f.size else partial))
    return states


def disk_needs(plans: list[RepoPlan], states: list[list[FileState]]) -> list[DiskNeed]:
    """Bytes still to write per filesystem (the Hub's sizes minus what is on disk), and its free space."""
    needs: dict[int, DiskNeed] = {}
    for p, plan_states in zip(plans, states):
        root = p.destination.storage
        existing = _existing_ancestor(root)
        needed = sum(s.file.size - s.partial for s in plan_states if not s.present)
        device = os.stat(existing).st_dev
        before = needs.get(device)
        needs[device] = DiskNeed(
            before.directory if before else root,
            needed + (before.needed if before else 0),
            shutil.disk_usage(existing).free,
        )
    return list(needs.values())


def check_space(needs: list[DiskNeed]) -> None:
    """Refuse before the first byte when the files will not fit."""
    for need in needs:
        if need.needed > need.free:
            raise BadInput(
                need.directory,
                f"not enough free disk space: the download needs {human_size(need.needed)} "
                f"more and its filesystem has {human_size(need.free)} free (free some "
                "space, or choose another HF_HUB_CACHE or --local-dir)",
            )


def create_destinations(plans: list[RepoPlan]) -> None:
    """Refuse before the first byte when a destination cannot be created."""
    for p in plans:
        try:
            os.makedirs(p.destination.directory, exist_ok=True)
        except OSError as e:
            raise BadInput(p.destination.directory, f"cannot create the download directory ({e.strerror})") from None


def fetch(plans: list[RepoPlan], states: list[list[FileState]], on_bytes: Callable[[int], None]) -> list[RepoResult]:
    """Download, verify and place every file; the first failure (in file order) is raised once all have ended."""
    run = _Run(read_timeout=_read_timeout(), on_bytes=on_bytes)
    jobs = [(p, s) for p, plan_states in zip(plans, states) for s in plan_states]
    with ThreadPoolExecutor(max(1, min(WORKERS, len(jobs)))) as pool:
        futures = [pool.submit(_fetch_file, p, s, run) for p, s in jobs]
        try:
            wait(futures)
        except BaseException:  # Ctrl-C: stop the transfers; their partials stay for the next run
            run.stop.set()
            pool.shutdown(cancel_futures=True)
            raise
    for future in futures:
        if future.exception() is not None:
            failed = sum(f.exception() is not None for f in futures)
            error = future.exception()
            if failed > 1 and isinstance(error, DownloadFailed):
                raise DownloadFailed(error.where, f"{error.problem} ({failed - 1} more file(s) did not complete)")
            raise error
    results = []
    for p in plans:
        results.append(RepoResult(p, [future.result() for (q, _), future in zip(jobs, futures) if q is p]))
        if p.destination.layout == "hf-cache" and p.moving:
            write_ref(os.path.dirname(p.destination.storage), p.repo, p.revision or "main", p.commit)
    return results


# ---------------------------------------------------------------- resolution


def _parse_ref(ref: str, revision: str | None) -> tuple[str, str | None]:
    repo, at, rev = ref.partition("@")
    if not REPO_ID.match(repo) or repo.split("/")[1] in (".", "..") or (at and not rev):
        raise BadInput(ref, "not a Hub repo id of the form org/name[@revision]")
    if rev and revision is not None:
        raise BadInput(ref, "the revision is given twice (@ and --revision): keep one")
    return repo, rev or revision


def _local_dirs(repos: list[str], local_dir: str | None) -> list[str | None]:
    """One repo goes to DIR itself; a pair to DIR/<name> each."""
    if local_dir is None:
        return [None] * len(repos)
    root = os.path.abspath(os.path.expanduser(local_dir))
    if len(repos) == 1:
        return [root]
    names = [repo.split("/")[1] for repo in repos]
    if names[0] == names[1]:
        raise BadInput(
            "--local-dir",
            f"both repos would be written to {os.path.join(root, names[0])}: "
            "download them one at a time, each with its own --local-dir",
        )
    return [os.path.join(root, name) for name in names]


def _resolve(
    repo: str,
    revision: str | None,
    role: str,
    local_dir: str | None,
    settings: HubSettings,
    include: list[str],
    exclude: list[str],
    metadata_only: bool,
) -> RepoPlan:
    from huggingface_hub.utils import filter_repo_objects

    where = f"{repo}@{revision}" if revision else repo
    try:
        hub_files = HubFiles.resolve(repo, revision, settings)
    except Unreachable as e:
        raise DownloadFailed(where, f"the Hub at {settings.endpoint} could not be reached ({e})") from None
    entries = list(
        filter_repo_objects(
            hub_files.list(), allow_patterns=include or None, ignore_patterns=exclude or None, key=lambda e: e.path
        )
    )
    if metadata_only:
        entries = [e for e in entries if e.path.endswith(METADATA_SUFFIXES)]
    if not entries:
        listed = ", ".join(e.path for e in hub_files.list()[:8]) or "none"
        raise BadInput(where, f"no file of the repo is selected (its files: {listed})")
    if local_dir is not None:
        for e in entries:
            if e.path.split("/")[0] == ".cache":  # where the partials and huggingface_hub's metadata live
                raise BadInput(where, f"the repo's file {e.path!r} would land in the download's own .cache folder")
    if local_dir is None:
        storage = os.path.join(settings.cache_dir, repo_folder(repo))
        destination = Destination("hf-cache", os.path.join(storage, "snapshots", hub_files.commit), storage)
    else:
        destination = Destination("local-dir", local_dir, local_dir)
    files = [_remote_file(hub_files, e, settings) for e in entries]
    return RepoPlan(
        repo,
        revision,
        hub_files.commit,
        role,
        settings,
        files,
        destination,
        list(include),
        list(exclude),
        metadata_only,
    )


def _remote_file(hub_files: HubFiles, entry: FileEntry, settings: HubSettings) -> RemoteFile:
    """The size and hash the Hub lists; from the file's HEAD answer when the listing lacks them (mirrors)."""
    where = f"{hub_files.where}/{entry.path}"
    size, sha256 = entry.size, entry.sha256
    blob_id = None if sha256 else entry.blob_id
    if size is None or (sha256 is None and blob_id is None):
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(hub_files.repo, entry.path, revision=hub_files.commit, endpoint=settings.endpoint)
        try:
            with hub_errors(hub_files.where, hub_files.repo, hub_files.revision, settings, entry.path):
                head = get_hf_file_metadata(url, timeout=REQUEST_TIMEOUT_S, endpoint=settings.endpoint)
        except Unreachable as e:
            raise DownloadFailed(where, f"the Hub at {settings.endpoint} could not be reached ({e})") from None
        if head.commit_hash is not None and head.commit_hash != hub_files.commit:
            raise BadInput(where, f"the Hub served commit {head.commit_hash} when asked for {hub_files.commit}")
        size = size if size is not None else head.size
        etag = (head.etag or "").lower()
        if sha256 is None and blob_id is None:
            sha256, blob_id = (etag, None) if SHA256.match(etag) else (None, etag if GIT_BLOB_ID.match(etag) else None)
    if type(size) is not int or size < 0:
        raise BadInput(where, f"the Hub gives no valid size for this file ({size!r})")
    if sha256 is not None and not SHA256.match(sha256):
        raise BadInput(where, f"the Hub's LFS sha256 {sha256!r} is not 64 hex digits")
    if blob_id is not None and not GIT_BLOB_ID.match(blob_id):
        raise BadInput(where, f"the Hub's git blob id {blob_id!r} is not 40 hex digits")
    if sha256 is None and blob_id is None:
        raise BadInput(
            where, "the Hub gives neither a sha256 nor a git blob id for this file, so it cannot be verified"
        )
    return RemoteFile(entry.path, size, sha256, blob_id)


# ---------------------------------------------------------------- transfer


def _fetch_file(p: RepoPlan, state: FileState, run: _Run) -> FileResult:
    f, dest = state.file, p.destination
    where = f"{p.where}/{f.path}"
    final = dest.final_path(f)
    if run.stop.is_set():
        raise _Cancelled()
    try:
        with _exclusive(dest.lock_path(f)):
            status = "downloaded"
            if os.path.lexists(final):
                if os.path.isfile(final) and os.path.getsize(final) == f.size:
                    sha, git = _hashers(f)
                    hash_file(final, [h for h in (sha, git) if h is not None])
                    if _matches(f, sha, git):
                        _place(p, f)
                        return FileResult(f.path, f.size, sha.hexdigest(), "present", 0, 0)
                status = "replaced"  # the verified download replaces it in one rename
            digest, transferred, resumed = _transfer(p, f, where, run)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(dest.partial_path(f), final)
            _place(p, f)
    except OSError as e:
        raise DownloadFailed(where, _disk_problem(e, dest.partial_path(f))) from None
    if status == "downloaded" and resumed:
        status = "resumed"
    return FileResult(f.path, f.size, digest, status, transferred, resumed)


def _transfer(p: RepoPlan, f: RemoteFile, where: str, run: _Run) -> tuple[str, int, int]:
    """Bring the partial to the file's full size, resuming from what is there; (sha256, new bytes, kept bytes)."""
    import httpx2
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    partial = p.destination.partial_path(f)
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        have = os.fstat(fd).st_size
        if have > f.size:
            os.ftruncate(fd, 0)
            have = 0
        sha, git = _hashers(f)
        if have:
            hash_file(partial, [h for h in (sha, git) if h is not None])
        os.lseek(fd, have, os.SEEK_SET)
        resumed, transferred, failures = have, 0, 0
        furthest = have  # only bytes past this count as progress: a restart re-fetches what it discarded
        url = hf_hub_url(p.repo, f.path, revision=p.commit, endpoint=p.settings.endpoint)
        timeout = httpx2.Timeout(REQUEST_TIMEOUT_S, read=run.read_timeout)
        while have < f.size:
            headers = build_hf_headers()
            headers["Accept-Encoding"] = "identity"  # the bytes hashed must be the file's, not a gzip of them
            if have:
                headers["Range"] = f"bytes={have}-"
            try:
                with get_session().stream("GET", url, headers=headers, timeout=timeout) as response:
                    status = response.status_code
                    if have and (status == 416 or (status == 206 and not _range_starts_at(response, have))):
                        raise _Restart(f"HTTP {status} to a Range request")  # fetch the whole file again
                    if status >= 500 or status in (408, 429):
                        raise _Retry(f"HTTP {status}")
                    with hub_errors(p.where, p.repo, p.revision, p.settings, f.path):
                        hf_raise_for_status(response)
                    if have and status == 200:  # Range ignored: the body starts at byte 0
                        sha, git, have, resumed = _discard(fd, have, f, run)
                    for chunk in response.iter_bytes():
                        if run.stop.is_set():
                            raise _Cancelled()
                        if have + len(chunk) > f.size:
                            os.close(fd)
                            fd = -1
                            os.unlink(partial)
                            raise DownloadFailed(
                                where,
                                f"the Hub sent more than the {f.size} bytes it lists for this "
                                "file: the bad copy was removed",
                            )
                        _write_all(fd, chunk)
                        sha.update(chunk)
                        if git is not None:
                            git.update(chunk)
                        have += len(chunk)
                        transferred += len(chunk)
                        run.on_bytes(len(chunk))
                if have < f.size:
                    raise _Retry(f"the connection closed at byte {have} of {f.size}")
            except (httpx2.TransportError, _Retry, _Restart) as e:
                failures = 1 if have > furthest else failures + 1
                furthest = max(furthest, have)
                if failures > RETRIES:
                    raise DownloadFailed(
                        where,
                        f"gave up after {RETRIES} retries without progress ({_reason(e)}); "
                        f"{have} of {f.size} bytes are kept in {partial}: run again to "
                        "resume",
                    ) from None
                if isinstance(e, _Restart):
                    sha, git, have, resumed = _discard(fd, have, f, run)
                else:
                    time.sleep(min(BACKOFF_S * 2 ** (failures - 1), MAX_BACKOFF_S))
        if not _matches(f, sha, git):
            os.close(fd)
            fd = -1
            os.unlink(partial)
            kind, got, listed = (
                ("sha256", sha.hexdigest(), f.sha256)
                if f.sha256
                else ("git blob id", git.hexdigest() if git else "", f.blob_id)
            )
            raise DownloadFailed(
                where,
                f"{kind} {got} differs from the Hub's {listed}: the bad copy was removed; "
                "run again to download it afresh",
            )
        os.fsync(fd)  # the bytes reach the disk before the rename gives them their final name
        return sha.hexdigest(), transferred, resumed
    finally:
        if fd >= 0:
            os.close(fd)


def _discard(fd: int, have: int, f: RemoteFile, run: _Run) -> tuple[Any, Any | None, int, int]:
    """Empty the partial: (fresh hashers, bytes on disk, bytes resumed)."""
    run.on_bytes(-have)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    sha, git = _hashers(f)
    return sha, git, 0, 0


def _place(p: RepoPlan, f: RemoteFile) -> None:
    """Make a verified file visible the way huggingface_hub would have."""
    dest = p.destination
    if dest.layout == "hf-cache":
        pointer = os.path.join(dest.directory, f.path)
        os.makedirs(os.path.dirname(pointer), exist_ok=True)
        target = os.path.relpath(dest.final_path(f), os.path.dirname(pointer))
        if os.path.islink(pointer) and os.readlink(pointer) == target:
            return
        if not os.path.lexists(pointer):  # a new link appears whole: no temporary name a kill could leave behind
            os.symlink(target, pointer)
            return
        tmp = f"{pointer}.{uuid.uuid4().hex[:8]}.tmp"
        os.symlink(target, tmp)
        os.replace(tmp, pointer)
    else:
        from pathlib import Path

        from huggingface_hub._local_folder import write_download_metadata

        write_download_metadata(local_dir=Path(dest.directory), filename=f.path, commit_hash=p.commit, etag=f.etag)


@contextlib.contextmanager
def _exclusive(lock_path: str) -> Iterator[None]:
    """One writer per partial file: another run (or thread) fetching the same blob waits, then finds it done."""
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _hashers(f: RemoteFile) -> tuple[Any, Any | None]:
    """sha256 always (the lock records it); the git blob hash too when that is what the Hub lists."""
    git = None if f.sha256 else hashlib.sha1(b"blob %d\0" % f.size, usedforsecurity=False)  # git's id, not a MAC
    return hashlib.sha256(), git


def _matches(f: RemoteFile, sha: Any, git: Any | None) -> bool:
    if f.sha256:
        return sha.hexdigest() == f.sha256
    return git is not None and git.hexdigest() == f.blob_id


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _range_starts_at(response: Any, offset: int) -> bool:
    match = re.match(r"^bytes (\d+)-\d+/(?:\d+|\*)$", response.headers.get("Content-Range", ""))
    return match is not None and int(match.group(1)) == offset


def _read_timeout() -> float:
    raw = os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT")
    if not raw:
        return DEFAULT_READ_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise BadInput("HF_HUB_DOWNLOAD_TIMEOUT", f"must be a number of seconds, not {raw!r}")
    return value


def _reason(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    if isinstance(error, (_Retry, _Restart)):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _disk_problem(error: OSError, partial: str) -> str:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        kept = os.path.getsize(partial) if os.path.isfile(partial) else 0
        return (
            f"the disk is full ({error.strerror}); no file was left under its final name, and the {kept} bytes "
            f"that arrived intact are kept in {partial}: free some space and run again to resume"
        )
    return f"cannot use {error.filename or partial} ({error.strerror or error})"


def _existing_ancestor(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def human_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"
