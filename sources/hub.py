"""Hub repos, read as metadata only: model info, small files, and header byte ranges, never tensor data.

Online, one `model_info` call pins the revision to a commit; small files go through `hf_hub_download`
into the HF cache, and safetensors/GGUF headers are read with bounded HTTP range requests. The parsed
headers and the file listing are kept in a small JSON record beside the HF cache
(`<HF_HUB_CACHE>/specpair-headers/<org>--<name>/<commit>.json`), so an offline run later (asked for,
or forced by an unreachable Hub) rebuilds the same checkpoint. Offline order: the HF cache, then the
built-in catalog.

huggingface_hub is imported inside functions: `specpair check` on local paths must not pay for it.
It also reads HF_ENDPOINT / HF_HUB_OFFLINE / cache paths once at import, so they are read here from
`os.environ` at call time and passed explicitly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from specpair.checkpoint import Checkpoint, FileEntry
from specpair.errors import BadInput
from specpair.formats import TensorInfo, TensorTable, gguf, safetensors
from specpair.sources.local import LocalFiles
from specpair.sources.reading import MAX_CONFIG_BYTES, read_checkpoint
from specpair.sources.settings import HubSettings, settings_from_env, write_atomic

HEADERS_CACHE = "specpair-headers"
RECORD_SCHEMA = "specpair.hub-metadata/1"
REQUEST_TIMEOUT_S = 10.0  # per request; an unreachable Hub must fail fast so the offline fallback runs
SAFETENSORS_FIRST_READ = 256 * 1024  # one request covers the header of most shards
GGUF_FIRST_READ = 1 << 20
GGUF_MAX_READ = 16 << 20  # GGUF reads double up to this: token lists make headers several MB
SHARD_WORKERS = 8
COMMIT = re.compile(r"^[0-9a-f]{40}$")
UNREACHABLE = "was unreachable"  # in the note of a checkpoint read offline because the Hub could not be reached
CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class Unreachable(Exception):
    """The Hub could not be reached (connection, DNS, timeout, 5xx): fall back to offline sources."""


class _NotCached(Exception):
    """The HF cache holds part of a checkpoint but not what is needed to build it."""


def open_repo(repo: str, revision: str | None, ref: str, gguf_file: str | None, offline: bool | None) -> Checkpoint:
    settings = settings_from_env(offline)
    if settings.offline:
        return _open_offline(repo, revision, ref, gguf_file, settings, unreachable=None)
    try:
        files = HubFiles.resolve(repo, revision, settings)
        checkpoint = read_checkpoint(files, ref, "hub", gguf_file, revision=files.commit)
    except Unreachable as e:
        return _open_offline(repo, revision, ref, gguf_file, settings, unreachable=str(e))
    files.save_record()
    if revision is None or not COMMIT.match(revision):
        write_ref(settings.cache_dir, repo, revision or "main", files.commit)
    return checkpoint


class HubFiles:
    """`RepoFiles` over one commit of a Hub repo."""

    def __init__(
        self, repo: str, revision: str | None, commit: str, entries: list[FileEntry], settings: HubSettings
    ) -> None:
        self.repo, self.commit, self.settings = repo, commit, settings
        self.revision = revision
        self.where = f"{repo}@{revision}" if revision else repo
        self._entries = {e.path: e for e in entries}
        self._tensors: TensorTable | None = None  # what this run read, for the offline record
        self._ggufs: dict[str, gguf.GGUFHeader] = {}

    @classmethod
    def resolve(cls, repo: str, revision: str | None, settings: HubSettings) -> HubFiles:
        """Pin `revision` (branch, tag, commit; None = main) to a commit with one model_info call."""
        from huggingface_hub import HfApi

        where = f"{repo}@{revision}" if revision else repo
        with hub_errors(where, repo, revision, settings):
            info = HfApi(endpoint=settings.endpoint).model_info(
                repo, revision=revision or "main", files_metadata=True, timeout=REQUEST_TIMEOUT_S
            )
        if not isinstance(info.sha, str) or not COMMIT.match(info.sha):
            raise BadInput(where, f"the Hub at {settings.endpoint} gave no commit id for this revision")
        for s in info.siblings or []:
            if not safe_relative(s.rfilename):  # names become cache paths; they must stay inside the snapshot
                raise BadInput(where, f"the Hub lists an unsafe file name {s.rfilename!r}")
        entries = [
            FileEntry(
                path=s.rfilename,
                size=s.size if s.size is not None else (s.lfs.size if s.lfs else None),
                sha256=s.lfs.sha256 if s.lfs else None,
                blob_id=s.blob_id,
            )
            for s in info.siblings or []
        ]
        return cls(repo, revision, info.sha, sorted(entries, key=lambda e: e.path), settings)

    def list(self) -> list[FileEntry]:
        return list(self._entries.values())

    def read(self, path: str, limit: int) -> bytes | None:
        entry = self._entries.get(path)
        if entry is None:
            return None
        where = f"{self.where}/{path}"
        if entry.size is not None and entry.size > limit:
            raise BadInput(where, f"is {entry.size} bytes, over the {limit}-byte limit for this file")
        from huggingface_hub import hf_hub_download

        with hub_errors(self.where, self.repo, self.revision, self.settings, path):
            local = hf_hub_download(
                self.repo,
                path,
                revision=self.commit,
                cache_dir=self.settings.cache_dir,
                endpoint=self.settings.endpoint,
                etag_timeout=REQUEST_TIMEOUT_S,
            )
        with open(local, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:  # the listing gave no size (mirrors without file metadata)
                raise BadInput(where, f"is {size} bytes, over the {limit}-byte limit for this file")
            return f.read()

    def safetensors_headers(self, shards: list[str]) -> list[TensorInfo]:
        return self.safetensors_table(shards).infos()

    def safetensors_table(self, shards: list[str]) -> TensorTable:
        if len(shards) == 1:
            found = [self._shard_header(shards[0])]
        else:
            with ThreadPoolExecutor(min(SHARD_WORKERS, len(shards))) as pool:
                found = list(pool.map(self._shard_header, shards))
        self._tensors = TensorTable.empty()
        for table in found:
            self._tensors.extend(table)
        return self._tensors

    def header_lengths(self, shards: list[str]) -> None:
        return None  # remote: read by threads, not a child

    def gguf_header(self, path: str) -> gguf.GGUFHeader:
        size = self._size(path)
        position, chunk = 0, GGUF_FIRST_READ

        def read(n: int) -> bytes:
            # The parser asks for at least n bytes and keeps any extra, so each request grows.
            nonlocal position, chunk
            length = min(max(n, chunk), size - position)
            if length <= 0:
                return b""
            data = self._read_range(path, position, length)
            position += len(data)
            chunk = min(chunk * 2, GGUF_MAX_READ)
            return data

        header = gguf.read_header(read, size, f"{self.where}/{path}")
        self._ggufs[path] = header
        return header

    def save_record(self) -> None:
        """Keep what this run read (listing, headers) for offline runs; merged with earlier GGUF headers."""
        path = _record_path(self.settings.cache_dir, self.repo, self.commit)
        ggufs = {}
        with contextlib.suppress(OSError, ValueError, AttributeError):
            with open(path, encoding="utf-8") as f:
                ggufs = dict(json.load(f).get("gguf") or {})
        ggufs.update({name: _gguf_to_json(h) for name, h in self._ggufs.items()})
        record = {
            "schema": RECORD_SCHEMA,
            "repo": self.repo,
            "commit": self.commit,
            "files": [dataclasses.asdict(e) for e in self._entries.values()],
            "safetensors": None
            if self._tensors is None
            else [[n, d, s, b, f] for n, d, s, b, f in zip(*self._tensors.columns()[:5])],
            "gguf": ggufs,
        }
        with contextlib.suppress(OSError):  # the record only saves work: a read-only or full disk must not fail
            write_atomic(path, json.dumps(record).encode("utf-8"))

    def _shard_header(self, shard: str) -> TensorTable:
        size = self._size(shard)
        prefix = self._read_range(shard, 0, min(SAFETENSORS_FIRST_READ, size))

        def read(offset: int, length: int) -> bytes:
            if offset + length <= len(prefix):
                return prefix[offset : offset + length]
            return self._read_range(shard, offset, length)

        return safetensors.read_table(read, size, f"{self.where}/{shard}", shard)[0]

    def _size(self, path: str) -> int:
        entry = self._entries.get(path)
        if entry is not None and entry.size is not None:
            return entry.size
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(self.repo, path, revision=self.commit, endpoint=self.settings.endpoint)
        with hub_errors(self.where, self.repo, self.revision, self.settings, path):
            size = get_hf_file_metadata(url, timeout=REQUEST_TIMEOUT_S, endpoint=self.settings.endpoint).size
        if size is None:
            raise BadInput(f"{self.where}/{path}", "the Hub gave no size for this file")
        return size

    def _read_range(self, path: str, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of one file; a server that ignores Range is read only that far."""
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        if length <= 0:
            return b""
        where = f"{self.where}/{path}"
        url = hf_hub_url(self.repo, path, revision=self.commit, endpoint=self.settings.endpoint)
        headers = build_hf_headers()
        headers["Range"] = f"bytes={offset}-{offset + length - 1}"
        headers["Accept-Encoding"] = "identity"
        with hub_errors(self.where, self.repo, self.revision, self.settings, path):
            with get_session().stream("GET", url, headers=headers, timeout=REQUEST_TIMEOUT_S) as response:
                hf_raise_for_status(response)
                skip = offset  # a 200 answer starts at byte 0
                if response.status_code == 206:
                    match = CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
                    if match is None or int(match.group(1)) != offset:
                        raise BadInput(
                            where,
                            f"the Hub answered range {offset}+{length} with "
                            f"Content-Range {response.headers.get('Content-Range')!r}",
                        )
                    skip = 0
                chunks, have = [], 0
                for chunk in response.iter_bytes():
                    if skip:
                        dropped = min(skip, len(chunk))
                        chunk, skip = chunk[dropped:], skip - dropped
                    chunks.append(chunk)
                    have += len(chunk)
                    if have >= length:
                        break  # closing the stream drops the rest of an unranged answer
        return b"".join(chunks)[:length]


class CachedFiles:
    """`RepoFiles` over one commit in the HF cache: its snapshot directory and the specpair record.

    Also reads a directory `specpair download --local-dir` wrote (no record), for `check specpair.lock`."""

    def __init__(
        self,
        repo: str,
        revision: str | None,
        commit: str,
        snapshot: str,
        record: dict[str, Any] | None,
        record_path: str,
        locked: list[str] | None = None,
    ) -> None:
        self.commit, self.snapshot = commit, snapshot
        self.where = f"{repo}@{revision}" if revision else repo
        self._local = LocalFiles(snapshot)
        self._record, self._record_path = record, record_path
        self._locked = locked  # the files a lockfile lists: looked at instead of walking the directory it names
        self._entries = self._listing()

    @classmethod
    def find(cls, repo: str, revision: str | None, cache_dir: str) -> CachedFiles | None:
        commit = _cached_commit(cache_dir, repo, revision)
        if commit is None:
            return None
        snapshot = os.path.join(cache_dir, repo_folder(repo), "snapshots", commit)
        record_path = _record_path(cache_dir, repo, commit)
        record = None
        if os.path.isfile(record_path):
            try:
                with open(record_path, encoding="utf-8") as f:
                    record = json.load(f)
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                raise BadInput(record_path, "unreadable specpair metadata cache entry (delete it)") from None
            if not isinstance(record, dict) or record.get("schema") != RECORD_SCHEMA:
                raise BadInput(record_path, f"not a {RECORD_SCHEMA} record (delete it)")
        elif not os.path.isfile(os.path.join(snapshot, "config.json")) and not _has_gguf(snapshot):
            return None  # a snapshot without config.json or a GGUF (or none at all) cannot describe a checkpoint
        return cls(repo, revision, commit, snapshot, record, record_path)

    def list(self) -> list[FileEntry]:
        return list(self._entries)

    def _listing(self) -> list[FileEntry]:
        if self._record is not None:
            return self._guard(lambda: [FileEntry(**e) for e in self._record["files"]])
        if self._locked is not None:
            entries = [
                FileEntry(path, os.stat(full).st_size)
                for path in self._locked
                if os.path.isfile(full := os.path.join(self.snapshot, path))
            ]
        else:
            entries = self._local.list() if os.path.isdir(self.snapshot) else []
        names = {e.path for e in entries}
        # Shards an index names are part of the checkpoint even when only the index was downloaded (and only
        # then is it read here: beside its shards it is ~10 MB of JSON saying what their headers say).
        if any(n.endswith(".safetensors") and "/" not in n for n in names):
            return entries
        for index in [n for n in names if n.endswith(".safetensors.index.json") and "/" not in n]:
            raw = self._local.read(index, MAX_CONFIG_BYTES) or b"{}"
            with contextlib.suppress(ValueError, AttributeError, RecursionError):  # the reader refuses it later
                weight_map = json.loads(raw).get("weight_map") or {}
                for shard in sorted({v for v in weight_map.values() if safe_relative(v)} - names):
                    entries.append(FileEntry(shard))
                    names.add(shard)
        return entries

    def read(self, path: str, limit: int) -> bytes | None:
        raw = self._local.read(path, limit)
        if raw is None and any(e.path == path for e in self._entries):
            raise _NotCached(path)
        return raw

    def safetensors_headers(self, shards: list[str]) -> list[TensorInfo] | None:
        table = self.safetensors_table(shards)
        return None if table is None else table.infos()

    def safetensors_table(self, shards: list[str]) -> TensorTable | None:
        """Headers from the record, else from cached shard files; None (config only) when neither has them."""
        if self._record is not None and self._record.get("safetensors") is not None:
            return self._guard(lambda: TensorTable.of([_tensor_from_json(t) for t in self._record["safetensors"]]))
        if not all(os.path.isfile(os.path.join(self.snapshot, s)) for s in shards):
            return None
        return self._local.safetensors_table(shards)

    def header_lengths(self, shards: list[str]) -> list[int] | None:
        if self._record is not None and self._record.get("safetensors") is not None:
            return None  # the record holds every shard's header at once
        return self._local.header_lengths(shards)

    def gguf_header(self, path: str) -> gguf.GGUFHeader:
        where = f"{self.where}/{path}"
        stored = (self._record or {}).get("gguf") or {}
        if path in stored:
            return self._guard(lambda: _gguf_from_json(stored[path], where))
        local = os.path.join(self.snapshot, path)
        if os.path.isfile(local):
            return self._local.gguf_header(path)  # the local reader's symlink and file-type checks apply
        raise _NotCached(path)

    def _guard(self, build: Callable[[], Any]) -> Any:
        try:
            return build()
        except (KeyError, TypeError, ValueError, AttributeError):
            raise BadInput(self._record_path, "malformed specpair metadata cache entry (delete it)") from None


def _open_offline(
    repo: str, revision: str | None, ref: str, gguf_file: str | None, settings: HubSettings, unreachable: str | None
) -> Checkpoint:
    cached = CachedFiles.find(repo, revision, settings.cache_dir)
    checkpoint = None
    if cached is not None:
        with contextlib.suppress(_NotCached):
            checkpoint = read_checkpoint(cached, ref, "hf-cache", gguf_file, revision=cached.commit)
    if checkpoint is None:
        from specpair.sources.catalog import lookup

        checkpoint = lookup(repo, revision, ref, gguf_file)
    if checkpoint is None:
        why = f" (the Hub at {settings.endpoint} is unreachable: {unreachable})" if unreachable else ""
        raise BadInput(ref, f"not reachable offline: not in the HF cache nor in the built-in catalog{why}")
    if unreachable:
        origin = (
            f"the HF cache at {settings.cache_dir}, commit {checkpoint.revision}"
            if checkpoint.source == "hf-cache"
            else "the built-in catalog"
        )
        checkpoint.notes.append(f"the Hub at {settings.endpoint} {UNREACHABLE} ({unreachable}); read from {origin}")
    return checkpoint


def unreachable_note(checkpoint: Checkpoint) -> str | None:
    """The note saying that `checkpoint` was read offline because the Hub could not be reached, if it was."""
    return next((n for n in checkpoint.notes if n.startswith("the Hub at ") and f" {UNREACHABLE} (" in n), None)


@contextlib.contextmanager
def hub_errors(
    where: str, repo: str, revision: str | None, settings: HubSettings, path: str | None = None
) -> Iterator[None]:
    """Turn huggingface_hub / HTTP failures into one-line BadInput, or Unreachable for the offline fallback."""
    import httpx2
    from huggingface_hub import errors as hf
    from huggingface_hub.utils import get_token

    try:
        yield
    except (httpx2.TransportError, hf.OfflineModeIsEnabled) as e:
        raise Unreachable(_short(e)) from None
    except hf.LocalEntryNotFoundError as e:  # hf_hub_download: the file's HEAD request failed
        if isinstance(e.__cause__, hf.FileMetadataError):
            raise BadInput(
                f"{where}/{path}",
                f"the answer of {settings.endpoint} lacks the Hub's file headers "
                "(X-Repo-Commit, ETag): is HF_ENDPOINT a Hub?",
            ) from None
        raise Unreachable(_short(e.__cause__ or e)) from None
    except hf.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        has_token = get_token() is not None
        page = f"{settings.endpoint}/{repo}"
        if isinstance(e, hf.GatedRepoError):
            if not has_token:
                raise BadInput(
                    where,
                    f"gated repo and no token was given: accept its licence at {page}, "
                    "then set HF_TOKEN or run `hf auth login`",
                ) from None
            raise BadInput(
                where,
                f"gated repo and this token's account has no access: accept the licence at {page} "
                "(or wait for the request to be approved)",
            ) from None
        if isinstance(e, hf.RevisionNotFoundError):
            raise BadInput(where, f"revision {revision or 'main'!r} not found") from None
        if isinstance(e, hf.RemoteEntryNotFoundError):
            raise BadInput(f"{where}/{path}", "file not found on the Hub") from None
        if isinstance(e, hf.RepositoryNotFoundError):
            hint = (
                "; if it is private, the token given cannot see it"
                if has_token
                else "; if it is private or gated, no token was given: set HF_TOKEN or run `hf auth login`"
            )
            raise BadInput(where, f"repository not found on {settings.endpoint}{hint}") from None
        if status == 401:
            raise BadInput(
                where, "the Hub rejected the token (401 Unauthorized): check HF_TOKEN or `hf auth login`"
            ) from None
        if status == 403:
            raise BadInput(
                where, "access denied (403 Forbidden): the token lacks read permission for this repo"
            ) from None
        if status is not None and status >= 500:
            raise Unreachable(f"HTTP {status}") from None
        raise BadInput(f"{where}/{path}" if path else where, f"the Hub answered HTTP {status}") from None
    except OSError as e:  # writing the HF cache: disk full, permissions
        raise BadInput(settings.cache_dir, f"cannot write the HF cache ({e.strerror or e})") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # huggingface_hub parsing a malformed answer
        raise BadInput(where, f"unexpected answer from {settings.endpoint} ({type(e).__name__}: {_short(e)})") from None


def _short(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def repo_folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")  # huggingface_hub's cache layout


def _record_path(cache_dir: str, repo: str, commit: str) -> str:
    return os.path.join(cache_dir, HEADERS_CACHE, repo.replace("/", "--"), f"{commit}.json")


def safe_relative(path: object) -> bool:
    """A revision used as a path under refs/, or a file name under a snapshot, must stay there."""
    return (
        isinstance(path, str)
        and not path.startswith("/")
        and "\\" not in path
        and all(part not in ("", ".", "..") for part in path.split("/"))
    )


def _cached_commit(cache_dir: str, repo: str, revision: str | None) -> str | None:
    if revision and COMMIT.match(revision):
        return revision
    revision = revision or "main"
    if not safe_relative(revision):
        return None
    try:
        with open(os.path.join(cache_dir, repo_folder(repo), "refs", revision), encoding="utf-8") as f:
            commit = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return commit if COMMIT.match(commit) else None


def write_ref(cache_dir: str, repo: str, revision: str, commit: str) -> None:
    """Record branch/tag -> commit the way huggingface_hub does, so offline runs find `main`."""
    if safe_relative(revision):
        with contextlib.suppress(OSError):  # like the header record: a cache that cannot be written only costs a lookup
            write_atomic(os.path.join(cache_dir, repo_folder(repo), "refs", revision), commit.encode("ascii"))


def _has_gguf(snapshot: str) -> bool:
    return os.path.isdir(snapshot) and any(n.endswith(".gguf") for n in os.listdir(snapshot))


def _tensor_to_json(t: TensorInfo) -> list[Any]:
    return [t.name, t.dtype, list(t.shape), t.nbytes, t.file]


def _tensor_from_json(item: list[Any]) -> TensorInfo:
    name, dtype, shape, nbytes, file = item
    if not (
        isinstance(name, str)
        and isinstance(dtype, str)
        and isinstance(file, str)
        and isinstance(nbytes, int)
        and isinstance(shape, list)
        and all(isinstance(d, int) for d in shape)
    ):
        raise ValueError(item)
    return TensorInfo(name, dtype, tuple(shape), nbytes, file)


def _gguf_to_json(header: gguf.GGUFHeader) -> dict[str, Any]:
    return {
        "version": header.version,
        "size": header.size,
        "fields": header.fields,
        "tensors": [_tensor_to_json(t) for t in header.tensors],
    }


def _gguf_from_json(item: dict[str, Any], where: str) -> gguf.GGUFHeader:
    if not isinstance(item["fields"], dict) or not isinstance(item["size"], int):
        raise ValueError(item)
    tensors = [dataclasses.replace(_tensor_from_json(t), file=where) for t in item["tensors"]]
    return gguf.GGUFHeader(where, int(item["version"]), item["fields"], tensors, item["size"])
