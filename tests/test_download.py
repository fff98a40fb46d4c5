"""`specpair download`: pinned, verified, resumable downloads, against real servers on 127.0.0.1.

The fake Hub (hubserver.FakeHub) gives file sizes, LFS sha256 and Range support, the Hub's error answers,
and injected faults (cut connections, stalls, flipped bytes, 5xx, ignored or refused Range); its byte
counters show what each run fetched. olah (a real Hub mirror over git) covers the normal path, after
which the files must work offline with huggingface_hub, `specpair inspect` and `specpair check`.
The command runs in this process (through `specpair.cli.main`), so retries can wait 10 ms instead of
seconds and a full disk can be simulated by patching `os.write`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures import build_dflash, build_target
from hubserver import FakeHub, Fault, free_port, olah_cli, start_olah

from specpair.cli import main
from specpair.sources import download

HF_VARIABLES = (
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_TOKEN",
    "XDG_CACHE_HOME",
    "HF_HUB_DOWNLOAD_TIMEOUT",
)
WEIGHTS = "model.safetensors"
CUT = 300_000  # where an injected fault cuts the target's model.safetensors (1.1 MB)


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


@pytest.fixture
def specpair(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """Run the CLI in this process: `specpair(*args) -> Result`."""

    def run(*args: str) -> Result:
        monkeypatch.setattr(sys, "argv", ["specpair", *args])
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Qwen3.5 target and a DFlash drafter for it, as local directories."""
    root = tmp_path_factory.mktemp("pair")
    return build_target(root / "target", "qwen3_5"), build_dflash(root / "draft")


def files_of(directory: Path) -> dict[str, bytes]:
    """The files of a checkpoint directory, leaving out the download bookkeeping (.cache/, and the specpair.lock a
    --local-dir download of one repo writes into its directory)."""
    found = {str(p.relative_to(directory)): p for p in sorted(directory.rglob("*")) if p.is_file()}
    return {
        name: p.read_bytes() for name, p in found.items() if not name.startswith(".cache/") and name != "specpair.lock"
    }


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_hub: FakeHub) -> Path:
    """HF_ENDPOINT on the fake Hub, a fresh HF_HOME, no token, the working directory in tmp_path
    (where specpair.lock lands), and retries 10 ms apart. Returns the HF hub cache directory."""
    for name in HF_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(download, "BACKOFF_S", 0.01)
    return tmp_path / "hf" / "hub"


def snapshot(cache: Path, repo: str, commit: str) -> Path:
    return cache / f"models--{repo.replace('/', '--')}" / "snapshots" / commit


def blob(cache: Path, repo: str, data: bytes) -> Path:
    return cache / f"models--{repo.replace('/', '--')}" / "blobs" / hashlib.sha256(data).hexdigest()


def one_line_error(result: Result, code: int) -> str:
    assert result.code == code, (result.out, result.err)
    assert result.err.startswith("error: ") and result.err.count("\n") == 1, result.err
    return result.err


def file_gets(hub: FakeHub, repo: str) -> list[tuple[str, str | None]]:
    return [(path, wanted) for r, path, wanted in hub.ranges if r == repo]


# ---------------------------------------------------------------- pairs, revisions, the lockfile


def test_pair_is_fetched_each_repo_at_its_own_commit(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, tmp_path: Path
) -> None:
    from huggingface_hub import hf_hub_download, scan_cache_dir

    target_dir, draft_dir = pair_dirs
    target = fake_hub.add("org/pair-target", files_of(target_dir))
    draft = fake_hub.add("org/pair-draft", files_of(draft_dir))
    draft.branches["v1.0"] = draft.commit  # a tag

    result = specpair("download", "org/pair-target@main", "org/pair-draft@v1.0", "--no-require-sha", "--json")

    assert result.code == 0, result.err
    report = result.json()
    assert report["schema"] == "specpair.download/1" and report["exit_code"] == 0
    assert [(r["repo"], r["role"], r["revision"], r["commit"]) for r in report["repos"]] == [
        ("org/pair-target", "target", "main", target.commit),
        ("org/pair-draft", "draft", "v1.0", draft.commit),
    ]
    assert ("GET", "/api/models/org/pair-target/revision/main") in fake_hub.requests
    assert ("GET", "/api/models/org/pair-draft/revision/v1.0") in fake_hub.requests
    for repo, commit, source in (
        ("org/pair-target", target.commit, target_dir),
        ("org/pair-draft", draft.commit, draft_dir),
    ):
        entry = next(r for r in report["repos"] if r["repo"] == repo)
        assert entry["verified"] and entry["path"] == str(snapshot(cache, repo, commit))
        assert entry["bytes_transferred"] == entry["bytes_total"] == sum(len(d) for d in files_of(source).values())
        assert files_of(Path(entry["path"])) == files_of(source)
        # Every file was fetched at the repo's own commit.
        assert {p for m, p in fake_hub.requests if m == "GET" and p.startswith(f"/{repo}/resolve/")} == {
            f"/{repo}/resolve/{commit}/{name}" for name in files_of(source)
        }
    assert (cache / "models--org--pair-draft" / "refs" / "v1.0").read_text() == draft.commit

    lock = json.loads((tmp_path / "specpair.lock").read_text())
    assert lock["schema"] == "specpair.lock/1"
    assert [(r["repo"], r["revision"], r["commit"], r["layout"]) for r in lock["repos"]] == [
        ("org/pair-target", "main", target.commit, "hf-cache"),
        ("org/pair-draft", "v1.0", draft.commit, "hf-cache"),
    ]
    assert {f["path"]: (f["size"], f["sha256"]) for f in lock["repos"][1]["files"]} == {
        name: (len(data), hashlib.sha256(data).hexdigest()) for name, data in files_of(draft_dir).items()
    }

    # huggingface_hub finds the files offline, by tag and by commit; its cache scan sees both snapshots.
    path = hf_hub_download("org/pair-draft", WEIGHTS, revision="v1.0", cache_dir=str(cache), local_files_only=True)
    assert Path(path).read_bytes() == (draft_dir / WEIGHTS).read_bytes()
    scanned = {r.repo_id: r for r in scan_cache_dir(cache).repos}
    assert {rev.commit_hash for rev in scanned["org/pair-target"].revisions} == {target.commit}
    assert {f.file_name for rev in scanned["org/pair-draft"].revisions for f in rev.files} == set(files_of(draft_dir))

    # `specpair check specpair.lock` reads the pair where it was downloaded, pinned to its commits.
    from_lock = specpair("check", "specpair.lock", "--json")
    local = specpair("check", str(target_dir), str(draft_dir), "--json")
    assert from_lock.code == local.code and from_lock.code in (0, 1), from_lock.err
    locked, plain = from_lock.json(), local.json()
    assert locked["target"]["revision"] == target.commit and locked["draft"]["revision"] == draft.commit
    assert {s: v["status"] for s, v in locked["verdicts"].items()} == {
        s: v["status"] for s, v in plain["verdicts"].items()
    }


def test_moving_ref_is_refused_under_require_sha_with_the_commit_to_pin(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, tmp_path: Path
) -> None:
    draft = fake_hub.add("org/moving", files_of(pair_dirs[1]))
    draft.branches["v2"] = draft.commit

    for args, asked in ((["org/moving"], "main"), (["org/moving", "--revision", "v2"], "v2")):
        err = one_line_error(specpair("download", *args), 2)
        assert f"'{asked}' is a branch or tag, now at commit {draft.commit}" in err
        assert f"pin it as org/moving@{draft.commit}" in err and "--no-require-sha" in err
    assert file_gets(fake_hub, "org/moving") == []  # refused before any file was fetched
    assert not (tmp_path / "specpair.lock").exists()

    pinned = specpair("download", "org/moving", "--revision", draft.commit, "--quiet")
    assert pinned.code == 0 and pinned.out == f"{snapshot(cache, 'org/moving', draft.commit)}\n"
    assert json.loads((tmp_path / "specpair.lock").read_text())["repos"][0]["revision"] == draft.commit
    # Without a lockfile, a branch is accepted: its commit is what is fetched and reported.
    unlocked = specpair("download", "org/moving@v2", "--no-lock", "--json")
    assert (
        unlocked.code == 0 and unlocked.json()["repos"][0]["commit"] == draft.commit and unlocked.json()["lock"] is None
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["org/a", "org/b", "--revision", "0" * 40], "--revision: applies to a single repo"),
        (["org/a@v1", "--revision", "v2"], "org/a@v1: the revision is given twice"),
        (["org/a", "org/b", "org/c"], "give one repo, or two"),
        (["not a repo"], "not a Hub repo id"),
        (["org/..", "--local-dir", "d"], "not a Hub repo id"),
        (["org/a", "--no-lock", "--lock", "x.lock"], "--lock and --no-lock contradict"),
        (["one/model", "two/model", "--local-dir", "d"], "both repos would be written to"),
    ],
)
def test_bad_arguments_exit_2_before_any_request(
    fake_hub: FakeHub, cache: Path, specpair, args: list[str], expected: str
) -> None:
    before = len(fake_hub.requests)
    err = one_line_error(specpair("download", *args), 2)
    assert expected in err
    assert len(fake_hub.requests) == before


def test_hf_hub_cache_is_honoured_and_an_unreachable_hub_exits_1(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = fake_hub.add("org/elsewhere", files_of(pair_dirs[1]))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    result = specpair("download", f"org/elsewhere@{repo.commit}", "--quiet")
    assert result.code == 0 and result.out == f"{snapshot(tmp_path / 'elsewhere', 'org/elsewhere', repo.commit)}\n"
    assert not cache.exists()

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    err = one_line_error(specpair("download", f"org/elsewhere@{repo.commit}"), 1)
    assert f"org/elsewhere@{repo.commit}: the Hub at http://127.0.0.1:" in err and "could not be reached" in err


def test_two_runs_fetching_the_same_file_take_turns(
    fake_hub: FakeHub, cache: Path, pair_dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")  # seconds; huggingface_hub reads it as an integer
    files = files_of(pair_dirs[1])
    repo = fake_hub.add("org/shared", files)
    fake_hub.faults[("org/shared", WEIGHTS)] = Fault(stall_at=1000, stall_s=60)  # keeps the first run busy a while
    runs = [
        download.plan([f"org/shared@{repo.commit}"], None, [], [], None, False, True, lambda p: None) for _ in range(2)
    ]
    results: list[list[download.RepoResult]] = []

    def run(plans: list[download.RepoPlan]) -> None:
        results.append(download.fetch(plans, [download.survey(p) for p in plans], lambda n: None))

    threads = [threading.Thread(target=run, args=(plans,)) for plans in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(results) == 2
    assert fake_hub.served[("org/shared", WEIGHTS)] == len(files[WEIGHTS])  # fetched once, by one of them
    statuses = sorted(f.status for r in results for f in r[0].files if f.path == WEIGHTS)
    assert statuses == ["downloaded", "present"]
    assert blob(cache, "org/shared", files[WEIGHTS]).read_bytes() == files[WEIGHTS]


def test_offline_mode_is_refused(cache: Path, specpair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = one_line_error(specpair("download", "org/any@" + "0" * 40), 2)
    assert "HF_HUB_OFFLINE: is set" in err and "specpair verify" in err


# ---------------------------------------------------------------- resume and faults


@pytest.mark.parametrize("layout", ["hf-cache", "local-dir"])
def test_interrupted_download_resumes_with_only_the_missing_bytes(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, tmp_path: Path, layout: str
) -> None:
    repo_id = f"org/resume-{layout}"
    files = files_of(pair_dirs[0])
    repo = fake_hub.add(repo_id, files)
    weights = files[WEIGHTS]
    fake_hub.faults[(repo_id, WEIGHTS)] = Fault(cut_at=CUT)  # every connection for it ends at byte CUT
    options = ["--local-dir", str(tmp_path / "model")] if layout == "local-dir" else []
    if layout == "hf-cache":
        final, partial = blob(cache, repo_id, weights), Path(str(blob(cache, repo_id, weights)) + ".incomplete")
    else:
        final = tmp_path / "model" / WEIGHTS
        partial = (
            tmp_path
            / "model"
            / ".cache"
            / "specpair"
            / "download"
            / f"{WEIGHTS}.{hashlib.sha256(weights).hexdigest()[:16]}.incomplete"
        )

    err = one_line_error(specpair("download", f"{repo_id}@{repo.commit}", *options), 1)

    assert f"{repo_id}@{repo.commit}/{WEIGHTS}: gave up after {download.RETRIES} retries without progress" in err
    assert f"{CUT} of {len(weights)} bytes are kept in {partial}: run again to resume" in err
    assert not final.exists() and partial.stat().st_size == CUT and partial.read_bytes() == weights[:CUT]
    assert not (tmp_path / "specpair.lock").exists() and not (tmp_path / "model" / "specpair.lock").exists()
    resumes = [wanted for path, wanted in file_gets(fake_hub, repo_id) if path == WEIGHTS]
    assert resumes[0] is None and set(resumes[1:]) == {f"bytes={CUT}-"} and len(resumes) == download.RETRIES + 1

    del fake_hub.faults[(repo_id, WEIGHTS)]
    fake_hub.served.clear()
    fake_hub.ranges.clear()
    result = specpair("download", f"{repo_id}@{repo.commit}", *options, "--json")

    assert result.code == 0, result.err
    assert fake_hub.served[(repo_id, WEIGHTS)] == len(weights) - CUT  # only the missing bytes
    assert file_gets(fake_hub, repo_id).count((WEIGHTS, f"bytes={CUT}-")) == 1
    entry = result.json()["repos"][0]
    by_path = {f["path"]: f for f in entry["files"]}
    assert by_path[WEIGHTS]["status"] == "resumed" and by_path[WEIGHTS]["bytes_resumed"] == CUT
    assert entry["bytes_resumed"] == CUT and entry["bytes_transferred"] == len(weights) - CUT
    assert {"present"} == {f["status"] for name, f in by_path.items() if name != WEIGHTS}
    assert final.read_bytes() == weights and not partial.exists()
    assert files_of(Path(entry["path"])) == files
    # the lock lies beside what was downloaded: in --local-dir, else in the working directory
    assert specpair("verify", str(tmp_path / "model") if layout == "local-dir" else "specpair.lock").code == 0


def test_local_dir_files_are_current_for_hf_download(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, tmp_path: Path
) -> None:
    from huggingface_hub import hf_hub_download

    repo = fake_hub.add("org/local", files_of(pair_dirs[1]))
    assert specpair("download", f"org/local@{repo.commit}", "--local-dir", "local", "--no-lock").code == 0
    served = sum(fake_hub.served[("org/local", name)] for name in repo.files)

    # huggingface_hub's own --local-dir bookkeeping says the files are current: it fetches nothing.
    path = hf_hub_download(
        "org/local", WEIGHTS, revision=repo.commit, local_dir=str(tmp_path / "local"), endpoint=fake_hub.url
    )
    assert Path(path).read_bytes() == repo.files[WEIGHTS]
    assert sum(fake_hub.served[("org/local", name)] for name in repo.files) == served
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == [".cache", "config.json", WEIGHTS]


@pytest.mark.parametrize(("name", "kind"), [(WEIGHTS, "sha256"), ("config.json", "git blob id")])
def test_corrupt_bytes_are_never_kept(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, tmp_path: Path, name: str, kind: str
) -> None:
    repo_id = f"org/corrupt-{name.split('.')[0]}"
    repo = fake_hub.add(repo_id, files_of(pair_dirs[1]))
    fake_hub.faults[(repo_id, name)] = Fault(corrupt_at=5)

    err = one_line_error(specpair("download", f"{repo_id}@{repo.commit}"), 1)

    assert err.startswith(f"error: {repo_id}@{repo.commit}/{name}: {kind} ")
    assert "the bad copy was removed; run again" in err
    storage = cache / f"models--{repo_id.replace('/', '--')}"
    assert not (snapshot(cache, repo_id, repo.commit) / name).exists()
    assert not any(p.name.endswith(".incomplete") for p in storage.rglob("*"))
    good = [p for p in (storage / "blobs").iterdir()]
    assert [p.read_bytes() for p in good] == [repo.files[n] for n in repo.files if n != name]

    del fake_hub.faults[(repo_id, name)]
    assert specpair("download", f"{repo_id}@{repo.commit}").code == 0
    assert (snapshot(cache, repo_id, repo.commit) / name).read_bytes() == repo.files[name]


@pytest.mark.parametrize(
    ("fault", "partial"),
    [
        (Fault(ignore_range=True), "prefix"),  # 200 to a Range request: start again from byte 0
        (Fault(refuse_range=True), "prefix"),  # 416: the server will not resume
        (Fault(), "longer"),  # a partial longer than the file is discarded
    ],
)
def test_partial_that_cannot_be_resumed_is_fetched_afresh(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, fault: Fault, partial: str
) -> None:
    repo_id = f"org/restart-{len(fake_hub.repos)}"
    files = files_of(pair_dirs[0])
    repo = fake_hub.add(repo_id, files)
    weights = files[WEIGHTS]
    fake_hub.faults[(repo_id, WEIGHTS)] = fault
    path = Path(str(blob(cache, repo_id, weights)) + ".incomplete")
    path.parent.mkdir(parents=True)
    path.write_bytes(weights[:CUT] if partial == "prefix" else weights + b"\0" * 10)

    result = specpair("download", f"{repo_id}@{repo.commit}", "--json")

    assert result.code == 0, result.err
    assert fake_hub.served[(repo_id, WEIGHTS)] == len(weights)
    entry = next(f for f in result.json()["repos"][0]["files"] if f["path"] == WEIGHTS)
    assert (
        entry["status"] == "downloaded" and entry["bytes_resumed"] == 0 and entry["bytes_transferred"] == len(weights)
    )
    assert blob(cache, repo_id, weights).read_bytes() == weights and not path.exists()


def test_corrupt_partial_is_removed_after_the_resume_fails_its_hash(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair
) -> None:
    files = files_of(pair_dirs[0])
    repo = fake_hub.add("org/bad-partial", files)
    weights = files[WEIGHTS]
    path = Path(str(blob(cache, "org/bad-partial", weights)) + ".incomplete")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff" + weights[1:CUT])

    err = one_line_error(specpair("download", f"org/bad-partial@{repo.commit}"), 1)

    assert f"org/bad-partial@{repo.commit}/{WEIGHTS}: sha256" in err and "bad copy was removed" in err
    assert fake_hub.served[("org/bad-partial", WEIGHTS)] == len(weights) - CUT
    assert not path.exists() and not blob(cache, "org/bad-partial", weights).exists()
    assert specpair("download", f"org/bad-partial@{repo.commit}").code == 0


def test_server_errors_are_retried_then_given_up(fake_hub: FakeHub, cache: Path, pair_dirs, specpair) -> None:
    files = files_of(pair_dirs[1])
    flaky = fake_hub.add("org/flaky", files)
    fake_hub.faults[("org/flaky", WEIGHTS)] = Fault(statuses=[500, 503, 429])
    assert specpair("download", f"org/flaky@{flaky.commit}").code == 0
    assert fake_hub.served[("org/flaky", WEIGHTS)] == len(files[WEIGHTS])

    down = fake_hub.add("org/down", {**files, "extra.json": b"{}"})
    fake_hub.faults[("org/down", WEIGHTS)] = Fault(statuses=[500] * 20)
    err = one_line_error(specpair("download", f"org/down@{down.commit}"), 1)
    assert (
        f"org/down@{down.commit}/{WEIGHTS}: gave up after {download.RETRIES} retries without progress (HTTP 500)" in err
    )
    assert len(fake_hub.faults[("org/down", WEIGHTS)].statuses) == 20 - download.RETRIES - 1
    # The other files were completed and stay in place for the next run.
    assert (snapshot(cache, "org/down", down.commit) / "extra.json").read_bytes() == b"{}"
    assert not (snapshot(cache, "org/down", down.commit) / WEIGHTS).exists()


def test_stalled_transfer_times_out_and_resumes(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server hangs for a minute (then hangs up): only the read timeout gets the download going again.
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")  # seconds; huggingface_hub reads it as an integer
    files = files_of(pair_dirs[0])
    repo = fake_hub.add("org/stall", files)
    fake_hub.faults[("org/stall", WEIGHTS)] = Fault(stall_at=CUT, stall_s=60)

    result = specpair("download", f"org/stall@{repo.commit}", "--json")

    assert result.code == 0, result.err
    assert fake_hub.served[("org/stall", WEIGHTS)] == len(files[WEIGHTS])  # no byte fetched twice
    assert file_gets(fake_hub, "org/stall").count((WEIGHTS, f"bytes={CUT}-")) == 1
    assert blob(cache, "org/stall", files[WEIGHTS]).read_bytes() == files[WEIGHTS]

    stuck = fake_hub.add("org/stuck", files)
    fake_hub.faults[("org/stuck", WEIGHTS)] = Fault(stall_at=CUT, stall_s=60, stalls=100)
    monkeypatch.setattr(download, "RETRIES", 2)
    err = one_line_error(specpair("download", f"org/stuck@{stuck.commit}"), 1)
    assert f"gave up after {download.RETRIES} retries without progress (ReadTimeout" in err
    assert f"{CUT} of {len(files[WEIGHTS])} bytes are kept" in err


def test_full_disk_mid_transfer_is_a_clean_error(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = files_of(pair_dirs[0])
    repo = fake_hub.add("org/full", files)
    weights = files[WEIGHTS]
    real_write = os.write
    room = {"left": CUT}

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".incomplete"):
            if room["left"] < len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            room["left"] -= len(data)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    err = one_line_error(specpair("download", f"org/full@{repo.commit}"), 1)
    monkeypatch.setattr(os, "write", real_write)

    assert f"org/full@{repo.commit}/{WEIGHTS}: the disk is full (No space left on device)" in err
    assert "no file was left under its final name" in err and "free some space and run again to resume" in err
    partial = Path(str(blob(cache, "org/full", weights)) + ".incomplete")
    assert (
        not blob(cache, "org/full", weights).exists()
        and not (snapshot(cache, "org/full", repo.commit) / WEIGHTS).exists()
    )
    kept = partial.stat().st_size
    assert 0 < kept <= CUT and partial.read_bytes() == weights[:kept] and f"the {kept} bytes" in err

    fake_hub.served.clear()
    assert specpair("download", f"org/full@{repo.commit}").code == 0
    assert fake_hub.served[("org/full", WEIGHTS)] == len(weights) - kept


def test_not_enough_disk_space_is_refused_before_any_byte(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = files_of(pair_dirs[0])
    repo = fake_hub.add("org/big", files)
    weights = files[WEIGHTS]
    partial = Path(str(blob(cache, "org/big", weights)) + ".incomplete")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(weights[:CUT])
    needed = sum(len(d) for d in files.values()) - CUT
    usage = shutil.disk_usage(cache)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=needed - 1))

    plan = specpair("download", f"org/big@{repo.commit}", "--dry-run", "--json")
    err = one_line_error(specpair("download", f"org/big@{repo.commit}"), 2)

    assert plan.code == 2 and plan.err == "" and plan.json()["exit_code"] == 2  # under --json, one document
    disk = plan.json()["disk"]
    assert disk == [{"directory": str(cache / "models--org--big"), "needed": needed, "free": needed - 1, "fits": False}]
    assert f"{cache / 'models--org--big'}: not enough free disk space" in err
    assert file_gets(fake_hub, "org/big") == []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=needed))
    assert specpair("download", f"org/big@{repo.commit}").code == 0  # exactly enough: the partial counts


def test_dry_run_shows_the_plan_and_fetches_nothing(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, tmp_path: Path
) -> None:
    files = files_of(pair_dirs[0])
    repo = fake_hub.add("org/plan", files)
    assert specpair("download", f"org/plan@{repo.commit}", "--include", "config.json").code == 0
    partial = Path(str(blob(cache, "org/plan", files[WEIGHTS])) + ".incomplete")
    partial.write_bytes(files[WEIGHTS][:CUT])
    gets = len(fake_hub.ranges)

    plan = specpair("download", f"org/plan@{repo.commit}", "--dry-run", "--json")
    human = specpair("download", f"org/plan@{repo.commit}", "--dry-run")

    assert plan.code == human.code == 0 and len(fake_hub.ranges) == gets
    report = plan.json()
    assert report["dry_run"] is True
    states = {f["path"]: (f["on_disk"], f["partial_bytes"]) for f in report["repos"][0]["files"]}
    assert states["config.json"] == ("present", 0) and states[WEIGHTS] == ("partial", CUT)
    assert {states[n] for n in files if n not in ("config.json", WEIGHTS)} == {("absent", 0)}
    assert report["repos"][0]["bytes_needed"] == sum(len(d) for n, d in files.items() if n != "config.json") - CUT
    assert report["disk"][0]["fits"] is True
    assert "dry run: nothing was fetched" in human.out and "partial" in human.out
    assert partial.stat().st_size == CUT


def test_present_but_corrupt_cache_blob_is_replaced(fake_hub: FakeHub, cache: Path, pair_dirs, specpair) -> None:
    files = files_of(pair_dirs[1])
    repo = fake_hub.add("org/rot", files)
    assert specpair("download", f"org/rot@{repo.commit}").code == 0
    stored = blob(cache, "org/rot", files[WEIGHTS])
    rotten = bytearray(stored.read_bytes())
    rotten[100] ^= 1
    stored.write_bytes(bytes(rotten))

    result = specpair("download", f"org/rot@{repo.commit}", "--json")

    assert result.code == 0
    status = {f["path"]: f["status"] for f in result.json()["repos"][0]["files"]}
    assert status == {WEIGHTS: "replaced", "config.json": "present"}
    assert stored.read_bytes() == files[WEIGHTS]


def test_selection_include_exclude_and_metadata_only(fake_hub: FakeHub, cache: Path, pair_dirs, specpair) -> None:
    files = files_of(pair_dirs[0])
    repo = fake_hub.add("org/select", files)

    def fetched(*options: str) -> set[str]:
        result = specpair("download", f"org/select@{repo.commit}", "--no-lock", "--json", *options)
        assert result.code == 0, result.err
        return {f["path"] for f in result.json()["repos"][0]["files"]}

    assert fetched("--metadata-only") == set(files) - {WEIGHTS}
    assert fetched("--include", "*.json", "--exclude", "tokenizer*") == {"config.json", "generation_config.json"}
    err = one_line_error(specpair("download", f"org/select@{repo.commit}", "--include", "*.gguf"), 2)
    assert "no file of the repo is selected" in err and "config.json" in err
    assert fake_hub.served[("org/select", WEIGHTS)] == 0


def test_metadata_only_pair_is_checked_from_the_lock(fake_hub: FakeHub, cache: Path, specpair, tmp_path: Path) -> None:
    target = fake_hub.add("org/meta-target", files_of(build_target(tmp_path / "t", "qwen3_5", shards=2)))
    draft = fake_hub.add("org/meta-draft", files_of(build_dflash(tmp_path / "d")))

    assert (
        specpair(
            "download", f"org/meta-target@{target.commit}", f"org/meta-draft@{draft.commit}", "--metadata-only"
        ).code
        == 0
    )
    result = specpair("check", "specpair.lock", "--json")

    assert result.code in (0, 1), result.err
    report = result.json()
    assert report["target"]["format"] == "config-only" and report["target"]["revision"] == target.commit
    assert sum(fake_hub.served[("org/meta-target", n)] for n in target.files if n.endswith(".safetensors")) == 0


@pytest.fixture(scope="module")
def error_repos(fake_hub: FakeHub, pair_dirs) -> FakeHub:
    files = files_of(pair_dirs[1])
    fake_hub.add("org/public", files)
    fake_hub.add("org/private", files, private=True, readers={"hf_reader"})
    fake_hub.add("org/gated", files, gated=True, readers={"hf_accepted"})
    fake_hub.add("org/unserved", files, unserved={"config.json"})  # listed, but the file route says EntryNotFound
    fake_hub.add("org/escape", {**files, "../escape.json": b"{}"})  # a hostile endpoint's file list
    fake_hub.add("org/dotcache", {**files, ".cache/huggingface/download/config.json.metadata": b"x"})
    return fake_hub


error_cases = [
    ("org/missing", None, ["org/missing@" + "0" * 40 + ": repository not found on", "no token was given"]),
    ("org/private", None, ["repository not found on", "no token was given"]),
    ("org/private", "hf_other", ["repository not found on", "the token given cannot see it"]),
    ("org/gated", None, ["gated repo and no token was given", "/org/gated, then set HF_TOKEN"]),
    ("org/gated", "hf_other", ["gated repo and this token's account has no access"]),
    ("org/public", "hf_revoked", ["the Hub rejected the token (401 Unauthorized)"]),
    ("org/unserved", None, ["/config.json: file not found on the Hub"]),
    ("org/escape", None, ["the Hub lists an unsafe file name '../escape.json'"]),
    ("org/dotcache", None, ["the repo's file '.cache/huggingface/download/config.json.metadata' would land in"]),
]


@pytest.mark.parametrize(("repo_id", "token", "expected"), error_cases)
def test_access_errors_are_one_line_exit_2(
    error_repos: FakeHub,
    cache: Path,
    specpair,
    monkeypatch: pytest.MonkeyPatch,
    repo_id: str,
    token: str | None,
    expected: list[str],
) -> None:
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    commit = error_repos.repos[repo_id].commit if repo_id in error_repos.repos else "0" * 40
    options = ["--local-dir", "out"] if repo_id == "org/dotcache" else []

    err = one_line_error(specpair("download", f"{repo_id}@{commit}", *options), 2)

    for fragment in expected:
        assert fragment in err


def test_readers_download_private_and_gated_repos(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = files_of(pair_dirs[1])
    for repo_id, token, options in (
        ("org/mine", "hf_reader", {"private": True, "readers": {"hf_reader"}}),
        ("org/licensed", "hf_accepted", {"gated": True, "readers": {"hf_accepted"}}),
    ):
        repo = fake_hub.add(repo_id, files, **options)
        monkeypatch.setenv("HF_TOKEN", token)
        assert specpair("download", f"{repo_id}@{repo.commit}", "--no-lock").code == 0
        assert files_of(snapshot(cache, repo_id, repo.commit)) == files


# ---------------------------------------------------------------- olah: a real Hub mirror


@pytest.fixture(scope="module")
def olah(tmp_path_factory: pytest.TempPathFactory, pair_dirs):
    target_dir, draft_dir = pair_dirs
    with start_olah(
        olah_cli(), tmp_path_factory.mktemp("olah"), {"org/target": target_dir, "org/draft": draft_dir}
    ) as served:
        yield served


def test_olah_pair_download_works_offline_everywhere(
    olah, pair_dirs, specpair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import hf_hub_download, scan_cache_dir

    endpoint, commits = olah
    target_dir, draft_dir = pair_dirs
    for name in HF_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "hf" / "hub"

    result = specpair("download", "org/target@main", f"org/draft@{commits['org/draft']}", "--no-require-sha", "--json")

    assert result.code == 0, result.err
    repos = result.json()["repos"]
    assert [(r["revision"], r["commit"]) for r in repos] == [
        ("main", commits["org/target"]),
        (commits["org/draft"], commits["org/draft"]),
    ]
    for entry, source in zip(repos, pair_dirs):
        assert files_of(Path(entry["path"])) == files_of(source)
    assert (cache / "models--org--target" / "refs" / "main").read_text() == commits["org/target"]

    # Offline from here on: huggingface_hub, `inspect`, `check` (by repo id and from the lock), `verify`.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for repo, source in (("org/target", target_dir), ("org/draft", draft_dir)):
        for name, data in files_of(source).items():
            path = hf_hub_download(repo, name, revision=commits[repo], cache_dir=str(cache), local_files_only=True)
            assert Path(path).read_bytes() == data
    assert {r.repo_id for r in scan_cache_dir(cache).repos} == {"org/target", "org/draft"}
    inspected = specpair("inspect", "org/target@main", "--offline", "--json")
    assert inspected.code == 0, inspected.err
    checkpoint = inspected.json()["checkpoint"]
    assert checkpoint["source"] == "hf-cache" and checkpoint["revision"] == commits["org/target"]
    assert checkpoint["format"] == "safetensors"
    by_repo = specpair(
        "check", f"org/target@{commits['org/target']}", f"org/draft@{commits['org/draft']}", "--offline", "--json"
    )
    from_lock = specpair("check", "specpair.lock", "--json")
    local = specpair("check", str(target_dir), str(draft_dir), "--json")
    statuses = [{s: v["status"] for s, v in r.json()["verdicts"].items()} for r in (by_repo, from_lock, local)]
    assert statuses[0] == statuses[1] == statuses[2]
    assert by_repo.json()["draft"]["source"] == "hf-cache"
    assert specpair("verify", ".").code == 0

    # A local directory through the same mirror (olah answers Range requests with the whole file).
    monkeypatch.delenv("HF_HUB_OFFLINE")
    plain = specpair("download", f"org/draft@{commits['org/draft']}", "--local-dir", "draft", "--no-lock", "--quiet")
    assert plain.code == 0 and plain.out == f"{tmp_path / 'draft'}\n"
    assert files_of(tmp_path / "draft") == files_of(draft_dir)
