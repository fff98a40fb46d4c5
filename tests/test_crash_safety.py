"""Crash safety of `specpair download` and `specpair convert`: SIGKILL at random moments, and a full disk.

Each command runs in a child forked from tests/forkserver.py (specpair and torch already imported) and is
killed with SIGKILL after a delay drawn uniformly from [0, T], T the command's own measured run time, so
the kills land anywhere in its work: resolving, transferring or converting, writing the lockfile, renaming.
After every kill:
- nothing partial or corrupt sits under a final name. download: every file under its final name (HF cache
  blob and snapshot link, or --local-dir file) has the Hub's bytes (sha256), every partial holds a prefix
  of its file, and a lockfile, once there, is complete. convert: DST is absent, or identical to a reference
  conversion (every file's sha256); only DST.specpair-partial may lie beside it;
- the source is untouched (the sha256 of its files);
- a re-run completes. download resumes from what the kill left (its own report: the bytes resumed are the
  partial's size) and `specpair verify` passes on its lock; convert, when DST does not exist, writes it
  identical to the reference past the stale partial, and when it does, refuses it (exit 2) untouched.
Some trials kill the re-run too before one may finish. The seed is fixed, so every run kills at the same
fractions of T. With SPECPAIR_CRASH_REPORT=1 the tests also write what they injected and saw into
docs/reliability.md (and may be given more kills with SPECPAIR_CRASH_KILLS=N); CI leaves the docs alone.

A full disk during convert: the writers' files opened on /dev/full (the kernel's ENOSPC, in-process), and
RLIMIT_FSIZE in a child (the kernel fails write() with EFBIG mid-file, through gguf-py's numpy tofile too).
"""

from __future__ import annotations

import builtins
import collections
import errno
import hashlib
import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fixtures import build_dflash, build_gguf_target, build_target
from hubserver import LFS_SUFFIXES, FakeHub, Fault, git_blob_id

from specpair.cli import main
from specpair.sources.lockfile import read_lock

SEED = 20261130
KILLS = int(os.environ.get("SPECPAIR_CRASH_KILLS", "50"))  # per command; each trial kills once or twice
DOCUMENT = os.environ.get("SPECPAIR_CRASH_REPORT") == "1"
FORKSERVER = Path(__file__).with_name("forkserver.py")
REPORT = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
PARTIAL = ".specpair-partial"
CHUNK_DELAY_S = 0.004  # the fake Hub's pause per 64 KiB of a weights file: a transfer takes ~70 ms


@dataclass
class Ran:
    status: int  # exit code, or -9 when the SIGKILL ended it
    seconds: float
    out: str
    err: str
    killed_by: str | None = None  # "timer" | "file": what set off the SIGKILL


class ForkServer:
    """tests/forkserver.py: commands forked from a process that has imported everything already."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.count = 0
        # one BLAS thread: the server stays single-threaded, so a fork copies no thread mid-flight
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, str(FORKSERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def run(
        self,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        kill_after_s: float | None = None,
        file_size_limit: int | None = None,
        kill_when: dict | None = None,
        signal: str | None = None,
    ) -> Ran:
        self.count += 1
        prefix = self.scratch / f"run-{self.count}"
        request = {
            "argv": argv,
            "cwd": str(cwd),
            "env": env,
            "output": str(prefix),
            "kill_after_s": kill_after_s,
            "file_size_limit": file_size_limit,
            "kill_when": kill_when,
            "signal": signal,
        }
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the fork server died"
        answer = json.loads(line)
        out, err = (Path(f"{prefix}{suffix}") for suffix in (".out", ".err"))
        ran = Ran(
            answer["status"],
            answer["seconds"],
            out.read_text(errors="replace"),
            err.read_text(errors="replace"),
            answer["killed_by"],
        )
        out.unlink()
        err.unlink()
        return ran

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    forks = ForkServer(tmp_path_factory.mktemp("forks"))
    yield forks
    forks.close()


def plain_env(**extra: str) -> dict[str, str]:
    """This environment without any Hugging Face setting, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}, **extra}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(path: Path) -> dict[str, str]:
    """sha256 of every file under a directory by relative path (a file: {"": sha256}); {} when absent."""
    if path.is_file():
        return {"": sha256(path)}
    return {str(p.relative_to(path)): sha256(p) for p in sorted(path.rglob("*")) if p.is_file()}


def one_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def write_report(section: str, lines: list[str]) -> None:
    """Replace the text between `<!-- {section}:start -->` and `<!-- {section}:end -->` in docs/reliability.md."""
    start, end = f"<!-- {section}:start -->", f"<!-- {section}:end -->"
    text = REPORT.read_text()
    assert start in text and end in text, f"docs/reliability.md has no {start} ... {end} markers"
    before, rest = text.split(start, 1)
    REPORT.write_text(before + start + "\n" + "\n".join(lines) + "\n" + end + rest.split(end, 1)[1])


def commit_note() -> str:
    root = REPORT.parents[1]
    commit = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=False
        ).stdout.strip()
        or "unknown"
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, check=False
    ).stdout.strip()
    return f"commit {commit}{' plus uncommitted changes' if dirty else ''}"


@dataclass
class Tally:
    """What one command's kills did, for the assertions' counts and the report."""

    kills: int = 0  # runs ended by the SIGKILL
    finished_first: int = 0  # runs that ended on their own before their kill was due
    landed: collections.Counter = field(default_factory=collections.Counter)  # the state a kill left
    reruns: collections.Counter = field(default_factory=collections.Counter)  # how the finishing runs ended
    fractions: list[float] = field(default_factory=list)  # each kill's delay / T

    def summary(self) -> str:
        tenths = collections.Counter(min(9, int(f * 10)) for f in self.fractions)
        return (
            f"{self.kills} kills ({self.finished_first} more runs ended before their kill was due), "
            f"delays per tenth of [0, T]: {[tenths[d] for d in range(10)]}"
        )


# ---------------------------------------------------------------------------------------------------
# convert


@dataclass(frozen=True)
class Conversion:
    source: Path
    to: str
    destination: str  # name of DST in a trial's directory
    options: tuple[str, ...] = ()

    def argv(self, destination: Path) -> list[str]:
        return [
            "convert",
            str(self.source),
            str(destination),
            "--to",
            self.to,
            "--quiet",
            "--device",
            "cpu",
            *self.options,
        ]


@pytest.fixture(scope="module")
def conversions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Conversion]:
    """A safetensors checkpoint into FP8 shards with an index, into one GGUF file, and a GGUF back to BF16."""
    root = tmp_path_factory.mktemp("sources")
    hf = build_target(root / "hf", "qwen3", layers=2, hidden=128, intermediate=256)
    gguf = build_gguf_target(root / "model.gguf", "llama", layers=2, hidden=128, intermediate=256)
    return {
        "safetensors shards": Conversion(hf, "fp8", "out", ("--max-shard-size", "150KB")),
        "one GGUF file": Conversion(hf, "gguf:Q8_0", "out.gguf"),
        "GGUF to safetensors": Conversion(gguf, "bf16", "out"),
    }


@dataclass
class Reference:
    files: dict[str, str]  # what DST must hold: relative path -> sha256
    seconds: float  # T: how long an uninterrupted run takes


def reference(server: ForkServer, conversion: Conversion, root: Path) -> Reference:
    """The conversion run three times uninterrupted: its output (the same every time) and its median time."""
    runs, outputs = [], []
    for k in range(3):
        destination = root / f"reference-{k}" / conversion.destination
        destination.parent.mkdir(parents=True)
        ran = server.run(conversion.argv(destination), cwd=destination.parent, env=plain_env())
        assert ran.status == 0, ran.err
        runs.append(ran.seconds)
        outputs.append(tree(destination))
    assert outputs[0] and outputs[0] == outputs[1] == outputs[2]  # convert writes the same bytes every time
    return Reference(outputs[0], sorted(runs)[1])


def convert_landing(destination: Path) -> str:
    """Where in the conversion a kill landed, from what it left on disk."""
    partial = destination.with_name(destination.name + PARTIAL)
    if destination.exists():
        return "after the rename: DST complete"
    if not partial.exists():
        return "before the partial existed"
    if partial.is_file():
        return "writing the GGUF partial" if partial.stat().st_size else "partial GGUF created, nothing written"
    names = sorted(p.name for p in partial.iterdir())
    if "config.json" in names:
        return "partial directory complete, not yet renamed"
    if any(n.endswith(".json") or n.endswith(".jinja") for n in names):
        return "copying the small files into the partial"
    return f"writing shards into the partial ({len(names)} so far)"


def check_after_kill(destination: Path, expected: Reference, source: Path, source_files: dict[str, str]) -> None:
    beside = {p.name for p in destination.parent.iterdir()}
    assert beside <= {destination.name, destination.name + PARTIAL}, f"left beside DST: {beside}"
    if destination.exists():
        assert tree(destination) == expected.files, "DST exists but differs from the reference conversion"
    assert tree(source) == source_files, "the source changed"


def test_convert_killed_anywhere_leaves_no_partial_output_and_reruns(
    server: ForkServer, conversions, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    tallies: dict[str, Tally] = {}
    for name, conversion in conversions.items():
        source_files = tree(conversion.source)
        expected = reference(server, conversion, tmp_path / name)
        tally = tallies[name] = Tally()
        trial = 0
        while tally.kills < -(-KILLS // len(conversions)):
            trial += 1
            destination = tmp_path / name / f"trial-{trial}" / conversion.destination
            destination.parent.mkdir(parents=True)
            argv = conversion.argv(destination)
            for _ in range(rng.choice((1, 1, 2))):  # some trials kill the re-run too
                delay = rng.uniform(0, expected.seconds)
                ran = server.run(argv, cwd=destination.parent, env=plain_env(), kill_after_s=delay)
                assert ran.status in (0, 2, -9), (ran.status, ran.err)
                if ran.status == -9:
                    tally.kills += 1
                    tally.fractions.append(delay / expected.seconds)
                    tally.landed[convert_landing(destination)] += 1
                else:
                    tally.finished_first += 1
                check_after_kill(destination, expected, conversion.source, source_files)
            existed = destination.exists()
            final = server.run(argv, cwd=destination.parent, env=plain_env())
            if existed:
                assert final.status == 2 and "already exists" in one_line(final.err)
                tally.reruns["DST already complete: refused (exit 2), left as it was"] += 1
            else:
                assert final.status == 0, final.err
                tally.reruns["completed past the stale partial"] += 1
            assert tree(destination) == expected.files
            assert {p.name for p in destination.parent.iterdir()} == {destination.name}
            assert tree(conversion.source) == source_files
    assert sum(t.kills for t in tallies.values()) >= KILLS
    if DOCUMENT:
        lines = [f"`specpair convert`, {commit_note()}; T = its median uninterrupted run time, seed {SEED}:", ""]
        for name, tally in tallies.items():
            lines.append(f"- **{name}** (`--to {conversions[name].to}`): " + tally.summary())
            lines += [f"  - kill landed {where}: {n}" for where, n in tally.landed.most_common()]
            lines += [f"  - then: {what}: {n}" for what, n in tally.reruns.most_common()]
        lines += [
            "",
            "Every kill: DST absent or identical to the reference (sha256 of every file), nothing but "
            "DST.specpair-partial beside it, the source unchanged; every re-run: DST identical to the "
            "reference, the partial gone.",
        ]
        write_report("crash-convert", lines)


# ---------------------------------------------------------------------------------------------------
# download


@pytest.fixture(scope="module")
def hub_pair(fake_hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """A target and its drafter on the fake Hub, their weights sent slowly: {repo: {path: bytes}}."""
    root = tmp_path_factory.mktemp("hub")
    sources = {
        "org/target": build_target(root / "target", "qwen3", layers=2, hidden=128, intermediate=256),
        "org/draft": build_dflash(root / "draft"),
    }
    pair = {}
    for repo, directory in sources.items():
        files = {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
        fake_hub.add(repo, files)
        for path in files:
            if path.endswith(LFS_SUFFIXES):
                fake_hub.faults[(repo, path)] = Fault(chunk_delay_s=CHUNK_DELAY_S)
        pair[repo] = files
    return pair


def etag(path: str, data: bytes) -> str:
    return hashlib.sha256(data).hexdigest() if path.endswith(LFS_SUFFIXES) else git_blob_id(data)


@dataclass
class Left:
    """What a (killed) download left for one repo: files complete under their final names, partial sizes."""

    final: set[str] = field(default_factory=set)
    partial: dict[str, int] = field(default_factory=dict)


def download_left(
    trial: Path, layout: str, pair: dict[str, dict[str, bytes]], commits: dict[str, str]
) -> dict[str, Left]:
    """Walk everything the download wrote and check it on the way: a name that is final holds the Hub's bytes,
    a partial holds a prefix of them, and nothing else lies in the snapshot or the local directory."""
    left = {}
    for repo, files in pair.items():
        seen = left[repo] = Left()
        by_etag = {etag(path, data): path for path, data in files.items()}
        if layout == "hf-cache":
            storage = trial / "hf" / "hub" / f"models--{repo.replace('/', '--')}"
            blobs, snapshot = storage / "blobs", storage / "snapshots" / commits[repo]
            for blob in sorted(blobs.iterdir()) if blobs.exists() else []:
                name = blob.name.removesuffix(".incomplete")
                assert name in by_etag, f"{blob}: no file of the repo has this etag"
                data, path = blob.read_bytes(), by_etag[name]
                if blob.name.endswith(".incomplete"):
                    assert files[path].startswith(data), f"{blob}: the partial is not a prefix of {path}"
                    seen.partial[path] = len(data)
                else:
                    assert data == files[path], f"{blob}: a final blob with other bytes than {path}"
                    seen.final.add(path)
            for entry in sorted(snapshot.rglob("*")) if snapshot.exists() else []:
                if entry.is_dir() and not entry.is_symlink():
                    continue
                path = str(entry.relative_to(snapshot))
                assert path in files, f"{entry}: a name in the snapshot that is no file of the repo"
                assert entry.is_symlink() and entry.resolve() == (blobs / etag(path, files[path])).resolve()
                assert entry.read_bytes() == files[path]
        else:
            directory = trial / "models" / repo.split("/")[1]
            for entry in sorted(directory.rglob("*")) if directory.exists() else []:
                path = str(entry.relative_to(directory))
                if entry.is_dir() or path.startswith(".cache/huggingface/"):  # huggingface_hub's download metadata
                    continue
                if path.startswith(".cache/specpair/download/"):
                    if path.endswith(".lock"):
                        continue
                    match = re.fullmatch(
                        r"(.+)\.([0-9a-f]{16})\.incomplete", path.removeprefix(".cache/specpair/download/")
                    )
                    assert match and match[1] in files and etag(match[1], files[match[1]]).startswith(match[2]), path
                    data = entry.read_bytes()
                    assert files[match[1]].startswith(data), f"{entry}: the partial is not a prefix of {match[1]}"
                    seen.partial[match[1]] = len(data)
                    continue
                assert path in files and entry.read_bytes() == files[path], (
                    f"{entry}: not the Hub's file under a final name"
                )
                seen.final.add(path)
    lock = lock_of(trial, layout)
    if lock.exists():  # written last, in one rename: complete, and only once every file is final
        locked = {r.repo: {(f.path, f.size, f.sha256) for f in r.files} for r in read_lock(str(lock))}
        assert locked == {
            repo: {(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()} for repo, files in pair.items()
        }
        assert all(seen.final == set(pair[repo]) for repo, seen in left.items())
    return left


def lock_of(trial: Path, layout: str) -> Path:
    """Where the download writes its lock: beside the files of a --local-dir download, else in the working directory."""
    return trial / "models" / "specpair.lock" if layout == "local-dir" else trial / "specpair.lock"


def download_landing(left: dict[str, Left], trial: Path, pair: dict[str, dict[str, bytes]], layout: str) -> str:
    final = sum(len(s.final) for s in left.values())
    if lock_of(trial, layout).exists():
        return "after the lockfile: complete"
    if final == sum(len(files) for files in pair.values()):
        return "every file verified, before the lockfile"
    if any(s.partial for s in left.values()):
        return "mid-transfer (partials on disk)"
    return "between files (no partial)" if final else "before the first byte"


def test_download_killed_anywhere_keeps_only_verified_files_and_resumes(
    server: ForkServer, fake_hub: FakeHub, hub_pair, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    commits = {repo: fake_hub.repos[repo].commit for repo in hub_pair}
    argv = ["download", *(f"{repo}@{commit}" for repo, commit in commits.items()), "--json"]
    source_bytes = {
        repo: {p: hashlib.sha256(d).hexdigest() for p, d in files.items()} for repo, files in hub_pair.items()
    }
    tallies: dict[str, Tally] = {}
    resumed = collections.Counter()
    for layout in ("hf-cache", "local-dir"):
        options = ["--local-dir", "models"] if layout == "local-dir" else []
        timings = []
        for k in range(3):
            trial = tmp_path / layout / f"timing-{k}"
            trial.mkdir(parents=True)
            ran = server.run(
                argv + options, cwd=trial, env=plain_env(HF_ENDPOINT=fake_hub.url, HF_HOME=str(trial / "hf"))
            )
            assert ran.status == 0, ran.err
            timings.append(ran.seconds)
        duration = sorted(timings)[1]
        tally = tallies[layout] = Tally()
        trial_number = 0
        while tally.kills < -(-KILLS // 2):
            trial_number += 1
            trial = tmp_path / layout / f"trial-{trial_number}"
            trial.mkdir(parents=True)
            env = plain_env(HF_ENDPOINT=fake_hub.url, HF_HOME=str(trial / "hf"))
            for _ in range(rng.choice((1, 1, 2))):  # some trials kill the resumed run too
                delay = rng.uniform(0, duration)
                ran = server.run(argv + options, cwd=trial, env=env, kill_after_s=delay)
                assert ran.status in (0, -9), (ran.status, ran.err)
                left = download_left(trial, layout, hub_pair, commits)
                if ran.status == -9:
                    tally.kills += 1
                    tally.fractions.append(delay / duration)
                    tally.landed[download_landing(left, trial, hub_pair, layout)] += 1
                else:
                    tally.finished_first += 1
            final = server.run(argv + options, cwd=trial, env=env)
            assert final.status == 0, final.err
            report = {r["repo"]: {f["path"]: f for f in r["files"]} for r in json.loads(final.out)["repos"]}
            for repo, seen in left.items():  # the run's own account matches what the kill left
                for path, data in hub_pair[repo].items():
                    got = report[repo][path]
                    if path in seen.final:
                        assert got["status"] == "present" and got["bytes_transferred"] == 0, got
                    else:
                        kept = seen.partial.get(path, 0)
                        assert (got["bytes_resumed"], got["bytes_transferred"]) == (kept, len(data) - kept), got
                        resumed["bytes"] += kept
                        resumed["files"] += bool(kept)
            assert all(s.final == set(hub_pair[r]) for r, s in download_left(trial, layout, hub_pair, commits).items())
            verified = server.run(["verify", str(lock_of(trial, layout))], cwd=trial, env=env)
            assert verified.status == 0, verified.out + verified.err
            tally.reruns["completed and verified"] += 1
            assert {
                repo: {p: hashlib.sha256(d).hexdigest() for p, d in fake_hub.repos[repo].files.items()}
                for repo in hub_pair
            } == source_bytes
    assert sum(t.kills for t in tallies.values()) >= KILLS
    if DOCUMENT:
        lines = [
            f"`specpair download` of a target and its drafter (13 files, 1.8 MB) from the fake Hub, weights "
            f"sent at 64 KiB per {CHUNK_DELAY_S * 1000:g} ms, {commit_note()}; T = median uninterrupted run, "
            f"seed {SEED}:",
            "",
        ]
        for layout, tally in tallies.items():
            lines.append(f"- **{layout}**: " + tally.summary())
            lines += [f"  - kill landed {where}: {n}" for where, n in tally.landed.most_common()]
            lines += [f"  - then: {what}: {n}" for what, n in tally.reruns.most_common()]
        lines += [
            "",
            f"Re-runs resumed {resumed['files']} partial files ({resumed['bytes']} bytes kept from killed "
            "runs, each file's resumed bytes equal to its partial's size). Every kill: every file under a "
            "final name had the Hub's bytes, every partial a prefix of its file, the lockfile absent or "
            "complete; every re-run: exit 0 and `specpair verify` clean.",
        ]
        write_report("crash-download", lines)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_sigterm_and_ctrl_c_leave_no_partial_behind(server: ForkServer, tmp_path: Path, signal_name: str) -> None:
    """Signalled once its partial holds a written shard (an EXL3 search still running): the conversion removes
    DST.specpair-partial and exits 128 + the signal's number, with one line saying so. Only SIGKILL may leave it."""
    source = build_target(tmp_path / "src", "qwen3", layers=1, hidden=64, intermediate=128)
    source_files = tree(source)
    trial = tmp_path / "trial"
    trial.mkdir()
    argv = [
        "convert",
        str(source),
        "out",
        "--to",
        "exl3:2",
        "--device",
        "cpu",
        "--quiet",
        "--keep",
        "*mlp*=bf16",
        "--keep",
        "lm_head.weight=bf16",
    ]
    ran = server.run(
        argv,
        cwd=trial,
        env=plain_env(),
        kill_after_s=600,
        signal=signal_name,
        kill_when={"glob": "out" + PARTIAL + "/*.safetensors", "min_bytes": 1},
    )
    number = int(getattr(__import__("signal"), signal_name))
    assert (ran.status, ran.killed_by) == (128 + number, "file"), ran.err
    assert one_line(ran.err) == f"error: interrupted by {signal_name}: nothing was left behind\n"
    assert list(trial.iterdir()) == [] and tree(source) == source_files


PARTIALS = {
    "hf-cache": "hf/hub/models--org--target/blobs/*.incomplete",
    "local-dir": "models/target/.cache/specpair/download/*.incomplete",
}


@pytest.mark.parametrize("layout", ["hf-cache", "local-dir"])
@pytest.mark.parametrize("eighths", [1, 4, 7])
def test_download_killed_mid_file_resumes_from_the_bytes_it_kept(
    server: ForkServer, fake_hub: FakeHub, hub_pair, tmp_path: Path, layout: str, eighths: int
) -> None:
    """The kill is placed by bytes, not by time: the fake Hub holds the target's weights at a byte offset, and the
    child is killed once its partial file holds half of that. The re-run then resumes from exactly what the partial
    keeps, and verifies."""
    commits = {repo: fake_hub.repos[repo].commit for repo in hub_pair}
    argv = ["download", *(f"{repo}@{commit}" for repo, commit in commits.items()), "--json"]
    options = ["--local-dir", "models"] if layout == "local-dir" else []
    weights = next(p for p in hub_pair["org/target"] if p.endswith(LFS_SUFFIXES))
    offset = len(hub_pair["org/target"][weights]) * eighths // 8
    trial = tmp_path / "trial"
    trial.mkdir()
    env = plain_env(HF_ENDPOINT=fake_hub.url, HF_HOME=str(trial / "hf"))
    held = Fault(chunk_delay_s=CHUNK_DELAY_S, stall_at=offset, stall_s=30)
    fake_hub.faults[("org/target", weights)], kept_fault = held, fake_hub.faults[("org/target", weights)]
    try:
        killed = server.run(
            argv + options,
            cwd=trial,
            env=env,
            kill_after_s=60,
            kill_when={"glob": PARTIALS[layout], "min_bytes": offset // 2},
        )
    finally:
        fake_hub.faults[("org/target", weights)] = kept_fault
    assert (killed.status, killed.killed_by) == (-9, "file"), killed.err
    left = download_left(trial, layout, hub_pair, commits)
    kept = left["org/target"].partial[weights]
    assert offset // 2 <= kept <= offset and not lock_of(trial, layout).exists()
    final = server.run(argv + options, cwd=trial, env=env)
    assert final.status == 0, final.err
    report = {f["path"]: f for r in json.loads(final.out)["repos"] if r["repo"] == "org/target" for f in r["files"]}
    total = len(hub_pair["org/target"][weights])
    assert (report[weights]["bytes_resumed"], report[weights]["bytes_transferred"]) == (kept, total - kept)
    assert server.run(["verify", str(lock_of(trial, layout))], cwd=trial, env=env).status == 0


# ---------------------------------------------------------------------------------------------------
# a full disk during convert


@pytest.mark.parametrize("name", ["safetensors shards", "one GGUF file"])
def test_full_disk_during_convert_is_one_line_and_leaves_nothing(
    conversions, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The writers' files are opened on /dev/full, where every write fails with the kernel's ENOSPC."""
    import gguf.gguf_writer

    from specpair.formats import safetensors

    conversion = conversions[name]
    source_files = tree(conversion.source)
    destination = tmp_path / conversion.destination

    def full_disk(path: str, mode: str = "r", *args: object, **kwargs: object):
        if "r" in mode:  # the source is read as ever
            return builtins.open(path, mode, *args, **kwargs)
        assert PARTIAL in str(path), path  # only the output is written
        return builtins.open("/dev/full", mode, *args, **kwargs)

    for module in (safetensors, gguf.gguf_writer):
        monkeypatch.setattr(module, "open", full_disk, raising=False)
    monkeypatch.setattr(sys, "argv", ["specpair", *conversion.argv(destination)])
    with pytest.raises(SystemExit) as exited:
        main()
    err = one_line(capsys.readouterr().err)
    assert exited.value.code == 1
    assert err == (
        f"error: {destination}: the disk is full ({os.strerror(errno.ENOSPC)}); nothing was left behind: "
        "free some space and run again\n"
    )
    assert list(tmp_path.iterdir()) == [] and tree(conversion.source) == source_files


@pytest.mark.parametrize("name", ["safetensors shards", "one GGUF file", "GGUF to safetensors"])
def test_file_size_limit_mid_write_is_one_line_and_leaves_nothing(
    server: ForkServer, conversions, name: str, tmp_path: Path
) -> None:
    """RLIMIT_FSIZE below the output's size: the kernel fails a write() part-way into a file (EFBIG)."""
    conversion = conversions[name]
    source_files = tree(conversion.source)
    destination = tmp_path / "out" / conversion.destination
    destination.parent.mkdir()
    limited = server.run(
        conversion.argv(destination), cwd=destination.parent, env=plain_env(), file_size_limit=64 << 10
    )
    assert limited.status == 1, limited.err
    err = one_line(limited.err)
    assert err.startswith(f"error: {destination}: writing failed (") and "nothing was left behind" in err
    assert list(destination.parent.iterdir()) == [] and tree(conversion.source) == source_files
    assert server.run(conversion.argv(destination), cwd=destination.parent, env=plain_env()).status == 0
    assert destination.exists()
