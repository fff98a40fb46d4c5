"""`specpair verify DIR|LOCK`: re-hash what `specpair download` wrote; and locks read as untrusted input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hubserver import FakeHub
from test_download import WEIGHTS, cache, files_of, one_line_error, pair_dirs, specpair  # noqa: F401 (fixtures)


@pytest.fixture
def downloaded(fake_hub: FakeHub, cache: Path, pair_dirs, specpair, tmp_path: Path) -> tuple[Path, Path]:
    """The pair downloaded into ./pair with --local-dir, locked in ./pair/specpair.lock: (lock, target dir)."""
    target_id, draft_id = f"org/verify-target-{len(fake_hub.repos)}", f"org/verify-draft-{len(fake_hub.repos)}"
    target = fake_hub.add(target_id, files_of(pair_dirs[0]))
    draft = fake_hub.add(draft_id, files_of(pair_dirs[1]))
    result = specpair(
        "download",
        f"{target_id}@{target.commit}",
        f"{draft_id}@{draft.commit}",
        "--local-dir",
        "pair",
        "--lock",
        "pair/specpair.lock",
    )
    assert result.code == 0, result.err
    lock = tmp_path / "pair" / "specpair.lock"
    return lock, lock.parent / json.loads(lock.read_text())["repos"][0]["path"]


def test_verify_dir_right_after_download_local_dir(
    fake_hub: FakeHub, cache: Path, pair_dirs, specpair, tmp_path: Path
) -> None:
    """The lock goes where the files went: `verify DIR` checks what `download ... --local-dir DIR` just wrote."""
    target = fake_hub.add("org/dir-target", files_of(pair_dirs[0]))
    draft = fake_hub.add("org/dir-draft", files_of(pair_dirs[1]))
    single = fake_hub.add("org/dir-single", files_of(pair_dirs[1]))

    pair = specpair(
        "download", f"org/dir-target@{target.commit}", f"org/dir-draft@{draft.commit}", "--local-dir", "models"
    )
    one = specpair("download", f"org/dir-single@{single.commit}", "--local-dir", "single")

    assert pair.code == one.code == 0, pair.err + one.err
    assert not (tmp_path / "specpair.lock").exists()
    for directory in ("models", "single"):
        result = specpair("verify", directory, "--json")
        assert result.code == 0, result.err
        assert {f["status"] for r in result.json()["repos"] for f in r["files"]} == {"ok"}
    assert {r["repo"] for r in specpair("verify", "models", "--json").json()["repos"]} == {
        "org/dir-target",
        "org/dir-draft",
    }


def test_untouched_download_verifies(downloaded: tuple[Path, Path], specpair, pair_dirs) -> None:
    lock, target_dir = downloaded

    by_file = specpair("verify", str(lock), "--json")
    by_dir = specpair("verify", str(lock.parent))

    assert by_file.code == by_dir.code == 0
    report = by_file.json()
    assert report["schema"] == "specpair.verify/1" and report["ok"] is True and report["exit_code"] == 0
    assert [len(r["files"]) for r in report["repos"]] == [len(files_of(d)) for d in pair_dirs]
    assert {f["status"] for r in report["repos"] for f in r["files"]} == {"ok"}
    assert "all 8 files match the lock" in by_dir.out
    # Paths below the lock's folder are stored relative to it: the folder can move as one.
    assert json.loads(lock.read_text())["repos"][0]["path"] == target_dir.name
    moved = lock.parent.parent / "moved"
    shutil.move(lock.parent, moved)
    assert specpair("verify", str(moved), "--quiet").code == 0


def test_flipped_byte_truncation_and_missing_file_are_reported(downloaded: tuple[Path, Path], specpair) -> None:
    lock, target_dir = downloaded
    weights = target_dir / WEIGHTS
    flipped = bytearray(weights.read_bytes())
    flipped[len(flipped) // 2] ^= 0x01
    weights.write_bytes(bytes(flipped))
    tokenizer = target_dir / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[:-1])
    (target_dir / "config.json").unlink()

    result = specpair("verify", str(lock), "--json")
    human = specpair("verify", str(lock))
    quiet = specpair("verify", str(lock), "--quiet")

    assert result.code == human.code == quiet.code == 1 and quiet.out == ""
    report = result.json()
    assert report["ok"] is False and report["exit_code"] == 1
    status = {f["path"]: f for f in report["repos"][0]["files"]}
    assert status[WEIGHTS]["status"] == "hash_differs" and status[WEIGHTS]["found_size"] == len(flipped)
    assert status["tokenizer.json"]["status"] == "size_differs"
    assert status["tokenizer.json"]["found_size"] == status["tokenizer.json"]["size"] - 1
    assert status["config.json"]["status"] == "missing"
    assert {f["status"] for name, f in status.items() if name not in (WEIGHTS, "tokenizer.json", "config.json")} == {
        "ok"
    }
    assert {f["status"] for f in report["repos"][1]["files"]} == {"ok"}
    for text in ("hash differs", "size differs", "missing", "3 of 8 files differ from the lock"):
        assert text in human.out


def test_cache_blob_that_vanished_is_missing(fake_hub: FakeHub, cache: Path, pair_dirs, specpair) -> None:
    repo = fake_hub.add("org/verify-cache", files_of(pair_dirs[1]))
    assert specpair("download", f"org/verify-cache@{repo.commit}").code == 0
    for blob in (cache / "models--org--verify-cache" / "blobs").iterdir():
        if blob.stat().st_size > 1000:
            blob.unlink()  # the snapshot symlink now dangles

    result = specpair("verify", "specpair.lock", "--json")

    assert result.code == 1
    assert {f["path"]: f["status"] for f in result.json()["repos"][0]["files"]} == {
        "config.json": "ok",
        WEIGHTS: "missing",
    }


def good_lock(tmp_path: Path) -> dict:
    (tmp_path / "model").mkdir(exist_ok=True)
    return {
        "schema": "specpair.lock/1",
        "repos": [
            {
                "repo": "org/model",
                "role": "target",
                "revision": None,
                "commit": "a" * 40,
                "endpoint": "http://127.0.0.1:9",
                "layout": "local-dir",
                "path": "model",
                "selection": {"include": [], "exclude": [], "metadata_only": False},
                "files": [{"path": "config.json", "size": 2, "sha256": "b" * 64}],
            }
        ],
    }


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: "{not json", "not valid JSON"),
        (lambda d: {**d, "schema": "specpair.lock/9"}, "not a specpair.lock/1 file"),
        (lambda d: {**d, "repos": []}, "'repos' must list one or two repos"),
        (lambda d: {**d, "repos": d["repos"] * 3}, "'repos' must list one or two repos"),
        (
            lambda d: {**d, "repos": [{**d["repos"][0], "commit": "main"}]},
            "repos[0]: 'commit' is not a 40-hex commit id",
        ),
        (lambda d: {**d, "repos": [{**d["repos"][0], "repo": "../x"}]}, "'repo' is not a Hub repo id"),
        (lambda d: {**d, "repos": [{**d["repos"][0], "layout": "zip"}]}, "'layout' must be one of"),
        (lambda d: {**d, "repos": [{**d["repos"][0], "selection": None}]}, "'selection' must hold"),
        (
            lambda d: {
                **d,
                "repos": [{**d["repos"][0], "files": [{"path": "../../etc/passwd", "size": 1, "sha256": "b" * 64}]}],
            },
            "repos[0]: files[0]: needs a relative 'path' inside the repo",
        ),
        (
            lambda d: {
                **d,
                "repos": [{**d["repos"][0], "files": [{"path": "/etc/passwd", "size": 1, "sha256": "b" * 64}]}],
            },
            "files[0]: needs a relative 'path'",
        ),
        (
            lambda d: {**d, "repos": [{**d["repos"][0], "files": [{"path": "a", "size": True, "sha256": "b" * 64}]}]},
            "files[0]: needs a relative 'path'",
        ),
        (
            lambda d: {**d, "repos": [{**d["repos"][0], "files": [{"path": "a", "size": 1, "sha256": "B" * 64}]}]},
            "files[0]: needs a relative 'path'",
        ),
    ],
)
def test_malformed_lock_is_bad_input_for_verify_and_check(
    tmp_path: Path, specpair, monkeypatch: pytest.MonkeyPatch, edit, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    document = edit(good_lock(tmp_path))
    (tmp_path / "specpair.lock").write_text(document if isinstance(document, str) else json.dumps(document))

    for command in ("verify", "check"):
        err = one_line_error(specpair(command, "specpair.lock"), 2)
        assert err.startswith("error: specpair.lock") and expected in err, err


def test_lock_arguments_that_are_not_there(tmp_path: Path, specpair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert "no specpair.lock in this directory" in one_line_error(specpair("verify", "."), 2)
    assert "no such file or directory" in one_line_error(specpair("verify", "gone.lock"), 2)
    (tmp_path / "specpair.lock").write_text(json.dumps(good_lock(tmp_path)))
    shutil.rmtree(tmp_path / "model")
    err = one_line_error(specpair("check", "specpair.lock"), 2)
    assert f"{tmp_path / 'model'}: org/model@{'a' * 40} is not there any more" in err
    assert f"`specpair download org/model@{'a' * 40} --local-dir {tmp_path / 'model'} --no-lock`" in err
    result = specpair("verify", "specpair.lock", "--json")
    assert result.code == 1 and result.json()["repos"][0]["files"][0]["status"] == "missing"
