"""A stand-in for the Hugging Face Hub on 127.0.0.1, for what olah cannot serve.

It answers the three routes specpair uses: `/api/models/{repo}/revision/{rev}` with file sizes, blob
ids and LFS sha256; HEAD/GET `/{repo}/resolve/{rev}/{path}` with the Hub's X-Repo-Commit / ETag /
X-Linked-Etag / X-Linked-Size headers and HTTP Range support; and the Hub's error answers
(`X-Error-Code: RepoNotFound | RevisionNotFound | EntryNotFound | GatedRepo`, 401 for a bad token)
that huggingface_hub maps to its exception types, and 503 for an outage. It counts the body bytes it serves per file, so
tests can check that only headers were read, or that a resumed download fetched only the missing bytes.

`FakeHub.faults[(repo, path)]` makes the file route misbehave as networks and CDNs do: cut the connection
at a byte, stall, flip a byte, answer a list of statuses (500, 503, ...), ignore or refuse Range requests,
or send slowly (a pause before each 64 KiB chunk).

`start_olah` runs olah, a real Hub mirror over local git repos, for the paths it does serve.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf")  # what a Hub repo's .gitattributes sends to LFS
API_ROUTE = re.compile(r"^/api/models/([^/]+/[^/]+)/revision/([^/]+)$")
RESOLVE_ROUTE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
WRITE_CHUNK = 64 * 1024


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str
    branches: dict[str, str]
    private: bool = False
    gated: bool = False
    readers: set[str] = field(default_factory=set)  # tokens that may read it (private) or accepted its licence (gated)
    unserved: set[str] = field(default_factory=set)  # listed by model info, yet EntryNotFound on the file route


@dataclass
class Fault:
    """How the file route misbehaves for one file (GET requests only)."""

    cut_at: int | None = None  # close the connection once the body reaches this byte of the file, every time
    stall_at: int | None = None  # stop sending at this byte of the file for `stall_s` seconds, then hang up
    stall_s: float = 0.0
    stalls: int = 1  # how many answers stall
    corrupt_at: int | None = None  # flip this byte of the file in every answer
    statuses: list[int] = field(default_factory=list)  # answer these, one per request, before serving normally
    ignore_range: bool = False  # answer a Range request with 200 and the whole file
    refuse_range: bool = False  # answer a Range request with 416
    chunk_delay_s: float = 0.0  # pause before each chunk of the body: a slow link, so a transfer takes time


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.valid_tokens: set[str] = set()
        self.down = False  # answer every request 503, as the Hub does in an outage
        self.served: Counter[tuple[str, str]] = Counter()  # (repo, path) -> body bytes sent
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.ranges: list[tuple[str, str, str | None]] = []  # (repo, path, Range header) of each file GET
        self.faults: dict[tuple[str, str], Fault] = {}
        self._server = _Server(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, repo: str, files: dict[str, bytes], **options: object) -> FakeRepo:
        commit = hashlib.sha1(repo.encode() + b"".join(files[name] for name in sorted(files))).hexdigest()
        self.repos[repo] = FakeRepo(files=files, commit=commit, branches={"main": commit}, **options)
        return self.repos[repo]

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up (as the download tests make clients do) is no error worth a traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep test output clean

        def do_GET(self) -> None:
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def _answer(self, send_body: bool) -> None:
            path = urlsplit(self.path).path
            hub.requests.append((self.command, path))
            if hub.down:
                self._error(503, None, "Service Unavailable")
            elif api := API_ROUTE.match(path):
                self._model_info(unquote(api.group(1)), unquote(api.group(2)))
            elif resolve := RESOLVE_ROUTE.match(path):
                repo_id, revision, name = (unquote(g) for g in resolve.groups())
                self._resolve(repo_id, revision, name, send_body)
            else:
                self._error(404, None, "no such route")

        def _access(self, repo_id: str, revision: str) -> tuple[FakeRepo, str, str | None] | None:
            """(repo, commit, token) when the request may see the repo at `revision`; else answers the error."""
            auth = self.headers.get("Authorization") or ""
            token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
            if token is not None and token not in hub.valid_tokens:
                self._error(401, None, "Invalid credentials in Authorization header")
                return None
            repo = hub.repos.get(repo_id)
            if repo is None or (repo.private and token not in repo.readers):
                self._error(401, "RepoNotFound", "Repository not found")
                return None
            commit = repo.branches.get(revision) or (revision if revision == repo.commit else None)
            if commit is None:
                self._error(404, "RevisionNotFound", "Invalid rev id")
                return None
            return repo, commit, token

        def _model_info(self, repo_id: str, revision: str) -> None:
            access = self._access(repo_id, revision)
            if access is None:
                return
            repo, commit, _ = access
            siblings = []
            for name, data in sorted(repo.files.items()):
                sibling: dict[str, object] = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
                if name.endswith(LFS_SUFFIXES):
                    sibling["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                siblings.append(sibling)
            body = json.dumps(
                {
                    "id": repo_id,
                    "sha": commit,
                    "private": repo.private,
                    "gated": repo.gated and "manual",
                    "siblings": siblings,
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _resolve(self, repo_id: str, revision: str, name: str, send_body: bool) -> None:
            access = self._access(repo_id, revision)
            if access is None:
                return
            repo, commit, token = access
            if repo.gated and token not in repo.readers:
                # The Hub: 401 without a token, 403 when the token's account has not accepted the licence.
                self._error(401 if token is None else 403, "GatedRepo", "Access to this model is restricted")
                return
            data = None if name in repo.unserved else repo.files.get(name)
            if data is None:
                self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
                return
            fault = hub.faults.get((repo_id, name)) if send_body else None
            if send_body:
                hub.ranges.append((repo_id, name, self.headers.get("Range")))
            if fault is not None and fault.statuses:
                self._error(fault.statuses.pop(0), None, "injected failure")
                return
            start, end, status = 0, len(data) - 1, 200
            wanted = RANGE.match(self.headers.get("Range") or "") if send_body else None
            if wanted and fault is not None and fault.refuse_range:
                self._error(416, None, "Range not satisfiable", {"Content-Range": f"bytes */{len(data)}"})
                return
            if wanted and not (fault is not None and fault.ignore_range):
                start = int(wanted.group(1))
                end = min(int(wanted.group(2)), len(data) - 1) if wanted.group(2) else len(data) - 1
                if start >= len(data):
                    self._error(416, None, "Range not satisfiable", {"Content-Range": f"bytes */{len(data)}"})
                    return
                status = 206
            body = data[start : end + 1]
            if fault is not None and fault.corrupt_at is not None and start <= fault.corrupt_at <= end:
                flipped = bytearray(body)
                flipped[fault.corrupt_at - start] ^= 0xFF
                body = bytes(flipped)
            self.send_response(status)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("Accept-Ranges", "bytes")
            if name.endswith(LFS_SUFFIXES):
                self.send_header("ETag", f'"{git_blob_id(data)}"')
                self.send_header("X-Linked-Etag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Linked-Size", str(len(data)))
            else:
                self.send_header("ETag", f'"{git_blob_id(data)}"')
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(len(body) if send_body else len(data)))
            self.end_headers()
            if send_body:
                self._send_body(repo_id, name, body, start, fault)

        def _send_body(self, repo_id: str, name: str, body: bytes, start: int, fault: Fault | None) -> None:
            """Written in chunks and counted as they go, so a client that stops reading is charged only for
            what reached its socket; a fault may stall the stream or cut it short."""
            stop = len(body)
            if fault is not None and fault.cut_at is not None:
                stop = max(0, min(stop, fault.cut_at - start))
            position = 0
            while position < stop:
                end = min(position + WRITE_CHUNK, stop)
                if (
                    fault is not None
                    and fault.stalls
                    and fault.stall_at is not None
                    and start + position <= fault.stall_at < start + end
                ):
                    if start + position == fault.stall_at:
                        fault.stalls -= 1
                        time.sleep(fault.stall_s)
                        self.close_connection = True
                        return
                    end = fault.stall_at - start
                if fault is not None and fault.chunk_delay_s:
                    time.sleep(fault.chunk_delay_s)
                try:
                    self.wfile.write(body[position:end])
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                    return
                hub.served[(repo_id, name)] += end - position
                position = end
            if stop < len(body):
                self.close_connection = True  # the client sees the body end before its Content-Length

        def _error(self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def git(*args: str, cwd: Path) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


VALID_TOKENS = {"hf_reader", "hf_accepted", "hf_other"}  # tokens FakeHub accepts in the tests


def olah_cli() -> str:
    """The olah-cli binary (SPECPAIR_OLAH_CLI, else PATH); a clear failure, not a skip, when it is missing."""
    import pytest

    found = os.environ.get("SPECPAIR_OLAH_CLI") or shutil.which("olah-cli")
    if not found or not os.path.exists(found):
        pytest.fail("olah-cli not found: set SPECPAIR_OLAH_CLI (scripts/test installs olah==0.5.4 in .venv-olah)")
    return found


@contextlib.contextmanager
def start_olah(binary: str, work: Path, repos: dict[str, Path]) -> Iterator[tuple[str, dict[str, str]]]:
    """olah on 127.0.0.1 serving each directory of `repos` ({"org/name": dir}) as a one-commit git repo;
    yields (endpoint, {repo: commit}). olah never reaches out: its upstream is a closed port."""
    commits = {}
    for repo, source in repos.items():
        repo_dir = work / "mirrors" / "models" / repo
        repo_dir.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(source), str(repo_dir)], check=True)
        git("init", "-q", "-b", "main", cwd=repo_dir)
        git("add", ".", cwd=repo_dir)
        git("commit", "-q", "-m", repo, cwd=repo_dir)
        commits[repo] = git("rev-parse", "HEAD", cwd=repo_dir)
    port = free_port()
    (work / "olah.toml").write_text(f"""
[basic]
host = "127.0.0.1"
port = {port}
repos-path = "{work / "repos"}"
hf-scheme = "http"
hf-netloc = "127.0.0.1:9"
hf-lfs-netloc = "127.0.0.1:9"
mirrors-path = ["{work / "mirrors"}"]
[accessibility]
offline = true
""")
    endpoint = f"http://127.0.0.1:{port}"
    probe = next(iter(repos))
    with open(work / "olah.log", "wb") as log:
        server = subprocess.Popen(
            [binary, "-c", str(work / "olah.toml")], cwd=work, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                probe_url = f"{endpoint}/api/models/{probe}/revision/main"
                with contextlib.suppress(OSError), urllib.request.urlopen(probe_url, timeout=2) as answer:  # not up yet
                    if json.load(answer).get("sha") == commits[probe]:
                        break
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"olah did not start: {(work / 'olah.log').read_text(errors='replace')[-2000:]}")
                time.sleep(0.2)
            yield endpoint, commits
        finally:
            server.terminate()
            server.wait(timeout=10)
